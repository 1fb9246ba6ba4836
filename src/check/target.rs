//! What the checks look at: the operator's namespace and the names `deploy/` gives its objects.

use std::time::Duration;

/// The names `deploy/` gives the operator's objects (in the operator's namespace unless said).
pub mod names {
    /// The CRD.
    pub const CRD: &str = "myapps.example.com";
    /// The ServiceAccount the Deployment runs as.
    pub const SERVICE_ACCOUNT: &str = "myapp-operator";
    /// The ClusterRole (cluster-wide permissions).
    pub const CLUSTER_ROLE: &str = "myapp-operator";
    /// The leader-election Role.
    pub const LEADER_ROLE: &str = "myapp-operator-leader-election";
    /// Both webhook configurations (cluster-scoped).
    pub const WEBHOOK_CONFIGURATION: &str = "myapp-operator";
    /// The Service the webhook configurations call.
    pub const WEBHOOK_SERVICE: &str = "myapp-operator-webhook";
    /// The operator's Deployment.
    pub const DEPLOYMENT: &str = "myapp-operator";
    /// The Secret holding the webhook's serving certificate.
    pub const WEBHOOK_SECRET: &str = "myapp-operator-webhook-tls";
    /// cert-manager's Certificate for that Secret.
    pub const CERTIFICATE: &str = "myapp-operator-webhook";
    /// The leader-election Lease.
    pub const LEASE: &str = "myapp-operator";
}

/// What the checks need to know besides the client.
#[derive(Clone, Debug)]
pub struct Target {
    /// The operator's namespace.
    pub namespace: String,
    /// Where the dry-run MyApps are sent (a namespace the webhooks apply to).
    pub probe_namespace: String,
    /// How long a MyApp's status may lag its spec before that is a failure.
    pub lag_bound: Duration,
}

/// The API's message for a failed call: the Status message when there is one.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Whether a call failed with 404 Not Found.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}
