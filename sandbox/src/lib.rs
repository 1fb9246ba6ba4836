//! kube-sandbox: an in-memory Kubernetes API server, faithful where kube and kubectl look.
#![forbid(unsafe_code)]

pub mod admission;
pub mod defaults;
pub mod schema;
