//! The admission chain against real HTTPS webhooks on loopback, with certificates made here.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Json, State};
use axum::http::{HeaderMap, Uri};
use base64::Engine as _;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube_sandbox::admission::{
    AdmissionAttributes, AdmissionChain, Error, GroupVersionKind, GroupVersionResource, Operation,
    ServiceRef, warning_header_value,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::PrivateKeyDer;
use serde_json::{Value, json};
use tokio::net::TcpListener;

// === A test webhook server ===

/// A certificate authority made for one test.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    fn new() -> Self {
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        // Distinct names, so that a stranger CA is an unknown issuer rather than a bad signer.
        let n = SERIAL.fetch_add(1, Ordering::SeqCst);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("sandbox test ca {n}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate and key for `names`.
    fn serving(&self, names: &[&str]) -> rustls::ServerConfig {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap()
    }
}

/// One review as the webhook received it.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    query: String,
    content_type: String,
    host: String,
    review: Value,
}

#[derive(Clone, Default)]
struct WebhookState {
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    /// Connection tasks, ended with the server so that a stopped webhook really is gone.
    serving: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

/// A webhook server on 127.0.0.1:0 whose behaviour is chosen by the request path.
struct TestWebhook {
    address: SocketAddr,
    state: WebhookState,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestWebhook {
    fn drop(&mut self) {
        self.task.abort();
        for connection in self.state.serving.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

impl TestWebhook {
    async fn start(tls: rustls::ServerConfig) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), tls).await
    }

    /// Binds `address`, retrying while a just-stopped server still holds it.
    async fn start_on(address: SocketAddr, tls: rustls::ServerConfig) -> Self {
        let mut attempts = 0;
        let listener = loop {
            match TcpListener::bind(address).await {
                Ok(listener) => break listener,
                Err(error) if attempts < 100 => {
                    attempts += 1;
                    eprintln!("waiting for {address}: {error}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("cannot bind {address}: {error}"),
            }
        };
        let address = listener.local_addr().unwrap();
        let state = WebhookState::default();
        let router = Router::new().fallback(answer).with_state(state.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let connections = state.connections.clone();
        let serving = state.serving.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                connections.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                let connection = tokio::spawn(async move {
                    // A client that rejects our certificate ends the handshake: nothing to serve.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
                serving.lock().unwrap().push(connection.abort_handle());
            }
        });
        Self {
            address,
            state,
            task,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    fn seen_on(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
}

fn review(uid: &str, response: Value) -> Json<Value> {
    let mut response = response;
    response["uid"] = json!(uid);
    Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

fn patch(ops: Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(ops.to_string())
}

/// The webhook: `/allow`, `/deny`, `/label` (adds a label), `/warn`, `/wrong-uid`, `/bad-patch`,
/// `/slow` (answers after 3 s), `/label-b` (adds another label).
async fn answer(
    State(state): State<WebhookState>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    state.seen.lock().unwrap().push(Seen {
        path: uri.path().to_owned(),
        query: uri.query().unwrap_or_default().to_owned(),
        content_type: header("content-type"),
        host: header("host"),
        review: body.clone(),
    });
    let uid = body["request"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let add_label = |key: &str| {
        let has_labels = body["request"]["object"]["metadata"]["labels"].is_object();
        let ops = if has_labels {
            json!([{"op": "add", "path": format!("/metadata/labels/{key}"), "value": "yes"}])
        } else {
            json!([{"op": "add", "path": "/metadata/labels", "value": {key: "yes"}}])
        };
        json!({"allowed": true, "patchType": "JSONPatch", "patch": patch(ops)})
    };
    match uri.path() {
        "/deny" => review(
            &uid,
            json!({"allowed": false, "status": {
                "code": 422, "reason": "Invalid", "message": "spec.replicas: must be at least 0",
                "details": {"causes": [{"field": "spec.replicas", "message": "must be at least 0", "reason": "FieldValueInvalid"}]}
            }}),
        ),
        "/label" => review(&uid, add_label("mutated")),
        "/label-b" => review(&uid, add_label("second")),
        "/warn" => review(
            &uid,
            json!({"allowed": true, "warnings": ["replicas is high", "image \"app\" has no tag"]}),
        ),
        "/warn-deny" => review(
            &uid,
            json!({"allowed": false, "warnings": ["about to deny"], "status": {"message": "no"}}),
        ),
        "/wrong-uid" => review("someone-else", json!({"allowed": true})),
        "/bad-patch" => review(
            &uid,
            json!({"allowed": true, "patchType": "JSONPatch",
                   "patch": patch(json!([{"op": "replace", "path": "/spec/absent/field", "value": 1}]))}),
        ),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            review(&uid, json!({"allowed": true}))
        }
        _ => review(&uid, json!({"allowed": true})),
    }
}

// === Configurations and requests ===

const SERVICE_DNS: &str = "webhook.ops.svc";

fn service() -> ServiceRef {
    ServiceRef::new("ops", "webhook", 8443)
}

/// One webhook entry pointing at the test service, with overrides merged in.
fn hook(name: &str, path: &str, ca: &str, overrides: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "clientConfig": {
            "service": {"namespace": "ops", "name": "webhook", "port": 8443, "path": path},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
        },
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}],
    });
    for (key, value) in overrides.as_object().cloned().unwrap_or_default() {
        hook[key] = value;
    }
    hook
}

fn validating(name: &str, hooks: Vec<Value>) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }))
    .unwrap()
}

fn mutating(name: &str, hooks: Vec<Value>) -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }))
    .unwrap()
}

fn create_deployment(namespace: &str) -> AdmissionAttributes {
    let mut request = AdmissionAttributes::new(
        Operation::Create,
        GroupVersionKind::new("apps", "v1", "Deployment"),
        GroupVersionResource::new("apps", "v1", "deployments"),
    );
    request.name = "web".to_owned();
    request.namespace = Some(namespace.to_owned());
    request.object = Some(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace, "labels": {"app": "web"}},
        "spec": {"replicas": 2}
    }));
    request.options = Some(json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}));
    request.user_info.username = Some("tester".to_owned());
    request
}

/// A webhook server for the test service and a chain that reaches it.
async fn setup() -> (TestCa, TestWebhook, AdmissionChain) {
    let ca = TestCa::new();
    let webhook = TestWebhook::start(ca.serving(&[SERVICE_DNS])).await;
    let chain = AdmissionChain::new().with_service(service(), webhook.address);
    (ca, webhook, chain)
}

fn internal_error_message(error: &Error) -> String {
    let status = error.status();
    assert_eq!(status.code, Some(500), "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("InternalError"));
    status.message.unwrap_or_default()
}

// === Tests ===

#[tokio::test]
async fn allowed_request_is_admitted_and_the_webhook_gets_a_v1_review() {
    let (ca, webhook, chain) = setup().await;
    let config = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), json!({}))],
    );
    let request = create_deployment("default");

    let admitted = chain.admit(&[], &[config], &request).await.unwrap();

    assert_eq!(admitted.object, request.object);
    assert!(admitted.warnings.is_empty());
    let seen = webhook.seen();
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(seen.query, "timeout=10s");
    assert_eq!(seen.content_type, "application/json");
    assert_eq!(seen.host, format!("{SERVICE_DNS}:8443"));
    assert_eq!(seen.review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(seen.review["kind"], "AdmissionReview");
    let r = &seen.review["request"];
    assert!(!r["uid"].as_str().unwrap().is_empty());
    assert_eq!(
        r["kind"],
        json!({"group": "apps", "version": "v1", "kind": "Deployment"})
    );
    assert_eq!(
        r["resource"],
        json!({"group": "apps", "version": "v1", "resource": "deployments"})
    );
    assert_eq!(r["requestKind"], r["kind"]);
    assert_eq!(r["requestResource"], r["resource"]);
    assert_eq!(r["operation"], "CREATE");
    assert_eq!(r["name"], "web");
    assert_eq!(r["namespace"], "default");
    assert_eq!(r["userInfo"]["username"], "tester");
    assert_eq!(r["object"], request.object.clone().unwrap());
    assert_eq!(r["oldObject"], Value::Null);
    assert_eq!(r["dryRun"], false);
    assert_eq!(r["options"]["kind"], "CreateOptions");
    assert!(r.get("subResource").is_none());
}

#[tokio::test]
async fn each_call_carries_a_fresh_uid_and_delete_sends_no_object() {
    let (ca, webhook, chain) = setup().await;
    let rules = json!({"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]});
    let config = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), rules)],
    );
    let create = create_deployment("default");
    let mut delete = create.clone();
    delete.operation = Operation::Delete;
    delete.old_object = delete.object.take();

    chain
        .admit(&[], std::slice::from_ref(&config), &create)
        .await
        .unwrap();
    let admitted = chain.admit(&[], &[config], &delete).await.unwrap();

    assert_eq!(admitted.object, None);
    let seen = webhook.seen();
    assert_ne!(
        seen[0].review["request"]["uid"],
        seen[1].review["request"]["uid"]
    );
    assert_eq!(seen[1].review["request"]["operation"], "DELETE");
    assert_eq!(seen[1].review["request"]["object"], Value::Null);
    assert_eq!(
        seen[1].review["request"]["oldObject"]["metadata"]["name"],
        "web"
    );
}

#[tokio::test]
async fn denial_carries_the_webhook_status_and_names_the_webhook() {
    let (ca, _webhook, chain) = setup().await;
    let config = validating(
        "v",
        vec![hook("deny.example.com", "/deny", &ca.pem(), json!({}))],
    );

    let rejection = chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap_err();

    let status = rejection.status();
    assert_eq!(status.code, Some(422));
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert_eq!(status.reason.as_deref(), Some("Invalid"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "admission webhook \"deny.example.com\" denied the request: spec.replicas: must be at least 0"
        )
    );
    let causes = status.details.unwrap().causes.unwrap();
    assert_eq!(causes[0].field.as_deref(), Some("spec.replicas"));
    let wire = serde_json::to_value(rejection.status()).unwrap();
    assert_eq!(wire["kind"], "Status");
    assert_eq!(wire["apiVersion"], "v1");
}

#[tokio::test]
async fn mutation_is_applied_and_the_validating_webhook_sees_it() {
    let (ca, webhook, chain) = setup().await;
    let mutate = mutating(
        "m",
        vec![hook("label.example.com", "/label", &ca.pem(), json!({}))],
    );
    let validate = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), json!({}))],
    );

    let admitted = chain
        .admit(&[mutate], &[validate], &create_deployment("default"))
        .await
        .unwrap();

    let object = admitted.object.unwrap();
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app": "web", "mutated": "yes"})
    );
    let validated = webhook.seen_on("/allow");
    assert_eq!(validated.len(), 1);
    assert_eq!(validated[0].review["request"]["object"], object);
}

#[tokio::test]
async fn mutating_webhooks_run_in_configuration_name_order_each_on_the_previous_result() {
    let (ca, webhook, chain) = setup().await;
    // Listed out of order: "a-first" must run before "b-second".
    let second = mutating(
        "b-second",
        vec![hook("b.example.com", "/label-b", &ca.pem(), json!({}))],
    );
    let first = mutating(
        "a-first",
        vec![hook("a.example.com", "/label", &ca.pem(), json!({}))],
    );

    let admitted = chain
        .admit(&[second, first], &[], &create_deployment("default"))
        .await
        .unwrap();

    let seen = webhook.seen();
    assert_eq!(seen[0].path, "/label");
    assert_eq!(seen[1].path, "/label-b");
    assert_eq!(
        seen[1].review["request"]["object"]["metadata"]["labels"]["mutated"],
        "yes"
    );
    assert_eq!(
        admitted.object.unwrap()["metadata"]["labels"],
        json!({"app": "web", "mutated": "yes", "second": "yes"})
    );
}

#[tokio::test]
async fn reinvocation_if_needed_calls_a_webhook_again_after_a_later_change() {
    let (ca, webhook, chain) = setup().await;
    let reinvoked = json!({"reinvocationPolicy": "IfNeeded"});
    let config = mutating(
        "m",
        vec![
            hook("a.example.com", "/allow", &ca.pem(), reinvoked),
            hook("b.example.com", "/label-b", &ca.pem(), json!({})),
        ],
    );

    chain
        .admit(&[config], &[], &create_deployment("default"))
        .await
        .unwrap();

    let again = webhook.seen_on("/allow");
    assert_eq!(again.len(), 2);
    assert_eq!(
        again[1].review["request"]["object"]["metadata"]["labels"]["second"],
        "yes"
    );
}

#[tokio::test]
async fn warnings_are_collected_and_kept_on_denial() {
    let (ca, _webhook, chain) = setup().await;
    let warn = validating(
        "a",
        vec![hook("warn.example.com", "/warn", &ca.pem(), json!({}))],
    );
    let warn_deny = validating(
        "b",
        vec![hook(
            "warn-deny.example.com",
            "/warn-deny",
            &ca.pem(),
            json!({}),
        )],
    );

    let admitted = chain
        .admit(
            &[],
            std::slice::from_ref(&warn),
            &create_deployment("default"),
        )
        .await
        .unwrap();
    assert_eq!(
        admitted.warnings,
        ["replicas is high", "image \"app\" has no tag"]
    );
    assert_eq!(
        warning_header_value(&admitted.warnings[1]),
        "299 - \"image \\\"app\\\" has no tag\""
    );

    let rejection = chain
        .admit(&[], &[warn, warn_deny], &create_deployment("default"))
        .await
        .unwrap_err();
    assert_eq!(rejection.warnings.len(), 3);
    assert_eq!(rejection.warnings[2], "about to deny");
    assert_eq!(
        rejection.status().message.as_deref(),
        Some("admission webhook \"warn-deny.example.com\" denied the request: no")
    );
}

#[tokio::test]
async fn a_wrong_uid_is_a_failed_call_under_fail_and_skipped_under_ignore() {
    let (ca, _webhook, chain) = setup().await;
    let fail = validating(
        "v",
        vec![hook("uid.example.com", "/wrong-uid", &ca.pem(), json!({}))],
    );
    let ignore = validating(
        "v",
        vec![hook(
            "uid.example.com",
            "/wrong-uid",
            &ca.pem(),
            json!({"failurePolicy": "Ignore"}),
        )],
    );
    let request = create_deployment("default");

    let rejection = chain.admit(&[], &[fail], &request).await.unwrap_err();
    let message = internal_error_message(&rejection.error);
    assert!(
        message.starts_with(
            "Internal error occurred: failed calling webhook \"uid.example.com\": received invalid webhook response: expected response.uid="
        ),
        "{message}"
    );

    let admitted = chain.admit(&[], &[ignore], &request).await.unwrap();
    assert_eq!(admitted.object, request.object);
}

#[tokio::test]
async fn a_patch_that_does_not_apply_is_an_internal_error_even_with_ignore() {
    let (ca, _webhook, chain) = setup().await;
    let config = mutating(
        "m",
        vec![hook(
            "bad.example.com",
            "/bad-patch",
            &ca.pem(),
            json!({"failurePolicy": "Ignore"}),
        )],
    );

    let rejection = chain
        .admit(&[config], &[], &create_deployment("default"))
        .await
        .unwrap_err();

    assert!(
        matches!(rejection.error, Error::ApplyPatch { .. }),
        "{}",
        rejection.error
    );
    let message = internal_error_message(&rejection.error);
    assert!(message.contains("bad.example.com"), "{message}");
}

#[tokio::test]
async fn a_validating_webhook_may_not_patch() {
    let (ca, _webhook, chain) = setup().await;
    let config = validating(
        "v",
        vec![hook("label.example.com", "/label", &ca.pem(), json!({}))],
    );

    let rejection = chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap_err();

    let message = internal_error_message(&rejection.error);
    assert!(
        message.contains("validating webhooks may not return patches"),
        "{message}"
    );
}

#[tokio::test]
async fn a_dead_endpoint_fails_closed_under_fail_and_open_under_ignore() {
    let ca = TestCa::new();
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = dead.local_addr().unwrap();
    drop(dead);
    let chain = AdmissionChain::new().with_service(service(), address);
    let request = create_deployment("default");
    let fail = validating(
        "v",
        vec![hook("dead.example.com", "/allow", &ca.pem(), json!({}))],
    );
    let ignore = validating(
        "v",
        vec![hook(
            "dead.example.com",
            "/allow",
            &ca.pem(),
            json!({"failurePolicy": "Ignore"}),
        )],
    );

    let rejection = chain.admit(&[], &[fail], &request).await.unwrap_err();
    let message = internal_error_message(&rejection.error);
    assert!(
        message.starts_with(&format!(
            "Internal error occurred: failed calling webhook \"dead.example.com\": failed to call webhook: Post \"https://{SERVICE_DNS}:8443/allow?timeout=10s\": dial tcp {address}:"
        )),
        "{message}"
    );

    assert!(chain.admit(&[], &[ignore], &request).await.is_ok());
}

#[tokio::test]
async fn an_unregistered_service_is_a_failed_call() {
    let (ca, _webhook, _chain) = setup().await;
    let chain = AdmissionChain::new();
    let config = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), json!({}))],
    );

    let rejection = chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap_err();

    let message = internal_error_message(&rejection.error);
    assert!(message.contains("ops/webhook:8443"), "{message}");
}

#[tokio::test]
async fn only_the_ca_bundle_is_trusted() {
    let (_ca, webhook, chain) = setup().await;
    let stranger = TestCa::new();
    let config = validating(
        "v",
        vec![hook(
            "allow.example.com",
            "/allow",
            &stranger.pem(),
            json!({}),
        )],
    );

    let rejection = chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap_err();

    let message = internal_error_message(&rejection.error);
    assert!(
        message.contains("tls: invalid peer certificate: UnknownIssuer"),
        "{message}"
    );
    assert!(webhook.seen().is_empty());
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let ca = TestCa::new();
    let webhook = TestWebhook::start(ca.serving(&["other.ops.svc", "localhost"])).await;
    let chain = AdmissionChain::new().with_service(service(), webhook.address);
    let config = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), json!({}))],
    );

    let rejection = chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap_err();

    let message = internal_error_message(&rejection.error);
    assert!(
        message.contains("certificate not valid for name \"webhook.ops.svc\""),
        "{message}"
    );
    assert!(webhook.seen().is_empty());
}

#[tokio::test]
async fn a_url_webhook_is_dialled_at_its_host() {
    let ca = TestCa::new();
    let webhook = TestWebhook::start(ca.serving(&["127.0.0.1"])).await;
    let chain = AdmissionChain::new();
    let client = json!({"clientConfig": {
        "url": format!("https://{}/allow", webhook.address),
        "caBundle": base64::engine::general_purpose::STANDARD.encode(ca.pem()),
    }});
    let config = validating(
        "v",
        vec![hook("url.example.com", "/unused", &ca.pem(), client)],
    );

    chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap();

    let seen = webhook.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/allow");
    assert_eq!(seen[0].query, "timeout=10s");
}

#[tokio::test]
async fn timeout_seconds_bounds_the_call() {
    let (ca, webhook, chain) = setup().await;
    let config = validating(
        "v",
        vec![hook(
            "slow.example.com",
            "/slow",
            &ca.pem(),
            json!({"timeoutSeconds": 1}),
        )],
    );

    let rejection = chain
        .admit(&[], &[config], &create_deployment("default"))
        .await
        .unwrap_err();

    assert!(
        matches!(&rejection.error, Error::CallWebhook { source, .. } if matches!(**source, Error::TimeOut { seconds: 1, .. }))
    );
    let message = internal_error_message(&rejection.error);
    assert!(message.contains("context deadline exceeded"), "{message}");
    assert_eq!(webhook.seen()[0].query, "timeout=1s");
}

#[tokio::test]
async fn dry_run_calls_webhooks_without_side_effects_and_refuses_the_others() {
    let (ca, webhook, chain) = setup().await;
    let clean = validating(
        "a",
        vec![hook(
            "clean.example.com",
            "/allow",
            &ca.pem(),
            json!({"sideEffects": "NoneOnDryRun"}),
        )],
    );
    let effects = validating(
        "b",
        vec![hook(
            "effects.example.com",
            "/warn",
            &ca.pem(),
            json!({"sideEffects": "Some"}),
        )],
    );
    let mut request = create_deployment("default");
    request.dry_run = true;

    let rejection = chain
        .admit(&[], &[clean, effects], &request)
        .await
        .unwrap_err();

    let status = rejection.status();
    assert_eq!(status.code, Some(400));
    assert_eq!(status.reason.as_deref(), Some("BadRequest"));
    assert_eq!(
        status.message.as_deref(),
        Some("admission webhook \"effects.example.com\" does not support dry run")
    );
    let seen = webhook.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/allow");
    assert_eq!(seen[0].review["request"]["dryRun"], true);
}

#[tokio::test]
async fn rules_selectors_and_match_conditions_decide_which_webhooks_are_called() {
    let (ca, webhook, chain) = setup().await;
    let pem = ca.pem();
    let config = validating(
        "v",
        vec![
            hook("any.example.com", "/any", &pem, json!({})),
            hook(
                "updates.example.com",
                "/updates",
                &pem,
                json!({"rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}]}),
            ),
            hook(
                "services.example.com",
                "/services",
                &pem,
                json!({"rules": [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["services"]}]}),
            ),
            hook(
                "not-system.example.com",
                "/not-system",
                &pem,
                json!({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}}),
            ),
            hook(
                "team-a.example.com",
                "/team-a",
                &pem,
                json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
            ),
            hook(
                "web-objects.example.com",
                "/web-objects",
                &pem,
                json!({"objectSelector": {"matchLabels": {"app": "web"}}}),
            ),
            hook(
                "db-objects.example.com",
                "/db-objects",
                &pem,
                json!({"objectSelector": {"matchLabels": {"app": "db"}}}),
            ),
            hook(
                "cel-yes.example.com",
                "/cel-yes",
                &pem,
                json!({"matchConditions": [{"name": "two", "expression": "object.spec.replicas == 2"}]}),
            ),
            hook(
                "cel-no.example.com",
                "/cel-no",
                &pem,
                json!({"matchConditions": [{"name": "spec-changed", "expression": "request.operation == 'UPDATE' && object.spec != oldObject.spec"}]}),
            ),
        ],
    );
    let mut in_team_b = create_deployment("team-b");
    in_team_b.namespace_labels = BTreeMap::from([
        (
            "kubernetes.io/metadata.name".to_owned(),
            "team-b".to_owned(),
        ),
        ("team".to_owned(), "b".to_owned()),
    ]);
    let mut in_system = create_deployment("kube-system");
    in_system.namespace_labels = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        "kube-system".to_owned(),
    )]);

    chain
        .admit(&[], std::slice::from_ref(&config), &in_team_b)
        .await
        .unwrap();
    let called: Vec<String> = webhook.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(called, ["/any", "/not-system", "/web-objects", "/cel-yes"]);

    chain.admit(&[], &[config], &in_system).await.unwrap();
    let called: Vec<String> = webhook.seen().into_iter().skip(4).map(|s| s.path).collect();
    assert_eq!(called, ["/any", "/web-objects", "/cel-yes"]);
}

#[tokio::test]
async fn a_failing_match_condition_follows_the_failure_policy() {
    let (ca, webhook, chain) = setup().await;
    let broken = json!([{"name": "broken", "expression": "object.spec.missing.deeper == 1"}]);
    let fail = validating(
        "v",
        vec![hook(
            "cel.example.com",
            "/allow",
            &ca.pem(),
            json!({"matchConditions": broken}),
        )],
    );
    let ignore = validating(
        "v",
        vec![hook(
            "cel.example.com",
            "/allow",
            &ca.pem(),
            json!({"matchConditions": broken, "failurePolicy": "Ignore"}),
        )],
    );
    let request = create_deployment("default");

    let rejection = chain.admit(&[], &[fail], &request).await.unwrap_err();
    let message = internal_error_message(&rejection.error);
    assert!(message.contains("match condition \"broken\""), "{message}");
    assert!(chain.admit(&[], &[ignore], &request).await.is_ok());
    assert!(webhook.seen().is_empty());
}

#[tokio::test]
async fn status_writes_reach_only_webhooks_that_name_the_subresource() {
    let (ca, webhook, chain) = setup().await;
    let status_rule = json!({"rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments/status"]}]});
    let config = validating(
        "v",
        vec![
            hook("main.example.com", "/main", &ca.pem(), json!({})),
            hook("status.example.com", "/status", &ca.pem(), status_rule),
        ],
    );
    let mut request = create_deployment("default");
    request.operation = Operation::Update;
    request.sub_resource = Some("status".to_owned());
    request.old_object = request.object.clone();

    chain.admit(&[], &[config], &request).await.unwrap();

    let seen = webhook.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/status");
    assert_eq!(seen[0].review["request"]["subResource"], "status");
}

#[tokio::test]
async fn webhook_configurations_are_never_sent_to_webhooks() {
    let (ca, webhook, chain) = setup().await;
    let everything = json!({"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "*"}]});
    let config = validating(
        "v",
        vec![hook("deny.example.com", "/deny", &ca.pem(), everything)],
    );
    let mut request = AdmissionAttributes::new(
        Operation::Delete,
        GroupVersionKind::new(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
        ),
        GroupVersionResource::new(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
        ),
    );
    request.name = "v".to_owned();

    chain.admit(&[], &[config], &request).await.unwrap();

    assert!(webhook.seen().is_empty());
}

#[tokio::test]
async fn kept_alive_connections_are_reused() {
    let (ca, webhook, chain) = setup().await;
    let config = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), json!({}))],
    );
    let request = create_deployment("default");

    for _ in 0..3 {
        chain
            .admit(&[], std::slice::from_ref(&config), &request)
            .await
            .unwrap();
    }

    assert_eq!(webhook.seen().len(), 3);
    assert_eq!(webhook.state.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_restarted_webhook_is_reached_on_a_new_connection() {
    let ca = TestCa::new();
    let first = TestWebhook::start(ca.serving(&[SERVICE_DNS])).await;
    let chain = AdmissionChain::new().with_service(service(), first.address);
    let config = validating(
        "v",
        vec![hook("allow.example.com", "/allow", &ca.pem(), json!({}))],
    );
    let request = create_deployment("default");
    chain
        .admit(&[], std::slice::from_ref(&config), &request)
        .await
        .unwrap();

    // The old server goes away with its connection; the pooled connection is dead.
    let address = first.address;
    drop(first);
    let second = TestWebhook::start_on(address, ca.serving(&[SERVICE_DNS])).await;
    chain.admit(&[], &[config], &request).await.unwrap();

    assert_eq!(second.seen().len(), 1);
    assert_eq!(second.state.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_patch_for_a_delete_is_an_internal_error() {
    let (ca, webhook, chain) = setup().await;
    let deletes = json!({"rules": [{"operations": ["DELETE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}]});
    let config = mutating(
        "m",
        vec![hook("label.example.com", "/label", &ca.pem(), deletes)],
    );
    let mut request = create_deployment("default");
    request.operation = Operation::Delete;
    request.old_object = request.object.take();

    let rejection = chain.admit(&[config], &[], &request).await.unwrap_err();

    let message = internal_error_message(&rejection.error);
    assert!(message.contains("no object to patch"), "{message}");
    assert_eq!(webhook.seen().len(), 1);
}
