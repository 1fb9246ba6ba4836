//! The admin server: `/livez`, `/readyz` and `/metrics` over plain HTTP on its own port.

use crate::Error;
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

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

/// Serves the admin routes until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(Error::ServeAdmin)
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
