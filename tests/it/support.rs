//! What several test modules share.

pub mod converge;
#[path = "../../sandbox/tests/support/kubectl.rs"]
pub mod kubectl;
pub mod operator;
pub mod process;
