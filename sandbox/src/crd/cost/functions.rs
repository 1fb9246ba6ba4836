//! The cost of one call and what is known of its result: cel-go's `functionCost`, with the
//! Kubernetes library's call costs.

use std::rc::Rc;

use super::{
    bounds::{Cost, REGEX_LENGTH, STRING_TRAVERSAL, Size, UNKNOWN},
    info::{Entry, Info},
};
use crate::crd::types::{Decl, Ty};

/// `functionCost` with the Kubernetes library's `EstimateCallCost` consulted first. Returns the
/// call's own cost (arguments included, target not) and what is known of its result.
pub(super) fn function_cost(
    name: &str,
    target: Option<&Info>,
    args: &[Info],
    arg_costs: &[Cost],
    args_sum: Cost,
) -> (Cost, Info) {
    let o1 = Cost::fixed(1).add(args_sum);
    let arg = |i: usize| args.get(i).map(Info::size).unwrap_or(UNKNOWN);
    let ty_of = |i: usize| args.get(i).map(|a| a.ty.clone()).unwrap_or(Ty::Dyn);
    let stringish = |t: &Ty| matches!(t, Ty::String | Ty::Bytes);
    let plain = |ty: Ty| Info::of(ty);
    let sized = |ty: Ty, size: Size| {
        let mut info = Info::of(ty);
        info.size = Some(size);
        info
    };
    if let Some(t) = target {
        let ts = t.size();
        match name {
            "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" => {
                let result = match name {
                    "isSorted" => Ty::Bool,
                    "indexOf" | "lastIndexOf" => Ty::Int,
                    _ => t.element().map(|d| d.ty.clone()).unwrap_or(Ty::Dyn),
                };
                let cost = match &t.ty {
                    Ty::List(elem) => {
                        let mut el = Cost::fixed(1);
                        if let Some(d) = elem.as_ref().filter(|d| stringish(&d.ty)) {
                            el = el.add(
                                Size {
                                    min: 0,
                                    max: d.max_elements,
                                }
                                .factor(STRING_TRAVERSAL),
                            );
                        }
                        ts.times_cost(el)
                    }
                    _ => ts.factor(STRING_TRAVERSAL),
                };
                return (cost.add(args_sum), plain(result));
            }
            "lowerAscii" | "upperAscii" | "substring" | "trim" => {
                return (
                    ts.factor(STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::String, ts),
                );
            }
            "replace" if args.len() >= 2 => {
                let (from, with) = (arg(0), arg(1));
                let (mut count, mut kept) = (Size::fixed(0), Size::fixed(0));
                if from.min == 0 {
                    count.max = ts.max.saturating_add(1);
                    kept.max = ts.max;
                } else if with.max <= from.min {
                    kept.max = ts.max;
                } else {
                    count.max = (ts.max as f64 / from.min as f64).ceil() as u64;
                }
                if from.max == 0 {
                    count.min = ts.min.saturating_add(1);
                    kept.min = ts.min;
                } else if from.max <= with.min {
                    kept.min = ts.min;
                } else {
                    count.min = (ts.min as f64 / from.max as f64).ceil() as u64;
                }
                let size = count.mul(with).add(kept);
                return (
                    ts.factor(2.0 * STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::String, size),
                );
            }
            "split" => {
                let max = match args.get(1).map(|a| a.ty.clone()) {
                    Some(Ty::Int) => args[1].size.map(|_| ts.max).unwrap_or(ts.max),
                    _ => ts.max,
                };
                let string = Rc::new(Decl::simple(Ty::String, 2));
                return (
                    ts.factor(2.0 * STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::List(Some(string)), Size { min: 0, max }),
                );
            }
            "join" => {
                let elem = t.element().map(|d| Size {
                    min: 0,
                    max: d.max_elements,
                });
                let mut size = elem.map(|e| ts.mul(e)).unwrap_or(Size::fixed(0));
                if !args.is_empty() {
                    let separators = Size {
                        min: ts.min.saturating_sub(1),
                        max: ts.max.saturating_sub(1),
                    };
                    size = size.add(arg(0).mul(separators));
                }
                return (
                    size.factor(STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::String, size),
                );
            }
            "find" | "findAll" if !args.is_empty() => {
                let str_cost = ts.add(Size::fixed(1)).factor(STRING_TRAVERSAL);
                let re_cost = arg(0).factor(REGEX_LENGTH);
                let ty = if name == "find" {
                    Ty::String
                } else {
                    Ty::List(None)
                };
                return (
                    str_cost.mul(re_cost).add(args_sum),
                    sized(
                        ty,
                        Size {
                            min: 0,
                            max: ts.max,
                        },
                    ),
                );
            }
            "matches" if args.len() == 1 => {
                let str_cost = ts.add(Size::fixed(1)).factor(STRING_TRAVERSAL);
                let re_cost = arg(0).factor(REGEX_LENGTH);
                return (str_cost.mul(re_cost).add(args_sum), plain(Ty::Bool));
            }
            "contains" if args.len() == 1 && !matches!(t.ty, Ty::List(_) | Ty::Map(_)) => {
                let cost = ts
                    .factor(STRING_TRAVERSAL)
                    .mul(arg(0).factor(STRING_TRAVERSAL));
                return (cost.add(args_sum), plain(Ty::Bool));
            }
            "startsWith" | "endsWith" if args.len() == 1 => {
                return (
                    arg(0).factor(STRING_TRAVERSAL).add(args_sum),
                    plain(Ty::Bool),
                );
            }
            "format" => return (ts.factor(STRING_TRAVERSAL).add(args_sum), plain(Ty::String)),
            "size" => return (o1, plain(Ty::Int)),
            "charAt" => return (o1, plain(Ty::String)),
            _ => {}
        }
    }
    match name {
        "url" | "quantity" | "isQuantity" | "isURL" | "semver" | "isSemver" | "ip" | "cidr"
        | "isIP" | "isCIDR"
            if args.len() == 1 && target.is_none() =>
        {
            let ty = if name.starts_with("is") {
                Ty::Bool
            } else {
                Ty::Dyn
            };
            (arg(0).factor(STRING_TRAVERSAL).add(args_sum), plain(ty))
        }
        "_&&_" | "_||_" if arg_costs.len() == 2 => {
            let (lhs, rhs) = (arg_costs[0], arg_costs[1]);
            (
                Cost {
                    min: lhs.min,
                    max: lhs.add(rhs).max,
                },
                plain(Ty::Bool),
            )
        }
        "_?_:_" if args.len() == 3 => {
            let size = arg(1).union(arg(2));
            let ty = if args[1].ty == args[2].ty {
                args[1].ty.clone()
            } else {
                Ty::Dyn
            };
            let mut info = sized(ty, size);
            info.entry = Entry::union(args[1].entry, args[2].entry);
            (arg_costs[0].add(arg_costs[1].union(arg_costs[2])), info)
        }
        "_==_" | "_!=_" => (compare(arg(0), arg(1)).add(args_sum), plain(Ty::Bool)),
        "_<_" | "_>_" | "_<=_" | "_>=_" => {
            let (a, b) = (ty_of(0), ty_of(1));
            let cost = if stringish(&a) || stringish(&b) {
                compare(arg(0), arg(1)).add(args_sum)
            } else if a == Ty::Dyn && b == Ty::Dyn {
                o1.union(compare(arg(0), arg(1)).add(args_sum))
            } else {
                o1
            };
            (cost, plain(Ty::Bool))
        }
        "_+_" if args.len() == 2 => {
            let size = arg(0).add(arg(1));
            let entry = Entry::union(args[0].entry, args[1].entry);
            let string = size.factor(STRING_TRAVERSAL).add(args_sum);
            let (a, b) = (ty_of(0), ty_of(1));
            let known = if a == Ty::Dyn { b.clone() } else { a.clone() };
            let (cost, ty) = match known {
                Ty::String | Ty::Bytes => (string, known),
                Ty::List(_) => (o1, list_union(&a, &b)),
                Ty::Dyn => (o1.union(string), Ty::Dyn),
                other => (o1, other),
            };
            let mut info = Info::of(ty);
            if matches!(info.ty, Ty::String | Ty::Bytes | Ty::List(_) | Ty::Dyn) {
                info.size = Some(size);
            }
            info.entry = entry;
            (cost, info)
        }
        "@in" if args.len() == 2 => {
            let cost = match args[1].ty {
                Ty::Map(_) => o1,
                _ => arg(1).factor(1.0).add(args_sum),
            };
            (cost, plain(Ty::Bool))
        }
        "_[_]" if args.len() == 2 => {
            let container = &args[0];
            let mut info = match (container.element(), container.decl.is_some()) {
                (Some(decl), true) => Info::from_decl(&decl),
                (Some(decl), false) => Info::of(decl.ty.clone()),
                (None, _) => Info::of(Ty::Dyn),
            };
            if let Some(entry) = container.entry {
                info.size = Some(entry.val);
            }
            (o1, info)
        }
        "bytes" if matches!(ty_of(0), Ty::String) => {
            let size = arg(0);
            (
                size.factor(STRING_TRAVERSAL).add(args_sum),
                sized(
                    Ty::Bytes,
                    Size {
                        min: size.min,
                        max: size.max.saturating_mul(4),
                    },
                ),
            )
        }
        "string" if matches!(ty_of(0), Ty::Bytes) => {
            let size = arg(0);
            (
                size.factor(STRING_TRAVERSAL).add(args_sum),
                sized(
                    Ty::String,
                    Size {
                        min: size.min / 4,
                        max: size.max,
                    },
                ),
            )
        }
        "matches" | "!_" | "@not_strictly_false" | "has" => (o1, plain(Ty::Bool)),
        "size" | "int" => (o1, plain(Ty::Int)),
        "uint" => (o1, plain(Ty::Uint)),
        "double" => (o1, plain(Ty::Double)),
        "string" => (o1, plain(Ty::String)),
        "bytes" => (o1, plain(Ty::Bytes)),
        "duration" => (o1, plain(Ty::Duration)),
        "timestamp" => (o1, plain(Ty::Timestamp)),
        "-_" | "_-_" | "_*_" | "_/_" | "_%_" => (o1, plain(numeric(&ty_of(0), &ty_of(1)))),
        _ => (o1, plain(Ty::Dyn)),
    }
}

/// Equality and ordering of strings, bytes and containers: a traversal of the smaller side.
pub(super) fn compare(lhs: Size, rhs: Size) -> Cost {
    let smallest = lhs.max.min(rhs.max);
    let min = u64::from(smallest > 0);
    Size { min, max: smallest }.factor(STRING_TRAVERSAL)
}

pub(super) fn list_union(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::List(Some(x)), Ty::List(Some(y))) if x.ty == y.ty => a.clone(),
        (Ty::List(Some(_)), Ty::List(None)) => a.clone(),
        (Ty::List(None), Ty::List(Some(_))) => b.clone(),
        _ => Ty::List(None),
    }
}

pub(super) fn numeric(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Dyn, other) | (other, Ty::Dyn) => other.clone(),
        (Ty::Timestamp, Ty::Timestamp) => Ty::Duration,
        (x, _) => x.clone(),
    }
}
