//! A tiny resource type with tiny rules, test fixtures and an HTTPS test client.

use std::{collections::BTreeMap, path::Path};

use axum::{Router, body::Body, http::Request};
use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower::ServiceExt as _;
use webhook::{Context, Metrics, Operation, Verdict, Violation, mutating, validating};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Widget {
    #[serde(default)]
    pub metadata: Meta,
    pub spec: WidgetSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WidgetSpec {
    pub size: i32,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

pub const PANIC_SIZE: i32 = 666;
pub const MANAGED_LABEL: &str = "widgets.example.com/managed";

pub fn validate(new: &Widget, old: Option<&Widget>, _context: &Context<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    if new.spec.size == PANIC_SIZE {
        panic!("the number of the beast");
    }
    if new.spec.size < 0 {
        verdict.violations.push(Violation::invalid(
            "spec.size",
            new.spec.size,
            "must be greater than or equal to 0",
        ));
    }
    for (i, tag) in new.spec.tags.iter().enumerate() {
        if new.spec.tags[..i].contains(tag) {
            verdict.violations.push(Violation::duplicate(
                format!("spec.tags[{i}]"),
                format!("{tag:?}"),
            ));
        }
    }
    if let Some(old) = old
        && new.spec.size < old.spec.size
    {
        verdict
            .violations
            .push(Violation::forbidden("spec.size", "may not shrink"));
    }
    if new.spec.size == 0 {
        verdict
            .warnings
            .push("spec.size is 0: the widget does nothing".to_owned());
    }
    verdict
}

pub fn mutate(widget: &mut Widget, context: &Context<'_>) {
    assert!(matches!(
        context.operation,
        Operation::Create | Operation::Update
    ));
    if widget.spec.size == PANIC_SIZE {
        panic!("the number of the beast");
    }
    widget.spec.color.get_or_insert_with(|| "blue".to_owned());
    if !widget.spec.tags.iter().any(|t| t == "managed") {
        widget.spec.tags.push("managed".to_owned());
    }
    widget
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .entry(MANAGED_LABEL.to_owned())
        .or_insert_with(|| "true".to_owned());
}

pub fn router(metrics: &Metrics) -> Router {
    metrics.instrument(
        Router::new()
            .route("/validate", validating(validate))
            .route("/mutate", mutating(mutate)),
    )
}

pub fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&fixture(name)).unwrap()
}

/// An answer: HTTP status, headers and the body parsed as JSON (Null if it is not JSON).
pub struct Answer {
    pub status: u16,
    pub headers: axum::http::HeaderMap,
    pub json: Value,
}

impl Answer {
    pub fn response(&self) -> &Value {
        &self.json["response"]
    }

    /// The decoded JSON Patch, or None when the answer has none.
    pub fn patch(&self) -> Option<Value> {
        use base64::Engine as _;
        let encoded = self.response().get("patch")?.as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        Some(serde_json::from_slice(&bytes).unwrap())
    }
}

pub async fn call(router: &Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

pub fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

pub async fn post_fixture(router: &Router, path: &str, name: &str) -> Answer {
    call(router, post(path, fixture(name))).await
}

/// Applies an RFC 6902 patch with the `json-patch` crate, as the API server would.
pub fn apply(object: &Value, patch: &Value) -> Value {
    let mut object = object.clone();
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    object
}

/// Builds a review around `object` for the mutating or validating route.
pub fn review(operation: &str, object: &Value, old: Option<&Value>) -> Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "prop-uid",
            "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "name": "w",
            "namespace": "default",
            "operation": operation,
            "object": object,
            "oldObject": old,
        }
    })
}

// === TLS test support ===

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::{net::TcpStream, sync::oneshot};
use tokio_rustls::{TlsConnector, client::TlsStream};
use webhook::{
    ServerConfig, ServerHandle,
    testing::{ServingPair, TestCa},
};

pub const SERVICE_NAME: &str = "webhook.test.svc";

pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The test CA, issuing pairs for [`SERVICE_NAME`].
pub struct Pki {
    ca: TestCa,
}

/// A serving pair in PEM, and the leaf in DER to compare with what a client sees.
pub type Pair = ServingPair;

const NAMES: [&str; 2] = [SERVICE_NAME, "webhook.test.svc.cluster.local"];

impl Pki {
    pub fn new() -> Self {
        Self {
            ca: TestCa::new("webhook test ca"),
        }
    }

    pub fn pair(&self) -> Pair {
        self.ca.issue(&NAMES)
    }

    /// A pair valid only from January 1st of `from` to January 1st of `to`: an expired or a
    /// not-yet-valid one.
    pub fn pair_valid(&self, from: i32, to: i32) -> Pair {
        self.ca.issue_with(&NAMES, |params| {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        })
    }

    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        self.client_config_for(rustls::DEFAULT_VERSIONS, alpn)
    }

    pub fn client_config_for(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        alpn: &[&[u8]],
    ) -> Arc<rustls::ClientConfig> {
        let mut config = self.ca.client_config(versions, alpn);
        // A resumed session reports the certificate of the session it resumes: tests that look
        // at the served certificate need full handshakes.
        config.resumption = rustls::client::Resumption::disabled();
        Arc::new(config)
    }
}

/// A directory laid out like a Secret mounted by the kubelet: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<timestamp>`; publishing writes a new timestamped directory and renames a new
/// `..data` link over the old one, then removes the old directory.
pub struct SecretDir {
    root: tempfile::TempDir,
    generation: AtomicU32,
}

impl SecretDir {
    pub fn new(pair: &Pair) -> Self {
        let dir = Self {
            root: tempfile::tempdir().unwrap(),
            generation: AtomicU32::new(0),
        };
        dir.publish_files(&pair.cert_pem, &pair.key_pem);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.path().join(name)).unwrap();
        }
        dir
    }

    pub fn path(&self) -> PathBuf {
        self.root.path().to_owned()
    }

    pub fn publish(&self, pair: &Pair) {
        self.publish_files(&pair.cert_pem, &pair.key_pem);
    }

    pub fn publish_files(&self, cert: &str, key: &str) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst);
        let stamp = format!("..2026_11_29_16_00_{generation:02}.{}", 100 + generation);
        let root = self.root.path();
        let fresh = root.join(&stamp);
        std::fs::create_dir(&fresh).unwrap();
        std::fs::write(fresh.join("tls.crt"), cert).unwrap();
        std::fs::write(fresh.join("tls.key"), key).unwrap();
        let old = std::fs::read_link(root.join("..data")).ok();
        std::os::unix::fs::symlink(&stamp, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(root.join(old)).unwrap();
        }
    }
}

/// A running test server with its shutdown trigger.
pub struct Running {
    pub handle: ServerHandle,
    pub metrics: Metrics,
    pub shutdown: oneshot::Sender<()>,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }
}

pub async fn start(
    dir: &SecretDir,
    router: Router,
    tune: impl FnOnce(&mut ServerConfig),
) -> Running {
    install_crypto_provider();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), dir.path());
    config.drain_delay = std::time::Duration::ZERO;
    tune(&mut config);
    let metrics = Metrics::new();
    let (shutdown, signal) = oneshot::channel::<()>();
    let handle = webhook::serve(config, router, metrics.clone(), async move {
        let _ = signal.await;
    })
    .await
    .unwrap();
    Running {
        handle,
        metrics,
        shutdown,
    }
}

pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from(SERVICE_NAME).unwrap(), tcp)
        .await
}

/// An HTTP/1.1 client connection over TLS, with the certificate the server presented.
pub struct Client {
    pub sender: SendRequest<Full<Bytes>>,
    /// Ends when the connection closes.
    pub connection: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

pub async fn client(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<Client> {
    let tls = tls_connect(addr, config).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(std::io::Error::other)?;
    let connection = tokio::spawn(connection);
    Ok(Client { sender, connection })
}

impl Client {
    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> Result<Answer, hyper::Error> {
        self.sender.ready().await?;
        let request = axum::http::Request::post(path)
            .header("host", SERVICE_NAME)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            headers,
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        })
    }
}
