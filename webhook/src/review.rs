//! placeholder
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReviewCode(pub u16);
