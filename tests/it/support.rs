//! What several test modules share.

pub mod converge;
pub mod operator;
