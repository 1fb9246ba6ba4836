//! The operator's one error type: each variant names the operation that failed.

use std::{path::PathBuf, time::Duration};

/// Everything that can fail in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- admin ---
    /// Binding the admin address failed.
    #[error("failed to bind the admin server to {addr} (is --admin-addr free?): {source}")]
    BindAdmin {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("admin server failed: {0}")]
    ServeAdmin(#[source] std::io::Error),
    // --- certs ---
    /// Generating a key or signing a certificate failed.
    #[error("failed to generate a certificate: {0}")]
    GenerateCertificate(#[source] rcgen::Error),
    /// A SAN is neither a DNS name nor an IP address.
    #[error("{0:?} is not a valid DNS name or IP address for the certificate")]
    InvalidSan(String),
    /// Writing a file failed.
    #[error("failed to write {path}: {source}")]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    // --- controller ---
    /// Applying the child Deployment failed.
    #[error("failed to apply Deployment: {0}")]
    ApplyDeployment(#[source] kube::Error),
    /// Applying the child Service failed.
    #[error("failed to apply Service: {0}")]
    ApplyService(#[source] kube::Error),
    /// Handing `spec.replicas` of the Deployment over to the handoff manager failed.
    #[error("failed to hand over Deployment replicas: {0}")]
    HandOffReplicas(#[source] kube::Error),
    /// Writing `.status` of the MyApp failed.
    #[error("failed to patch MyApp status: {0}")]
    PatchStatus(#[source] kube::Error),
    /// The MyApp has no namespace (it is a namespaced kind, so the API never sends one without).
    #[error("MyApp {0} has no namespace")]
    MissingNamespace(String),
    /// The reconcile took longer than its deadline.
    #[error("reconcile did not finish within {0:?}")]
    ReconcileDeadline(Duration),
    /// A watch cache was dropped (the controller is shutting down).
    #[error("a watch cache is gone: the controller is shutting down")]
    CacheGone,
    // --- leader ---
    /// Reading the Lease failed.
    #[error("failed to read Lease: {0}")]
    ReadLease(#[source] kube::Error),
    /// Creating the Lease failed.
    #[error("failed to create Lease: {0}")]
    CreateLease(#[source] kube::Error),
    /// Writing the Lease (acquire, renew, release) failed.
    #[error("failed to update Lease: {0}")]
    UpdateLease(#[source] kube::Error),
    /// The API did not answer in time.
    #[error("Lease request did not finish within {0:?}")]
    LeaseDeadline(Duration),
    // --- telemetry ---
    /// The `--log-level` filter does not parse.
    #[error(
        "invalid --log-level {filter:?}: {source} (examples: info, debug, myapp_operator=debug,kube=warn)"
    )]
    ParseLogFilter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("failed to install the log subscriber: {0}")]
    InstallLogger(#[source] tracing_subscriber::util::TryInitError),
}
