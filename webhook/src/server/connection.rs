//! One connection: the TLS handshake, HTTP/1.1 requests, the bound on every wait between them,
//! and a close that lets the client read the last answer.

use std::{
    convert::Infallible,
    future::{Future, poll_fn},
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    http::{HeaderValue, Request, StatusCode, header},
    response::{IntoResponse, Response},
};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf},
    net::TcpStream,
    sync::Notify,
    time::{Instant, Sleep, timeout},
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::debug;

use super::config::ServerConfig;
use crate::{
    metrics::{Metrics, Rejection},
    review::{self, BodyTimedOut, MAX_BODY_BYTES},
};

/// The largest request head read (request line and headers). The API server sends well under
/// 4 KiB; hyper answers `431` beyond this, and a slow head cannot grow a buffer past it.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What every connection shares with the accept loop.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) router: Router,
    pub(super) metrics: Metrics,
    pub(super) acceptor: TlsAcceptor,
    pub(super) config: Arc<ServerConfig>,
    /// Cancelled when the drain begins: answers from then on carry `Connection: close`.
    pub(super) draining: CancellationToken,
    /// Cancelled when the drain delay is over: connections finish what they answer and close.
    pub(super) closing: CancellationToken,
}

type Service = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// Serves one accepted connection until it closes, is shed, or a timeout ends it.
pub(super) async fn serve(
    shared: Shared,
    tcp: TcpStream,
    peer: SocketAddr,
    activity: Arc<Activity>,
) {
    let _ = tcp.set_nodelay(true);
    let config = shared.config.clone();
    let handshake = timeout(config.handshake_timeout, shared.acceptor.accept(tcp));
    let stream = tokio::select! {
        result = handshake => match result {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                debug!(%peer, %error, "TLS handshake failed");
                shared.metrics.reject(Rejection::HandshakeFailed);
                return;
            }
            Err(_) => {
                debug!(%peer, "TLS handshake timed out");
                shared.metrics.reject(Rejection::HandshakeTimeout);
                return;
            }
        },
        () = activity.shed.cancelled() => {
            shared.metrics.reject(Rejection::Shed);
            return;
        }
    };
    activity.handshaken();

    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let service = {
        let shared = shared.clone();
        let activity = activity.clone();
        hyper::service::service_fn(move |request| {
            let shared = shared.clone();
            let busy = activity.begin_request();
            Box::pin(async move {
                let mut response = handle(&shared, request).await;
                if shared.draining.is_cancelled() {
                    // The client re-dials for its next request and reaches a replica that stays.
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                drop(busy);
                Ok(response)
            }) as Service
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's own header timeout starts as soon as the connection is idle, which would make it
    // an idle timeout too; the loop below keeps the states apart.
    http.timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let mut connection = http.serve_connection(io, service);

    // `closing`: hyper was asked to close after what it is answering; the others remember a
    // signal already handled, so its branch does not fire again.
    let (mut closing, mut saw_closing, mut saw_shed) = (false, false, false);
    let result = loop {
        let deadline = activity.next_deadline(&config);
        tokio::select! {
            result = poll_fn(|cx| connection.poll_without_shutdown(cx)) => break result,
            () = shared.closing.cancelled(), if !saw_closing => {
                saw_closing = true;
                // Idle connections close now, a request in flight is answered with
                // `Connection: close`; a connection that never sent its first request gets
                // it answered (its client dialled expecting that), within the timeouts.
                if activity.served() > 0 || activity.in_flight() {
                    closing = true;
                    Pin::new(&mut connection).graceful_shutdown();
                }
            }
            () = activity.shed.cancelled(), if !saw_shed => {
                saw_shed = true;
                shared.metrics.reject(Rejection::Shed);
                if !activity.in_flight() {
                    return;
                }
                // It became busy after being picked: finish that request, then close.
                closing = true;
                Pin::new(&mut connection).graceful_shutdown();
            }
            () = activity.changed.notified() => {}
            () = sleep_until(deadline) => match activity.expired(&config) {
                Some(Expiry::FirstRequest) => {
                    debug!(%peer, "No request after the handshake");
                    shared.metrics.reject(Rejection::FirstRequestTimeout);
                    return;
                }
                Some(Expiry::HeaderRead) => {
                    debug!(%peer, "Request headers timed out");
                    shared.metrics.reject(Rejection::HeaderTimeout);
                    return;
                }
                Some(Expiry::Idle) if closing => return,
                Some(Expiry::Idle) => {
                    debug!(%peer, "Closing idle connection");
                    closing = true;
                    Pin::new(&mut connection).graceful_shutdown();
                }
                None => {}
            },
        }
    };
    if let Err(error) = result {
        debug!(%peer, %error, "Connection ended with an error");
        return;
    }
    let stream = connection.into_parts().io.into_inner().inner;
    activity.lingering();
    tokio::select! {
        () = linger(stream, config.linger) => {}
        () = activity.shed.cancelled() => {}
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Closes the way Go's server does after an answer the client may not expect yet (a `413`
/// while it is still sending the body): `close_notify` and FIN first, then read and discard
/// for at most `bound`, so the kernel does not answer the client's late bytes with a reset that
/// would destroy the answer in its receive buffer.
async fn linger(mut stream: TlsStream<TcpStream>, bound: Duration) {
    let _ = timeout(bound, async move {
        if stream.shutdown().await.is_err() {
            return;
        }
        // The rest is discarded unread: no need to decrypt it.
        let (mut tcp, _) = stream.into_inner();
        let mut sink = vec![0; 64 * 1024];
        while let Ok(1..) = tcp.read(&mut sink).await {}
    })
    .await;
}

/// One request: the body limit, the body and request timeouts, then the router.
async fn handle(shared: &Shared, request: Request<Incoming>) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        // Answer before reading a byte of the body; the connection then lingers and closes.
        shared.metrics.reject(Rejection::BodyTooLarge);
        return review::too_large_response();
    }
    let timed_out = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(Deadline {
            inner: body,
            sleep: Box::pin(tokio::time::sleep(shared.config.body_read_timeout)),
            timed_out: timed_out.clone(),
        })
    });
    match timeout(
        shared.config.request_timeout,
        shared.router.clone().oneshot(request),
    )
    .await
    {
        Ok(Ok(response)) => {
            if timed_out.load(Ordering::Relaxed) {
                shared.metrics.reject(Rejection::BodyTimeout);
            }
            response
        }
        Ok(Err(infallible)) => match infallible {},
        Err(_) => {
            shared.metrics.reject(Rejection::RequestTimeout);
            (
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, HeaderValue::from_static("close"))],
                "request timed out\n",
            )
                .into_response()
        }
    }
}

/// The request body, failing with [`BodyTimedOut`] when it is not complete by its deadline.
struct Deadline {
    inner: Incoming,
    sleep: Pin<Box<Sleep>>,
    timed_out: Arc<AtomicBool>,
}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// === Activity: what a connection waits for, and since when ===

pub(super) enum Expiry {
    FirstRequest,
    HeaderRead,
    Idle,
}

/// What a connection is doing, in milliseconds since it was accepted. Shared with the slot
/// table, which reads it to pick a connection to shed.
pub(super) struct Activity {
    start: Instant,
    handshaken: AtomicBool,
    lingering: AtomicBool,
    // The end of the handshake or of the last request.
    last_activity: AtomicU64,
    // 0: no request head pending; otherwise 1 + the time its first byte arrived.
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    served: AtomicU64,
    // Wakes the connection's timer when a deadline moves earlier (a head starts, a request
    // ends); deadlines that move later are simply re-checked when the timer fires.
    changed: Notify,
    shed: CancellationToken,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            start: Instant::now(),
            handshaken: AtomicBool::new(false),
            lingering: AtomicBool::new(false),
            last_activity: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            changed: Notify::new(),
            shed: CancellationToken::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, millis: u64) -> Instant {
        self.start + Duration::from_millis(millis)
    }

    fn handshaken(&self) {
        self.last_activity.store(self.now(), Ordering::Relaxed);
        self.handshaken.store(true, Ordering::Release);
    }

    fn lingering(&self) {
        self.lingering.store(true, Ordering::Release);
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::Acquire)
    }

    fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Asks the connection to close now (it lost its slot).
    pub(super) fn shed(&self) {
        self.shed.cancel();
    }

    /// Which connection to shed first: the smallest rank. `None` while a request is answered.
    /// Connections waiting for a request that has not begun (handshake, first request, a head
    /// still arriving, lingering) go before idle keep-alive ones, the longest-waiting first.
    pub(super) fn shed_rank(&self) -> Option<(u8, Instant)> {
        if self.in_flight() {
            return None;
        }
        // A head that trickles in is ranked by when it began, not by its latest byte.
        let head = self.head_started.load(Ordering::Acquire);
        let since = match head {
            0 => self.at(self.last_activity.load(Ordering::Relaxed)),
            started => self.at(started - 1),
        };
        let pre_request = !self.handshaken.load(Ordering::Acquire)
            || self.lingering.load(Ordering::Acquire)
            || head != 0
            || self.served() == 0;
        Some((u8::from(!pre_request), since))
    }

    fn on_read(&self) {
        let now = self.now();
        self.last_activity.store(now, Ordering::Relaxed);
        if !self.in_flight() {
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

    /// When the current wait ends; `None` while a request is answered (the request and body
    /// timeouts bound that).
    fn next_deadline(&self, config: &ServerConfig) -> Option<Instant> {
        self.waiting(config).map(|(deadline, _)| deadline)
    }

    fn expired(&self, config: &ServerConfig) -> Option<Expiry> {
        let (deadline, expiry) = self.waiting(config)?;
        (Instant::now() >= deadline).then_some(expiry)
    }

    fn waiting(&self, config: &ServerConfig) -> Option<(Instant, Expiry)> {
        let head = self.head_started.load(Ordering::Acquire);
        if head != 0 {
            return Some((
                self.at(head - 1) + config.header_read_timeout,
                Expiry::HeaderRead,
            ));
        }
        if self.in_flight() {
            return None;
        }
        let since = self.at(self.last_activity.load(Ordering::Relaxed));
        if self.served() == 0 {
            Some((since + config.first_request_timeout, Expiry::FirstRequest))
        } else {
            Some((since + config.idle_timeout, Expiry::Idle))
        }
    }
}

/// Marks a request in flight until dropped.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_activity.store(self.0.now(), Ordering::Relaxed);
        self.0.served.fetch_add(1, Ordering::AcqRel);
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
