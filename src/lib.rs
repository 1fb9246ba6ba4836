//! myapp-operator: a controller for the `MyApp` custom resource and its admission webhook.
#![forbid(unsafe_code)]

pub mod cli;
pub mod crd;
pub mod resources;
