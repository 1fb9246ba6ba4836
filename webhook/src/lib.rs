//! `webhook`: hardened HTTPS serving and `AdmissionReview` plumbing for Kubernetes admission
//! webhooks. It knows nothing about any particular resource: callers bring typed rules.
//!
//! - [`validating`] / [`mutating`]: typed rule -> axum route handler (see [`review`]);
//! - [`patch`]: the add-only JSON Patch computed against the raw request object;
//! - [`serve`]: tokio-rustls + hyper HTTP/1.1 with timeouts, body limit, bounded connections,
//!   certificate hot-reload ([`tls`]) and graceful drain;
//! - [`Metrics`]: prometheus-client metrics for the operator's `/metrics`;
//! - `testing` (feature `testing`, dev-dependencies only): a test CA and its TLS configurations.
//!
//! The answers chosen for bad input, and where they follow controller-runtime, are in the
//! table below (also the crate's README).
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod error;
pub mod metrics;
pub mod patch;
pub mod review;
mod server;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use error::Error;
pub use metrics::{Decision, Metrics};
pub use review::{Context, Operation, Verdict, Violation, mutating, validating};
pub use server::{ServerConfig, ServerHandle, serve};
