//! What the checks look at: the operator's namespace and the names `deploy/` gives its objects.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{Api, Client};

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
    /// The ClusterRole and the Role (in the operator's namespace) of `deploy/sharding/`.
    pub const SHARDING_ROLE: &str = "myapp-operator-sharding";
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
    /// The ConfigMap `myapp-operator dev` writes to say what it is (see [`super::Install`]).
    pub const DEV_MARKER: &str = "myapp-operator-dev";
}

/// What kind of installation `check` walks, told by a marker, never guessed.
#[derive(Clone, Debug, Default)]
pub enum Install {
    /// The manifests of `deploy/` in a cluster: every check applies.
    #[default]
    Cluster,
    /// `myapp-operator dev`: the in-memory API server, with the operator and its webhook in the
    /// dev process. No ServiceAccount, pods, Service, Secret or Lease exist, so the checks of
    /// those are skipped; the webhook configurations are checked against the certificate the
    /// process serves, which the marker carries.
    Dev {
        /// The PEM chain the dev webhook serves.
        serving_chain: String,
    },
}

/// The key of [`names::DEV_MARKER`] holding the served certificate chain.
const DEV_SERVING_CHAIN: &str = "tls.crt";

/// The ConfigMap `myapp-operator dev` writes into the operator's namespace of its API server,
/// with the certificate chain its webhook serves.
pub fn dev_marker(namespace: &str, serving_chain: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::DEV_MARKER.into()),
            namespace: Some(namespace.into()),
            annotations: Some(BTreeMap::from([(
                "myapp.example.com/explanation".to_owned(),
                "Written by `myapp-operator dev`: this API server is its in-memory sandbox, and \
                 the operator and its webhook run in the dev process. `myapp-operator check` \
                 reads it to skip what only a cluster install has."
                    .to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            DEV_SERVING_CHAIN.to_owned(),
            serving_chain.to_owned(),
        )])),
        ..ConfigMap::default()
    }
}

/// Which installation `client` reaches: [`Install::Dev`] when the dev marker is in
/// `namespace`, else a cluster install (also when the marker cannot be read: the cluster
/// checks then say what is missing).
pub async fn install(client: &Client, namespace: &str) -> Install {
    let marker = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(names::DEV_MARKER)
        .await;
    match marker {
        Ok(Some(marker)) => Install::Dev {
            serving_chain: marker
                .data
                .and_then(|mut d| d.remove(DEV_SERVING_CHAIN))
                .unwrap_or_default(),
        },
        _ => Install::Cluster,
    }
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
    /// What kind of installation this is ([`install`] reads it before the checks run).
    pub install: Install,
    /// How the operator's Deployment shards, if it turns sharding on (read before the checks
    /// run).
    pub sharding: Option<crate::shard::sharder::By>,
}

impl Target {
    /// Whether this is `myapp-operator dev`'s installation.
    pub fn is_dev(&self) -> bool {
        matches!(self.install, Install::Dev { .. })
    }
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
