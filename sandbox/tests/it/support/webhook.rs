//! A tiny HTTPS admission webhook for end-to-end tests: a CA made at test time (rcgen), a serving
//! certificate for `webhook.ops.svc`, and three paths: `/label` (mutating: adds label
//! `mutated: "yes"`), `/check` (validating: denies `spec.replicas > 5`, warns when it is 5),
//! `/allow`. Every review it receives is kept, for tests to look at what the API server sent.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Json, State};
use axum::http::Uri;
use base64::Engine as _;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::PrivateKeyDer;
use serde_json::{Value, json};
use tokio::net::TcpListener;

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
        _ => json!({"uid": uid, "allowed": true}),
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

impl Webhook {
    /// Starts the webhook on 127.0.0.1:0.
    pub async fn start() -> Webhook {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sandbox e2e test ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let dns = format!("{}.{}.svc", SERVICE.1, SERVICE.0);
        let cert = CertificateParams::new(vec![dns])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
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
            ca_pem: ca.pem(),
            reviews,
            task,
        }
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
