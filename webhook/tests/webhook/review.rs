//! The router driven in-process with fixture reviews.

use axum::{body::Body, http::Request};
use serde_json::{Value, json};
use webhook::{Decision, Metrics};

use super::support::{
    MANAGED_LABEL, apply, call, fixture, fixture_json, post, post_fixture, router,
};

const UID: &str = "0df28fbd-5f5f-11e8-bc74-36e6bb280816";

#[tokio::test]
async fn a_valid_create_is_allowed_and_echoes_uid_api_version_and_kind() {
    let answer = post_fixture(&router(&Metrics::new()), "/validate", "create.json").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer.json["kind"], "AdmissionReview");
    assert_eq!(answer.response()["uid"], UID);
    assert_eq!(answer.response()["allowed"], true);
    assert!(answer.response().get("patch").is_none());
    assert!(answer.response().get("patchType").is_none());
    assert!(answer.response().get("status").is_none());
}

#[tokio::test]
async fn every_violation_is_denied_at_once_with_its_field() {
    let answer = post_fixture(&router(&Metrics::new()), "/validate", "create-invalid.json").await;
    assert_eq!(answer.status, 200);
    let response = answer.response();
    assert_eq!(response["uid"], "7f0c-invalid");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["reason"], "Invalid");
    assert_eq!(response["status"]["status"], "Failure");
    assert_eq!(
        response["status"]["message"],
        "Widget.example.com \"small\" is invalid: [spec.size: Invalid value: -1: must be greater \
         than or equal to 0, spec.tags[1]: Duplicate value: \"blue\"]"
    );
    assert_eq!(
        response["status"]["details"]["causes"],
        json!([
            {"reason": "FieldValueInvalid", "field": "spec.size",
             "message": "Invalid value: -1: must be greater than or equal to 0"},
            {"reason": "FieldValueDuplicate", "field": "spec.tags[1]",
             "message": "Duplicate value: \"blue\""},
        ])
    );
    assert_eq!(response["status"]["details"]["kind"], "Widget");
    assert_eq!(response["status"]["details"]["group"], "example.com");
    assert_eq!(response["status"]["details"]["name"], "small");
    assert!(
        response.get("patch").is_none(),
        "validating answers never patch"
    );
}

#[tokio::test]
async fn warnings_are_passed_through_on_an_allowed_request() {
    let answer = post_fixture(&router(&Metrics::new()), "/validate", "create-warning.json").await;
    assert_eq!(answer.response()["allowed"], true);
    assert_eq!(
        answer.response()["warnings"],
        json!(["spec.size is 0: the widget does nothing"])
    );
}

#[tokio::test]
async fn an_update_gives_the_rule_the_old_object() {
    let answer = post_fixture(&router(&Metrics::new()), "/validate", "update-shrink.json").await;
    let response = answer.response();
    assert_eq!(response["uid"], "7f0c-update");
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["status"]["details"]["causes"][0]["message"],
        "Forbidden: may not shrink"
    );
}

#[tokio::test]
async fn an_update_without_old_object_is_denied_as_a_bad_request() {
    let answer = post_fixture(
        &router(&Metrics::new()),
        "/validate",
        "update-without-old-object.json",
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.response()["uid"], "7f0c-update-no-old");
    assert_eq!(answer.response()["allowed"], false);
    assert_eq!(answer.response()["status"]["code"], 400);
    assert_eq!(
        answer.response()["status"]["message"],
        "request.oldObject is missing on UPDATE"
    );
}

#[tokio::test]
async fn a_create_without_object_is_denied_as_a_bad_request_on_both_routes() {
    let router = router(&Metrics::new());
    for path in ["/validate", "/mutate"] {
        let answer = post_fixture(&router, path, "create-without-object.json").await;
        assert_eq!(answer.response()["uid"], "7f0c-noobj", "{path}");
        assert_eq!(answer.response()["allowed"], false, "{path}");
        assert_eq!(answer.response()["status"]["code"], 400, "{path}");
        assert_eq!(
            answer.response()["status"]["message"],
            "request.object is missing on CREATE"
        );
    }
}

#[tokio::test]
async fn delete_and_connect_are_allowed_without_patch_on_both_routes() {
    let router = router(&Metrics::new());
    for (name, uid) in [
        ("delete.json", "7f0c-delete"),
        ("connect.json", "7f0c-connect"),
    ] {
        for path in ["/validate", "/mutate"] {
            let answer = post_fixture(&router, path, name).await;
            assert_eq!(answer.status, 200);
            assert_eq!(answer.response()["uid"], uid);
            assert_eq!(answer.response()["allowed"], true, "{name} {path}");
            assert!(answer.response().get("patch").is_none(), "{name} {path}");
            assert!(
                answer.response().get("patchType").is_none(),
                "{name} {path}"
            );
        }
    }
}

#[tokio::test]
async fn an_object_that_does_not_parse_is_admitted_unchanged_by_mutation() {
    // The API server validates against the schema after mutation, so the author gets the
    // schema's own message for the field.
    let router = router(&Metrics::new());
    let answer = post_fixture(&router, "/mutate", "create-bad-object.json").await;
    assert_eq!(answer.status, 200);
    let response = answer.response();
    assert_eq!(response["uid"], "7f0c-bad-object");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
}

#[tokio::test]
async fn an_object_that_does_not_parse_is_denied_by_validation_naming_the_field() {
    let router = router(&Metrics::new());
    for path in ["/validate"] {
        let answer = post_fixture(&router, path, "create-bad-object.json").await;
        assert_eq!(answer.status, 200, "{path}");
        let response = answer.response();
        assert_eq!(response["uid"], "7f0c-bad-object");
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 400);
        assert_eq!(response["status"]["reason"], "BadRequest");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(
                "request.object does not parse as Widget: spec.size: invalid type: string \"big\""
            ),
            "{path}: {message}"
        );
    }
}

#[tokio::test]
async fn a_panicking_rule_is_answered_with_the_uid_and_code_500() {
    let metrics = Metrics::new();
    let router = router(&metrics);
    for path in ["/validate", "/mutate"] {
        let answer = post_fixture(&router, path, "create-panic.json").await;
        assert_eq!(answer.status, 200, "{path}");
        let response = answer.response();
        assert_eq!(response["uid"], "7f0c-panic");
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 500);
        assert_eq!(
            response["status"]["message"],
            "admission rule panicked: the number of the beast"
        );
        assert!(response.get("patch").is_none());
    }
    assert_eq!(metrics.requests("/validate", Decision::Error, 500), 1);
    assert_eq!(metrics.requests("/mutate", Decision::Error, 500), 1);
}

#[tokio::test]
async fn the_mutating_patch_adds_defaults_and_creates_absent_parents() {
    let answer = post_fixture(&router(&Metrics::new()), "/mutate", "create.json").await;
    let response = answer.response();
    assert_eq!(response["uid"], UID);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    assert_eq!(
        answer.patch().unwrap(),
        json!([
            {"op": "add", "path": "/metadata/labels", "value": {MANAGED_LABEL: "true"}},
            {"op": "add", "path": "/spec/color", "value": "blue"},
            {"op": "add", "path": "/spec/tags/1", "value": "managed"},
        ])
    );
}

#[tokio::test]
async fn the_patch_applies_keeps_unknown_fields_and_a_second_run_is_empty() {
    let router = router(&Metrics::new());
    for name in [
        "create.json",
        "create-without-tags.json",
        "update-shrink.json",
    ] {
        let review = fixture_json(name);
        let object = &review["request"]["object"];
        let answer = post_fixture(&router, "/mutate", name).await;
        let patched = apply(object, &answer.patch().expect(name));
        assert_eq!(
            patched["spec"]["futureField"], object["spec"]["futureField"],
            "{name}"
        );
        assert_eq!(
            patched["metadata"]["annotations"], object["metadata"]["annotations"],
            "{name}"
        );
        assert_eq!(patched["spec"]["color"], "blue");

        let mut again = review.clone();
        again["request"]["object"] = patched;
        let second = call(&router, post("/mutate", again.to_string())).await;
        assert_eq!(second.response()["allowed"], true);
        assert!(
            second.response().get("patch").is_none(),
            "{name}: {:?}",
            second.json
        );
        assert!(second.response().get("patchType").is_none());
    }
}

#[tokio::test]
async fn a_complete_object_gets_no_patch() {
    let answer = post_fixture(&router(&Metrics::new()), "/mutate", "create-complete.json").await;
    assert_eq!(answer.response()["uid"], "7f0c-complete");
    assert_eq!(answer.response()["allowed"], true);
    assert!(
        answer.response().get("patch").is_none(),
        "{:?}",
        answer.json
    );
    assert!(answer.response().get("patchType").is_none());
}

#[tokio::test]
async fn dry_run_gets_the_same_answer() {
    let router = router(&Metrics::new());
    let wet = post_fixture(&router, "/mutate", "create.json").await;
    let dry = post_fixture(&router, "/mutate", "create-dry-run.json").await;
    assert_eq!(dry.response()["uid"], "7f0c-dry");
    assert_eq!(dry.patch(), wet.patch());
}

#[tokio::test]
async fn the_timeout_query_is_accepted() {
    let router = router(&Metrics::new());
    let answer = call(
        &router,
        post("/validate?timeout=10s", fixture("create.json")),
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.response()["allowed"], true);
}

async fn bad(router: &axum::Router, request: Request<Body>) -> (u16, Value) {
    let answer = call(router, request).await;
    let response = answer.response().clone();
    if answer.status != 405 {
        assert_eq!(response["allowed"], false, "{:?}", answer.json);
        assert_eq!(response["status"]["code"], answer.status);
    }
    (answer.status, response)
}

#[tokio::test]
async fn an_envelope_field_of_the_wrong_type_is_answered_with_the_uid() {
    let router = router(&Metrics::new());
    let review: Value = serde_json::from_slice(&fixture("create.json")).unwrap();
    type Breakage = (&'static str, fn(&mut Value));
    let breakages: [Breakage; 4] = [
        ("request.kind", |r| r["request"]["kind"] = json!("s")),
        ("request.name", |r| r["request"]["name"] = Value::Null),
        ("apiVersion", |r| r["apiVersion"] = json!(0)),
        ("request.dryRun", |r| r["request"]["dryRun"] = json!("yes")),
    ];
    for (field, break_it) in breakages {
        let mut broken = review.clone();
        break_it(&mut broken);
        for path in ["/validate", "/mutate"] {
            let body = serde_json::to_vec(&broken).unwrap();
            let (status, response) = bad(&router, post(path, body)).await;
            assert_eq!(status, 400, "{field} on {path}");
            assert_eq!(
                response["uid"], review["request"]["uid"],
                "{field} on {path}: {response}"
            );
        }
    }
}

#[tokio::test]
async fn user_input_echoed_in_messages_is_cut_and_says_how_long_it_was() {
    let router = router(&Metrics::new());
    let huge = "n".repeat(1 << 20);
    let cut = "…\" (1048576 bytes)";
    // The object's name in a denial: cut in the message, left out of the details.
    let mut review = fixture_json("create-invalid.json");
    review["request"]["name"] = json!(huge);
    let answer = call(&router, post("/validate", review.to_string())).await;
    let status = &answer.response()["status"];
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("…\" (1048576 bytes) is invalid: ["),
        "{message}"
    );
    assert!(message.len() < 1024, "{} bytes", message.len());
    assert!(status["details"].get("name").is_none(), "{status}");
    assert_eq!(status["details"]["causes"].as_array().unwrap().len(), 2);
    // A wrongly typed field whose value serde would quote whole.
    let mut review = fixture_json("create.json");
    review["request"]["object"]["spec"]["size"] = json!(huge);
    let answer = call(&router, post("/validate", review.to_string())).await;
    let message = answer.response()["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "request.object does not parse as Widget: spec.size: invalid type: string \"nnn"
        ),
        "{}",
        &message[..200]
    );
    assert!(
        message.ends_with("cut)") && message.len() < 1200,
        "{} bytes",
        message.len()
    );
    // Envelope values in HTTP 400 answers.
    let mut review = fixture_json("create.json");
    review["request"]["operation"] = json!(huge);
    let (status, response) = bad(&router, post("/validate", review.to_string())).await;
    assert_eq!(status, 400);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("unsupported operation \"nnn") && message.contains(cut),
        "{}",
        &message[..100]
    );
    assert!(message.len() < 1024);
}

#[tokio::test]
async fn bad_envelopes_get_a_precise_4xx() {
    let metrics = Metrics::new();
    let router = router(&metrics);
    let (status, response) = bad(&router, post("/validate", "{not json")).await;
    assert_eq!(status, 400);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("failed to parse AdmissionReview: key must be a string"),
        "{response}"
    );

    let (status, response) = bad(&router, post("/validate", "")).await;
    assert_eq!(status, 400);
    assert_eq!(response["status"]["message"], "request body is empty");

    let (status, response) = bad(&router, post("/validate", fixture("missing-request.json"))).await;
    assert_eq!(status, 400);
    assert_eq!(
        response["status"]["message"],
        "AdmissionReview has no request"
    );

    let (status, response) = bad(&router, post("/mutate", fixture("wrong-kind.json"))).await;
    assert_eq!(status, 400);
    assert_eq!(
        response["uid"], "7f0c-kind",
        "the uid is echoed when readable"
    );
    assert_eq!(
        response["status"]["message"],
        "unsupported kind \"Widget\", expected \"AdmissionReview\""
    );

    let (status, response) = bad(&router, post("/mutate", fixture("wrong-api-version.json"))).await;
    assert_eq!(status, 400);
    assert_eq!(
        response["status"]["message"],
        "unsupported AdmissionReview apiVersion \"admission.k8s.io/v1beta1\", expected \
         \"admission.k8s.io/v1\""
    );

    let no_uid = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "request": {"operation": "CREATE", "object": {}}});
    let (status, response) = bad(&router, post("/validate", no_uid.to_string())).await;
    assert_eq!(status, 400);
    assert_eq!(response["status"]["message"], "request.uid is missing");

    let mut odd = fixture_json("create.json");
    odd["request"]["operation"] = json!("PATCH");
    let (status, response) = bad(&router, post("/validate", odd.to_string())).await;
    assert_eq!(status, 400);
    assert_eq!(
        response["status"]["message"],
        "unsupported operation \"PATCH\", expected CREATE, UPDATE, DELETE or CONNECT"
    );

    assert_eq!(metrics.requests("/validate", Decision::Error, 400), 5);
    assert_eq!(metrics.requests("/mutate", Decision::Error, 400), 2);
}

#[tokio::test]
async fn a_wrong_content_type_gets_415() {
    let router = router(&Metrics::new());
    for content_type in [Some("text/plain"), Some("application/yaml"), None] {
        let mut request = Request::post("/validate");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let (status, response) = bad(
            &router,
            request.body(fixture("create.json").into()).unwrap(),
        )
        .await;
        assert_eq!(status, 415, "{content_type:?}");
        assert!(
            response["status"]["message"]
                .as_str()
                .unwrap()
                .ends_with("expected application/json"),
            "{response}"
        );
    }
    let charset = Request::post("/validate")
        .header("content-type", "application/json; charset=utf-8")
        .body(Body::from(fixture("create.json")))
        .unwrap();
    assert_eq!(call(&router, charset).await.status, 200);
}

#[tokio::test]
async fn methods_other_than_post_get_405() {
    let router = router(&Metrics::new());
    for method in ["GET", "PUT", "DELETE"] {
        let request = Request::builder()
            .method(method)
            .uri("/validate")
            .body(Body::empty())
            .unwrap();
        let answer = call(&router, request).await;
        assert_eq!(answer.status, 405, "{method}");
        assert_eq!(answer.headers["allow"], "POST");
    }
}

#[tokio::test]
async fn a_streamed_body_over_the_limit_gets_413() {
    // No Content-Length: the limit has to be found while reading.
    let chunk = vec![b' '; 1024 * 1024];
    let chunks = (0..8).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
    let body = Body::from_stream(futures::stream::iter(chunks));
    let (status, response) = bad(&router(&Metrics::new()), post("/validate", body)).await;
    assert_eq!(status, 413);
    assert_eq!(
        response["status"]["message"],
        "request entity is too large; limit is 7340032 bytes"
    );
}

#[tokio::test]
async fn metrics_count_requests_by_path_decision_and_code() {
    let metrics = Metrics::new();
    let router = router(&metrics);
    post_fixture(&router, "/validate", "create.json").await;
    post_fixture(&router, "/validate", "create.json").await;
    post_fixture(&router, "/validate", "create-invalid.json").await;
    post_fixture(&router, "/mutate", "create.json").await;
    post_fixture(&router, "/mutate", "create-complete.json").await;
    assert_eq!(metrics.requests("/validate", Decision::Allowed, 200), 2);
    assert_eq!(metrics.requests("/validate", Decision::Denied, 422), 1);
    assert_eq!(metrics.requests("/mutate", Decision::Patched, 200), 1);
    assert_eq!(metrics.requests("/mutate", Decision::Allowed, 200), 1);

    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(
            "webhook_requests_total{path=\"/validate\",decision=\"denied\",code=\"422\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("webhook_request_duration_seconds_count{path=\"/mutate\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("webhook_certificate_expiry_timestamp_seconds"),
        "{text}"
    );
}
