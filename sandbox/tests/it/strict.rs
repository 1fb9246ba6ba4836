//! Requests kube-apiserver 1.33 refuses, refused here the same way (code, reason, message), so
//! that a client that sends them fails in the tests as it would fail in a cluster.

use crate::support::api::{config_map, with_widgets};
use crate::support::fixtures::widget;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::core::Status;
use kube_sandbox::Sandbox;
use serde_json::{Value, json};

const WIDGETS: &str = "/apis/sandbox.test/v1/namespaces/default/widgets";

fn request(
    method: &str,
    uri: &str,
    content_type: &str,
    body: &Value,
) -> axum::http::Request<Vec<u8>> {
    axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(serde_json::to_vec(body).unwrap())
        .unwrap()
}

/// The Status a refused request answers, or the answer of one that was not refused.
async fn refusal(
    client: &kube::Client,
    request: axum::http::Request<Vec<u8>>,
) -> Result<Box<Status>, String> {
    match client.request_text(request).await {
        Err(kube::Error::Api(status)) => Ok(status),
        Err(other) => Err(format!("not an API error: {other}")),
        Ok(body) => Err(format!("admitted: {body}")),
    }
}

async fn sandbox_with_widget() -> (Sandbox, kube::Client, Value) {
    let sandbox = Sandbox::new();
    let (client, widgets) = with_widgets(&sandbox).await;
    let created = widgets
        .create(&PostParams::default(), &widget("w", 1, "m"))
        .await
        .unwrap();
    let stored = serde_json::to_value(created).unwrap();
    (sandbox, client, stored)
}

#[tokio::test]
async fn a_create_that_carries_a_resource_version_is_refused_unless_it_is_a_dry_run() {
    let (_sandbox, client, _) = sandbox_with_widget().await;
    let body = json!({"apiVersion": "sandbox.test/v1", "kind": "Widget",
                      "metadata": {"name": "x", "resourceVersion": "7"},
                      "spec": {"replicas": 1, "message": "m"}});
    let status = refusal(&client, request("POST", WIDGETS, "application/json", &body))
        .await
        .unwrap();
    assert_eq!(status.code, 500);
    assert_eq!(status.reason, "");
    assert_eq!(
        status.message,
        "resourceVersion should not be set on objects to be created"
    );
    let dry_run = format!("{WIDGETS}?dryRun=All");
    assert!(
        refusal(
            &client,
            request("POST", &dry_run, "application/json", &body)
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn an_apply_must_name_the_endpoints_api_version_and_kind_and_carry_no_managed_fields() {
    let (_sandbox, client, _) = sandbox_with_widget().await;
    let uri = format!("{WIDGETS}/a?fieldManager=test");
    let apply = |body: Value| request("PATCH", &uri, "application/apply-patch+yaml", &body);
    let spec = json!({"replicas": 1, "message": "m"});

    let status = refusal(
        &client,
        apply(json!({"kind": "Widget", "metadata": {"name": "a"}, "spec": spec})),
    )
    .await
    .unwrap();
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        status.message,
        "Incorrect version specified in apply patch. Specified patch version: , expected: sandbox.test/v1"
    );
    let status = refusal(
        &client,
        apply(json!({"apiVersion": "sandbox.test/v1", "metadata": {"name": "a"}, "spec": spec})),
    )
    .await
    .unwrap();
    assert_eq!(status.code, 500);
    assert!(
        status
            .message
            .contains("failed to create typed patch object"),
        "{}",
        status.message
    );
    let status = refusal(
        &client,
        apply(json!({"apiVersion": "sandbox.test/v1", "kind": "Widget",
        "metadata": {"name": "a", "managedFields": [{"manager": "x"}]}, "spec": spec})),
    )
    .await
    .unwrap();
    assert_eq!(
        (status.code, status.message.as_str()),
        (400, "metadata.managedFields must be nil")
    );
    let whole = json!({"apiVersion": "sandbox.test/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": spec});
    assert!(
        refusal(&client, apply(whole)).await.is_err(),
        "a complete apply is admitted"
    );
}

#[tokio::test]
async fn a_put_of_a_custom_resource_needs_a_resource_version_and_a_built_in_one_does_not() {
    let (_sandbox, client, mut stored) = sandbox_with_widget().await;
    let uri = format!("{WIDGETS}/w");
    let rv = stored["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion")
        .unwrap();
    let status = refusal(&client, request("PUT", &uri, "application/json", &stored))
        .await
        .unwrap();
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "widgets.sandbox.test \"w\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
    );
    stored["metadata"]["resourceVersion"] = rv;
    assert!(
        refusal(&client, request("PUT", &uri, "application/json", &stored))
            .await
            .is_err()
    );

    let configmaps = Api::<ConfigMap>::default_namespaced(client.clone());
    configmaps
        .create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}});
    let put = request(
        "PUT",
        "/api/v1/namespaces/default/configmaps/c",
        "application/json",
        &body,
    );
    assert!(
        refusal(&client, put).await.is_err(),
        "unconditional update of a ConfigMap"
    );
}

#[tokio::test]
async fn field_selectors_on_a_custom_resource_name_only_metadata_and_its_selectable_fields() {
    let (_sandbox, client, _) = sandbox_with_widget().await;
    let list = |selector: &str| {
        let uri = format!("{WIDGETS}?fieldSelector={selector}");
        axum::http::Request::get(uri).body(Vec::new()).unwrap()
    };
    let status = refusal(&client, list("spec.message%3Dm")).await.unwrap();
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    assert_eq!(status.message, "field label not supported: spec.message");
    let watch = format!("{WIDGETS}?watch=true&fieldSelector=spec.replicas%3D1");
    let status = refusal(
        &client,
        axum::http::Request::get(watch).body(Vec::new()).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status.message, "field label not supported: spec.replicas");
    for supported in ["metadata.name%3Dw", "metadata.namespace%3Ddefault"] {
        assert!(
            refusal(&client, list(supported)).await.is_err(),
            "{supported}"
        );
    }

    // A CRD version's selectableFields extend the set.
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.sandbox.test";
    let patch = json!([{"op": "add", "path": "/spec/versions/0/selectableFields",
                        "value": [{"jsonPath": ".spec.message"}]}]);
    client
        .request_text(request(
            "PATCH",
            crds,
            "application/json-patch+json",
            &patch,
        ))
        .await
        .unwrap();
    assert!(refusal(&client, list("spec.message%3Dm")).await.is_err());
}

#[tokio::test]
async fn a_watch_from_a_resource_version_the_server_has_not_reached_times_out_too_large() {
    let (sandbox, client, _) = sandbox_with_widget().await;
    let current = sandbox.resource_version();
    let ahead = current + 1000;
    let uri = format!("{WIDGETS}?watch=true&resourceVersion={ahead}");
    let status = refusal(
        &client,
        axum::http::Request::get(uri).body(Vec::new()).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!((status.code, status.reason.as_str()), (504, "Timeout"));
    assert_eq!(
        status.message,
        format!("Too large resource version: {ahead}, current: {current}")
    );
    let details = status.details.unwrap();
    assert_eq!(details.causes[0].reason, "ResourceVersionTooLarge");
    assert_eq!(details.retry_after_seconds, 1);
}

#[tokio::test]
async fn a_strategic_merge_patch_of_a_custom_resource_is_unsupported_and_the_answer_lists_what_is()
{
    let (_sandbox, client, _) = sandbox_with_widget().await;
    let patch = json!({"spec": {"message": "n"}});
    let status = refusal(
        &client,
        request(
            "PATCH",
            &format!("{WIDGETS}/w"),
            "application/strategic-merge-patch+json",
            &patch,
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (status.code, status.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
    assert_eq!(
        status.message,
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    );
}

#[tokio::test]
async fn unknown_fields_under_strict_validation_are_refused_in_the_words_of_each_verb() {
    let (_sandbox, client, stored) = sandbox_with_widget().await;
    let strict = |uri: &str| format!("{uri}?fieldValidation=Strict");
    let unknown = "strict decoding error: unknown field \"spec.bogus\"";
    // POST and PUT decode the body and name the kind; a patch names only the field.
    let body = json!({"apiVersion": "sandbox.test/v1", "kind": "Widget",
                      "metadata": {"name": "x"},
                      "spec": {"replicas": 1, "message": "m", "bogus": true}});
    let mut put = stored.clone();
    put["spec"]["bogus"] = json!(true);
    let patch = json!({"spec": {"bogus": true}});
    let cases = [
        request("POST", &strict(WIDGETS), "application/json", &body),
        request(
            "PUT",
            &strict(&format!("{WIDGETS}/w")),
            "application/json",
            &put,
        ),
        request(
            "PATCH",
            &strict(&format!("{WIDGETS}/w")),
            "application/merge-patch+json",
            &patch,
        ),
    ];
    let mut messages = Vec::new();
    for case in cases {
        let status = refusal(&client, case).await.unwrap();
        assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
        messages.push(status.message);
    }
    let named = format!("Widget in version \"v1\" cannot be handled as a Widget: {unknown}");
    assert_eq!(messages, [named.clone(), named, unknown.to_owned()]);
}
