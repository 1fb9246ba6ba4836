//! Rule evaluation against the API server's wording; expected texts are apiextensions-apiserver
//! `pkg/apiserver/schema/cel/validation_test.go` cases (`no such key: d2`, `index out of bounds:
//! 100`, `division by zero`) and `validation.go`'s formats around them.

use kube::core::cel::compile_schema;
use serde_json::{Value, json};

use super::*;

fn evaluate(schema: &Value, object: &Value, old: Option<&Value>) -> Vec<String> {
    let compiled = compile_schema(schema);
    let rules = Rules::new(&compiled);
    rules
        .evaluate(&compiled, schema, object, old)
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn with_rule(rule: Value) -> Value {
    json!({
        "type": "object",
        "x-kubernetes-validations": [rule],
        "properties": {
            "a1": {"type": "object", "properties": {
                "d2": {"type": "object", "properties": {"e2": {"type": "string"}}}
            }},
            "name": {"type": "string"},
            "array": {"type": "array", "items": {"type": "integer"}}
        }
    })
}

#[test]
fn a_rule_reading_an_absent_field_reports_no_such_key_with_its_message() {
    let schema = with_rule(json!({"rule": "has(self.a1.d2.e2)", "message": "e2 is needed"}));
    assert_eq!(
        evaluate(&schema, &json!({"a1": {}}), None),
        [r#"<nil>: Invalid value: "object": no such key: d2 evaluating rule: e2 is needed"#]
    );
}

#[test]
fn without_a_message_the_rule_itself_is_named() {
    let schema = with_rule(json!({"rule": "self.name.startsWith('x')"}));
    assert_eq!(
        evaluate(&schema, &json!({}), None),
        [
            r#"<nil>: Invalid value: "object": no such key: name evaluating rule: self.name.startsWith('x')"#
        ]
    );
}

#[test]
fn an_absent_argument_of_a_global_call_is_named_too() {
    // The `cel` crate reports this one as `Missing argument or target`.
    let schema = with_rule(json!({"rule": "size(self.name) > 0", "message": "name is needed"}));
    assert_eq!(
        evaluate(&schema, &json!({"array": []}), None),
        [r#"<nil>: Invalid value: "object": no such key: name evaluating rule: name is needed"#]
    );
}

#[test]
fn other_runtime_errors_use_cel_gos_words() {
    for (rule, expected) in [
        ("self.array[100] == 0", "index out of bounds: 100"),
        ("1 / (size(self.array) - 1) == 1", "division by zero"),
    ] {
        let schema = with_rule(json!({ "rule": rule }));
        let got = evaluate(&schema, &json!({"array": [1]}), None);
        assert_eq!(
            got,
            [format!(
                r#"<nil>: Invalid value: "object": {expected} evaluating rule: {rule}"#
            )]
        );
    }
}

#[test]
fn a_failed_rule_is_reported_at_its_field_path_with_its_reason_and_the_nodes_type() {
    let schema = json!({"type": "object", "properties": {"spec": {
        "type": "object",
        "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "self.min <= self.max", "messageExpression": "'min ' + string(self.min) + ' is over max'",
             "fieldPath": ".min", "reason": "FieldValueForbidden"},
            {"rule": "self.min != 5", "message": " five "}
        ]
    }}});
    assert_eq!(
        evaluate(&schema, &json!({"spec": {"min": 5, "max": 1}}), None),
        [
            "spec.min: Forbidden: min 5 is over max",
            r#"spec: Invalid value: "object": five"#
        ]
    );
}

#[test]
fn an_optional_old_self_is_an_optional_and_map_list_items_correlate_by_key() {
    let schema = json!({"type": "object", "properties": {"items": {
        "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
        "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "integer"}},
                  "x-kubernetes-validations": [
                      {"rule": "!oldSelf.hasValue() || self.v >= oldSelf.value().v",
                       "message": "v may not shrink", "optionalOldSelf": true}
                  ]}
    }}});
    let old = json!({"items": [{"k": "a", "v": 2}, {"k": "b", "v": 2}]});
    // Reordered: `b` still compares with the old `b`; `c` is new.
    let new = json!({"items": [{"k": "b", "v": 1}, {"k": "a", "v": 3}, {"k": "c", "v": 0}]});
    assert_eq!(
        evaluate(&schema, &new, Some(&old)),
        [r#"items[0]: Invalid value: "object": v may not shrink"#]
    );
    assert!(evaluate(&schema, &new, None).is_empty());
}

#[test]
fn items_of_other_lists_have_no_old_self() {
    let schema = json!({"type": "object", "properties": {"items": {
        "type": "array",
        "items": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >= oldSelf"}]}
    }}});
    let got = evaluate(
        &schema,
        &json!({"items": [1]}),
        Some(&json!({"items": [2]})),
    );
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn matches_gives_the_same_answers_and_compiles_each_constant_pattern_once() {
    let schema = json!({"type": "object", "properties": {"names": {
        "type": "array",
        "items": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self.matches('^[a-z]+$')", "message": "lower-case letters"},
            {"rule": "matches(self, '^[a-z]')", "message": "starts with a letter"},
            {"rule": "!self.matches('^[a-z]+$') || self.size() < 10", "message": "short"}
        ]}
    }}});
    let compiled = compile_schema(&schema);
    let rules = Rules::new(&compiled);
    assert_eq!(rules.pattern_compilations(), 2, "two distinct patterns");
    let object = json!({"names": ["abc", "Abc", "1bc", "abcdefghijk"]});
    for _ in 0..10 {
        let got: Vec<String> = rules
            .evaluate(&compiled, &schema, &object, None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                r#"names[1]: Invalid value: "string": lower-case letters"#,
                r#"names[1]: Invalid value: "string": starts with a letter"#,
                r#"names[2]: Invalid value: "string": lower-case letters"#,
                r#"names[2]: Invalid value: "string": starts with a letter"#,
                r#"names[3]: Invalid value: "string": short"#,
            ]
        );
    }
    assert_eq!(rules.pattern_compilations(), 2, "none compiled again");
}

#[test]
fn a_pattern_computed_at_run_time_is_compiled_on_each_call() {
    let schema = json!({"type": "object", "properties": {
        "value": {"type": "string"}, "pattern": {"type": "string"}
    }, "x-kubernetes-validations": [{"rule": "self.value.matches(self.pattern)"}]});
    let compiled = compile_schema(&schema);
    let rules = Rules::new(&compiled);
    let object = json!({"value": "abc", "pattern": "^a"});
    assert!(rules.evaluate(&compiled, &schema, &object, None).is_empty());
    assert!(rules.evaluate(&compiled, &schema, &object, None).is_empty());
    assert_eq!(rules.pattern_compilations(), 2);
}
