//! myapp-operator: a controller for the `MyApp` custom resource and its admission webhook.
#![forbid(unsafe_code)]

pub mod admission;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod metrics;
pub mod resources;
