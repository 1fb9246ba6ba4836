//! The sandbox handle: options, building, serving on a socket, and shutting down.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::faults::{self, FaultHandle};
use crate::rollout::{self, RolloutHandle};
use crate::{admission, server, store};

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
}

/// Options fixed when the sandbox is built.
#[derive(Clone, Debug)]
pub struct SandboxBuilder {
    server_minor: u32,
    log_capacity: usize,
    namespaces: Vec<String>,
    deployment_controller: bool,
    rollout_delay: Duration,
    admission: admission::AdmissionChain,
}

impl Default for SandboxBuilder {
    fn default() -> Self {
        SandboxBuilder {
            server_minor: 32,
            log_capacity: 100_000,
            namespaces: vec!["default".into(), "kube-system".into(), "kube-public".into()],
            deployment_controller: true,
            rollout_delay: Duration::from_millis(200),
            admission: admission::AdmissionChain::new(),
        }
    }
}

impl SandboxBuilder {
    /// The Kubernetes minor version `/version` reports (1.`minor`); kubectl picks its build from it.
    pub fn server_minor_version(mut self, minor: u32) -> Self {
        self.server_minor = minor;
        self
    }

    /// How many events the watch log keeps; a watch from an older version gets 410 Expired.
    pub fn event_log_capacity(mut self, events: usize) -> Self {
        self.log_capacity = events.max(1);
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

    /// Builds the sandbox.
    pub fn build(self) -> Sandbox {
        let store = store::Store::new(self.log_capacity);
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
            faults: Arc::new(faults::Faults::new()),
            server_minor: self.server_minor,
            rollout: rollout::Rollouts::new(self.deployment_controller, self.rollout_delay),
            admission: self.admission,
            served: Mutex::new(None),
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
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::LocalAddr)?;
        *self.inner.served.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
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
        Ok(Served {
            addr,
            faults: self.faults(),
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// A kubeconfig for the address last passed to [`Sandbox::serve`], if it serves.
    pub fn kubeconfig(&self) -> Option<String> {
        let addr = (*self.inner.served.lock().unwrap_or_else(|p| p.into_inner()))?;
        Some(kubeconfig_for(addr))
    }

    /// The fault-injection and request-log handle.
    pub fn faults(&self) -> FaultHandle {
        FaultHandle(self.inner.faults.clone())
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
}

/// A kubeconfig (YAML) pointing at a sandbox served on `addr`, context `sandbox`, namespace default.
pub fn kubeconfig_for(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: http://{addr}\nusers:\n- name: sandbox\n  user:\n    token: sandbox\ncontexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: sandbox\n    namespace: default\ncurrent-context: sandbox\n"
    )
}

/// A sandbox serving on a socket. Dropping it stops the server.
pub struct Served {
    addr: SocketAddr,
    faults: FaultHandle,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl Served {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig pointing at this server.
    pub fn kubeconfig(&self) -> String {
        kubeconfig_for(self.addr)
    }

    /// Stops accepting connections, ends open watches, and waits for requests in flight.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Watches would otherwise keep the graceful shutdown waiting for their timeout.
        self.faults.close_watches();
        match self.task.take() {
            Some(task) => task.await.map_err(Error::Join)?,
            None => Ok(()),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
