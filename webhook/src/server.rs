//! The HTTPS server: tokio-rustls + hyper HTTP/1.1, with explicit timeouts, a body limit,
//! bounded connections, certificate hot-reload and a graceful drain.

mod config;
mod connection;
mod slots;

use std::{
    future::Future,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use axum::Router;
use rustls_pki_types::ServerName;
use tokio::{
    io::AsyncWriteExt as _,
    net::{TcpListener, TcpStream},
    task::JoinHandle,
    time::timeout,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{info, warn};

pub use self::config::ServerConfig;
use self::{
    connection::{Activity, Shared},
    slots::Slots,
};
use crate::{
    error::Error,
    metrics::Metrics,
    tls::{CertStore, PinnedVerifier},
};

/// A running server. Dropping it does not stop the server; the shutdown signal does.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    certs: CertStore,
    handshake_timeout: Duration,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The bound address (with the real port when the configured one was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The serving certificate store (for its `notAfter`, or to force a reload).
    pub fn certs(&self) -> &CertStore {
        &self.certs
    }

    /// Does one TLS handshake with the server over loopback and returns how long it took.
    ///
    /// The first handshake of a process is slow (the crypto library seeds its random generator
    /// and builds tables); call this before reporting ready so the API server's first call is
    /// not the slow one. The client trusts exactly the certificate being served.
    pub async fn warm_up(&self) -> Result<Duration, Error> {
        let ip = match self.local_addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let addr = SocketAddr::new(ip, self.local_addr.port());
        let mut config = rustls::ClientConfig::builder_with_provider(self.certs.provider().clone())
            .with_safe_default_protocol_versions()
            .map_err(Error::ConfigureTls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier::new(&self.certs)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let warm_up_error = |source| Error::WarmUp { addr, source };
        let start = std::time::Instant::now();
        let tcp = TcpStream::connect(addr).await.map_err(warm_up_error)?;
        let connect = TlsConnector::from(Arc::new(config)).connect(ServerName::from(ip), tcp);
        let mut tls = timeout(self.handshake_timeout, connect)
            .await
            .map_err(|_| warm_up_error(io::ErrorKind::TimedOut.into()))?
            .map_err(warm_up_error)?;
        let elapsed = start.elapsed();
        // A clean close_notify; the server does not care either way.
        let _ = tls.shutdown().await;
        info!(?elapsed, "Warmed up TLS");
        Ok(elapsed)
    }

    /// Waits until the server has drained and stopped.
    pub async fn wait(self) -> Result<(), Error> {
        self.task.await.map_err(Error::JoinServer)
    }
}

/// Loads the certificates (failing fast), binds, and serves `router` until `shutdown` resolves
/// and the drain is over.
///
/// Every route of `router` is instrumented with `metrics` (see [`Metrics::instrument`]). The
/// certificate directory is watched and polled for a new pair until the server stops.
pub async fn serve(
    config: ServerConfig,
    router: Router,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<ServerHandle, Error> {
    let certs = CertStore::load(config.certs.clone(), metrics.clone())?;
    let acceptor = TlsAcceptor::from(certs.server_config()?);
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: config.addr,
        source,
    })?;
    let stop_watching = CancellationToken::new();
    let watcher = certs.watch(config.cert_poll_interval, stop_watching.clone())?;
    info!(%local_addr, "Serving webhooks");

    let server = Server {
        slots: Slots::new(config.max_connections),
        shared: Shared {
            router: metrics.instrument(router),
            metrics,
            acceptor,
            config: Arc::new(config.clone()),
            draining: CancellationToken::new(),
            closing: CancellationToken::new(),
        },
    };
    let task = tokio::spawn(async move {
        server.run(listener, shutdown).await;
        stop_watching.cancel();
        let _ = watcher.await;
        info!("Stopped serving webhooks");
    });
    Ok(ServerHandle {
        local_addr,
        certs,
        handshake_timeout: config.handshake_timeout,
        task,
    })
}

struct Server {
    shared: Shared,
    slots: Arc<Slots>,
}

impl Server {
    async fn run(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let connections = TaskTracker::new();
        let config = self.shared.config.clone();
        let draining = self.shared.draining.clone();
        let stop_accepting = async move {
            shutdown.await;
            info!(drain_delay = ?config.drain_delay, "Shutdown requested; draining");
            draining.cancel();
            tokio::time::sleep(config.drain_delay).await;
        };
        tokio::pin!(stop_accepting);

        loop {
            let (tcp, peer) = tokio::select! {
                () = &mut stop_accepting => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors: a waiting connection gives its up; otherwise
                        // back off instead of spinning.
                        let exhausted = matches!(error.raw_os_error(), Some(EMFILE | ENFILE));
                        if !(exhausted && self.slots.shed_one()) {
                            warn!(%error, "Failed to accept a connection");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let activity = Arc::new(Activity::new());
            let slot = tokio::select! {
                () = &mut stop_accepting => break,
                slot = self.slots.admit(activity.clone()) => slot,
            };
            let shared = self.shared.clone();
            connections.spawn(async move {
                connection::serve(shared, tcp, peer, activity).await;
                drop(slot);
            });
        }

        drop(listener);
        info!(
            open = self.slots.len(),
            "Stopped accepting; finishing open connections"
        );
        self.shared.closing.cancel();
        connections.close();
        // Every state a connection can still be in is bounded: a connection accepted last goes
        // through all of them at worst. One still open after that is stuck beyond fixing.
        let config = &self.shared.config;
        let bound = config.handshake_timeout
            + config.first_request_timeout
            + config.header_read_timeout
            + config.request_timeout
            + config.linger;
        if timeout(bound, connections.wait()).await.is_err() {
            warn!(
                open = connections.len(),
                "Abandoned connections still open after the drain"
            );
        }
    }
}

// Linux (and BSD) errno values for "too many open files" (process, system).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;
