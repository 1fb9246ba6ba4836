//! The admission chain against real HTTPS webhooks on loopback, with certificates made here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::webhook::testing::TestCa;
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
use kube_sandbox::testing::eventually;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;

// === A test webhook server ===

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

    /// Binds `address`, waiting while a just-stopped server still holds it.
    async fn start_on(address: SocketAddr, tls: rustls::ServerConfig) -> Self {
        let listener = eventually(&format!("{address} is free to bind"), || async {
            TcpListener::bind(address)
                .await
                .inspect_err(|error| eprintln!("waiting for {address}: {error}"))
                .ok()
        })
        .await;
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

    /// The reviews received since the last call.
    fn take_seen(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.state.seen.lock().unwrap())
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

/// A CA made for one test. Each has its own name, so that a stranger CA is an unknown issuer
/// rather than a bad signer.
fn test_ca() -> TestCa {
    static SERIAL: AtomicUsize = AtomicUsize::new(0);
    let n = SERIAL.fetch_add(1, Ordering::SeqCst);
    TestCa::new(&format!("sandbox test ca {n}"))
}

/// One webhook entry pointing at the test service and trusting `ca`, with overrides merged in.
fn hook(name: &str, path: &str, ca: &TestCa, overrides: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "clientConfig": {
            "service": {"namespace": "ops", "name": "webhook", "port": 8443, "path": path},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca.ca_pem()),
        },
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}],
    });
    for (key, value) in overrides.as_object().cloned().unwrap_or_default() {
        hook[key] = value;
    }
    hook
}

/// A configuration of `kind` named `name` holding `hooks`.
fn configuration<T: DeserializeOwned>(kind: &str, name: &str, hooks: Vec<Value>) -> T {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": hooks,
    }))
    .unwrap()
}

fn validating(name: &str, hooks: Vec<Value>) -> ValidatingWebhookConfiguration {
    configuration("ValidatingWebhookConfiguration", name, hooks)
}

fn mutating(name: &str, hooks: Vec<Value>) -> MutatingWebhookConfiguration {
    configuration("MutatingWebhookConfiguration", name, hooks)
}

/// The validating configuration `v` holding the one hook [`hook`] makes.
fn validating_one(
    name: &str,
    path: &str,
    ca: &TestCa,
    overrides: Value,
) -> ValidatingWebhookConfiguration {
    validating("v", vec![hook(name, path, ca, overrides)])
}

/// The mutating configuration `m` holding the one hook [`hook`] makes.
fn mutating_one(
    name: &str,
    path: &str,
    ca: &TestCa,
    overrides: Value,
) -> MutatingWebhookConfiguration {
    mutating("m", vec![hook(name, path, ca, overrides)])
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

/// The create of `web` in `default` as a DELETE: the object is the old object.
fn delete_deployment() -> AdmissionAttributes {
    let mut request = create_deployment("default");
    request.operation = Operation::Delete;
    request.old_object = request.object.take();
    request
}

/// A webhook server for the test service and a chain that reaches it.
async fn setup() -> (TestCa, TestWebhook, AdmissionChain) {
    let ca = test_ca();
    let webhook = TestWebhook::start(ca.server_config(&[SERVICE_DNS])).await;
    let chain = AdmissionChain::new().with_service(service(), webhook.address);
    (ca, webhook, chain)
}

fn internal_error_message(error: &Error) -> String {
    let status = error.status();
    assert_eq!(status.code, Some(500), "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("InternalError"));
    status.message.unwrap_or_default()
}

/// The paths the webhook was called at, in order.
fn paths(seen: Vec<Seen>) -> Vec<String> {
    seen.into_iter().map(|s| s.path).collect()
}

// === Tests ===

#[tokio::test]
async fn allowed_request_is_admitted_and_the_webhook_gets_a_v1_review() {
    let (ca, webhook, chain) = setup().await;
    let config = validating_one("allow.example.com", "/allow", &ca, json!({}));
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
    let config = validating_one("allow.example.com", "/allow", &ca, rules);

    chain
        .admit(
            &[],
            std::slice::from_ref(&config),
            &create_deployment("default"),
        )
        .await
        .unwrap();
    let admitted = chain
        .admit(&[], &[config], &delete_deployment())
        .await
        .unwrap();

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
    let config = validating_one("deny.example.com", "/deny", &ca, json!({}));

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
    let mutate = mutating_one("label.example.com", "/label", &ca, json!({}));
    let validate = validating_one("allow.example.com", "/allow", &ca, json!({}));

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
        vec![hook("b.example.com", "/label-b", &ca, json!({}))],
    );
    let first = mutating(
        "a-first",
        vec![hook("a.example.com", "/label", &ca, json!({}))],
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
            hook("a.example.com", "/allow", &ca, reinvoked),
            hook("b.example.com", "/label-b", &ca, json!({})),
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
    let warn = validating("a", vec![hook("warn.example.com", "/warn", &ca, json!({}))]);
    let warn_deny = validating(
        "b",
        vec![hook("warn-deny.example.com", "/warn-deny", &ca, json!({}))],
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
async fn a_failed_call_refuses_the_request_under_fail_and_is_skipped_under_ignore() {
    let (ca, webhook, chain) = setup().await;
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_address = dead.local_addr().unwrap();
    drop(dead);
    let dead_chain = AdmissionChain::new().with_service(service(), dead_address);
    let broken = json!({"matchConditions": [{"name": "broken", "expression": "object.spec.missing.deeper == 1"}]});
    // (case, hook name, path, overrides, the chain, how the refusal starts, the calls the
    // webhook gets under both policies)
    let cases: Vec<(&str, &str, &str, Value, &AdmissionChain, String, usize)> = vec![
        (
            "an answer for another uid",
            "uid.example.com",
            "/wrong-uid",
            json!({}),
            &chain,
            "Internal error occurred: failed calling webhook \"uid.example.com\": received invalid webhook response: expected response.uid=".to_owned(),
            2,
        ),
        (
            "an endpoint nothing listens on",
            "dead.example.com",
            "/allow",
            json!({}),
            &dead_chain,
            format!(
                "Internal error occurred: failed calling webhook \"dead.example.com\": failed to call webhook: Post \"https://{SERVICE_DNS}:8443/allow?timeout=10s\": dial tcp {dead_address}:"
            ),
            0,
        ),
        (
            "a match condition that cannot be evaluated",
            "cel.example.com",
            "/allow",
            broken,
            &chain,
            "Internal error occurred: failed calling webhook \"cel.example.com\": failed to evaluate match condition \"broken\"".to_owned(),
            0,
        ),
    ];
    let request = create_deployment("default");
    for (case, name, path, overrides, chain, refusal, calls) in cases {
        let mut ignore = overrides.clone();
        ignore["failurePolicy"] = json!("Ignore");
        let fail = validating_one(name, path, &ca, overrides);
        let ignore = validating_one(name, path, &ca, ignore);

        let rejection = chain.admit(&[], &[fail], &request).await.unwrap_err();
        let message = internal_error_message(&rejection.error);
        assert!(message.starts_with(&refusal), "{case}: {message}");
        let admitted = chain.admit(&[], &[ignore], &request).await;
        assert_eq!(
            admitted.map(|a| a.object).ok(),
            Some(request.object.clone()),
            "{case}: skipped under Ignore"
        );
        assert_eq!(
            webhook.take_seen().len(),
            calls,
            "{case}: the calls the webhook got"
        );
    }
}

#[tokio::test]
async fn a_patch_that_does_not_apply_is_an_internal_error_even_with_ignore() {
    let (ca, _webhook, chain) = setup().await;
    let config = mutating_one(
        "bad.example.com",
        "/bad-patch",
        &ca,
        json!({"failurePolicy": "Ignore"}),
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
async fn a_call_that_cannot_be_made_or_answered_is_an_internal_error_that_says_why() {
    let (ca, webhook, chain) = setup().await;
    let unregistered = AdmissionChain::new();
    let deletes = json!({"rules": [{"operations": ["DELETE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}]});
    // (case, the chain, mutating and validating configurations, request, what the refusal
    // says, the calls the webhook gets)
    let cases = [
        (
            "a validating webhook that patches",
            &chain,
            vec![],
            vec![validating_one(
                "label.example.com",
                "/label",
                &ca,
                json!({}),
            )],
            create_deployment("default"),
            "validating webhooks may not return patches",
            1,
        ),
        (
            "a service the chain has no address for",
            &unregistered,
            vec![],
            vec![validating_one(
                "allow.example.com",
                "/allow",
                &ca,
                json!({}),
            )],
            create_deployment("default"),
            "ops/webhook:8443",
            0,
        ),
        (
            "a patch for a delete",
            &chain,
            vec![mutating_one("label.example.com", "/label", &ca, deletes)],
            vec![],
            delete_deployment(),
            "no object to patch",
            1,
        ),
    ];
    for (case, chain, mutating, validating, request, says, calls) in cases {
        let rejection = chain
            .admit(&mutating, &validating, &request)
            .await
            .unwrap_err();
        let message = internal_error_message(&rejection.error);
        assert!(message.contains(says), "{case}: {message}");
        assert_eq!(
            webhook.take_seen().len(),
            calls,
            "{case}: the calls the webhook got"
        );
    }
}

#[tokio::test]
async fn timeout_seconds_bounds_the_call() {
    let (ca, webhook, chain) = setup().await;
    let config = validating_one(
        "slow.example.com",
        "/slow",
        &ca,
        json!({"timeoutSeconds": 1}),
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
async fn the_webhook_must_present_a_certificate_from_its_ca_bundle_for_the_service_name() {
    // (case, the names the served certificate is for, whether the caBundle holds another CA
    // than the one that signed it, what the refusal says)
    let cases: Vec<(&str, &[&str], bool, &str)> = vec![
        (
            "a certificate signed by a CA the bundle does not hold",
            &[SERVICE_DNS],
            true,
            "tls: invalid peer certificate: UnknownIssuer",
        ),
        (
            "a certificate for another name",
            &["other.ops.svc", "localhost"],
            false,
            "certificate not valid for name \"webhook.ops.svc\"",
        ),
    ];
    for (case, names, stranger, says) in cases {
        let ca = test_ca();
        let webhook = TestWebhook::start(ca.server_config(names)).await;
        let chain = AdmissionChain::new().with_service(service(), webhook.address);
        let trusted = if stranger { test_ca() } else { ca };
        let config = validating_one("allow.example.com", "/allow", &trusted, json!({}));

        let rejection = chain
            .admit(&[], &[config], &create_deployment("default"))
            .await
            .unwrap_err();

        let message = internal_error_message(&rejection.error);
        assert!(message.contains(says), "{case}: {message}");
        assert!(webhook.seen().is_empty(), "{case}: the webhook was called");
    }
}

#[tokio::test]
async fn a_url_webhook_is_dialled_at_its_host() {
    let ca = test_ca();
    let webhook = TestWebhook::start(ca.server_config(&["127.0.0.1"])).await;
    let chain = AdmissionChain::new();
    let client = json!({"clientConfig": {
        "url": format!("https://{}/allow", webhook.address),
        "caBundle": base64::engine::general_purpose::STANDARD.encode(ca.ca_pem()),
    }});
    let config = validating_one("url.example.com", "/unused", &ca, client);

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
async fn dry_run_calls_webhooks_without_side_effects_and_refuses_the_others() {
    let (ca, webhook, chain) = setup().await;
    let clean = validating(
        "a",
        vec![hook(
            "clean.example.com",
            "/allow",
            &ca,
            json!({"sideEffects": "NoneOnDryRun"}),
        )],
    );
    let effects = validating(
        "b",
        vec![hook(
            "effects.example.com",
            "/warn",
            &ca,
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
    // (name and path, overrides)
    let hooks = [
        ("any", json!({})),
        (
            "updates",
            json!({"rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}]}),
        ),
        (
            "services",
            json!({"rules": [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["services"]}]}),
        ),
        (
            "not-system",
            json!({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}}),
        ),
        (
            "team-a",
            json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
        ),
        (
            "web-objects",
            json!({"objectSelector": {"matchLabels": {"app": "web"}}}),
        ),
        (
            "db-objects",
            json!({"objectSelector": {"matchLabels": {"app": "db"}}}),
        ),
        (
            "cel-yes",
            json!({"matchConditions": [{"name": "two", "expression": "object.spec.replicas == 2"}]}),
        ),
        (
            "cel-no",
            json!({"matchConditions": [{"name": "spec-changed", "expression": "request.operation == 'UPDATE' && object.spec != oldObject.spec"}]}),
        ),
    ];
    let config = validating(
        "v",
        hooks
            .into_iter()
            .map(|(name, overrides)| {
                hook(
                    &format!("{name}.example.com"),
                    &format!("/{name}"),
                    &ca,
                    overrides,
                )
            })
            .collect(),
    );
    let in_namespace = |name: &str, labels: &[(&str, &str)]| {
        let mut request = create_deployment(name);
        request.namespace_labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        request
    };
    let in_team_b = in_namespace(
        "team-b",
        &[("kubernetes.io/metadata.name", "team-b"), ("team", "b")],
    );
    let in_system = in_namespace(
        "kube-system",
        &[("kubernetes.io/metadata.name", "kube-system")],
    );

    chain
        .admit(&[], std::slice::from_ref(&config), &in_team_b)
        .await
        .unwrap();
    let called = paths(webhook.seen());
    assert_eq!(called, ["/any", "/not-system", "/web-objects", "/cel-yes"]);

    chain.admit(&[], &[config], &in_system).await.unwrap();
    let called = paths(webhook.seen().split_off(4));
    assert_eq!(called, ["/any", "/web-objects", "/cel-yes"]);
}

#[tokio::test]
async fn status_writes_reach_only_webhooks_that_name_the_subresource() {
    let (ca, webhook, chain) = setup().await;
    let status_rule = json!({"rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments/status"]}]});
    let config = validating(
        "v",
        vec![
            hook("main.example.com", "/main", &ca, json!({})),
            hook("status.example.com", "/status", &ca, status_rule),
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
    let config = validating_one("deny.example.com", "/deny", &ca, everything);
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
    let config = validating_one("allow.example.com", "/allow", &ca, json!({}));
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
    let (ca, first, chain) = setup().await;
    let config = validating_one("allow.example.com", "/allow", &ca, json!({}));
    let request = create_deployment("default");
    chain
        .admit(&[], std::slice::from_ref(&config), &request)
        .await
        .unwrap();

    // The old server goes away with its connection; the pooled connection is dead.
    let address = first.address;
    drop(first);
    let second = TestWebhook::start_on(address, ca.server_config(&[SERVICE_DNS])).await;
    chain.admit(&[], &[config], &request).await.unwrap();

    assert_eq!(second.seen().len(), 1);
    assert_eq!(second.state.connections.load(Ordering::SeqCst), 1);
}
