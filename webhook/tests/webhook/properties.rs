//! Property tests of the mutating patch, through the in-process router.

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use webhook::Metrics;

use super::support::{Answer, PANIC_SIZE, apply, post, review, router};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

fn answer(path: &str, review: &Value) -> Answer {
    let router = router(&Metrics::new());
    runtime().block_on(super::support::call(
        &router,
        post(path, review.to_string()),
    ))
}

/// Any JSON, for the fields the Widget type does not know.
fn unknown_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z~/é ]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z~/]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn widget() -> impl Strategy<Value = Value> {
    let tags = prop::collection::vec(prop_oneof!["[a-c]", Just("managed".to_owned())], 0..4);
    let labels = prop::option::of(prop::collection::btree_map(
        prop_oneof!["[a-c]", Just(super::support::MANAGED_LABEL.to_owned())],
        "[a-z]{0,3}",
        0..3,
    ));
    (
        (-3i32..10).prop_filter("not the panic size", |s| *s != PANIC_SIZE),
        prop::option::of(tags),
        prop::option::of(prop_oneof![
            Just(Value::Null),
            "[a-z]{1,5}".prop_map(Value::from)
        ]),
        labels,
        prop::option::of(unknown_json()),
        prop::option::of(unknown_json()),
        prop::option::of(unknown_json()),
    )
        .prop_map(
            |(size, tags, color, labels, spec_extra, meta_extra, status)| {
                let mut spec = json!({"size": size});
                if let Some(tags) = tags {
                    spec["tags"] = json!(tags);
                }
                if let Some(color) = color {
                    spec["color"] = color;
                }
                if let Some(extra) = spec_extra {
                    spec["futureField"] = extra;
                }
                let mut metadata = json!({"name": "w"});
                if let Some(labels) = labels {
                    metadata["labels"] = json!(labels);
                }
                if let Some(extra) = meta_extra {
                    metadata["annotations~/odd"] = extra;
                }
                let mut object = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                                    "metadata": metadata, "spec": spec});
                if let Some(status) = status {
                    object["status"] = status;
                }
                object
            },
        )
}

fn at<'v>(value: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_patch_applies_is_add_only_keeps_unknown_fields_and_is_idempotent(object in widget()) {
        let first = answer("/mutate", &review("CREATE", &object, None));
        prop_assert_eq!(first.status, 200);
        prop_assert_eq!(&first.response()["allowed"], &json!(true));
        let patch = first.patch().unwrap_or_else(|| json!([]));
        for op in patch.as_array().unwrap() {
            prop_assert_eq!(&op["op"], "add");
        }
        let patched = apply(&object, &patch);

        for path in [&["spec", "futureField"][..], &["metadata", "annotations~/odd"], &["status"]] {
            prop_assert_eq!(
                at(&object, path).map(|v| v.to_string()),
                at(&patched, path).map(|v| v.to_string()),
                "{:?} changed", path
            );
        }

        let second = answer("/mutate", &review("UPDATE", &patched, Some(&object)));
        prop_assert_eq!(&second.response()["allowed"], &json!(true));
        prop_assert!(second.patch().is_none(), "second run patched: {:?}", second.patch());

        let valid_before = answer("/validate", &review("CREATE", &object, None));
        if valid_before.response()["allowed"] == json!(true) {
            let valid_after = answer("/validate", &review("CREATE", &patched, None));
            prop_assert_eq!(&valid_after.response()["allowed"], &json!(true), "{:?}", valid_after.json);
        }
    }
}
