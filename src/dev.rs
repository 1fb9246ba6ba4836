//! `dev`: the whole system on one machine with no cluster. A kube-sandbox API server on
//! loopback, the webhook with a fresh CA, the CRD and the webhook configurations from
//! `deploy/` installed into it, and the controller. The end-to-end tests use the same
//! [`Environment`], so what `dev` shows is what the tests prove.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    core::v1::ConfigMap,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use kube_sandbox::{ClientError, Sandbox, Served, admission::ServiceRef};
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    Error,
    admission::AdmissionConfig,
    certs,
    cli::DevArgs,
    resources::FIELD_MANAGER,
    run::{self, Parts},
};

/// The webhook configurations a cluster install uses, embedded so `dev` works from any directory.
pub const WEBHOOKS_YAML: &str = include_str!("../deploy/base/webhooks.yaml");
/// Namespace and name of the webhook Service in `deploy/` (what the configurations point at).
pub const WEBHOOK_SERVICE: (&str, &str) = ("myapp-system", "myapp-operator-webhook");

/// How to start an [`Environment`].
#[derive(Clone, Debug)]
pub struct Options {
    /// API server address (loopback; port 0 picks one).
    pub api_addr: SocketAddr,
    /// Webhook address (loopback; port 0 picks one).
    pub webhook_addr: SocketAddr,
    /// Where the kubeconfig and the certificates are written.
    pub state_dir: PathBuf,
    /// Whether the sandbox simulates Deployment rollouts, and how long one takes.
    pub rollout_delay: Option<Duration>,
    /// The minor version the API server reports (1.N).
    pub server_minor: u32,
    /// How long the API server keeps an Event after its last write.
    pub event_ttl: Duration,
    /// How many bytes of watch history the API server keeps.
    pub watch_history_bytes: usize,
    /// The webhook rules' configuration.
    pub admission: AdmissionConfig,
    /// How long the webhook keeps answering after shutdown begins.
    pub drain_delay: Duration,
}

impl Options {
    /// Everything on free loopback ports, rollouts simulated after 50 ms.
    pub fn ephemeral(state_dir: PathBuf) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            api_addr: any,
            webhook_addr: any,
            state_dir,
            rollout_delay: Some(Duration::from_millis(50)),
            server_minor: kube_sandbox::DEFAULT_MINOR,
            event_ttl: Duration::from_secs(3600),
            watch_history_bytes: 64 << 20,
            admission: AdmissionConfig::default(),
            drain_delay: Duration::ZERO,
        }
    }
}

/// A running sandbox with the webhook and the install applied (the controller is separate:
/// tests start zero, one or two of them). Dropping it stops what it started, so a failing test
/// leaves no server behind; [`Environment::shutdown`] stops in order and waits.
pub struct Environment {
    /// The in-memory API server.
    pub sandbox: Sandbox,
    /// Shared metrics, health and registry.
    pub parts: Parts,
    /// Path of the written kubeconfig.
    pub kubeconfig_path: PathBuf,
    /// Both taken only by [`Environment::shutdown`].
    served: Option<Served>,
    webhook: Option<webhook::ServerHandle>,
    stop_webhook: CancellationToken,
}

impl Environment {
    /// Starts the webhook (fresh certificate), the sandbox, and installs the CRD and the webhook
    /// configurations with the CA filled in.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let parts = Parts::new();
        private_dir(&options.state_dir)?;
        let cert_dir = options.state_dir.join("certs");
        let bundle = certs::generate(&certs::service_sans(WEBHOOK_SERVICE.1, WEBHOOK_SERVICE.0))?;
        bundle.write_to(&cert_dir)?;

        let stop_webhook = CancellationToken::new();
        let mut config = webhook::ServerConfig::new(options.webhook_addr, &cert_dir);
        config.drain_delay = options.drain_delay;
        let webhook = webhook::serve(
            config,
            crate::admission::router(options.admission.clone()),
            parts.webhook_metrics.clone(),
            stop_webhook.clone().cancelled_owned(),
        )
        .await
        .map_err(Error::StartWebhook)?;
        webhook.warm_up().await.map_err(Error::StartWebhook)?;
        parts.health.set_webhook_serving(webhook.certs().clone());

        let service = ServiceRef::new(WEBHOOK_SERVICE.0, WEBHOOK_SERVICE.1, 443);
        let sandbox = Sandbox::builder()
            .namespace(WEBHOOK_SERVICE.0)
            .deployment_controller(options.rollout_delay.is_some())
            .rollout_delay(options.rollout_delay.unwrap_or_default())
            .server_minor_version(options.server_minor)
            .event_ttl(options.event_ttl)
            .event_log_bytes(options.watch_history_bytes)
            .webhook_service(service, webhook.local_addr())
            // As a cluster is reached: HTTPS with a CA, and a token (the admin's, in the
            // kubeconfig), so RBAC objects applied in dev are enforced for other users.
            .authentication()
            .build();
        let served = sandbox
            .serve_tls(options.api_addr)
            .await
            .map_err(|source| Error::StartSandbox {
                addr: options.api_addr,
                source,
            })?;

        let kubeconfig_path =
            std::path::absolute(options.state_dir.join("kubeconfig")).map_err(|source| {
                Error::WriteFile {
                    path: options.state_dir.join("kubeconfig"),
                    source,
                }
            })?;
        // It holds the API server's address and credentials: the owner's only.
        certs::write_file(&kubeconfig_path, &served.kubeconfig(), true).map_err(|source| {
            Error::WriteFile {
                path: kubeconfig_path.clone(),
                source,
            }
        })?;

        let env = Self {
            sandbox,
            parts,
            kubeconfig_path,
            served: Some(served),
            webhook: Some(webhook),
            stop_webhook,
        };
        env.install(&bundle.ca_pem, &bundle.cert_pem).await?;
        Ok(env)
    }

    /// A kube client for the sandbox, through its loopback address as kubectl reaches it.
    pub async fn client(&self) -> Result<Client, Error> {
        kube_sandbox::client_for(&self.served().kubeconfig())
            .await
            .map_err(|e| match e {
                ClientError::Kubeconfig(e) => Error::ReadKubeconfig(e),
                ClientError::Client(e) => Error::ConnectCluster(e),
            })
    }

    /// The sandbox's address.
    pub fn api_addr(&self) -> SocketAddr {
        self.served().addr()
    }

    /// The webhook's address.
    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook
            .as_ref()
            .expect("the webhook runs until shutdown")
            .local_addr()
    }

    /// Installs the CRD and the webhook configurations (trusting `ca_pem`), and the marker
    /// that tells `check` this is dev, with the certificate the webhook serves.
    async fn install(&self, ca_pem: &str, serving_pem: &str) -> Result<(), Error> {
        let client = self.client().await?;
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let crd = crate::crd::stamped_crd();
        let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone());
        crds.patch(
            &crd.metadata.name.clone().unwrap_or_default(),
            &apply,
            &Patch::Apply(&crd),
        )
        .await
        .map_err(Error::Install)?;

        for mut mutating in
            webhook_documents::<MutatingWebhookConfiguration>("MutatingWebhookConfiguration")?
        {
            for hook in mutating.webhooks.iter_mut().flatten() {
                hook.client_config.ca_bundle =
                    Some(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()));
            }
            apply_cluster_scoped(&client, &mutating, &apply).await?;
        }
        for mut validating in
            webhook_documents::<ValidatingWebhookConfiguration>("ValidatingWebhookConfiguration")?
        {
            for hook in validating.webhooks.iter_mut().flatten() {
                hook.client_config.ca_bundle =
                    Some(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()));
            }
            apply_cluster_scoped(&client, &validating, &apply).await?;
        }
        let marker = crate::check::target::dev_marker(WEBHOOK_SERVICE.0, serving_pem);
        Api::<ConfigMap>::namespaced(client.clone(), WEBHOOK_SERVICE.0)
            .patch(
                crate::check::target::names::DEV_MARKER,
                &apply,
                &Patch::Apply(&marker),
            )
            .await
            .map_err(Error::Install)?;
        info!("Installed the CRD and the webhook configurations");
        Ok(())
    }

    /// Stops the webhook (after its drain delay) and the API server.
    pub async fn shutdown(mut self) {
        self.parts.health.set_shutting_down();
        self.stop_webhook.cancel();
        if let Some(webhook) = self.webhook.take() {
            let _ = webhook.wait().await;
        }
        if let Some(served) = self.served.take() {
            let _ = served.shutdown().await;
        }
    }

    fn served(&self) -> &Served {
        self.served
            .as_ref()
            .expect("the API server runs until shutdown")
    }
}

impl Drop for Environment {
    fn drop(&mut self) {
        // The webhook server stops on its token; the API server stops when `Served` drops.
        self.stop_webhook.cancel();
    }
}

/// Creates `dir` (and its parents) readable by its owner only: it holds a kubeconfig and keys.
fn private_dir(dir: &std::path::Path) -> Result<(), Error> {
    let failed = |source| Error::WriteFile {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
    }
    Ok(())
}

/// The documents of [`WEBHOOKS_YAML`] of one kind.
pub fn webhook_documents<T: DeserializeOwned>(kind: &str) -> Result<Vec<T>, Error> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(WEBHOOKS_YAML).map_err(Error::ParseWebhooks)?;
    docs.into_iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| serde_json::from_value(d).map_err(Error::DecodeWebhooks))
        .collect()
}

async fn apply_cluster_scoped<K>(
    client: &Client,
    object: &K,
    params: &PatchParams,
) -> Result<(), Error>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    Api::<K>::all(client.clone())
        .patch(&name, params, &Patch::Apply(object))
        .await
        .map_err(Error::Install)?;
    Ok(())
}

/// `myapp-operator dev`: starts everything, prints how to use it, serves until Ctrl-C.
pub async fn dev(args: DevArgs) -> Result<(), Error> {
    // The sandbox authenticates nobody: on any other interface it would hand the cluster to
    // whoever reaches the port.
    for (flag, addr) in [
        ("--api-addr", args.api_addr),
        ("--webhook-addr", args.webhook_addr),
        ("--admin-addr", args.admin_addr),
    ] {
        if !addr.ip().is_loopback() {
            return Err(Error::DevNotLoopback { flag, addr });
        }
    }
    let options = Options {
        api_addr: args.api_addr,
        webhook_addr: args.webhook_addr,
        state_dir: args.state_dir.clone(),
        rollout_delay: Some(args.rollout_delay),
        server_minor: args.server_minor,
        event_ttl: args.event_ttl,
        watch_history_bytes: args.watch_history_mib as usize * (1 << 20),
        admission: run::admission_config(&args.admission),
        drain_delay: Duration::ZERO,
    };
    let env = Environment::start(options).await?;
    let admin_listener = crate::admin::bind(args.admin_addr).await?;
    let admin_addr = admin_listener.local_addr().map_err(Error::ServeAdmin)?;
    let stop = CancellationToken::new();
    let admin = tokio::spawn(crate::admin::serve(
        admin_listener,
        crate::admin::router(env.parts.health.clone(), env.parts.registry.clone()),
        stop.clone().cancelled_owned(),
    ));
    let controller = tokio::spawn(run::reconcile_while_leading(
        env.client().await?,
        run::controller_config(&args.controller, Some("dev".into())),
        None,
        env.parts.clone(),
        stop.clone(),
    ));

    println!("export KUBECONFIG={}", env.kubeconfig_path.display());
    println!("api: https://{}", env.api_addr());
    println!("webhook: https://{}", env.webhook_addr());
    println!("admin: http://{admin_addr}");
    println!();
    println!("In another terminal, after the export line above:");
    for line in next_steps(!args.admission.default_env.is_empty()) {
        println!("  {line}");
    }
    println!("Ctrl-C stops everything.");

    let _ = tokio::signal::ctrl_c().await;
    info!("Stopping");
    stop.cancel();
    let _ = controller.await;
    let _ = admin.await;
    env.shutdown().await;
    Ok(())
}

/// What to type next, printed by `dev` (paths relative to the repository root). The webhook
/// injects env defaults only when `--default-env` configured some: say so only then.
pub fn next_steps(defaults_configured: bool) -> Vec<&'static str> {
    let mut steps = NEXT_STEPS.to_vec();
    if defaults_configured {
        steps[0] = "kubectl apply -f deploy/examples/myapp.yaml                               # admitted, defaulted, reconciled";
        steps[2] = "kubectl get myapp web -o yaml                                             # --default-env injected, status reported";
    }
    steps
}

/// [`next_steps`] without `--default-env`.
pub const NEXT_STEPS: &[&str] = &[
    "kubectl apply -f deploy/examples/myapp.yaml                               # admitted, reconciled",
    "kubectl get myapps -w                                                     # watch the phase move to Running",
    "kubectl get myapp web -o yaml                                             # spec and status as reported",
    "kubectl get deployments,services                                          # the children",
    "kubectl apply -f deploy/examples/invalid-replicas-negative.yaml           # refused by the CRD schema",
    "kubectl apply -f deploy/examples/invalid-image-digest-wrong-length.yaml   # refused by the webhook",
];
