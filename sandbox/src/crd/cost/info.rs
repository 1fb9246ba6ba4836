//! What the walk knows of one expression: its type, the schema node it reads, and its size.

use std::rc::Rc;

use super::bounds::{Size, UNKNOWN};
use crate::crd::types::{Decl, Ty};

/// The container kind and entry sizes of a list or map built in the expression.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) list: bool,
    pub(super) key: Size,
    pub(super) val: Size,
}

impl Entry {
    pub(super) fn union(a: Option<Entry>, b: Option<Entry>) -> Option<Entry> {
        let (a, b) = (a?, b?);
        Some(Entry {
            list: a.list,
            key: a.key.union(b.key),
            val: a.val.union(b.val),
        })
    }
}

/// What the walk knows of one expression.
#[derive(Clone, Debug)]
pub(super) struct Info {
    pub(super) ty: Ty,
    /// The schema node the expression reads (cel-go's field path, resolved).
    pub(super) decl: Option<Rc<Decl>>,
    /// A computed size (literals, call results).
    pub(super) size: Option<Size>,
    /// A local variable's size, used last.
    pub(super) var_size: Option<Size>,
    pub(super) entry: Option<Entry>,
}

impl Info {
    pub(super) fn of(ty: Ty) -> Self {
        Info {
            ty,
            decl: None,
            size: None,
            var_size: None,
            entry: None,
        }
    }

    pub(super) fn from_decl(decl: &Rc<Decl>) -> Self {
        Info {
            decl: Some(decl.clone()),
            ..Info::of(decl.ty.clone())
        }
    }

    /// `computeSize`, then unknown.
    pub(super) fn size(&self) -> Size {
        self.size
            .or_else(|| {
                let decl = self.decl.as_ref().filter(|d| d.sized)?;
                Some(Size {
                    min: 0,
                    max: decl.max_elements,
                })
            })
            .or_else(|| scalar(&self.ty).then(|| Size::fixed(1)))
            .or(self.var_size)
            .unwrap_or(UNKNOWN)
    }

    pub(super) fn element(&self) -> Option<Rc<Decl>> {
        match &self.ty {
            Ty::List(e) | Ty::Map(e) => e.clone(),
            _ => None,
        }
    }
}

pub(super) fn scalar(ty: &Ty) -> bool {
    matches!(
        ty,
        Ty::Bool | Ty::Double | Ty::Duration | Ty::Int | Ty::Timestamp | Ty::Uint
    )
}
