//! The sandbox handle: options, building, serving on a socket, and shutting down.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::authn::{self, UserInfo};
use crate::faults::{self, FaultHandle};
use crate::rollout::{self, RolloutHandle};
use crate::{admission, server, store, tls};

/// Errors of the sandbox's own operations (API errors are answered as `Status`, not raised).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the listening socket failed.
    #[error("failed to bind the sandbox listener: {0}")]
    Bind(#[source] std::io::Error),
    /// Reading the bound address failed.
    #[error("failed to read the sandbox listener address: {0}")]
    LocalAddr(#[source] std::io::Error),
    /// Serving HTTP failed.
    #[error("failed to serve the sandbox: {0}")]
    Serve(#[source] std::io::Error),
    /// The server task ended abnormally.
    #[error("failed to join the sandbox server task: {0}")]
    Join(#[source] tokio::task::JoinError),
    /// Generating the serving CA or certificate failed.
    #[error("failed to generate the sandbox serving certificate: {0}")]
    GenerateCertificate(#[source] rcgen::Error),
    /// Building the TLS configuration from the generated certificate failed.
    #[error("failed to configure TLS for the sandbox: {0}")]
    ConfigureTls(#[source] rustls::Error),
}

/// Options fixed when the sandbox is built.
#[derive(Clone, Debug)]
pub struct SandboxBuilder {
    server_minor: u32,
    retention: store::Retention,
    namespaces: Vec<String>,
    deployment_controller: bool,
    simulate_pods: bool,
    rollout_delay: Duration,
    admission: admission::AdmissionChain,
    tokens: authn::Tokens,
    request_log: usize,
    sharded_list_watch: bool,
}

impl Default for SandboxBuilder {
    fn default() -> Self {
        SandboxBuilder {
            server_minor: crate::discovery::DEFAULT_MINOR,
            retention: store::Retention::default(),
            namespaces: vec!["default".into(), "kube-system".into(), "kube-public".into()],
            deployment_controller: true,
            simulate_pods: true,
            rollout_delay: Duration::from_millis(200),
            admission: admission::AdmissionChain::new(),
            tokens: authn::Tokens::default(),
            request_log: faults::REQUEST_LOG_CAPACITY,
            sharded_list_watch: false,
        }
    }
}

impl SandboxBuilder {
    /// The Kubernetes minor version `/version` reports (1.`minor`, default [`crate::DEFAULT_MINOR`]);
    /// kubectl picks its build from it.
    pub fn server_minor_version(mut self, minor: u32) -> Self {
        self.server_minor = minor;
        self
    }

    /// How many events the watch log keeps (default 100,000); a watch from an older version
    /// gets 410 Expired.
    pub fn event_log_capacity(mut self, events: usize) -> Self {
        self.retention.log_events = events.max(1);
        self
    }

    /// How many of the most recent requests [`FaultHandle::requests`] keeps (default 100,000).
    /// [`FaultHandle::request_counts`] counts every request regardless.
    pub fn request_log_capacity(mut self, requests: usize) -> Self {
        self.request_log = requests.max(1);
        self
    }

    /// About how many bytes of memory the watch log's objects take (default 64 MiB):
    /// with [`Self::event_log_capacity`], what bounds the sandbox's memory under churn.
    pub fn event_log_bytes(mut self, bytes: usize) -> Self {
        self.retention.log_bytes = bytes;
        self
    }

    /// How long an Event lives after its last write (default 1 h, kube-apiserver's
    /// `--event-ttl`); then it is deleted, as etcd's lease deletes it.
    pub fn event_ttl(mut self, ttl: Duration) -> Self {
        self.retention.event_ttl = ttl;
        self
    }

    /// Extra namespaces that exist from the start (besides default, kube-system, kube-public).
    pub fn namespace(mut self, name: impl Into<String>) -> Self {
        self.namespaces.push(name.into());
        self
    }

    /// Whether the simulated Deployment controller writes rollout status (default on).
    pub fn deployment_controller(mut self, enabled: bool) -> Self {
        self.deployment_controller = enabled;
        self
    }

    /// Whether the simulated Deployment controller creates ReplicaSets and Pods, as
    /// kube-controller-manager and a kubelet would (default on). Off, it writes only the
    /// Deployment's status after the delay: for benchmarks, where thousands of Pods would slow
    /// every list and watch.
    pub fn simulate_pods(mut self, enabled: bool) -> Self {
        self.simulate_pods = enabled;
        self
    }

    /// KEP-5866's feature gate (`ShardedListAndWatch`, alpha in Kubernetes 1.36, off by
    /// default): LIST and WATCH take a `shardSelector` (see [`crate::shard`]). Off, the
    /// parameter is ignored, as an API server without the gate ignores it.
    pub fn sharded_list_watch(mut self, enabled: bool) -> Self {
        self.sharded_list_watch = enabled;
        self
    }

    /// How long a simulated rollout takes before its status is written.
    pub fn rollout_delay(mut self, delay: Duration) -> Self {
        self.rollout_delay = delay;
        self
    }

    /// Webhooks whose `clientConfig.service` is `service` are dialled at `address` (the
    /// certificate is still verified for `<name>.<namespace>.svc`).
    pub fn webhook_service(self, service: admission::ServiceRef, address: SocketAddr) -> Self {
        self.admission.register_service(service, address);
        self
    }

    /// Turns bearer-token authentication and RBAC authorization on: a request needs a
    /// registered token (else 401), and a user outside `system:masters` needs a Role or
    /// ClusterRole bound to it (else 403). The kubeconfigs then carry the admin token
    /// ([`authn::ADMIN_TOKEN_ID`]). Registering any token turns it on too.
    pub fn authentication(mut self) -> Self {
        self.tokens.enable();
        self
    }

    /// Registers a bearer token, named `id` in the request log, that authenticates as `user`
    /// (`system:authenticated` is added). Read its secret with [`Sandbox::token`].
    pub fn token(mut self, id: &str, user: UserInfo) -> Self {
        self.tokens.register(id, user);
        self
    }

    /// Registers a ServiceAccount token, as a pod's bound token: several ids may stand for one
    /// ServiceAccount (one per replica), each with its own `credential-id` extra.
    pub fn service_account_token(self, id: &str, namespace: &str, name: &str) -> Self {
        self.token(id, UserInfo::service_account(namespace, name))
    }

    /// Builds the sandbox.
    pub fn build(self) -> Sandbox {
        let store = store::Store::new(self.retention);
        {
            let mut state = store.lock();
            if let Some(rt) = state.registry.get("", "v1", "namespaces") {
                for ns in &self.namespaces {
                    if state.get(&rt.storage(), "", ns).is_none() {
                        let obj = server::new_namespace(ns);
                        state.put(&rt, obj, store::EventType::Added);
                    }
                }
            }
        }
        let inner = server::Inner {
            store: Arc::new(store),
            faults: Arc::new(faults::Faults::new(self.request_log)),
            server_minor: self.server_minor,
            rollout: rollout::Rollouts::new(
                self.deployment_controller,
                self.simulate_pods,
                self.rollout_delay,
            ),
            admission: self.admission,
            served: Mutex::new(None),
            tokens: self.tokens,
            sharded_list_watch: self.sharded_list_watch,
        };
        Sandbox {
            inner: Arc::new(inner),
        }
    }
}

/// An in-memory API server. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<server::Inner>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// A sandbox with default options (see [`SandboxBuilder`]).
    pub fn new() -> Self {
        SandboxBuilder::default().build()
    }

    /// A builder for options.
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// The API server as an axum router, for in-process use:
    /// `kube::Client::new(sandbox.router(), "default")`.
    pub fn router(&self) -> Router {
        server::router(self.inner.clone())
    }

    /// Serves over plain HTTP on `addr` (use port 0 for a free one).
    pub async fn serve(&self, addr: SocketAddr) -> Result<Served, Error> {
        let listener = bind(addr).await?;
        let addr = listener.local_addr().map_err(Error::LocalAddr)?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let app = self.router();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await
                .map_err(Error::Serve)
        });
        tracing::info!(%addr, "Sandbox serving");
        Ok(self.served(addr, None, stop_tx, task))
    }

    /// Serves over HTTPS on `addr`, with a CA generated now and a certificate valid for
    /// `localhost`, 127.0.0.1, ::1 and the bound address; the kubeconfigs trust that CA.
    pub async fn serve_tls(&self, addr: SocketAddr) -> Result<Served, Error> {
        let listener = bind(addr).await?;
        let addr = listener.local_addr().map_err(Error::LocalAddr)?;
        let cert = tls::generate(addr).map_err(Error::GenerateCertificate)?;
        let acceptor = cert.acceptor().map_err(Error::ConfigureTls)?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let app = self.router();
        let task = tokio::spawn(async move {
            tls::serve(listener, acceptor, app, stop_rx).await;
            Ok(())
        });
        tracing::info!(%addr, "Sandbox serving HTTPS");
        Ok(self.served(addr, Some(cert.ca_pem), stop_tx, task))
    }

    fn served(
        &self,
        addr: SocketAddr,
        ca_pem: Option<String>,
        stop: oneshot::Sender<()>,
        task: JoinHandle<Result<(), Error>>,
    ) -> Served {
        *self.inner.served.lock().unwrap_or_else(|p| p.into_inner()) = Some((addr, ca_pem.clone()));
        Served {
            addr,
            ca_pem,
            sandbox: self.clone(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A kubeconfig for the address last served (see [`Served::kubeconfig`]), if it serves.
    pub fn kubeconfig(&self) -> Option<String> {
        let (addr, ca) = self
            .inner
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        Some(self.kubeconfig_with(addr, ca.as_deref(), authn::ADMIN_TOKEN_ID))
    }

    /// The secret of the token registered as `id` (the admin's is [`authn::ADMIN_TOKEN_ID`]),
    /// or None when no such token is registered.
    pub fn token(&self, id: &str) -> Option<String> {
        self.inner.tokens.secret(id)
    }

    fn kubeconfig_with(&self, addr: SocketAddr, ca_pem: Option<&str>, id: &str) -> String {
        let token = if self.inner.tokens.enabled() {
            self.token(id).unwrap_or_default()
        } else {
            "sandbox".to_string()
        };
        render_kubeconfig(addr, ca_pem, &token)
    }

    /// The fault-injection and request-log handle.
    pub fn faults(&self) -> FaultHandle {
        FaultHandle {
            faults: self.inner.faults.clone(),
            store: self.inner.store.clone(),
        }
    }

    /// Switches and knobs of the simulated Deployment controller.
    pub fn rollouts(&self) -> RolloutHandle {
        RolloutHandle(self.inner.rollout.clone())
    }

    /// The admission chain, to register webhook service addresses after the sandbox is built.
    pub fn admission(&self) -> admission::AdmissionChain {
        self.inner.admission.clone()
    }

    /// Number of stored objects (all kinds, including the initial namespaces).
    pub fn object_count(&self) -> usize {
        self.inner.store.lock().len()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.store.lock().rv
    }

    /// Objects as stored, read in memory: no request, no serialization, no watch event; one
    /// short hold of the store's lock for all `keys`. For an observer that must not load the
    /// server it observes, such as a benchmark's convergence check. A key is (API group, `""`
    /// for the core group; resource plural; namespace; name); an absent object, or a resource
    /// not served, is None.
    pub fn stored(&self, keys: &[(&str, &str, &str, &str)]) -> Vec<Option<Arc<serde_json::Value>>> {
        let state = self.inner.store.lock();
        keys.iter()
            .map(|&(group, plural, namespace, name)| {
                let rt = state.registry.any_version(group, plural)?;
                state.get_shared(&rt.storage(), namespace, name).cloned()
            })
            .collect()
    }
}

/// Why [`client_for`] could not make a client of a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig does not parse, or its current context does not load.
    #[error("failed to load the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// kube could not build a client of the loaded configuration.
    #[error("failed to build a client of the kubeconfig: {0}")]
    Client(#[source] kube::Error),
}

/// The kube configuration of `kubeconfig`'s (YAML) current context, as a client out of process
/// loads it: for callers that change it (a header) before building the client.
pub async fn config_for(kubeconfig: &str) -> Result<kube::Config, ClientError> {
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(ClientError::Kubeconfig)?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(ClientError::Kubeconfig)
}

/// A client of `kubeconfig`'s (YAML) current context: for a served sandbox, HTTPS to its
/// address with its CA and the token the kubeconfig names, as the operator reaches it.
pub async fn client_for(kubeconfig: &str) -> Result<kube::Client, ClientError> {
    kube::Client::try_from(config_for(kubeconfig).await?).map_err(ClientError::Client)
}

/// A kubeconfig (YAML) pointing at a sandbox served over plain HTTP on `addr`, context
/// `sandbox`, namespace default (its token is only accepted while authentication is off).
pub fn kubeconfig_for(addr: SocketAddr) -> String {
    render_kubeconfig(addr, None, "sandbox")
}

fn render_kubeconfig(addr: SocketAddr, ca_pem: Option<&str>, token: &str) -> String {
    use base64::Engine as _;
    let cluster = match ca_pem {
        Some(ca) => format!(
            "    server: https://{addr}\n    certificate-authority-data: {}\n",
            base64::engine::general_purpose::STANDARD.encode(ca)
        ),
        None => format!("    server: http://{addr}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n{cluster}users:\n- name: sandbox\n  user:\n    token: {token}\ncontexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: sandbox\n    namespace: default\ncurrent-context: sandbox\n"
    )
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::Bind)
}

/// A sandbox serving on a socket. Dropping it stops the server.
pub struct Served {
    addr: SocketAddr,
    ca_pem: Option<String>,
    sandbox: Sandbox,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl Served {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA (PEM) the HTTPS certificate chains to; None over plain HTTP.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kubeconfig pointing at this server: `https://` with `certificate-authority-data` when
    /// served with TLS, and the admin token when authentication is on.
    pub fn kubeconfig(&self) -> String {
        self.sandbox
            .kubeconfig_with(self.addr, self.ca_pem.as_deref(), authn::ADMIN_TOKEN_ID)
    }

    /// A kubeconfig that authenticates with the token registered as `id`, if there is one.
    pub fn kubeconfig_for_token(&self, id: &str) -> Option<String> {
        self.sandbox.token(id)?;
        Some(
            self.sandbox
                .kubeconfig_with(self.addr, self.ca_pem.as_deref(), id),
        )
    }

    /// Stops accepting connections, ends open watches, answers writes held by a stall, and
    /// waits for requests in flight.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.sandbox.faults().release_stalled();
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        // Watches would otherwise keep the graceful shutdown waiting for their timeout (290 s
        // for kube's watcher). A client whose watch ends asks again at once, on a connection
        // the server has not closed yet: end those too, until the server has stopped.
        loop {
            self.sandbox.faults().close_watches();
            tokio::select! {
                joined = &mut task => return joined.map_err(Error::Join)?,
                () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            // Their connections outlive the server task: they must not wait forever.
            self.sandbox.faults().release_stalled();
        }
    }
}
