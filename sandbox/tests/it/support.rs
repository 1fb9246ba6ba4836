//! What several test modules share.

pub mod fixtures;
pub mod webhook;
