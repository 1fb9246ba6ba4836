//! The `AdmissionReview` requests webhooks get, field by field, as kube-apiserver 1.33 sends
//! them (`apiserver/pkg/endpoints/handlers/{create,update,patch,delete}.go`,
//! `registry/generic/registry/store.go`), and how a denial without a reason reaches kubectl.

use crate::support::api::{api_error, widget_yaml};
use crate::support::fixtures::{Widget, client};
use crate::support::kubectl::{apply_widget_crd, served_kubectl, stderr};
use crate::support::webhook::Webhook;
use kube::Client;
use kube::api::{Api, PostParams};
use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;
use serde_json::{Value, json};

const WIDGETS: &str = "/apis/sandbox.test/v1/namespaces/default/widgets";

/// A sandbox with the Widget CRD, a mutating webhook at `mutate_path` and a validating one at
/// `validate_path`, both for every operation on widgets and free of side effects.
async fn sandbox_reviewing(webhook: &Webhook, mutate_path: &str, validate_path: &str) -> Sandbox {
    let (mut mutating, mut validating) = webhook.configurations("sandbox.test", "widgets");
    for (config, path) in [
        (&mut mutating, mutate_path),
        (&mut validating, validate_path),
    ] {
        let hook = &mut config["webhooks"][0];
        hook["rules"][0]["operations"] = json!(["*"]);
        hook["clientConfig"]["service"]["path"] = json!(path);
    }
    validating["webhooks"][0]["name"] = json!("deny.sandbox.test");
    webhook.sandbox_with(mutating, validating).await
}

/// A webhook, the sandbox [`sandbox_reviewing`] makes for it, and a client of that sandbox.
async fn reviewing(mutate_path: &str, validate_path: &str) -> (Webhook, Sandbox, Client) {
    let webhook = Webhook::start().await;
    let sandbox = sandbox_reviewing(&webhook, mutate_path, validate_path).await;
    let client = client(&sandbox);
    clear(&webhook);
    (webhook, sandbox, client)
}

const JSON: &str = "application/json";
const MERGE_PATCH: &str = "application/merge-patch+json";

/// Sends one request with a JSON body (none when `body` is null).
async fn send(
    client: &Client,
    method: &str,
    uri: &str,
    content_type: &str,
    body: &Value,
) -> Result<Value, kube::Error> {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(body).unwrap()
    };
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(bytes)
        .unwrap();
    client.request::<Value>(request).await
}

/// The one review request received at `path` since the last [`clear`].
fn one(webhook: &Webhook, path: &str) -> Value {
    let reviews = webhook.reviews.lock().unwrap();
    let at: Vec<&Value> = reviews
        .iter()
        .filter(|(p, _)| p == path)
        .map(|(_, review)| &review["request"])
        .collect();
    assert_eq!(at.len(), 1, "reviews at {path}: {reviews:?}");
    at[0].clone()
}

fn clear(webhook: &Webhook) {
    webhook.reviews.lock().unwrap().clear();
}

fn widget_body(metadata: Value) -> Value {
    json!({"apiVersion": "sandbox.test/v1", "kind": "Widget", "metadata": metadata,
           "spec": {"replicas": 1, "message": "m"}})
}

#[tokio::test]
async fn a_create_is_reviewed_before_and_after_the_server_sets_uid_creation_time_generation_and_name()
 {
    let (webhook, _sandbox, client) = reviewing("/mutate", "/validate").await;

    let uri = format!("{WIDGETS}?fieldManager=maker&fieldValidation=Strict");
    let body = widget_body(json!({"generateName": "gen-"}));
    let created = send(&client, "POST", &uri, JSON, &body).await.unwrap();
    let (mutating, validating) = (one(&webhook, "/mutate"), one(&webhook, "/validate"));

    // Mutating admission runs before the registry store: nothing server-set yet, no name.
    let meta = &mutating["object"]["metadata"];
    for field in ["uid", "creationTimestamp", "generation", "name"] {
        assert!(meta.get(field).is_none(), "mutating saw {field}: {meta}");
    }
    assert!(mutating.get("name").is_none(), "{mutating}");
    assert_eq!(meta["generateName"], "gen-");

    // Validating admission sees what is stored, and the generated name.
    let meta = &validating["object"]["metadata"];
    let stored = &created["metadata"];
    assert!(stored["name"].as_str().unwrap().starts_with("gen-"));
    for field in ["uid", "creationTimestamp", "name"] {
        assert_eq!(meta[field], stored[field], "{field}");
    }
    assert_eq!(meta["generation"], 1);
    assert_eq!(validating["name"], stored["name"]);

    for review in [&mutating, &validating] {
        assert_eq!(review["operation"], "CREATE");
        assert_eq!(review["dryRun"], false);
        assert_eq!(
            review["options"],
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions",
                   "fieldManager": "maker", "fieldValidation": "Strict"})
        );
    }
}

#[tokio::test]
async fn a_status_a_mutating_webhook_sees_on_create_is_gone_by_validation() {
    let (webhook, _sandbox, client) = reviewing("/mutate", "/validate").await;

    let mut body = widget_body(json!({"name": "with-status"}));
    body["status"] = json!({"observed_replicas": 3});
    send(&client, "POST", WIDGETS, JSON, &body).await.unwrap();
    // The status is dropped by the strategy's PrepareForCreate, after mutating admission.
    let mutating = one(&webhook, "/mutate");
    assert_eq!(mutating["object"]["status"]["observed_replicas"], 3);
    let validating = one(&webhook, "/validate");
    assert!(validating["object"].get("status").is_none(), "{validating}");
}

#[tokio::test]
async fn patches_are_reviewed_with_update_options_and_an_apply_that_creates_with_create_options() {
    let (webhook, _sandbox, client) = reviewing("/mutate", "/validate").await;

    // A server-side apply that creates: CREATE with CreateOptions, no `force`.
    let uri = format!("{WIDGETS}/applied?fieldManager=applier&force=true");
    let body = widget_body(json!({"name": "applied"}));
    send(
        &client,
        "PATCH",
        &uri,
        "application/apply-patch+yaml",
        &body,
    )
    .await
    .unwrap();
    let reviews = webhook.reviews.lock().unwrap().clone();
    assert_eq!(reviews.len(), 2, "{reviews:?}");
    for (path, review) in &reviews {
        let request = &review["request"];
        assert_eq!(request["operation"], "CREATE", "{path}");
        assert_eq!(request["name"], "applied", "{path}");
        assert_eq!(
            request["options"],
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "applier"}),
            "{path}"
        );
        let has_uid = request["object"]["metadata"].get("uid").is_some();
        assert_eq!(has_uid, path == "/validate", "{path}: {request}");
    }
    clear(&webhook);

    // A merge patch: UPDATE with UpdateOptions carrying what the query asked.
    let uri = format!("{WIDGETS}/applied?fieldManager=patcher&fieldValidation=Ignore");
    let patch = json!({"spec": {"replicas": 2}});
    send(&client, "PATCH", &uri, MERGE_PATCH, &patch)
        .await
        .unwrap();
    for path in ["/mutate", "/validate"] {
        let request = one(&webhook, path);
        assert_eq!(request["operation"], "UPDATE");
        assert_eq!(
            request["options"],
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions",
                   "fieldManager": "patcher", "fieldValidation": "Ignore"})
        );
    }
    clear(&webhook);

    // A PUT without options: UpdateOptions and nothing else, not the server's defaults.
    let mut current = send(
        &client,
        "GET",
        &format!("{WIDGETS}/applied"),
        JSON,
        &Value::Null,
    )
    .await
    .unwrap();
    current["spec"]["replicas"] = json!(4);
    send(
        &client,
        "PUT",
        &format!("{WIDGETS}/applied"),
        JSON,
        &current,
    )
    .await
    .unwrap();
    let request = one(&webhook, "/validate");
    assert_eq!(
        request["options"],
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"})
    );
}

#[tokio::test]
async fn webhooks_see_the_writers_managed_fields_and_what_they_change_is_owned_by_no_one() {
    let (webhook, _sandbox, client) = reviewing("/label", "/validate").await;
    let managers = |object: &Value| -> Vec<(String, String)> {
        let entries = object["metadata"]["managedFields"].as_array().cloned();
        entries
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap().into(),
                    e["operation"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    let maker = ("maker".to_owned(), "Update".to_owned());
    let patcher = ("patcher".to_owned(), "Update".to_owned());

    let uri = format!("{WIDGETS}?fieldManager=maker");
    let created = send(
        &client,
        "POST",
        &uri,
        JSON,
        &widget_body(json!({"name": "owned"})),
    )
    .await
    .unwrap();
    for path in ["/label", "/validate"] {
        assert_eq!(
            managers(&one(&webhook, path)["object"]),
            vec![maker.clone()],
            "{path}"
        );
    }
    // The label the mutating webhook added is on the object and in no one's fields.
    assert_eq!(created["metadata"]["labels"]["mutated"], "yes");
    let fields = &created["metadata"]["managedFields"][0]["fieldsV1"];
    assert!(fields["f:spec"].get("f:replicas").is_some(), "{fields}");
    assert!(fields.pointer("/f:metadata/f:labels").is_none(), "{fields}");
    clear(&webhook);

    let uri = format!("{WIDGETS}/owned?fieldManager=patcher");
    let patch = json!({"spec": {"replicas": 2}});
    send(&client, "PATCH", &uri, MERGE_PATCH, &patch)
        .await
        .unwrap();
    let request = one(&webhook, "/label");
    assert_eq!(
        managers(&request["object"]),
        [maker.clone(), patcher.clone()]
    );
    assert_eq!(managers(&request["oldObject"]), [maker]);
}

#[tokio::test]
async fn a_dry_run_delete_is_reviewed_as_a_dry_run_with_its_delete_options() {
    let (webhook, _sandbox, client) = reviewing("/mutate", "/validate").await;
    let body = widget_body(json!({"name": "kept"}));
    send(&client, "POST", WIDGETS, JSON, &body).await.unwrap();
    clear(&webhook);

    // kubectl and kube send the options as the body.
    let options = json!({"apiVersion": "v1", "kind": "DeleteOptions",
                         "propagationPolicy": "Foreground", "dryRun": ["All"]});
    send(
        &client,
        "DELETE",
        &format!("{WIDGETS}/kept"),
        JSON,
        &options,
    )
    .await
    .unwrap();
    for path in ["/mutate", "/validate"] {
        let request = one(&webhook, path);
        assert_eq!(request["operation"], "DELETE");
        assert_eq!(request["dryRun"], true);
        assert_eq!(request["name"], "kept");
        assert_eq!(
            request["options"],
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
                   "propagationPolicy": "Foreground", "dryRun": ["All"]})
        );
    }
    // Without a body, the query is the options.
    clear(&webhook);
    let uri = format!("{WIDGETS}/kept?dryRun=All&gracePeriodSeconds=0");
    send(&client, "DELETE", &uri, JSON, &Value::Null)
        .await
        .unwrap();
    let request = one(&webhook, "/validate");
    assert_eq!(request["dryRun"], true);
    assert_eq!(
        request["options"],
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
               "gracePeriodSeconds": 0, "dryRun": ["All"]})
    );
    let widgets: Api<Widget> = Api::default_namespaced(client);
    assert!(widgets.get_opt("kept").await.unwrap().is_some());
}

#[tokio::test]
async fn a_denial_without_a_reason_reaches_the_client_with_no_reason() {
    let webhook = Webhook::start().await;
    let sandbox = sandbox_reviewing(&webhook, "/mutate", "/deny").await;
    let widgets: Api<Widget> = Api::default_namespaced(client(&sandbox));
    let status = api_error(
        widgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(widget_body(json!({"name": "no"}))).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 400);
    assert_eq!(status.reason, "");
    assert_eq!(
        status.message,
        "admission webhook \"deny.sandbox.test\" denied the request: widgets are closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_prints_a_denial_without_a_reason_as_error_from_server() {
    let webhook = Webhook::start().await;
    let sandbox = sandbox_reviewing(&webhook, "/mutate", "/deny").await;
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    apply_widget_crd(&k, &[]).await;
    let manifest = k.file("closed.yaml", &widget_yaml("closed", 1, "m"));
    let out = k.run(&["create", "-f", path_str(&manifest)]).await;
    let printed = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    // kubectl's StandardErrorMessage: `Error from server (<reason>): ` only with a reason.
    assert_eq!(
        printed.trim_end(),
        format!(
            "Error from server: error when creating \"{}\": admission webhook \"deny.sandbox.test\" denied the request: widgets are closed",
            path_str(&manifest)
        )
    );
}
