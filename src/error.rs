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
    /// The serving certificate would outlive the CA that signs it.
    #[error(
        "--cert-days {cert_days} is longer than --ca-days {ca_days}: a certificate cannot outlive its CA; lower --cert-days (MYAPP_CERTS_CERT_DAYS) or raise --ca-days (MYAPP_CERTS_CA_DAYS)"
    )]
    CertOutlivesCa { cert_days: u32, ca_days: u32 },
    /// A SAN is neither a DNS name nor an IP address.
    #[error("{0:?} is not a valid DNS name or IP address for the certificate")]
    InvalidSan(String),
    /// `certs` would overwrite a file.
    #[error("{0} exists already; pass --force to replace it (and every client's trust in its CA)")]
    CertificateExists(std::path::PathBuf),
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
    /// Removing the shard labels of a MyApp the sharder drains failed.
    #[error("failed to let go of the MyApp for another shard: {0}")]
    ReleaseShard(#[source] kube::Error),
    /// The MyApp has no namespace (it is a namespaced kind, so the API never sends one without).
    #[error("MyApp {0} has no namespace")]
    MissingNamespace(String),
    /// The reconcile took longer than its deadline.
    #[error("reconcile did not finish within {0:?}")]
    ReconcileDeadline(Duration),
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
    /// The lease timing flags would let two replicas write at once.
    #[error("invalid lease timing: {0}")]
    LeaseTiming(String),
    /// `--sharding` without an election: nothing would assign MyApps to shards.
    #[error(
        "--sharding needs --leader-elect: each replica holds a shard Lease, and the holder of the operator's Lease assigns MyApps to the shards"
    )]
    ShardingWithoutElection,
    /// `--shard-by namespace` without `--sharding`: it would be silently ignored.
    #[error(
        "--shard-by namespace says how to shard, and sharding is off: add --sharding (MYAPP_SHARDING=true), or drop --shard-by"
    )]
    ShardByWithoutSharding,
    /// `--shard-by namespace` with an identity that cannot name its acknowledgement.
    #[error(
        "--shard-by namespace needs an --identity of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (it names an annotation), not {0:?}"
    )]
    ShardIdentity(String),
    /// `--shard-by namespace` on an API server that ignores `shardSelector`.
    #[error(
        "--shard-by namespace needs an API server that filters lists by shardSelector (KEP-5866, alpha in Kubernetes 1.36, behind its feature gate), and {api_server} ignored it: turn the feature on, or use --shard-by label"
    )]
    ShardSelectorUnsupported { api_server: String },
    /// Asking the API server whether it filters by `shardSelector` failed.
    #[error(
        "--shard-by namespace: could not ask the API server whether it filters lists by shardSelector: {0}"
    )]
    ShardSelectorProbe(#[source] kube::Error),
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
    // --- run ---
    /// Neither an in-cluster service account nor a kubeconfig was found or usable.
    #[error(
        "failed to find the cluster's configuration from KUBECONFIG={kubeconfig} or the pod's service account (set KUBECONFIG or run in a pod): {source}"
    )]
    InferConfig {
        /// `KUBECONFIG` as set, or `unset`.
        kubeconfig: String,
        #[source]
        source: Box<crate::kubeconfig::InferError>,
    },
    /// The kubeconfig `check` was pointed at could not be read or used.
    #[error("failed to load the kubeconfig {path}: {source}")]
    LoadKubeconfig {
        /// The file.
        path: PathBuf,
        #[source]
        source: Box<crate::kubeconfig::LoadError>,
    },
    /// A second signal ended the graceful shutdown early.
    #[error(
        "a second signal cut the graceful shutdown short; in-flight requests may have been dropped"
    )]
    ForcedShutdown,
    /// No cluster could be reached from the kubeconfig or the in-cluster service account.
    #[error("failed to connect to the cluster (set KUBECONFIG or run in a pod): {0}")]
    ConnectCluster(#[source] kube::Error),
    /// Installing the SIGTERM handler failed.
    #[error("failed to install the SIGTERM handler: {0}")]
    InstallSignalHandler(#[source] std::io::Error),
    /// The webhook server did not start (certificates, address, warm-up).
    #[error("failed to start the webhook server: {0}{fix}", fix = webhook_fix(.0))]
    StartWebhook(#[source] webhook::Error),
    // --- dev (only with the `dev` feature) ---
    #[cfg(feature = "dev")]
    /// The in-memory API server did not start.
    #[error(
        "failed to start the sandbox API server on {addr} (is it free? pick another with --api-addr, or 0 for any): {source}"
    )]
    StartSandbox {
        /// The address asked for.
        addr: std::net::SocketAddr,
        #[source]
        source: kube_sandbox::Error,
    },
    #[cfg(feature = "dev")]
    /// `dev` was asked to listen beyond loopback.
    #[error(
        "dev serves an unauthenticated API server: {flag} {addr} must be a loopback address (127.0.0.1 or [::1])"
    )]
    DevNotLoopback {
        /// The flag.
        flag: &'static str,
        /// Its value.
        addr: std::net::SocketAddr,
    },
    #[cfg(feature = "dev")]
    /// The sandbox's kubeconfig could not be read back.
    #[error("failed to read the sandbox kubeconfig: {0}")]
    ReadKubeconfig(#[source] kube::config::KubeconfigError),
    #[cfg(feature = "dev")]
    /// Installing the CRD or the webhook configurations into the sandbox failed.
    #[error("failed to install into the sandbox: {0}")]
    Install(#[source] kube::Error),
    #[cfg(feature = "dev")]
    /// The embedded deploy/base/webhooks.yaml does not parse.
    #[error("failed to parse deploy/base/webhooks.yaml: {0}")]
    ParseWebhooks(#[source] serde_saphyr::Error),
    #[cfg(feature = "dev")]
    /// A document of deploy/base/webhooks.yaml is not the kind it says.
    #[error("failed to decode deploy/base/webhooks.yaml: {0}")]
    DecodeWebhooks(#[source] serde_json::Error),
}

/// `error` and every cause under it, joined by ": " (kube's errors say "client error (Connect)"
/// and keep the reason, such as "Connection refused", in their sources).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let words = cause.to_string();
        if !text.contains(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = cause.source();
    }
    text
}

/// What to do about a webhook server that did not start, in the flags of `run` (empty when the
/// webhook's own message says it already).
fn webhook_fix(error: &webhook::Error) -> &'static str {
    use webhook::Error as E;
    match error {
        E::ReadFile { .. } | E::WatchDirectory { .. } => {
            "; point --cert-dir (MYAPP_CERT_DIR) at a directory holding tls.crt and tls.key: in a cluster the Secret cert-manager writes, mounted by deploy/base/deployment.yaml; locally, write a pair with `myapp-operator certs --out <dir>`"
        }
        E::ParseCertificate { .. } | E::ParseKey { .. } | E::MatchKey { .. } => {
            "; replace tls.crt and tls.key in --cert-dir (MYAPP_CERT_DIR) with a matching PEM pair: cert-manager's Secret, or `myapp-operator certs --out <dir> --force` locally"
        }
        E::Bind { .. } => {
            "; is --webhook-addr (MYAPP_WEBHOOK_ADDR) free? pick another address, or 127.0.0.1:0 for any free port"
        }
        _ => "",
    }
}
