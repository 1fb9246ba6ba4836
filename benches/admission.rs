//! Admission cost: in-process through the router against the JSON-parse baseline, and over real
//! TLS with keep-alive against a baseline route that reads the same review and answers a fixed
//! body of the validating answer's size. Reported, never asserted.
//!
//! `cargo bench -p myapp-operator --bench admission -- --warm-up-time 1 --measurement-time 3`

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{body::Body, http::Request, routing::post};
use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use myapp_operator::admission::{self, AdmissionConfig, MUTATE_PATH, VALIDATE_PATH};
use serde_json::{Value, json};
use tokio::{net::TcpStream, sync::Mutex};
use tower::ServiceExt as _;
use webhook::testing::TestCa;

fn config() -> AdmissionConfig {
    AdmissionConfig {
        max_replicas: 100,
        default_env: vec![
            admission::parse_default_env("LOG_LEVEL=info").unwrap(),
            admission::parse_default_env("REGION=eu-1").unwrap(),
        ],
        shards: None,
    }
}

/// A MyApp as kubectl apply sends it: labels, the last-applied annotation, managed fields.
fn myapp(replicas: i32, image: &str) -> Value {
    let spec = json!({
        "replicas": replicas,
        "image": image,
        "port": 8080,
        "env": [
            {"name": "LOG_LEVEL", "value": "debug"},
            {"name": "FEATURE_FLAGS", "value": "search,checkout,recommendations"},
            {"name": "DATABASE_URL", "value": "postgres://web@db.shop.svc.cluster.local:5432/web"},
        ],
    });
    let last_applied = json!({"apiVersion": "example.com/v1", "kind": "MyApp",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app.kubernetes.io/name": "web"}},
        "spec": spec});
    json!({
        "apiVersion": "example.com/v1",
        "kind": "MyApp",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "6e0b4f3a-2f1c-4a4e-9a57-1b2c3d4e5f60",
            "generation": 3,
            "resourceVersion": "182733",
            "creationTimestamp": "2026-11-29T15:00:00Z",
            "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop",
                       "team": "storefront"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": last_applied.to_string(),
            },
            "managedFields": [{
                "manager": "kubectl-client-side-apply", "operation": "Update",
                "apiVersion": "example.com/v1", "time": "2026-11-29T15:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {".": {},
                    "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                    "f:labels": {".": {}, "f:app.kubernetes.io/name": {}}},
                    "f:spec": {".": {}, "f:env": {}, "f:image": {}, "f:port": {}, "f:replicas": {}}},
            }],
        },
        "spec": spec,
    })
}

fn review(operation: &str, object: &Value, old: Option<&Value>) -> Bytes {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "example.com", "version": "v1", "kind": "MyApp"},
            "resource": {"group": "example.com", "version": "v1", "resource": "myapps"},
            "requestKind": {"group": "example.com", "version": "v1", "kind": "MyApp"},
            "requestResource": {"group": "example.com", "version": "v1", "resource": "myapps"},
            "name": "web",
            "namespace": "shop",
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:ci:deployer",
                         "uid": "b1c2d3e4-0000-4000-8000-000000000002",
                         "groups": ["system:serviceaccounts", "system:serviceaccounts:ci",
                                    "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1",
                        "kind": if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" },
                        "fieldManager": "kubectl-client-side-apply"},
        }
    });
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

fn reviews() -> [(&'static str, Bytes); 2] {
    let old = myapp(3, "ghcr.io/example/web:1.4.2");
    let new = myapp(4, "ghcr.io/example/web:1.4.3");
    let create = review("CREATE", &new, None);
    let update = review("UPDATE", &new, Some(&old));
    eprintln!(
        "review sizes: create {} bytes, update {} bytes",
        create.len(),
        update.len()
    );
    [("create", create), ("update", update)]
}

fn request(path: &str, body: Bytes) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

fn in_process(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let router = admission::router(config());
    let mut group = c.benchmark_group("admission_in_process");
    for (operation, bytes) in reviews() {
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(format!("{operation}/parse_value_baseline"), |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&bytes)).unwrap());
        });
        for (name, path) in [("validate", VALIDATE_PATH), ("mutate", MUTATE_PATH)] {
            group.bench_function(format!("{operation}/{name}"), |b| {
                b.to_async(&runtime).iter(|| async {
                    let response = router
                        .clone()
                        .oneshot(request(path, bytes.clone()))
                        .await
                        .unwrap();
                    response.into_body().collect().await.unwrap().to_bytes()
                });
            });
        }
    }
    group.finish();
}

// === Over TLS ===

/// The baseline route over TLS.
const FIXED_PATH: &str = "/fixed";

struct Tls {
    _dir: tempfile::TempDir,
    _shutdown: tokio::sync::oneshot::Sender<()>,
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
}

/// The validating route's answer to `review`, computed once in process: the baseline route
/// answers these bytes, so it sends what the validating route sends and does no work for it.
async fn validating_answer(review: Bytes) -> Bytes {
    let response = admission::router(config())
        .oneshot(request(VALIDATE_PATH, review))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    body
}

async fn start_tls_server(review: Bytes) -> Tls {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = TestCa::new("admission bench ca");
    let pair = ca.issue(&["webhook.bench.svc"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &pair.key_pem).unwrap();

    // The baseline: a route that reads the review as the webhook routes do, and answers a fixed
    // body as small as theirs (not the 2.3 KB review: sending that back cost more than the
    // validating route's whole work).
    let fixed = validating_answer(review).await;
    eprintln!("fixed baseline answer: {} bytes", fixed.len());
    let router = admission::router(config()).route(
        FIXED_PATH,
        post(move |body: Bytes| async move {
            black_box(body);
            fixed
        }),
    );
    let server_config = webhook::ServerConfig::new("127.0.0.1:0".parse().unwrap(), dir.path());
    let (shutdown, signal) = tokio::sync::oneshot::channel::<()>();
    let handle = webhook::serve(server_config, router, webhook::Metrics::new(), async move {
        let _ = signal.await;
    })
    .await
    .unwrap();
    let cold = handle.warm_up().await.unwrap();
    eprintln!("first (warm-up) TLS handshake: {cold:?}");

    let client = ca.client_config(rustls::DEFAULT_VERSIONS, &[b"http/1.1"]);
    Tls {
        _dir: dir,
        _shutdown: shutdown,
        addr: handle.local_addr(),
        client: Arc::new(client),
    }
}

async fn connect(tls: &Tls) -> SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(tls.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls.client.clone())
        .connect(
            rustls_pki_types::ServerName::try_from("webhook.bench.svc").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

async fn send(sender: &mut SendRequest<Full<Bytes>>, path: &str, body: Bytes) -> Bytes {
    sender.ready().await.unwrap();
    let request = hyper::Request::post(path)
        .header("host", "webhook.bench.svc")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap().to_bytes()
}

fn over_tls(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let [(_, create), _] = reviews();
    let tls = runtime.block_on(start_tls_server(create.clone()));
    let sender = Arc::new(Mutex::new(runtime.block_on(connect(&tls))));
    let mut group = c.benchmark_group("admission_tls_keep_alive");
    group.throughput(Throughput::Elements(1));
    for (name, path) in [
        ("fixed_answer_baseline", FIXED_PATH),
        ("validate", VALIDATE_PATH),
        ("mutate", MUTATE_PATH),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let (sender, body) = (sender.clone(), create.clone());
                async move {
                    let mut sender = sender.lock().await;
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(send(&mut sender, path, body.clone()).await);
                    }
                    start.elapsed()
                }
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = in_process, over_tls
}
criterion_main!(benches);
