//! A tiny HTTPS admission webhook for end-to-end tests: a CA made at test time (rcgen), a serving
//! certificate for `webhook.ops.svc`, and three paths: `/label` (mutating: adds label
//! `mutated: "yes"`), `/check` (validating: denies `spec.replicas > 5`, warns when it is 5),
//! `/deny` (denies everything with a message and no reason), and any other path allows. Every
//! review it receives is kept, for tests to look at what the API server sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Json, State};
use axum::http::Uri;
use base64::Engine as _;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::ClusterResourceScope;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, PostParams};
use kube::{Client, Resource};
use kube_sandbox::Sandbox;
use kube_sandbox::admission::ServiceRef;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::PrivateKeyDer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::fixtures;

/// The webhook's service name as configurations reference it.
pub const SERVICE: (&str, &str, u16) = ("ops", "webhook", 8443);

/// A running webhook and the CA that signed its certificate.
pub struct Webhook {
    /// Where it listens.
    pub address: SocketAddr,
    /// PEM of the CA, for `caBundle`.
    pub ca_pem: String,
    /// The reviews received so far, with the path each came to.
    pub reviews: Reviews,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reviews a [`Webhook`] received: (path, review).
pub type Reviews = Arc<Mutex<Vec<(String, Value)>>>;

async fn answer(State(reviews): State<Reviews>, uri: Uri, Json(body): Json<Value>) -> Json<Value> {
    reviews
        .lock()
        .unwrap()
        .push((uri.path().to_owned(), body.clone()));
    let uid = body["request"]["uid"].clone();
    let object = &body["request"]["object"];
    let response = match uri.path() {
        "/label" => {
            let ops = if object["metadata"]["labels"].is_object() {
                json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}])
            };
            let patch = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch})
        }
        "/check" => {
            let replicas = object["spec"]["replicas"].as_i64().unwrap_or(0);
            if replicas > 5 {
                json!({"uid": uid, "allowed": false, "status": {
                    "code": 422, "reason": "Invalid",
                    "message": format!("spec.replicas: Invalid value: {replicas}: must be at most 5"),
                }})
            } else if replicas == 5 {
                json!({"uid": uid, "allowed": true, "warnings": ["spec.replicas is at the limit"]})
            } else {
                json!({"uid": uid, "allowed": true})
            }
        }
        "/deny" => json!({"uid": uid, "allowed": false,
                          "status": {"message": "widgets are closed"}}),
        _ => json!({"uid": uid, "allowed": true}),
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// A CA made now and a serving configuration for `webhook.ops.svc` signed by it.
fn serving_config() -> (rustls::ServerConfig, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = ::webhook::testing::TestCa::new("sandbox e2e test ca");
    let dns = format!("{}.{}.svc", SERVICE.1, SERVICE.0);
    (ca.server_config(&[&dns]), ca.ca_pem())
}

/// A serving configuration whose certificate is its own CA: self-signed, `CA:TRUE`, for
/// `names`, as `openssl req -x509` makes one; the PEM is both the certificate and `caBundle`.
fn self_signed_ca_config(names: &[&str]) -> (rustls::ServerConfig, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    (tls, cert.pem())
}

/// Reads one request with a `content-length` body from `stream`, keeping what follows it in
/// `buffer`; its body, or `None` at end of stream.
async fn read_request<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let body = buffer[end + 4..end + 4 + length].to_vec();
                buffer.drain(..end + 4 + length);
                return Some(body);
            }
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

impl Webhook {
    /// Starts the webhook on 127.0.0.1:0.
    pub async fn start() -> Webhook {
        Self::serving(serving_config()).await
    }

    /// Starts the webhook serving a self-signed `CA:TRUE` certificate for `names`, which is
    /// also its `caBundle`.
    pub async fn start_self_signed_ca(names: &[&str]) -> Webhook {
        Self::serving(self_signed_ca_config(names)).await
    }

    async fn serving((tls, ca_pem): (rustls::ServerConfig, String)) -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let reviews = Reviews::default();
        let router = Router::new().fallback(answer).with_state(reviews.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Webhook {
            address,
            ca_pem,
            reviews,
            task,
        }
    }

    /// A webhook that answers (allows) the first review on each connection, keeping it alive,
    /// then reads the next review in full and closes the connection without answering: the
    /// race a server that closes idle keep-alive connections loses.
    pub async fn start_hanging_up_after_first_answer() -> Webhook {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (tls, ca_pem) = serving_config();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buffer = Vec::new();
                    for answered in [true, false] {
                        let Some(body) = read_request(&mut tls, &mut buffer).await else {
                            return;
                        };
                        if !answered {
                            break;
                        }
                        let review: Value = serde_json::from_slice(&body).unwrap_or_default();
                        let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                            "response": {"uid": review["request"]["uid"], "allowed": true}})
                        .to_string();
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            answer.len()
                        );
                        let _ = tls.write_all(head.as_bytes()).await;
                        let _ = tls.write_all(answer.as_bytes()).await;
                    }
                    let _ = tls.shutdown().await;
                    // Whatever the client sends now is never read.
                    let _ = tls.read(&mut [0u8; 1]).await;
                });
            }
        });
        Webhook {
            address,
            ca_pem,
            reviews: Reviews::default(),
            task,
        }
    }

    /// A sandbox that dials this webhook for [`SERVICE`].
    pub fn sandbox(&self) -> Sandbox {
        Sandbox::builder()
            .webhook_service(
                ServiceRef::new(SERVICE.0, SERVICE.1, SERVICE.2),
                self.address,
            )
            .build()
    }

    /// [`Webhook::sandbox`] with the Widget CRD and the `mutating` and `validating`
    /// configurations (JSON manifests) created.
    pub async fn sandbox_with(&self, mutating: Value, validating: Value) -> Sandbox {
        let sandbox = self.sandbox();
        let client = fixtures::client(&sandbox);
        fixtures::install_crd(&client).await;
        create_cluster_object::<MutatingWebhookConfiguration>(&client, mutating).await;
        create_cluster_object::<ValidatingWebhookConfiguration>(&client, validating).await;
        sandbox
    }

    /// Mutating (`/label`) and validating (`/check`) configurations for `group`/`resources`,
    /// as JSON manifests.
    pub fn configurations(&self, group: &str, resource: &str) -> (Value, Value) {
        let hook = |name: &str, path: &str| {
            json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {
                    "service": {"namespace": SERVICE.0, "name": SERVICE.1, "port": SERVICE.2, "path": path},
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
                },
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [group],
                           "apiVersions": ["*"], "resources": [resource]}],
            })
        };
        let mutating = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "label"},
            "webhooks": [hook("label.sandbox.test", "/label")],
        });
        let validating = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "check"},
            "webhooks": [hook("check.sandbox.test", "/check")],
        });
        (mutating, validating)
    }
}

/// Creates the cluster-scoped `K` that `manifest` describes.
pub async fn create_cluster_object<K>(client: &Client, manifest: Value)
where
    K: Resource<Scope = ClusterResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Serialize,
{
    Api::<K>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(manifest).unwrap(),
        )
        .await
        .unwrap();
}
