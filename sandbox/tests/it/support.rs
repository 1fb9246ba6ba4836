//! What several test modules share.

pub mod api;
pub mod fixtures;
pub mod kubectl;
pub mod vendored;
pub mod watch;
pub mod webhook;
