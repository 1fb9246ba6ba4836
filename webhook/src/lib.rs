//! `webhook`: hardened HTTPS serving and `AdmissionReview` plumbing for Kubernetes admission
//! webhooks. It knows nothing about any particular resource: callers bring typed rules.
#![forbid(unsafe_code)]

mod error;
pub mod metrics;
pub mod patch;
pub mod review;
mod server;
pub mod tls;

pub use error::Error;
pub use metrics::{Decision, Metrics};
pub use review::{Context, Operation, Verdict, Violation, mutating, validating};
pub use server::{ServerConfig, ServerHandle, serve};
