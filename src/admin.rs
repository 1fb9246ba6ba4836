//! The admin server: `/livez`, `/readyz` and `/metrics` over plain HTTP on its own port.

use crate::Error;
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tower::ServiceExt as _;

/// What readiness depends on; each part flips as the process starts and stops.
///
/// Readiness is what the webhook Service routes on, so a replica is ready when its webhook
/// serves a valid certificate and it is not shutting down. The controller's state (leading,
/// caches synced, CRD missing) is deliberately not part of it: a lease hand-off or a missing
/// CRD must never take a webhook endpoint away. The metrics report that state instead.
#[derive(Debug, Default)]
pub struct Health {
    shutting_down: AtomicBool,
    webhook_serving: AtomicBool,
}

impl Health {
    /// The webhook's certificate is loaded and its listener answers.
    pub fn set_webhook_serving(&self, serving: bool) {
        self.webhook_serving.store(serving, Ordering::SeqCst);
    }

    /// Shutdown began: readiness goes false at once so endpoints drop this pod.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Why the process is not ready; empty when it is.
    pub fn unready_reasons(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if self.shutting_down.load(Ordering::SeqCst) {
            reasons.push("shutting down");
        }
        if !self.webhook_serving.load(Ordering::SeqCst) {
            reasons.push("webhook not serving yet");
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
        health.set_webhook_serving(true);
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
    async fn metrics_are_served_as_openmetrics_text() {
        let mut registry = Registry::default();
        let m = crate::metrics::Metrics::register(&mut registry);
        m.leader.set(1);
        let router = router(Arc::new(Health::default()), Arc::new(registry));
        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("myapp_leader 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
}
