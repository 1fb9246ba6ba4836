//! `webhook`: hardened HTTPS serving and `AdmissionReview` plumbing for Kubernetes admission
//! webhooks. It knows nothing about any particular resource: callers bring typed rules.
#![forbid(unsafe_code)]

mod error;
pub mod metrics;
pub mod review;
pub mod tls;

pub use error::Error;
pub use metrics::Metrics;
