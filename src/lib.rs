//! myapp-operator: a controller for the `MyApp` custom resource and its admission webhook.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod cache;
pub mod certs;
pub mod cli;
pub mod controller;
pub mod crd;
#[cfg(feature = "dev")]
pub mod dev;
pub mod error;
#[cfg(any(test, feature = "dev"))]
pub mod fixtures;
pub mod leader;
pub mod metrics;
pub mod plan;
pub mod recent;
pub mod resources;
pub mod run;
pub mod status;
pub mod telemetry;

pub use error::Error;
