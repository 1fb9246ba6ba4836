//! kube-sandbox: an in-memory Kubernetes API server, faithful where kube and kubectl look.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_sandbox::Error> {
//! let sandbox = kube_sandbox::Sandbox::new();
//! // In-process, no socket: kube::Client::new(sandbox.router(), "default")
//! let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await?;
//! std::fs::write("kubeconfig", served.kubeconfig()).ok();
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

/// The admission webhook call chain over HTTPS (mutating, then validating).
pub mod admission;
/// Users, bearer tokens and impersonation: who a request is from.
pub mod authn;
/// Simulated kube-controller-manager and kubelet: ReplicaSets and Pods of Deployments.
mod controllers;
/// CustomResourceDefinition validation: structural schemas, CEL rules and their static cost.
pub mod crd;
/// The API server's defaults for Deployments, Services and pod templates; cluster IPs.
pub mod defaults;
/// `/version`, `/api`, `/apis`, resource lists, OpenAPI v3 documents.
mod discovery;
/// Built-in objects as Go's encoder writes them: `omitempty` fields at their zero value left out.
pub mod encoding;
/// Core and `events.k8s.io` Events as two views of one store: conversion and field labels.
pub mod events;
/// Fault injection and the request log.
pub mod faults;
/// Field sets (`FieldsV1`): owned, changed and removed fields, and list semantics.
pub mod fields;
/// `metadata.managedFields`: field ownership per manager, and apply conflicts.
pub mod managed;
/// OpenAPI v3 schemas of the built-in kinds, from k8s-openapi's schemars output.
mod openapi;
/// The OpenAPI v2 document (JSON or gnostic protobuf) made from the v3 ones.
mod openapi_v2;
/// JSON merge patch, JSON patch and strategic merge patch.
pub mod patch;
/// The Table columns of built-in kinds (Deployments, ReplicaSets, Pods, Services, Events).
pub mod printers;
/// The RBAC authorizer: Roles, ClusterRoles, their bindings, and the default roles.
pub mod rbac;
/// Served resource types: built-ins and CRD-registered kinds.
pub mod registry;
/// The simulated Deployment controller.
mod rollout;
/// The sandbox handle: options, building, serving, shutting down.
mod sandbox;
/// The `scale` subresource.
pub mod scale;
/// Structural schemas of CRDs: validation, pruning, defaulting, CEL.
pub mod schema;
/// Label and field selectors.
pub mod selector;
/// HTTP routing, the verbs (one file each), watch streams, and the write pipeline.
mod server;
/// KEP-5866's server-side sharded list and watch: the `shardSelector` grammar and its hash.
pub mod shard;
/// `Status` errors: the one error type of the request path.
pub mod status;
/// Objects, the resourceVersion counter, the event log, garbage collection.
pub mod store;
/// `Table` output for kubectl get.
pub mod table;
/// Test support for every crate's tests: kubectl, child processes, polling (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing;
/// HTTPS serving with a CA generated at start.
mod tls;

pub use authn::{Identity, UserInfo};
pub use discovery::DEFAULT_MINOR;
pub use faults::{FaultHandle, RequestKey, RequestRecord, WriteFault};
pub use rollout::RolloutHandle;
pub use sandbox::{
    ClientError, Error, Sandbox, SandboxBuilder, Served, client_for, config_for, kubeconfig_for,
};
pub use status::ApiError;
