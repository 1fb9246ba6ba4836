//! The admin server: `/livez`, `/readyz` and `/metrics` over plain HTTP on its own port.

use crate::Error;
use std::{
    net::SocketAddr,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tower::ServiceExt as _;
use webhook::tls::CertStore;

/// What readiness depends on; each part flips as the process starts and stops.
///
/// Readiness is what the webhook Service routes on, so a replica is ready when its webhook
/// serves a valid certificate and it is not shutting down. The controller's state (leading,
/// caches synced, CRD missing) is deliberately not part of it: a lease hand-off or a missing
/// CRD must never take a webhook endpoint away. The metrics report that state instead.
#[derive(Debug, Default)]
pub struct Health {
    shutting_down: AtomicBool,
    /// Set once the webhook answers; its certificate is judged at every probe, so a pair that
    /// expires (its renewal never came) turns readiness off, and a reloaded one turns it on.
    webhook: OnceLock<CertStore>,
}

impl Health {
    /// The webhook answers, serving the certificates of `certs`.
    pub fn set_webhook_serving(&self, certs: CertStore) {
        // Set once per process; a second call would serve the same store.
        let _ = self.webhook.set(certs);
    }

    /// Shutdown began: readiness goes false at once so endpoints drop this pod.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Why the process is not ready; empty when it is.
    pub fn unready_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if self.shutting_down.load(Ordering::SeqCst) {
            reasons.push("shutting down".to_owned());
        }
        match self.webhook.get().map(CertStore::not_valid_now) {
            None => reasons.push("webhook not serving yet".to_owned()),
            Some(Some(invalid)) => reasons.push(invalid.to_string()),
            Some(None) => {}
        }
        reasons
    }
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    registry: Arc<Registry>,
}

/// The admin routes, for serving and for in-process tests.
pub fn router(health: Arc<Health>, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState { health, registry })
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let reasons = state.health.unready_reasons();
    if reasons.is_empty() {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", reasons.join(", ")),
        )
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain; charset=utf-8")],
            "failed to encode metrics\n".to_owned(),
        ),
    }
}

/// Binds the admin address; returns the listener (its local address is the one to print).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::BindAdmin { addr, source })
}

/// Connections the admin server holds at once: probes and scrapes need a handful; beyond this a
/// new connection is closed at once, so the admin port can never use up the process's files.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request head, and stay idle between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long answering one request may take (encoding the metrics is the slowest).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown begins, how long open connections get before they are dropped: a half-sent
/// request must not keep the process alive.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Serves the admin routes until `shutdown` resolves, then gives open connections
/// [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let closing = tokio_util::sync::CancellationToken::new();
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of files or the like: the kernel keeps the backlog; try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        connections.spawn(connection(stream, router.clone(), closing.clone(), slot));
        // Reap finished connections as they go, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
    }
    closing.cancel();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
    Ok(())
}

/// One admin connection, bounded by [`HEADER_TIMEOUT`] and [`REQUEST_TIMEOUT`].
async fn connection(
    stream: tokio::net::TcpStream,
    router: Router,
    closing: tokio_util::sync::CancellationToken,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let response = router.clone().oneshot(request.map(axum::body::Body::new));
        async move {
            Ok::<_, std::convert::Infallible>(
                match tokio::time::timeout(REQUEST_TIMEOUT, response).await {
                    Ok(Ok(response)) => response,
                    Ok(Err(never)) => match never {},
                    Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
                },
            )
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's header timer also runs while a kept-alive connection waits for its next request,
    // so it bounds idle connections too.
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = closing.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let response = router
            .clone()
            .oneshot(axum::http::Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    /// A store serving a pair valid from `from` to `until`, seconds from now.
    fn serving(from: i64, until: i64) -> (tempfile::TempDir, CertStore) {
        let at = |offset: i64| {
            let now = std::time::SystemTime::now();
            let span = Duration::from_secs(offset.unsigned_abs());
            if offset < 0 { now - span } else { now + span }
        };
        let dir = tempfile::tempdir().unwrap();
        crate::certs::generate_between(&["localhost".to_owned()], at(from), at(3600), at(until))
            .unwrap()
            .write_to(dir.path())
            .unwrap();
        let paths = webhook::tls::CertPaths::in_dir(dir.path());
        let store = CertStore::load(paths, webhook::Metrics::new()).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn readiness_follows_the_webhook_and_shutdown_only() {
        let health = Arc::new(Health::default());
        let router = router(health.clone(), Arc::new(Registry::default()));
        assert_eq!(get(&router, "/livez").await.0, StatusCode::OK);
        assert_eq!(
            get(&router, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: webhook not serving yet\n".into()
            )
        );
        let (_dir, certs) = serving(-60, 3600);
        health.set_webhook_serving(certs);
        assert_eq!(get(&router, "/readyz").await.0, StatusCode::OK);
        health.set_shutting_down();
        assert_eq!(
            get(&router, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: shutting down\n".into()
            )
        );
        assert_eq!(
            get(&router, "/livez").await.0,
            StatusCode::OK,
            "liveness is not readiness"
        );
    }

    #[tokio::test]
    async fn a_served_certificate_past_its_not_after_is_not_ready_but_live() {
        // Expired a minute ago: within the clock skew the loader allows, so the process runs
        // and waits for the renewal, but the API server would refuse the pair.
        let (_dir, certs) = serving(-3600, -60);
        let not_after = certs.validity().not_after;
        let health = Arc::new(Health::default());
        health.set_webhook_serving(certs);
        let router = router(health, Arc::new(Registry::default()));
        let (status, body) = get(&router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let date = k8s_openapi::jiff::Timestamp::from_second(not_after)
            .unwrap()
            .to_string();
        assert_eq!(
            body,
            format!("not ready: serving certificate expired (notAfter {date})\n")
        );
        assert_eq!(get(&router, "/livez").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_pair_that_turns_valid_within_the_clock_skew_is_ready() {
        // An issuer whose clock runs 30 s ahead: every replica reloads this pair at once, and
        // none may leave its Service for it.
        let (_dir, certs) = serving(30, 3600);
        let health = Arc::new(Health::default());
        health.set_webhook_serving(certs);
        assert_eq!(health.unready_reasons(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let mut registry = Registry::default();
        let m = crate::metrics::Metrics::register(&mut registry);
        m.caches_synced.set(1);
        let router = router(Arc::new(Health::default()), Arc::new(registry));
        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("myapp_caches_synced 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
}
