//! The HTTPS server: tokio-rustls + hyper HTTP/1.1, with explicit timeouts, a body limit,
//! bounded connections, certificate hot-reload and a graceful drain.

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    http::{HeaderValue, Request, StatusCode, header},
    response::{IntoResponse, Response},
};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Notify, Semaphore},
    task::JoinHandle,
    time::{Instant, timeout},
};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

use crate::{
    error::Error,
    metrics::{Metrics, Rejection},
    review::{self, MAX_BODY_BYTES},
    tls::{CertPaths, CertStore, PinnedVerifier},
};

/// How the server listens, times out and drains. Build with [`ServerConfig::new`] and adjust.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address to bind; port 0 picks a free port (see [`ServerHandle::local_addr`]).
    pub addr: SocketAddr,
    /// Where the serving certificate and key live (`tls.crt`, `tls.key`).
    pub certs: CertPaths,
    /// How often the certificate directory is re-read besides watching it (<= 10 s advised).
    pub cert_poll_interval: Duration,
    /// Time allowed from TCP accept to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed from the first byte of a request to the end of its headers.
    pub header_read_timeout: Duration,
    /// Time allowed from the end of the headers to the response (includes reading the body).
    pub request_timeout: Duration,
    /// An idle keep-alive connection is closed after this long. Keep it above the API server's
    /// idle-pool timeout (90 s) so the client, not the server, closes idle connections: a server
    /// closing first races with a request being sent, and POSTs are not retried.
    pub idle_timeout: Duration,
    /// After the shutdown signal, how long to keep accepting and answering as usual (the API
    /// server keeps sending on pooled connections after the pod left the endpoints).
    pub drain_delay: Duration,
    /// At most this many connections are served at once; further ones wait in the backlog.
    pub max_connections: usize,
}

impl ServerConfig {
    /// Defaults: poll 10 s, handshake 10 s, headers 10 s, request 30 s, idle 120 s,
    /// drain 10 s, 512 connections.
    pub fn new(addr: SocketAddr, cert_dir: impl Into<PathBuf>) -> Self {
        Self {
            addr,
            certs: CertPaths::in_dir(cert_dir),
            cert_poll_interval: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            drain_delay: Duration::from_secs(10),
            max_connections: 512,
        }
    }
}

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
        router: metrics.instrument(router),
        metrics,
        acceptor,
        config: Arc::new(config.clone()),
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

#[derive(Clone)]
struct Server {
    router: Router,
    metrics: Metrics,
    acceptor: TlsAcceptor,
    config: Arc<ServerConfig>,
}

impl Server {
    async fn run(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let slots = Arc::new(Semaphore::new(self.config.max_connections));
        let connections = TaskTracker::new();
        let closing = CancellationToken::new();
        let drain_delay = self.config.drain_delay;
        let stop_accepting = async move {
            shutdown.await;
            info!(?drain_delay, "Shutdown requested; draining");
            tokio::time::sleep(drain_delay).await;
        };
        tokio::pin!(stop_accepting);

        loop {
            let slot = tokio::select! {
                () = &mut stop_accepting => break,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
            };
            let (tcp, peer) = tokio::select! {
                () = &mut stop_accepting => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // EMFILE and friends: back off instead of spinning.
                        warn!(%error, "Failed to accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let server = self.clone();
            let closing = closing.clone();
            connections.spawn(async move {
                server.connection(tcp, peer, closing).await;
                drop(slot);
            });
        }

        drop(listener);
        info!(
            open = connections.len(),
            "Stopped accepting; finishing open connections"
        );
        closing.cancel();
        connections.close();
        // In-flight requests end within the request timeout; a connection still open after
        // that is stuck in a way no further waiting fixes.
        let bound = self.config.request_timeout + self.config.handshake_timeout;
        if timeout(bound, connections.wait()).await.is_err() {
            warn!(
                open = connections.len(),
                "Abandoned connections still open after the drain"
            );
        }
    }

    async fn connection(self, tcp: TcpStream, peer: SocketAddr, closing: CancellationToken) {
        let _ = tcp.set_nodelay(true);
        let stream = match timeout(self.config.handshake_timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                debug!(%peer, %error, "TLS handshake failed");
                self.metrics.reject(Rejection::HandshakeFailed);
                return;
            }
            Err(_) => {
                debug!(%peer, "TLS handshake timed out");
                self.metrics.reject(Rejection::HandshakeTimeout);
                return;
            }
        };

        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Tracked {
            inner: stream,
            activity: activity.clone(),
        });
        let service = {
            let server = self.clone();
            let activity = activity.clone();
            hyper::service::service_fn(move |request| {
                let server = server.clone();
                let busy = activity.begin_request();
                async move {
                    let response = server.handle(request).await;
                    drop(busy);
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let mut http = hyper::server::conn::http1::Builder::new();
        // hyper's own header timeout starts as soon as the connection is idle, which would make
        // it an idle timeout too; the loop below keeps the two apart.
        http.timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true);
        let connection = http.serve_connection(io, service);
        tokio::pin!(connection);

        let mut draining = false;
        loop {
            let deadline = activity.next_deadline(&self.config);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        debug!(%peer, %error, "Connection ended with an error");
                    }
                    return;
                }
                () = closing.cancelled(), if !draining => {
                    // Idle connections close now; a request in flight gets `Connection: close`.
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = activity.changed.notified() => {}
                () = tokio::time::sleep_until(deadline) => match activity.expired(&self.config) {
                    Some(Expiry::HeaderRead) => {
                        debug!(%peer, "Request headers timed out");
                        self.metrics.reject(Rejection::HeaderTimeout);
                        return;
                    }
                    Some(Expiry::Idle) if draining => return,
                    Some(Expiry::Idle) => {
                        debug!(%peer, "Closing idle connection");
                        draining = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    None => {}
                },
            }
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response {
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
            // Answer before reading a byte of the body; hyper then closes the connection.
            self.metrics.reject(Rejection::BodyTooLarge);
            return review::too_large_response();
        }
        let request = request.map(Body::new);
        match timeout(
            self.config.request_timeout,
            self.router.clone().oneshot(request),
        )
        .await
        {
            Ok(Ok(response)) => response,
            Ok(Err(infallible)) => match infallible {},
            Err(_) => {
                self.metrics.reject(Rejection::RequestTimeout);
                (
                    StatusCode::REQUEST_TIMEOUT,
                    [(header::CONNECTION, HeaderValue::from_static("close"))],
                    "request timed out\n",
                )
                    .into_response()
            }
        }
    }
}

// === Activity tracking (header-read and idle timeouts) ===

enum Expiry {
    HeaderRead,
    Idle,
}

/// What a connection is doing, in milliseconds since it was established.
struct Activity {
    start: Instant,
    last_activity: AtomicU64,
    // 0: no request head pending; otherwise 1 + the time its first byte arrived.
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    // Wakes the connection's timer when a deadline moves earlier (a head starts, a request
    // ends); deadlines that move later are simply re-checked when the timer fires.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_activity: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, millis: u64) -> Instant {
        self.start + Duration::from_millis(millis)
    }

    fn on_read(&self) {
        let now = self.now();
        self.last_activity.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let started =
                self.head_started
                    .compare_exchange(0, now + 1, Ordering::AcqRel, Ordering::Relaxed);
            if started.is_ok() {
                self.changed.notify_one();
            }
        }
    }

    fn begin_request(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        Busy(self.clone())
    }

    fn next_deadline(&self, config: &ServerConfig) -> Instant {
        let head = self.head_started.load(Ordering::Acquire);
        if head != 0 {
            return self.at(head - 1) + config.header_read_timeout;
        }
        if self.in_flight.load(Ordering::Acquire) == 0 {
            return self.at(self.last_activity.load(Ordering::Relaxed)) + config.idle_timeout;
        }
        // A request is being answered: the request timeout bounds it; look again later.
        Instant::now() + config.request_timeout
    }

    fn expired(&self, config: &ServerConfig) -> Option<Expiry> {
        let now = Instant::now();
        let head = self.head_started.load(Ordering::Acquire);
        if head != 0 {
            return (now >= self.at(head - 1) + config.header_read_timeout)
                .then_some(Expiry::HeaderRead);
        }
        let idle = self.in_flight.load(Ordering::Acquire) == 0
            && now >= self.at(self.last_activity.load(Ordering::Relaxed)) + config.idle_timeout;
        idle.then_some(Expiry::Idle)
    }
}

/// Marks a request in flight until dropped.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_activity.store(self.0.now(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// The TLS stream, noting when bytes arrive.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.on_read();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
