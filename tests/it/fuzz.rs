//! A structure-aware fuzz target for the review path: valid reviews, mutated where it hurts
//! (wrong types, removed fields, long strings, deep nesting, long lists, edge numbers, on any
//! node of the envelope or the object), sent through the operator's webhook routes. Every answer
//! must be a well-formed `AdmissionReview` with the uid whenever it was readable, never an
//! internal error.
//!
//! `cargo test` runs a fixed number of cases from a fixed seed, so a failure reproduces. The
//! longer run for release checks (see the webhook README, "Fuzzing"):
//!
//! ```text
//! MYAPP_FUZZ_CASES=200000 MYAPP_FUZZ_SEED=$RANDOM cargo test --release --test it fuzz
//! ```
//!
//! A failing input is written to a temporary file whose path the failure names; once fixed, it
//! goes into `tests/it/fuzz-corpus/`, which every run replays first.

use std::{path::Path, sync::OnceLock};

use crate::support::runtime;
use axum::{Router, body::Body, http::Request};
use http_body_util::BodyExt as _;
use myapp_operator::admission::{self, AdmissionConfig, MUTATE_PATH, SCALE_PATH, VALIDATE_PATH};
use proptest::{
    prelude::*,
    test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
};
use serde_json::{Value, json};
use tower::ServiceExt as _;

const DEFAULT_CASES: u32 = 256;
const DEFAULT_SEED: u64 = 0x6d79_6170_705f_667a;
const UID: &str = "fuzz-0000-4000-8000-000000000001";

fn router() -> &'static Router {
    static ROUTER: OnceLock<Router> = OnceLock::new();
    ROUTER.get_or_init(|| {
        admission::router(AdmissionConfig {
            max_replicas: 10,
            default_env: vec![admission::parse_default_env("TEAM=shop").unwrap()],
            // Sharding on, so that hostile labels meet the shard label's reader too.
            shards: Some(myapp_operator::shard::view::ShardView::from(
                myapp_operator::shard::Ring::new(["pod-a", "pod-b"]),
            )),
        })
    })
}

fn myapp(replicas: i64) -> Value {
    json!({
        "apiVersion": "example.com/v1",
        "kind": "MyApp",
        "metadata": {"name": "web", "namespace": "default", "labels": {"team": "shop"}},
        "spec": {
            "replicas": replicas,
            "image": "ghcr.io/example/web:1.4.2",
            "port": 8080,
            "env": [{"name": "LOG_LEVEL", "value": "info"}],
        },
    })
}

fn scale(replicas: i64) -> Value {
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas},
        "status": {"replicas": 3, "selector": "app=web"},
    })
}

fn review(kind: Value, operation: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID,
            "kind": kind,
            "resource": {"group": "example.com", "version": "v1", "resource": "myapps"},
            "name": "web",
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

/// The valid reviews the fuzzer starts from, with the route each goes to.
fn seeds() -> Vec<(&'static str, Value)> {
    let myapp_kind = json!({"group": "example.com", "version": "v1", "kind": "MyApp"});
    let scale_kind = json!({"group": "autoscaling", "version": "v1", "kind": "Scale"});
    let mut scale_review = review(scale_kind, "UPDATE", scale(4), scale(3));
    scale_review["request"]["subResource"] = json!("scale");
    vec![
        (
            VALIDATE_PATH,
            review(myapp_kind.clone(), "CREATE", myapp(3), Value::Null),
        ),
        (
            VALIDATE_PATH,
            review(myapp_kind.clone(), "UPDATE", myapp(3), myapp(2)),
        ),
        (
            MUTATE_PATH,
            review(myapp_kind.clone(), "CREATE", myapp(3), Value::Null),
        ),
        (
            MUTATE_PATH,
            review(myapp_kind, "UPDATE", myapp(3), myapp(3)),
        ),
        (SCALE_PATH, scale_review),
    ]
}

/// What to do at one node of a review.
#[derive(Clone, Debug)]
enum Mutation {
    Replace(Value),
    Remove,
    LongString(usize),
    Nest(usize),
    Repeat(usize),
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![
            Just(json!(i64::MIN)),
            Just(json!(u64::MAX)),
            Just(json!(-1)),
            Just(json!(0)),
            Just(json!(1e308)),
            Just(json!(0.5)),
            Just(json!(1001)),
            Just(json!(2147483648_i64)),
            any::<i64>().prop_map(Value::from),
        ],
        "(\\PC|[\u{0}-\u{1f}\u{feff}]){0,12}".prop_map(Value::from),
        Just(json!("sha256:")),
        Just(json!("a@sha256:0")),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => any_json().prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        1 => (0usize..100_000).prop_map(Mutation::LongString),
        1 => (1usize..300).prop_map(Mutation::Nest),
        1 => (0usize..3_000).prop_map(Mutation::Repeat),
    ]
}

/// Every JSON Pointer into `value`, the root included.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let escaped = key.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{at}/{escaped}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

fn mutate(review: &mut Value, selector: usize, mutation: &Mutation) {
    let mut all = Vec::new();
    pointers(review, String::new(), &mut all);
    let pointer = &all[selector % all.len()];
    if let Mutation::Remove = mutation {
        if let Some((parent, key)) = pointer.rsplit_once('/')
            && let Some(parent) = review.pointer_mut(parent)
        {
            let key = key.replace("~1", "/").replace("~0", "~");
            match parent {
                Value::Object(map) => drop(map.remove(&key)),
                Value::Array(items) => {
                    if let Ok(i) = key.parse::<usize>() {
                        items.remove(i);
                    }
                }
                _ => {}
            }
        }
        return;
    }
    let Some(node) = review.pointer_mut(pointer) else {
        return;
    };
    *node = match mutation {
        Mutation::Replace(value) => value.clone(),
        Mutation::LongString(len) => Value::from("x".repeat(*len)),
        Mutation::Nest(depth) => (0..*depth).fold(node.take(), |inner, _| json!([inner])),
        Mutation::Repeat(count) => Value::Array(vec![node.take(); *count]),
        Mutation::Remove => unreachable!("handled above"),
    };
}

/// Posts `body` to `path` and checks the answer; `Err` says what is wrong with it.
fn check(path: &str, body: Vec<u8>) -> Result<(), String> {
    // The uid is readable when the body is JSON with a string at request.uid.
    let readable_uid = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/request/uid")?.as_str().map(str::to_owned));
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let (status, answer) = runtime().block_on(async {
        let response = router().clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice::<Value>(&bytes))
    });
    let answer = answer.map_err(|e| format!("HTTP {status}, body not JSON: {e}"))?;
    if !matches!(status, 200 | 400 | 413) {
        return Err(format!("HTTP {status}: {answer}"));
    }
    if answer["apiVersion"] != "admission.k8s.io/v1" || answer["kind"] != "AdmissionReview" {
        return Err(format!("not an AdmissionReview: {answer}"));
    }
    let response = &answer["response"];
    if let Some(uid) = readable_uid
        && response["uid"] != uid.as_str()
    {
        return Err(format!("uid {uid:?} not echoed: {answer}"));
    }
    let Some(allowed) = response["allowed"].as_bool() else {
        return Err(format!("no response.allowed: {answer}"));
    };
    if !allowed {
        let code = response["status"]["code"].as_u64().unwrap_or(0);
        if !matches!(code, 400 | 413 | 422) {
            return Err(format!("denied with code {code}: {answer}"));
        }
    }
    if status != 200 && allowed {
        return Err(format!("HTTP {status} but allowed: {answer}"));
    }
    if response.get("patch").is_some() && response["patchType"] != "JSONPatch" {
        return Err(format!("patch without patchType JSONPatch: {answer}"));
    }
    Ok(())
}

fn from_env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.parse().ok()
}

#[test]
fn mutated_valid_reviews_always_get_a_well_formed_answer_with_their_uid() {
    let cases = from_env("MYAPP_FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    let seed = from_env::<u64>("MYAPP_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        // Regressions live in tests/it/fuzz-corpus/ as plain reviews, replayed by the test below.
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let seeds = seeds();
    let strategy = (
        0..seeds.len(),
        prop::collection::vec((any::<usize>(), mutation()), 1..4),
    );
    let result = runner.run(&strategy, |(which, mutations)| {
        let (path, mut review) = seeds[which].clone();
        for (selector, mutation) in &mutations {
            mutate(&mut review, *selector, mutation);
        }
        let body = serde_json::to_vec(&review).unwrap();
        if let Err(problem) = check(path, body.clone()) {
            let file = std::env::temp_dir().join(format!("myapp-fuzz-{}.json", std::process::id()));
            std::fs::write(&file, &body).unwrap();
            return Err(TestCaseError::fail(format!(
                "{path}: {problem}\n(the review is in {}; once fixed, copy it to \
                 tests/it/fuzz-corpus/<route>--<what>.json)",
                file.display()
            )));
        }
        Ok(())
    });
    if let Err(error) = result {
        panic!("seed {seed}: {error}");
    }
}

#[test]
fn every_review_of_the_fuzz_corpus_gets_a_well_formed_answer_with_its_uid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fuzz-corpus");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().path();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let path = match name.split_once("--").map(|(route, _)| route) {
            Some("validate") => VALIDATE_PATH,
            Some("mutate") => MUTATE_PATH,
            Some("scale") => SCALE_PATH,
            _ => panic!("{name}: corpus files are named <validate|mutate|scale>--<what>.json"),
        };
        let body = std::fs::read(&file).unwrap();
        if let Err(problem) = check(path, body) {
            panic!("{name}: {problem}");
        }
        replayed += 1;
    }
    assert!(replayed >= 5, "the corpus holds the known regressions");
}
