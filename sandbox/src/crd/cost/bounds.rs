//! The two quantities of the estimate, each a `[min, max]` range: a cost, and a size.

/// `[min, max]` of a cost, saturating at `u64::MAX` as cel-go's does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub min: u64,
    pub max: u64,
}

/// `[min, max]` of a size (string length, list or map entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Size {
    pub(super) min: u64,
    pub(super) max: u64,
}

pub(super) const UNKNOWN: Size = Size {
    min: 0,
    max: u64::MAX,
};
pub(super) const STRING_TRAVERSAL: f64 = 0.1;
pub(super) const REGEX_LENGTH: f64 = 0.25;

impl Cost {
    pub(super) fn fixed(n: u64) -> Self {
        Cost { min: n, max: n }
    }
    pub(super) fn add(self, o: Cost) -> Cost {
        Cost {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    pub(super) fn mul(self, o: Cost) -> Cost {
        Cost {
            min: self.min.saturating_mul(o.min),
            max: self.max.saturating_mul(o.max),
        }
    }
    pub(super) fn union(self, o: Cost) -> Cost {
        Cost {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
}

impl Size {
    pub(super) fn fixed(n: u64) -> Self {
        Size { min: n, max: n }
    }
    pub(super) fn add(self, o: Size) -> Size {
        Size {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    pub(super) fn mul(self, o: Size) -> Size {
        Size {
            min: self.min.saturating_mul(o.min),
            max: self.max.saturating_mul(o.max),
        }
    }
    pub(super) fn union(self, o: Size) -> Size {
        Size {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
    pub(super) fn times_cost(self, c: Cost) -> Cost {
        Cost {
            min: self.min.saturating_mul(c.min),
            max: self.max.saturating_mul(c.max),
        }
    }
    pub(super) fn factor(self, f: f64) -> Cost {
        Cost {
            min: by_factor(self.min, f),
            max: by_factor(self.max, f),
        }
    }
}

/// `multiplyByCostFactor`: rounded up, saturating.
fn by_factor(x: u64, f: f64) -> u64 {
    let product = (x as f64 * f).ceil();
    if product >= 18_446_744_073_709_551_616.0 {
        u64::MAX
    } else {
        product as u64
    }
}
