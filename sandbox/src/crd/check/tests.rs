//! Rules the type checker refuses, with the substrings apiextensions-apiserver's tests assert
//! (`pkg/apiserver/schema/cel/compilation_test.go`, `validation_test.go`) and cel-go's wording
//! and positions for the rest; and rules it must keep accepting.

use serde_json::json;

use crate::crd::rules::compile;
use crate::crd::types;

fn check(rule: &str) -> Result<(), String> {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "replicas": {"type": "integer"},
        "ratio": {"type": "number"},
        "enabled": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "port": {"x-kubernetes-int-or-string": true},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "when": {"type": "string", "format": "date-time"},
        "every": {"type": "string", "format": "duration"}
    }});
    let decl = types::decl(&schema, true).expect("declares");
    compile(rule, &decl).map(|_| ())
}

#[test]
fn an_operator_over_operands_it_has_no_overload_for_is_refused() {
    assert_eq!(
        check("self.name + 1 == 'a'").unwrap_err(),
        "ERROR: <input>:1:11: found no matching overload for '_+_' applied to '(string, int)'\n | self.name + 1 == 'a'\n | ..........^"
    );
    for (rule, expected) in [
        (
            "self.replicas == 'a'",
            "found no matching overload for '_==_' applied to '(int, string)'",
        ),
        (
            "self.name < 3",
            "found no matching overload for '_<_' applied to '(string, int)'",
        ),
        (
            "self.enabled && self.name",
            "found no matching overload for '_&&_' applied to '(bool, string)'",
        ),
        (
            "!self.name",
            "found no matching overload for '!_' applied to '(string)'",
        ),
        (
            "self.tags + self.name == []",
            "found no matching overload for '_+_' applied to '(list(string), string)'",
        ),
    ] {
        let error = check(rule).unwrap_err();
        assert!(error.contains(expected), "{rule}: {error}");
    }
}

#[test]
fn an_unknown_function_is_an_undeclared_reference() {
    assert_eq!(
        check("fakeFunction('abc') == 'ABC'").unwrap_err(),
        "ERROR: <input>:1:1: undeclared reference to 'fakeFunction' (in container '')\n | fakeFunction('abc') == 'ABC'\n | ^"
    );
    let error = check("self.name.shout() == 'A'").unwrap_err();
    assert!(
        error.starts_with("ERROR: <input>:1:16: undeclared reference to 'shout' (in container '')"),
        "{error}"
    );
}

#[test]
fn a_known_function_with_the_wrong_number_of_arguments_has_no_matching_overload() {
    assert_eq!(
        check("self.name.startsWith()").unwrap_err(),
        "ERROR: <input>:1:21: found no matching overload for 'startsWith' applied to 'string.()'\n | self.name.startsWith()\n | ....................^"
    );
    let error = check("size(self.name, 1) > 0").unwrap_err();
    assert!(
        error.contains("found no matching overload for 'size' applied to '(string, int)'"),
        "{error}"
    );
}

#[test]
fn a_field_the_schema_does_not_declare_and_a_result_that_is_not_a_bool_stay_refused() {
    let error = check("has(self.nmae)").unwrap_err();
    assert!(error.contains("undefined field 'nmae'"), "{error}");
    let estimate = {
        let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        let decl = types::decl(&schema, true).expect("declares");
        compile("self.name + 'x'", &decl).expect("compiles")
    };
    assert_eq!(estimate.result, Some(types::Ty::String));
}

#[test]
fn rules_over_values_of_unknown_type_and_the_libraries_are_accepted() {
    for rule in [
        "self.port == 80 || self.port == 'http'",
        "self.port + 1 > 0",
        "self.replicas + 1 > self.ratio",
        "self.replicas == 1.0",
        "self.when + self.every > self.when",
        "self.labels.all(k, k.startsWith('a') && self.labels[k].size() < 10)",
        "self.tags.exists(t, t.matches('^a')) && self.tags.isSorted()",
        "self.name.split('.').size() <= 3 && self.name.lowerAscii() == self.name",
        "isQuantity(self.name) && quantity(self.name).isGreaterThan(quantity('1'))",
        "url(self.name).getHost() != ''",
        "self.?name.orValue('') != ''",
        "self.tags == [] || self.labels == {}",
        "self.name.indexOf('a', 1) >= -1 && self.name.substring(1) != ''",
        "!has(self.name) || self.name != null",
    ] {
        check(rule).unwrap_or_else(|e| panic!("{rule}: {e}"));
    }
}
