//! What several test modules share.

pub mod converge;
pub mod install;
pub mod operator;
