//! The validator against apiextensions' own expectations (`TestValidateCustomResource` in
//! `pkg/apiserver/validation/validation_test.go`) and the Gateway API address case.

use serde_json::{Value, json};

use crate::schema::CrdSchema;

fn errors(schema: Value, object: Value) -> Vec<String> {
    let schema = CrdSchema::from_value(schema).expect("test schema compiles");
    let mut got: Vec<String> = schema
        .validate(&object, None)
        .iter()
        .map(ToString::to_string)
        .collect();
    got.sort();
    got
}

fn sorted(expected: &[&str]) -> Vec<String> {
    let mut expected: Vec<String> = expected.iter().map(|e| (*e).to_owned()).collect();
    expected.sort();
    expected
}

fn field(schema: Value) -> Value {
    json!({"type": "object", "properties": {"field": schema}})
}

#[test]
fn int_or_string_with_any_of_reports_the_first_alternative() {
    let schema = field(json!({"nullable": true, "x-kubernetes-int-or-string": true,
                              "anyOf": [{"type": "integer"}, {"type": "string"}]}));
    for ok in [
        json!({}),
        json!({"field": null}),
        json!({"field": 42}),
        json!({"field": "foo"}),
    ] {
        assert_eq!(errors(schema.clone(), ok), Vec::<String>::new());
    }
    for (value, ty) in [
        (json!(true), "boolean"),
        (json!(1.2), "number"),
        (json!({}), "object"),
        (json!([]), "array"),
    ] {
        assert_eq!(
            errors(schema.clone(), json!({"field": value})),
            sorted(&[
                r#"<nil>: Invalid value: "": "field" must validate at least one schema (anyOf)"#,
                &format!(
                    r#"field: Invalid value: "{ty}": field in body must be of type integer,string: "{ty}""#
                ),
                &format!(
                    r#"field: Invalid value: "{ty}": field in body must be of type integer: "{ty}""#
                ),
            ])
        );
    }
}

#[test]
fn all_of_reports_its_branches_and_then_itself() {
    let schema = field(json!({"nullable": true, "x-kubernetes-int-or-string": true,
                              "allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}]}));
    assert_eq!(
        errors(schema.clone(), json!({"field": 42})),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(schema, json!({"field": true})),
        sorted(&[
            r#"<nil>: Invalid value: "": "field" must validate all the schemas (allOf). None validated"#,
            r#"<nil>: Invalid value: "": "field" must validate at least one schema (anyOf)"#,
            r#"field: Invalid value: "boolean": field in body must be of type integer,string: "boolean""#,
            r#"field: Invalid value: "boolean": field in body must be of type integer: "boolean""#,
        ])
    );
}

#[test]
fn a_wrong_type_does_not_hide_an_enum_error() {
    let schema = field(
        json!({"type": "object", "required": ["nestedint", "nestedstring"], "properties": {
        "nestedint": {"type": "integer", "enum": [1, 2]},
        "nestedstring": {"type": "string", "enum": ["a", "b"]}}}),
    );
    assert_eq!(
        errors(schema.clone(), json!({"field": {}})),
        sorted(&[
            "field.nestedint: Required value",
            "field.nestedstring: Required value"
        ])
    );
    assert_eq!(
        errors(
            schema,
            json!({"field": {"nestedint": "x", "nestedstring": true}})
        ),
        sorted(&[
            r#"field.nestedint: Invalid value: "string": field.nestedint in body must be of type integer: "string""#,
            r#"field.nestedint: Unsupported value: "x": supported values: "1", "2""#,
            r#"field.nestedstring: Invalid value: "boolean": field.nestedstring in body must be of type string: "boolean""#,
            r#"field.nestedstring: Unsupported value: true: supported values: "a", "b""#,
        ])
    );
}

#[test]
fn a_null_is_a_wrong_type_unless_nullable() {
    let schema = field(json!({"type": "object"}));
    assert_eq!(
        errors(schema, json!({"field": null})),
        [r#"field: Invalid value: "null": field in body must be of type object: "null""#]
    );
}

#[test]
fn limits_are_worded_with_singulars() {
    let schema = json!({"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 1},
        "l": {"type": "array", "maxItems": 1, "items": {"type": "string"}}}});
    assert_eq!(
        errors(schema, json!({"s": "ab", "l": ["a", "b"]})),
        sorted(&[
            "l: Too many: 2: must have at most 1 item",
            "s: Too long: may not be more than 1 byte"
        ])
    );
}

#[test]
fn a_format_error_names_the_format_as_written() {
    let schema = json!({"type": "object", "properties": {
        "at": {"type": "string", "format": "date-time"},
        "n": {"type": "string", "format": "ipv4"},
        "free": {"type": "string", "format": "no-such-format"}}});
    assert_eq!(
        errors(
            schema.clone(),
            json!({"at": "2024-01-01", "free": "anything"})
        ),
        [r#"at: Invalid value: "2024-01-01": at in body must be of type date-time: "2024-01-01""#]
    );
    // A number for a formatted string is refused in the format's name, as kube-openapi's type
    // validator does.
    assert_eq!(
        errors(schema, json!({"n": 4})),
        [r#"n: Invalid value: "int64": n in body must be of type ipv4: "int64""#]
    );
}

/// The Gateway API `spec.addresses` item schema (`gateway.networking.k8s.io_gateways.yaml`).
fn gateway_addresses() -> Value {
    json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"addresses": {
        "type": "array", "maxItems": 16,
        "items": {"type": "object",
            "oneOf": [
                {"properties": {"type": {"enum": ["IPAddress"]},
                                "value": {"anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]}}},
                {"properties": {"type": {"not": {"enum": ["IPAddress"]}}}}],
            "properties": {"type": {"type": "string", "default": "IPAddress"},
                           "value": {"type": "string", "maxLength": 253}}}}}}}})
}

#[test]
fn a_gateway_ip_address_with_a_port_fails_the_ip_address_alternative() {
    let addresses = |a: Value| json!({"spec": {"addresses": [a]}});
    let schema = gateway_addresses();
    for ok in [
        json!({"type": "IPAddress", "value": "1.2.3.4"}),
        json!({"type": "IPAddress", "value": "2001:db8::1"}),
        json!({"type": "Hostname", "value": "example.com"}),
    ] {
        assert_eq!(errors(schema.clone(), addresses(ok)), Vec::<String>::new());
    }
    let schema = CrdSchema::from_value(schema).unwrap();
    let got: Vec<String> = schema
        .validate(
            &addresses(json!({"type": "IPAddress", "value": "1.2.3.4:8080"})),
            None,
        )
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            r#"<nil>: Invalid value: "": "spec.addresses[0]" must validate one and only one schema (oneOf). Found none valid"#,
            r#"<nil>: Invalid value: "": "spec.addresses[0].value" must validate at least one schema (anyOf)"#,
            r#"spec.addresses[0].value: Invalid value: "1.2.3.4:8080": spec.addresses[0].value in body must be of type ipv4: "1.2.3.4:8080""#,
        ]
    );
}

#[test]
fn one_of_with_two_valid_alternatives_says_how_many() {
    let schema = field(json!({"type": "string", "oneOf": [{"minLength": 1}, {"maxLength": 5}]}));
    assert_eq!(
        errors(schema, json!({"field": "abc"})),
        [
            r#"<nil>: Invalid value: "": "field" must validate one and only one schema (oneOf). Found 2 valid alternatives"#
        ]
    );
}

#[test]
fn a_status_write_validates_status_with_paths_relative_to_it() {
    let schema = CrdSchema::from_value(json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "status": {"type": "object", "properties": {
            "ip": {"type": "string", "oneOf": [{"format": "ipv4"}, {"format": "ipv6"}]}}}}}))
    .unwrap();
    let old = json!({"spec": {"n": "not checked"}, "status": {}});
    let object = json!({"spec": {"n": "not checked"}, "status": {"ip": "x"}});
    let got: Vec<String> = schema
        .validate_status(&object, Some(&old))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            r#"status: Invalid value: "": "ip" must validate one and only one schema (oneOf). Found none valid"#,
            r#"status.ip: Invalid value: "x": ip in body must be of type ipv4: "x""#,
        ]
    );
}
