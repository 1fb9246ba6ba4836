//! myapp-operator: a controller for the `MyApp` custom resource and its admission webhook.
#![forbid(unsafe_code)]

/// The admin server: `/livez`, `/readyz`, `/metrics`.
pub mod admin;
/// The MyApp admission rules (validate, default) and their webhook routes.
pub mod admission;
/// What the watch caches keep: slim typed Deployments and Services, MyApps with a digest of
/// their status.
mod cache;
/// Local CA and webhook serving certificates.
pub mod certs;
/// `check`: the installation diagnosed, one line per check, with the fix.
pub mod check;
/// Flags and subcommands.
pub mod cli;
/// The async shell: watches, carrying out each reconcile's plan, backoff, Events.
pub mod controller;
/// The `MyApp` API: spec, status, schema and CEL rules.
pub mod crd;
/// `dev`: the whole system locally on the in-memory API server (feature `dev`).
#[cfg(feature = "dev")]
pub mod dev;
/// The operator's one error type.
mod error;
/// The write gate: writes pass only while this replica provably holds its Lease.
mod fence;
/// Fights over a child: another writer's rewrites told from a user's edits, and named.
mod fight;
/// Test objects: `MyApp::test(name)` and its chainable setters (tests and feature `dev`).
#[cfg(any(test, feature = "dev"))]
mod fixtures;
/// OCI image references: the distribution grammar the admission rules check `spec.image` against.
mod image;
/// The cluster's configuration from kubeconfig files or the pod's service account.
pub mod kubeconfig;
/// Leader election on a Lease.
pub mod leader;
/// Prometheus metrics.
pub mod metrics;
/// The children's watch caches: each child one allocation of its (token-coded) JSON.
mod packed;
/// One RBAC permission the operator needs; the tables are next to the calls.
pub mod permission;
/// One reconcile decided without IO: what to apply, report, publish, and when to look again.
mod plan;
/// Read-your-writes: our writes the watch caches have not seen yet.
mod recent;
/// Pure builders of the desired Deployment and Service, and the applied-or-not comparison.
pub mod resources;
/// `run`: one process, webhook and admin servers on every replica, ordered shutdown.
pub mod run;
/// Sharding: which live shard reconciles which MyApp, and the sharder that places them.
pub mod shard;
/// A MyApp's phase and conditions from its observed Deployment.
pub mod status;
/// Logging setup.
pub mod telemetry;
/// Version, git commit and compiler of this binary.
pub mod version;

pub use error::Error;
