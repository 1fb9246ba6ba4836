//! The MyApp admission rules through the webhook router, in-process: the examples, the patch,
//! and properties tying the webhook to the CRD schema and its CEL rules.

use std::{path::Path, sync::OnceLock};

use crate::support::runtime;
use axum::{Router, body::Body, http::Request};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use kube::CustomResourceExt;
use kube_sandbox::schema::CrdSchema;
use myapp_operator::{
    admission::{self, AdmissionConfig, Limits, MUTATE_PATH, VALIDATE_PATH},
    crd::{EnvVar, MAX_ENV, MAX_ENV_VALUE_LEN, MyApp, MyAppSpec},
    shard::{Ring, SHARD_LABEL, view::ShardView},
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt as _;

fn schema() -> &'static CrdSchema {
    static SCHEMA: OnceLock<CrdSchema> = OnceLock::new();
    SCHEMA.get_or_init(|| CrdSchema::from_crd(&MyApp::crd(), "v1").unwrap())
}

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

fn review(operation: &str, object: &Value, old: Option<&Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3f1b7d2c-0000-4000-8000-000000000001",
            "kind": {"group": "example.com", "version": "v1", "kind": "MyApp"},
            "resource": {"group": "example.com", "version": "v1", "resource": "myapps"},
            "name": object["metadata"]["name"],
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

/// The `response` of an answer from `router`.
fn call(router: &Router, path: &str, review: &Value) -> Value {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(review.to_string()))
        .unwrap();
    runtime().block_on(async {
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            answer["response"]["uid"],
            "3f1b7d2c-0000-4000-8000-000000000001"
        );
        answer["response"].clone()
    })
}

fn patch_of(response: &Value) -> Option<Value> {
    let encoded = response.get("patch")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    Some(serde_json::from_slice(&bytes).unwrap())
}

fn apply(object: &Value, patch: &Value) -> Value {
    let mut object = object.clone();
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    object
}

fn example(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/examples")
        .join(name);
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn each_invalid_example_is_denied_naming_the_field() {
    let router = admission::router(config());
    for (name, field) in [
        ("invalid-replicas-negative.yaml", "spec.replicas"),
        ("invalid-port-zero.yaml", "spec.port"),
        ("invalid-port-too-large.yaml", "spec.port"),
        ("invalid-image-empty.yaml", "spec.image"),
        ("invalid-image-not-a-reference.yaml", "spec.image"),
        ("invalid-image-digest-wrong-length.yaml", "spec.image"),
        ("invalid-env-duplicate-name.yaml", "spec.env[1].name"),
        ("invalid-env-bad-name.yaml", "spec.env[0].name"),
        ("invalid-name-not-dns-label.yaml", "metadata.name"),
    ] {
        let response = call(
            &router,
            VALIDATE_PATH,
            &review("CREATE", &example(name), None),
        );
        assert_eq!(response["allowed"], false, "{name}");
        assert_eq!(response["status"]["code"], 422, "{name}");
        assert_eq!(response["status"]["reason"], "Invalid", "{name}");
        assert_eq!(
            response["status"]["details"]["causes"][0]["field"], field,
            "{name}: {response}"
        );
        assert!(
            response["status"]["message"]
                .as_str()
                .unwrap()
                .starts_with("MyApp.example.com \""),
            "{name}: {response}"
        );
    }
}

#[test]
fn an_env_list_far_over_the_limit_is_denied_with_its_count_and_left_unpatched() {
    let router = admission::router(config());
    let mut app = example("myapp.yaml");
    let env: Vec<Value> = (0..100_000)
        .map(|i| json!({"name": format!("E{i}"), "value": "x"}))
        .collect();
    app["spec"]["env"] = json!(env);
    app["spec"]["port"] = json!(0);
    app["metadata"]["name"] = json!("w".repeat(100_000));
    let response = call(&router, VALIDATE_PATH, &review("CREATE", &app, None));
    assert_eq!(response["allowed"], false);
    let causes: Vec<(&str, &str)> = response["status"]["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["field"].as_str().unwrap(), c["message"].as_str().unwrap()))
        .collect();
    assert_eq!(causes.len(), 3, "{causes:?}");
    assert_eq!(causes[0].0, "metadata.name");
    assert!(
        causes[0].1.contains("…\" (100000 bytes)"),
        "{}",
        causes[0].1
    );
    assert_eq!(causes[1].0, "spec.port");
    assert_eq!(
        causes[2],
        ("spec.env", "Too many: 100000: must have at most 64 items")
    );
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.len() < 2048,
        "the name is echoed cut: {} bytes",
        message.len()
    );
    // The mutating route admits it unchanged: no defaults appended to a list that is refused.
    let response = call(&router, MUTATE_PATH, &review("CREATE", &app, None));
    assert_eq!(response["allowed"], true);
    assert!(patch_of(&response).is_none(), "{response}");
}

#[test]
fn the_valid_examples_are_allowed_and_a_latest_image_draws_a_warning() {
    let router = admission::router(config());
    for name in ["myapp.yaml", "myapp-autoscaled.yaml"] {
        let response = call(
            &router,
            VALIDATE_PATH,
            &review("CREATE", &example(name), None),
        );
        assert_eq!(response["allowed"], true, "{name}: {response}");
    }
    let mut latest = example("myapp.yaml");
    latest["spec"]["image"] = json!("nginx:latest");
    let response = call(&router, VALIDATE_PATH, &review("CREATE", &latest, None));
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"],
        json!(["spec.image uses :latest; pin a version or digest"])
    );
}

#[test]
fn the_configured_maximum_applies_and_ratchets_on_unchanged_updates() {
    let router = admission::router(config());
    let mut app = example("myapp.yaml");
    app["spec"]["replicas"] = json!(101);
    let create = call(&router, VALIDATE_PATH, &review("CREATE", &app, None));
    assert_eq!(create["allowed"], false);
    let mut relabelled = app.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let update = call(
        &router,
        VALIDATE_PATH,
        &review("UPDATE", &relabelled, Some(&app)),
    );
    assert_eq!(update["allowed"], true, "{update}");
    assert_eq!(update["warnings"].as_array().unwrap().len(), 1);
}

#[test]
fn mutation_appends_env_defaults_without_touching_user_names() {
    let router = admission::router(config());
    let mut app = example("myapp.yaml");
    app["spec"]["env"] = json!([{"name": "REGION", "value": "us-2"}]);
    let response = call(&router, MUTATE_PATH, &review("CREATE", &app, None));
    assert_eq!(response["patchType"], "JSONPatch");
    assert_eq!(
        patch_of(&response).unwrap(),
        json!([{"op": "add", "path": "/spec/env/1", "value": {"name": "LOG_LEVEL", "value": "info"}}])
    );

    let mut bare = example("myapp.yaml");
    bare["spec"].as_object_mut().unwrap().remove("env");
    let response = call(&router, MUTATE_PATH, &review("CREATE", &bare, None));
    assert_eq!(
        patch_of(&response).unwrap(),
        json!([{"op": "add", "path": "/spec/env", "value": [
            {"name": "LOG_LEVEL", "value": "info"}, {"name": "REGION", "value": "eu-1"}]}])
    );

    let without_defaults = admission::router(AdmissionConfig::default());
    let response = call(
        &without_defaults,
        MUTATE_PATH,
        &review("CREATE", &bare, None),
    );
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
}

#[test]
fn with_sharding_a_created_myapp_gets_its_shard_from_the_ring_beside_its_own_labels() {
    let shards = ["pod-a", "pod-b", "pod-c"];
    let router = admission::router(AdmissionConfig {
        shards: Some(ShardView::from(Ring::new(shards))),
        ..config()
    });
    let ring = Ring::new(shards);
    let mut bare = example("myapp.yaml");
    bare["spec"]["env"] =
        json!([{"name": "LOG_LEVEL", "value": "debug"}, {"name": "REGION", "value": "x"}]);
    bare["metadata"].as_object_mut().unwrap().remove("labels");
    let name = bare["metadata"]["name"].as_str().unwrap().to_owned();
    let shard = ring.shard_for("default", &name).unwrap();

    // Without labels: the label map is added with the shard in it.
    let response = call(&router, MUTATE_PATH, &review("CREATE", &bare, None));
    assert_eq!(
        patch_of(&response).unwrap(),
        json!([{"op": "add", "path": "/metadata/labels", "value": {SHARD_LABEL: shard}}])
    );
    // With labels of its own: the shard is added beside them.
    let mut labelled = bare.clone();
    labelled["metadata"]["labels"] = json!({"team": "shop"});
    let response = call(&router, MUTATE_PATH, &review("CREATE", &labelled, None));
    let stamped = apply(&labelled, &patch_of(&response).unwrap());
    assert_eq!(
        stamped["metadata"]["labels"],
        json!({"team": "shop", SHARD_LABEL: shard})
    );
    // Already on a shard (the user's or the sharder's choice): left as it is.
    let mut placed = labelled.clone();
    placed["metadata"]["labels"][SHARD_LABEL] = json!("pod-z");
    let response = call(&router, MUTATE_PATH, &review("CREATE", &placed, None));
    assert!(patch_of(&response).is_none(), "{response}");
    // An update is never stamped: a MyApp without a label may have just been let go, and
    // where it goes is the sharder's to say.
    let response = call(&router, MUTATE_PATH, &review("UPDATE", &bare, Some(&bare)));
    assert!(patch_of(&response).is_none(), "{response}");
    // Nor a create under generateName (no name to hash yet), nor before the ring is known.
    let mut generated = bare.clone();
    generated["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("name");
    generated["metadata"]["generateName"] = json!("web-");
    let mut request = review("CREATE", &generated, None);
    request["request"]["name"] = json!("");
    let response = call(&router, MUTATE_PATH, &request);
    assert!(patch_of(&response).is_none(), "{response}");
    let unknown = admission::router(AdmissionConfig {
        shards: Some(ShardView::default()),
        ..config()
    });
    let response = call(&unknown, MUTATE_PATH, &review("CREATE", &bare, None));
    assert!(patch_of(&response).is_none(), "{response}");
}

// === Properties ===

fn image() -> impl Strategy<Value = String> {
    let hex = "[0-9a-f]{60,66}";
    prop_oneof![
        // Plausible references, with and without registry, tag and digest.
        (
            prop::option::of(prop_oneof![
                Just("ghcr.io".to_owned()),
                Just("localhost:5000".to_owned()),
                "[a-zA-Z0-9-]{1,6}\\.[a-z]{2,3}(:[0-9]{1,5})?",
            ]),
            "[a-z0-9]{1,5}(([._]|__|-{1,2})[a-z0-9]{1,4})?(/[a-z0-9]{1,5})?",
            prop::option::of("[a-zA-Z0-9_][a-zA-Z0-9._-]{0,8}"),
            prop::option::of(hex.prop_map(|h| format!("sha256:{h}"))),
        )
            .prop_map(|(domain, path, tag, digest)| {
                let mut image = domain.map(|d| format!("{d}/")).unwrap_or_default();
                image.push_str(&path);
                if let Some(tag) = tag {
                    image = format!("{image}:{tag}");
                }
                if let Some(digest) = digest {
                    image = format!("{image}@{digest}");
                }
                image
            }),
        // Anything made of the characters references use.
        "[a-zA-Z0-9:/@._-]{0,24}",
        Just(String::new()),
        Just(format!("r.io/{}", "a".repeat(300))),
    ]
}

// === Image references from the reference grammar ===

/// What a registry host can be: DNS names (upper-case included, which makes the first component
/// a host), `localhost`, IPv6 literals (valid ones, full and compressed, and hex-and-colon
/// strings that are not addresses), and near misses of each.
fn host() -> impl Strategy<Value = String> {
    let ipv6 = prop_oneof![
        any::<[u16; 8]>().prop_map(|a| std::net::Ipv6Addr::from(a).to_string()),
        any::<[u16; 8]>().prop_map(|a| a.map(|x| format!("{x:X}")).join(":")),
        Just("::1".to_owned()),
        Just("::".to_owned()),
        "[0-9a-fA-F:]{1,10}",
        Just("::ffff:1.2.3.4".to_owned()),
    ];
    prop_oneof![
        Just("localhost".to_owned()),
        "[a-z0-9]{1,3}([.][a-z0-9]{1,3}){0,2}",
        "[a-zA-Z0-9][a-zA-Z0-9-]{0,3}([.][a-zA-Z0-9-]{1,4}){0,2}",
        "[a-zA-Z0-9_.-]{1,6}",
        ipv6.clone().prop_map(|a| format!("[{a}]")),
        ipv6.prop_map(|a| format!("[{a}")),
        "[\\[][0-9a-fA-Fg:.]{0,6}[\\]]",
    ]
}

/// A path component: as the grammar has it, or of its alphabet with upper case and edge
/// separators.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9]{1,4}(([._]|__|-{1,3})[a-z0-9]{1,4}){0,2}",
        1 => "[a-zA-Z0-9._-]{0,5}",
    ]
}

/// An algorithm's digest, right or wrong by a little.
fn digest() -> impl Strategy<Value = String> {
    let hex = |len: std::ops::RangeInclusive<usize>| {
        prop::collection::vec(prop::sample::select(b"0123456789abcdef".to_vec()), len)
            .prop_map(|b| String::from_utf8(b).unwrap())
    };
    prop_oneof![
        hex(63..=65).prop_map(|h| format!("sha256:{h}")),
        hex(64..=64).prop_map(|h| format!("sha256:{}", h.to_uppercase())),
        hex(127..=129).prop_map(|h| format!("sha512:{h}")),
        hex(96..=96).prop_map(|h| format!("sha384:{h}")),
        (
            "[a-z0-9]{1,6}([+._-][a-z0-9]{1,4})?",
            "[a-zA-Z0-9=_-]{30,34}"
        )
            .prop_map(|(algorithm, encoded)| format!("{algorithm}:{encoded}")),
        "[a-zA-Z0-9+._:-]{0,12}",
    ]
}

/// `[host[:port]/]path[:tag][@digest]`, each part from the grammar or just off it, and
/// references at the length limits (a 255-character name, 512 characters in all).
fn reference() -> impl Strategy<Value = String> {
    let port = prop_oneof!["[0-9]{1,5}", Just(String::new()), "[a-z0-9]{1,3}"];
    let tag = prop_oneof![
        4 => "[a-zA-Z0-9_][a-zA-Z0-9._-]{0,10}",
        1 => "[a-zA-Z0-9._-]{0,4}",
        1 => (126usize..=129).prop_map(|n| "t".repeat(n)),
    ];
    let parts = (
        prop::option::of((host(), prop::option::of(port))),
        prop::collection::vec(component(), 1..4),
        prop::option::of(tag),
        prop::option::of(digest()),
    )
        .prop_map(|(host, path, tag, digest)| {
            let mut image = String::new();
            if let Some((host, port)) = host {
                image.push_str(&host);
                if let Some(port) = port {
                    image = format!("{image}:{port}");
                }
                image.push('/');
            }
            image.push_str(&path.join("/"));
            if let Some(tag) = tag {
                image = format!("{image}:{tag}");
            }
            if let Some(digest) = digest {
                image = format!("{image}@{digest}");
            }
            image
        });
    let long = (
        245usize..=260,
        prop::option::of(100usize..=128),
        any::<bool>(),
    )
        .prop_map(|(name, tag, digest)| {
            let mut image = format!("r.io/{}", "a".repeat(name - 5));
            if let Some(tag) = tag {
                image = format!("{image}:{}", "t".repeat(tag));
            }
            if digest {
                image = format!("{image}@sha512:{}", "0".repeat(128));
            }
            image
        });
    prop_oneof![8 => parts, 1 => long]
}

/// Why the webhook may refuse what the schema admits: its own rules, as the table in the
/// module documentation of `src/admission.rs` lists them.
const WEBHOOK_ONLY: &[&str] = &[
    "the repository name may be at most 255 characters",
    "sha256 needs 64 and sha512 128 lower-case hex digits",
    "is not an IPv6 address",
];

/// The schema's and its CEL rule's verdict on `image`, then the webhook's: the messages about
/// `spec.image`, none when admitted.
fn verdicts(image: &str) -> (Vec<String>, Vec<String>) {
    let object = json!({
        "apiVersion": "example.com/v1",
        "kind": "MyApp",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"image": image, "port": 8080},
    });
    let schema = schema()
        .validate(&object, None)
        .into_iter()
        .filter(|e| e.field == "spec.image")
        .map(|e| e.message)
        .collect();
    let spec = MyAppSpec {
        replicas: None,
        image: image.to_owned(),
        port: 8080,
        env: Vec::new(),
    };
    let webhook = admission::validate(&spec, None, &Limits::default())
        .violations
        .into_iter()
        .filter(|v| v.field == "spec.image")
        .map(|v| v.message)
        .collect();
    (schema, webhook)
}

/// Whether the two verdicts agree: both admit, both refuse, or only the webhook refuses, for
/// one of its own rules.
fn agree(image: &str) -> Result<(), String> {
    match verdicts(image) {
        (schema, webhook) if schema.is_empty() == webhook.is_empty() => Ok(()),
        (schema, _) if !schema.is_empty() => Err(format!(
            "{image:?}: the schema refuses ({schema:?}) what the webhook admits"
        )),
        (_, webhook)
            if webhook
                .iter()
                .all(|m| WEBHOOK_ONLY.iter().any(|r| m.contains(r))) =>
        {
            Ok(())
        }
        (_, webhook) => Err(format!(
            "{image:?}: the webhook refuses ({webhook:?}) what the schema admits, for a rule \
             the schema has too"
        )),
    }
}

#[test]
fn the_schema_and_the_webhook_agree_on_these_image_references() {
    let digest = "0123456789abcdef".repeat(4);
    for (image, schema_admits, webhook_admits) in [
        ("[::1]:5000/app:1", true, true),
        ("[2001:db8::5]/team/app@sha256:", false, false),
        ("[2001:DB8::5]:443/team/app", true, true),
        ("[:]/app", true, false),
        ("[::ffff:1.2.3.4]/app", false, false),
        ("[ab]/app", false, false),
        ("[::1]", false, false),
        ("a.b_c/app", false, false),
        ("a_b/app", true, true),
        ("Registry/app", true, true),
        ("Reg_istry/app", false, false),
        ("localhost:5000/app", true, true),
        (&format!("app@sha256:{digest}"), true, true),
        (
            &format!("app@sha256:{}", digest.to_uppercase()),
            true,
            false,
        ),
        (&format!("app@sha384:{digest}"), true, true),
        (&format!("r.io/{}", "a".repeat(250)), true, true),
        (&format!("r.io/{}", "a".repeat(251)), true, false),
    ] {
        let (schema, webhook) = verdicts(image);
        assert_eq!(schema.is_empty(), schema_admits, "{image}: {schema:?}");
        assert_eq!(webhook.is_empty(), webhook_admits, "{image}: {webhook:?}");
        agree(image).unwrap();
    }
}

fn env_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Z_][A-Z0-9_]{0,6}",
        "[-._a-zA-Z0-9]{0,5}",
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("..x".to_owned()),
        Just("DUP".to_owned()),
        Just("N".repeat(129)),
    ]
}

fn env_list() -> impl Strategy<Value = Option<Vec<Value>>> {
    let entry = (
        env_name(),
        prop_oneof![
            4 => "[a-z]{0,4}",
            1 => Just("v".repeat(MAX_ENV_VALUE_LEN + 1)),
            1 => Just("é".repeat(MAX_ENV_VALUE_LEN / 2 + 1)),
        ],
    )
        .prop_map(|(name, value)| json!({"name": name, "value": value}));
    prop::option::of(prop_oneof![
        4 => prop::collection::vec(entry, 0..5),
        1 => (MAX_ENV - 1..=MAX_ENV + 1).prop_map(|n| {
            (0..n).map(|i| json!({"name": format!("E{i}"), "value": ""})).collect()
        }),
    ])
}

fn myapp() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            "[a-z][a-z0-9-]{0,8}[a-z0-9]",
            "[a-zA-Z0-9.-]{1,10}",
            Just("a".repeat(64)),
        ],
        prop::option::of(prop_oneof![
            -3i64..4,
            98i64..103,
            997i64..1003,
            Just(1i64 << 40)
        ]),
        image(),
        prop_oneof![-2i64..3, 65533i64..65538, Just(8080i64)],
        env_list(),
        any::<bool>(),
    )
        .prop_map(|(name, replicas, image, port, env, extra)| {
            let mut spec = json!({"image": image, "port": port});
            if let Some(replicas) = replicas {
                spec["replicas"] = json!(replicas);
            }
            if let Some(env) = env {
                spec["env"] = Value::from(env);
            }
            if extra {
                spec["unknownToTheSchema"] = json!({"kept": [1, "two"]});
            }
            json!({
                "apiVersion": "example.com/v1",
                "kind": "MyApp",
                "metadata": {"name": name, "namespace": "default",
                             "annotations": {"note": "untouched"}},
                "spec": spec,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// The CRD's image rule, evaluated by the sandbox's CEL interpreter, and the webhook's image
    /// grammar admit the same references; the webhook refuses more only for its own rules.
    #[test]
    fn the_schema_and_the_webhook_admit_the_same_image_references(image in reference()) {
        prop_assert_eq!(agree(&image), Ok(()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Empty names are not generated: the API server either generates the name (generateName)
    /// or refuses the request before the schema or any webhook sees it.
    #[test]
    fn whatever_the_crd_schema_or_cel_rejects_the_webhook_denies(object in myapp()) {
        // The API server prunes and defaults before admission, then validates after.
        let mut admitted = object.clone();
        schema().prune(&mut admitted);
        schema().apply_defaults(&mut admitted);
        let schema_errors = schema().validate(&admitted, None);
        let router = admission::router(AdmissionConfig::default());
        let response = call(&router, VALIDATE_PATH, &review("CREATE", &admitted, None));
        if !schema_errors.is_empty() {
            prop_assert_eq!(
                &response["allowed"], &json!(false),
                "schema rejects {:?} but the webhook allowed {}", schema_errors, admitted
            );
        }
    }

    #[test]
    fn mutation_patches_apply_keep_unknown_fields_are_idempotent_and_never_invalidate(
        object in myapp()
    ) {
        let router = admission::router(config());
        let response = call(&router, MUTATE_PATH, &review("CREATE", &object, None));
        // Mutation refuses nothing: a spec that does not parse is left to the schema.
        prop_assert_eq!(&response["allowed"], &json!(true), "{}", response);
        let patched = match patch_of(&response) {
            Some(patch) => apply(&object, &patch),
            None => object.clone(),
        };
        prop_assert_eq!(&patched["metadata"], &object["metadata"]);
        prop_assert_eq!(
            patched["spec"].get("unknownToTheSchema"), object["spec"].get("unknownToTheSchema")
        );
        let again = call(&router, MUTATE_PATH, &review("UPDATE", &patched, Some(&object)));
        prop_assert!(again.get("patch").is_none(), "second run patched {:?}", patch_of(&again));

        let before = call(&router, VALIDATE_PATH, &review("CREATE", &object, None));
        if before["allowed"] == json!(true) {
            let after = call(&router, VALIDATE_PATH, &review("CREATE", &patched, None));
            prop_assert_eq!(&after["allowed"], &json!(true), "{}", after);
        }
    }

    #[test]
    fn validate_of_default_never_denies_a_spec_that_validates(
        replicas in prop::option::of(-1i32..5),
        names in prop::collection::vec("[A-C]{1,2}", 0..6),
        defaults in prop::collection::vec(("[A-D]{1,2}", "[a-z]{0,3}"), 0..5),
    ) {
        let spec = MyAppSpec {
            replicas,
            image: "ghcr.io/example/web:1.4.2".to_owned(),
            port: 8080,
            env: names.iter().map(|n| EnvVar { name: n.clone(), value: String::new() }).collect(),
        };
        let defaults: Vec<EnvVar> = defaults
            .into_iter()
            .map(|(name, value)| admission::parse_default_env(&format!("{name}={value}")).unwrap())
            .collect();
        let limits = Limits::default();
        if admission::validate(&spec, None, &limits).violations.is_empty() {
            let mut defaulted = spec.clone();
            admission::default(&mut defaulted, &defaults);
            prop_assert!(admission::validate(&defaulted, None, &limits).violations.is_empty());
            let mut twice = defaulted.clone();
            admission::default(&mut twice, &defaults);
            prop_assert_eq!(twice, defaulted);
        }
    }
}
