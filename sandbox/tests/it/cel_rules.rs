//! Custom resources refused by their CRD's CEL rules as kube-apiserver 1.33 refuses them: a rule
//! that fails to evaluate (apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go`), and
//! the error list around the rules (`hasBlockingErr` in `pkg/registry/customresource/strategy.go`).

use crate::support::fixtures::client;

use kube::core::Status;
use kube_sandbox::Sandbox;
use serde_json::{Value, json};

const SKIPPED: &str = "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

fn gizmo_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gizmos.sandbox.test"},
        "spec": {
            "group": "sandbox.test", "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "listKind": "GizmoList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "properties": {
                        "mode": {"type": "string", "enum": ["A", "B"]},
                        "tls": {"type": "object", "properties": {"secret": {"type": "string"}}},
                        "port": {"type": "integer", "maximum": 100},
                        "name": {"type": "string", "pattern": "^[a-z]+$"}
                    },
                    "x-kubernetes-validations": [
                        {"rule": "self.mode != 'B' || self.tls.secret != ''",
                         "message": "mode B needs a TLS secret"},
                        {"rule": "!has(self.port) || self.port != 7", "message": "port 7 is reserved"},
                        {"rule": "size(self.name) < 6"}
                    ]
                }}
            }}}]
        }
    })
}

fn post(uri: &str, body: &Value) -> axum::http::Request<Vec<u8>> {
    axum::http::Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap()
}

/// The causes, as (field, message), of creating a Gizmo with `spec`.
async fn refusal(spec: Value) -> Vec<(String, String)> {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    client
        .request_text(post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &gizmo_crd(),
        ))
        .await
        .expect("the CRD is created");
    let gizmo = json!({"apiVersion": "sandbox.test/v1", "kind": "Gizmo",
                       "metadata": {"name": "g"}, "spec": spec});
    let status: Box<Status> = match client
        .request_text(post(
            "/apis/sandbox.test/v1/namespaces/default/gizmos",
            &gizmo,
        ))
        .await
    {
        Err(kube::Error::Api(status)) => status,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(status.code, 422, "{status:?}");
    status
        .details
        .expect("details")
        .causes
        .into_iter()
        .map(|c| (c.field, c.message))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(f, m)| ((*f).to_owned(), (*m).to_owned()))
        .collect()
}

#[tokio::test]
async fn a_rule_that_reads_an_absent_field_names_the_key_and_the_rules_message() {
    let causes = refusal(json!({"mode": "B", "name": "ok"})).await;
    assert_eq!(
        causes,
        pairs(&[(
            "spec",
            "Invalid value: \"object\": no such key: tls evaluating rule: mode B needs a TLS secret"
        )])
    );
}

#[tokio::test]
async fn an_absent_argument_of_a_global_function_names_the_key_and_the_rule() {
    let causes = refusal(json!({"mode": "A"})).await;
    assert_eq!(
        causes,
        pairs(&[(
            "spec",
            "Invalid value: \"object\": no such key: name evaluating rule: size(self.name) < 6"
        )])
    );
}

#[tokio::test]
async fn a_value_outside_its_enum_stops_the_rules_and_says_so() {
    let causes = refusal(json!({"mode": "C", "port": 7, "name": "ok"})).await;
    assert_eq!(
        causes,
        pairs(&[
            (
                "spec.mode",
                "Unsupported value: \"C\": supported values: \"A\", \"B\""
            ),
            ("<nil>", SKIPPED),
        ])
    );
}

#[tokio::test]
async fn a_value_over_its_maximum_or_off_its_pattern_leaves_the_rules_to_run() {
    let causes = refusal(json!({"mode": "A", "port": 101, "name": "Abcdefg"})).await;
    assert_eq!(
        causes,
        pairs(&[
            (
                "spec.name",
                "Invalid value: \"Abcdefg\": spec.name in body should match '^[a-z]+$'"
            ),
            (
                "spec.port",
                "Invalid value: 101: spec.port in body should be less than or equal to 100"
            ),
            (
                "spec",
                "Invalid value: \"object\": failed rule: size(self.name) < 6"
            ),
        ])
    );
}
