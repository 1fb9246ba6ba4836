//! Structural-schema validation, pruning and defaulting of custom resources, as the API server
//! does it for a CRD version's `openAPIV3Schema`.
//!
//! Covers what operators' schemas use: `type` (with `nullable`, `x-kubernetes-int-or-string`),
//! `format` (`formats.rs`), `required`, `minimum`/`maximum` (and their exclusive forms),
//! `minLength`/`maxLength`, `pattern`, `enum`, `minItems`/`maxItems`,
//! `minProperties`/`maxProperties`, `allOf`/`anyOf`/`oneOf`/`not` (`junctors.rs`), list-map and
//! list-set uniqueness, `x-kubernetes-preserve-unknown-fields`, `default`, and CEL
//! `x-kubernetes-validations` (evaluated by `kube-cel`, the kube-rs project's CEL engine).
//! The OpenAPI checks are kube-openapi's validator (`openapi.rs`); messages follow the API
//! server's field-error wording so tests can compare them.
//!
//! CEL rules (`evaluate.rs`) run only when the OpenAPI checks found none of the errors the API
//! server lets stop them (`hasBlockingErr` in apiextensions-apiserver
//! `pkg/registry/customresource/strategy.go`: a wrong type, a missing required field, a value
//! outside its enum, too long, too many); then the answer ends with the entry that says rules
//! were skipped. A value not in its `format` is a wrong type to kube-openapi (`FormatOf` makes
//! an `InvalidType` error), so it stops the rules too; the junctors' own messages, a pattern,
//! minimum or duplicate leave them to run.
//!
//! CEL rules ratchet as the API server's do (`CRDValidationRatcheting`, on by default since
//! 1.30), at the granularity of the object's top-level fields: on an update, a rule that does
//! not use `oldSelf` is not evaluated inside a top-level field (`spec`, `status`) whose value is
//! unchanged, since the API server would drop its failure. So a status write does not evaluate
//! the spec's rules.
//!
//! Rules at the root see `metadata` as the API server declares it there: `name` and
//! `generateName` only.
//!
//! Not modelled: `multipleOf`, runtime CEL cost budgets
//! (the static estimate is checked when the CRD is written, `crate::crd`), and
//! `metadata` validation beyond what CEL rules on the root ask of it. Ratcheting stops at the
//! top-level fields (the API server also ratchets unchanged nodes inside a changed field, and
//! the OpenAPI checks), and a ratcheted rule is not evaluated at all: the API server evaluates
//! it, sends a failure as a warning, and still rejects a rule that fails to evaluate (no such
//! key, overflow); the sandbox does neither.

mod defaulting;
mod errors;
mod evaluate;
mod formats;
mod junctors;
mod openapi;
mod result;
mod value;
mod walk;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::{CompiledSchema, compile_schema};
use regex::Regex;
use serde_json::Value;

pub use errors::{FieldError, SchemaError};
use evaluate::Rules;
pub(crate) use value::{CEL_RESERVED, escape, strings};
use walk::{
    apply_defaults, collect_patterns, drop_ratcheting_rules, first_compile_error, list_errors,
    prune_value, rule_view,
};

/// The OpenAPI errors after which the API server does not run CEL rules (`hasBlockingErr`).
const BLOCKING: [&str; 5] = [
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
];

/// The entry `hasBlockingErr` adds: `field.Invalid(nil, nil, ...)`, whose path prints as
/// `<nil>` and value as `"null"`.
const RULES_SKIPPED: &str = "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

/// Whether `schema` or any schema below it has `x-kubernetes-validations` (`hasXValidations`).
fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => {
            map.get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .is_some_and(|rules| !rules.is_empty())
                || map.values().any(has_rules)
        }
        Value::Array(items) => items.iter().any(has_rules),
        _ => false,
    }
}

/// A CRD version's schema with its patterns and CEL rules compiled once.
pub struct CrdSchema {
    schema: Value,
    /// Every `pattern` of the schema, compiled, by its text.
    patterns: HashMap<String, Regex>,
    cel: CompiledSchema,
    /// `cel` without the rules that ratchet, keyed by the unchanged top-level fields (sorted);
    /// compiled the first time an update leaves those fields unchanged.
    ratcheted: Mutex<HashMap<Vec<String>, Arc<CompiledSchema>>>,
    rules: Rules,
    /// Whether any node has rules (the API server has no CEL validator otherwise).
    has_rules: bool,
    /// The schema reduced to the nodes that lead to a `default` (None: it has none), for
    /// defaulting on read.
    defaults: Option<Value>,
}

impl std::fmt::Debug for CrdSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrdSchema")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl CrdSchema {
    /// Prepares the schema of `version` in `crd`, failing like the API server would refuse the
    /// CRD: no such version, no schema, a bad pattern, a CEL rule that does not compile.
    pub fn from_crd(crd: &CustomResourceDefinition, version: &str) -> Result<Self, SchemaError> {
        let v = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .ok_or_else(|| SchemaError::MissingVersion(version.to_owned()))?;
        let schema = v
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .ok_or_else(|| SchemaError::MissingSchema(version.to_owned()))?;
        Self::from_value(serde_json::to_value(schema).map_err(SchemaError::ReadSchema)?)
    }

    /// Prepares a schema given as JSON (an `openAPIV3Schema` object).
    pub fn from_value(schema: Value) -> Result<Self, SchemaError> {
        let mut patterns = HashMap::new();
        collect_patterns(&schema, "", &mut patterns)?;
        let cel = compile_schema(&schema);
        if let Some((path, message)) = first_compile_error(&cel, "") {
            return Err(SchemaError::CompileRule { path, message });
        }
        let rules = Rules::new(&cel);
        let has_rules = has_rules(&schema);
        Ok(Self {
            defaults: defaulting::defaults_skeleton(&schema),
            schema,
            patterns,
            cel,
            ratcheted: Mutex::default(),
            rules,
            has_rules,
        })
    }

    /// The `openAPIV3Schema` as written (list and map types for field ownership).
    pub fn raw(&self) -> &Value {
        &self.schema
    }

    /// Every violation of the schema and its CEL rules by `object` (a whole custom resource),
    /// `old` being the stored object on update (for transition rules). Empty means valid.
    ///
    /// Call it on a pruned and defaulted object, as the API server does.
    pub fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let errors = self.openapi_errors(&self.schema, object, None);
        self.with_lists_and_rules(errors, object, old)
    }

    /// The violations of a `/status` write: the OpenAPI checks of `status` alone against its
    /// schema, named relative to it in the messages and under `status` in the field paths
    /// (`customResourceValidator.ValidateStatusUpdate`), then list uniqueness and the CEL
    /// rules over the whole object as on any update (`statusStrategy.ValidateUpdate`).
    pub fn validate_status(&self, object: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let errors = match (
            object.get("status"),
            self.schema.pointer("/properties/status"),
        ) {
            (Some(status), Some(schema)) => self.openapi_errors(schema, status, Some("status")),
            _ => Vec::new(),
        };
        self.with_lists_and_rules(errors, object, old)
    }

    /// kube-openapi's errors for `value` against `schema`, as field errors under `prefix`.
    fn openapi_errors(
        &self,
        schema: &Value,
        value: &Value,
        prefix: Option<&str>,
    ) -> Vec<FieldError> {
        let validator = openapi::Validator {
            patterns: &self.patterns,
        };
        let outcome = validator.validate(schema, value, "");
        outcome
            .problems
            .into_iter()
            .map(|p| p.into_field_error(prefix))
            .collect()
    }

    /// `errors` followed by the list-type errors (on update, only when the old object had
    /// none) and, unless an error blocks them, the CEL rules' failures.
    fn with_lists_and_rules(
        &self,
        mut errors: Vec<FieldError>,
        object: &Value,
        old: Option<&Value>,
    ) -> Vec<FieldError> {
        let mut lists = Vec::new();
        list_errors(&self.schema, object, "", &mut lists);
        if !lists.is_empty()
            && old.is_none_or(|old| {
                let mut old_lists = Vec::new();
                list_errors(&self.schema, old, "", &mut old_lists);
                old_lists.is_empty()
            })
        {
            errors.extend(lists);
        }
        if !self.has_rules {
            return errors;
        }
        if errors.iter().any(|e| BLOCKING.contains(&e.reason.as_str())) {
            errors.push(FieldError::new("<nil>", "FieldValueInvalid", RULES_SKIPPED));
            return errors;
        }
        let ratcheted = self.ratcheted_rules(object, old);
        let cel = ratcheted.as_deref().unwrap_or(&self.cel);
        let (seen, old_seen) = (rule_view(object), old.map(rule_view));
        errors.extend(
            self.rules
                .evaluate(cel, &self.schema, &seen, old_seen.as_ref()),
        );
        errors
    }

    /// How many regular expressions the rules' `matches()` calls have compiled.
    pub fn pattern_compilations(&self) -> usize {
        self.rules.pattern_compilations()
    }

    /// The rules to evaluate on an update that leaves some top-level fields of the object as
    /// they were: all but those inside the unchanged fields that do not use `oldSelf` (the API
    /// server evaluates those too but drops their failures). None when every rule applies.
    fn ratcheted_rules(&self, object: &Value, old: Option<&Value>) -> Option<Arc<CompiledSchema>> {
        let old = old?;
        let mut unchanged: Vec<&String> = self
            .cel
            .properties
            .keys()
            .filter(|key| {
                object
                    .get(key.as_str())
                    .is_some_and(|v| old.get(key.as_str()) == Some(v))
            })
            .collect();
        if unchanged.is_empty() {
            return None;
        }
        unchanged.sort();
        let key: Vec<String> = unchanged.into_iter().cloned().collect();
        let mut cache = self.ratcheted.lock().unwrap_or_else(|p| p.into_inner());
        let compiled = cache.entry(key).or_insert_with_key(|unchanged| {
            // The schema compiled without errors in `from_value`, so it does again.
            let mut compiled = compile_schema(&self.schema);
            for field in unchanged {
                if let Some(node) = compiled.properties.get_mut(field) {
                    drop_ratcheting_rules(node);
                }
            }
            Arc::new(compiled)
        });
        Some(compiled.clone())
    }

    /// Drops fields the schema does not declare (keeping `apiVersion`, `kind` and `metadata` at
    /// the root, and everything under `x-kubernetes-preserve-unknown-fields`), and nulls in
    /// fields that are not `nullable`. Returns the dropped paths (for `fieldValidation`).
    pub fn prune(&self, object: &mut Value) -> Vec<String> {
        let mut dropped = Vec::new();
        if let Value::Object(map) = object {
            for (key, value) in map.iter_mut() {
                if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
                    && let Some(child) = self.schema.get("properties").and_then(|p| p.get(key))
                {
                    prune_value(child, value, key, &mut dropped);
                }
            }
            let preserve = self
                .schema
                .get("x-kubernetes-preserve-unknown-fields")
                .and_then(Value::as_bool)
                == Some(true);
            map.retain(|key, _| {
                let keep = preserve
                    || matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
                    || self
                        .schema
                        .get("properties")
                        .and_then(|p| p.get(key))
                        .is_some();
                if !keep {
                    dropped.push(key.clone());
                }
                keep
            });
        }
        dropped
    }

    /// Fills absent fields that have a schema `default`, where their parent object exists.
    pub fn apply_defaults(&self, object: &mut Value) {
        if let Some(defaults) = &self.defaults {
            apply_defaults(defaults, object, true);
        }
    }

    /// `object` as the API server reads it from storage: with the schema's defaults filled in.
    /// None when nothing is missing (the stored object reads as it is).
    pub fn read_defaulted(&self, object: &Value) -> Option<Value> {
        defaulting::defaulted(self.defaults.as_ref()?, object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> CrdSchema {
        CrdSchema::from_value(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 0, "maximum": 10},
                        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5,
                                 "x-kubernetes-validations": [{"rule": "self != 'bad'", "message": "name must not be bad"}]},
                        "tags": {"type": "array", "maxItems": 2, "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                        "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                                  "items": {"type": "object", "required": ["k"],
                                            "properties": {"k": {"type": "string"}, "v": {"type": "string", "default": "d"}}}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "opt": {"type": "string", "nullable": true}
                    }
                }
            }
        }))
        .expect("test schema compiles")
    }

    fn fields(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn accepts_a_valid_object() {
        let obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
                         "spec": {"size": 3, "name": "ok", "tags": ["a", "b"], "items": [{"k": "a"}, {"k": "b"}]}});
        assert_eq!(fields(&schema().validate(&obj, None)), Vec::<String>::new());
    }

    #[test]
    fn reports_bounds_with_the_api_servers_wording() {
        let obj = json!({"spec": {"size": -1}});
        assert_eq!(
            fields(&schema().validate(&obj, None)),
            [
                "spec.size: Invalid value: -1: spec.size in body should be greater than or equal to 0"
            ]
        );
        let obj = json!({"spec": {"size": 11}});
        assert_eq!(
            fields(&schema().validate(&obj, None)),
            ["spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10"]
        );
    }

    #[test]
    fn reports_every_violation_at_once() {
        let obj = json!({"spec": {"name": "ABCDEFG", "tags": ["a", "a", "b"], "items": [{"k": "x"}, {"k": "x"}]}});
        let got = fields(&schema().validate(&obj, None));
        assert!(
            got.contains(&"spec.size: Required value".to_owned()),
            "{got:?}"
        );
        assert!(
            got.contains(&"spec.name: Too long: may not be more than 5 bytes".to_owned()),
            "{got:?}"
        );
        // kube-openapi's string validator stops at its first failure: no pattern error.
        assert!(!got.iter().any(|e| e.contains("should match")), "{got:?}");
        assert!(
            got.contains(&"spec.tags: Too many: 3: must have at most 2 items".to_owned()),
            "{got:?}"
        );
        assert!(
            got.contains(&"spec.tags[1]: Duplicate value: \"a\"".to_owned()),
            "{got:?}"
        );
        assert!(
            got.iter()
                .any(|e| e.starts_with("spec.items[1]: Duplicate value:")),
            "{got:?}"
        );
    }

    #[test]
    fn reports_wrong_types_and_nulls() {
        let got = fields(&schema().validate(&json!({"spec": {"size": "3", "opt": null}}), None));
        assert_eq!(
            got,
            [
                "spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\"",
                SKIPPED,
            ]
        );
        let got = fields(&schema().validate(&json!({"spec": {"size": 1.5}}), None));
        assert_eq!(got.len(), 2, "{got:?}");
    }

    const SKIPPED: &str = "<nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

    #[test]
    fn errors_that_block_rules_skip_them_and_say_so() {
        // A missing required field blocks; the bad name's rule is not evaluated.
        let got = fields(&schema().validate(&json!({"spec": {"name": "bad"}}), None));
        assert_eq!(got, ["spec.size: Required value", SKIPPED]);
    }

    #[test]
    fn other_openapi_errors_leave_rules_to_run() {
        // Above the maximum and not matching the pattern: Invalid errors, which do not block.
        let got = fields(&schema().validate(&json!({"spec": {"size": 11, "name": "bad1"}}), None));
        assert_eq!(
            got,
            [
                "spec.name: Invalid value: \"bad1\": spec.name in body should match '^[a-z]+$'",
                "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
            ]
        );
        let got = fields(&schema().validate(&json!({"spec": {"size": 11, "name": "bad"}}), None));
        assert_eq!(
            got,
            [
                "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
                "spec.name: Invalid value: \"string\": name must not be bad",
            ]
        );
    }

    #[test]
    fn a_schema_without_rules_adds_no_skipped_entry() {
        let schema = CrdSchema::from_value(json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {"size": {"type": "integer"}}}
        }}))
        .expect("compiles");
        let got = fields(&schema.validate(&json!({"spec": {}}), None));
        assert_eq!(got, ["spec.size: Required value"]);
    }

    #[test]
    fn evaluates_cel_rules_with_their_message() {
        let got = fields(&schema().validate(&json!({"spec": {"size": 1, "name": "bad"}}), None));
        assert_eq!(
            got,
            ["spec.name: Invalid value: \"string\": name must not be bad"]
        );
    }

    #[test]
    fn root_rules_see_only_the_name_and_generate_name_of_metadata() {
        let schema = CrdSchema::from_value(json!({"type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.metadata.name.startsWith('a')", "message": "name starts with a"},
                {"rule": "has(self.metadata.generateName)", "message": "generateName is seen"},
                {"rule": "!has(self.metadata.labels) && !has(self.metadata.managedFields)",
                 "message": "other metadata is hidden"}],
            "properties": {"spec": {"type": "object"}}}))
        .unwrap();
        let object = |name: &str| {
            json!({"apiVersion": "x/v1", "kind": "X",
                   "metadata": {"name": name, "generateName": "a-", "labels": {"x": "y"},
                                "managedFields": [{"manager": "m"}]},
                   "spec": {}})
        };
        assert!(schema.validate(&object("abc"), None).is_empty());
        assert!(
            schema
                .validate(&object("abc"), Some(&object("abd")))
                .is_empty()
        );
        assert_eq!(
            fields(&schema.validate(&object("xyz"), None)),
            ["<nil>: Invalid value: \"object\": name starts with a"]
        );
    }

    #[test]
    fn prunes_unknown_fields_and_non_nullable_nulls() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "labels": {"x": "y"}},
                             "extra": 1,
                             "spec": {"size": 1, "unknown": true, "free": {"any": {"thing": 1}},
                                      "items": [{"k": "a", "zzz": 1}], "name": null, "opt": null}});
        let dropped = schema().prune(&mut obj);
        assert_eq!(dropped, ["spec.items[0].zzz", "spec.unknown", "extra"]);
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "labels": {"x": "y"}},
                   "spec": {"size": 1, "free": {"any": {"thing": 1}}, "items": [{"k": "a"}], "opt": null}})
        );
    }

    #[test]
    fn a_root_that_preserves_unknown_fields_keeps_them() {
        let schema = CrdSchema::from_value(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                                  "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}}}))
            .unwrap();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "spec": {"a": "x", "b": 1}, "status": {"free": true}});
        assert_eq!(schema.prune(&mut obj), ["spec.b"]);
        assert_eq!(obj["status"], json!({"free": true}));
    }

    #[test]
    fn applies_defaults_only_where_the_parent_exists() {
        let mut obj = json!({"spec": {"size": 1, "items": [{"k": "a"}, {"k": "b", "v": "set"}]}});
        schema().apply_defaults(&mut obj);
        assert_eq!(
            obj["spec"]["items"],
            json!([{"k": "a", "v": "d"}, {"k": "b", "v": "set"}])
        );
    }

    #[test]
    fn refuses_a_rule_that_does_not_compile() {
        let err = CrdSchema::from_value(
            json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.("}]}),
        )
        .expect_err("a broken rule is refused");
        assert!(matches!(err, SchemaError::CompileRule { .. }), "{err}");
    }

    /// Rules on `spec.name` and the root, a transition rule on `spec.size`, and a status.
    fn ratcheting_schema() -> CrdSchema {
        CrdSchema::from_value(json!({
            "type": "object",
            "x-kubernetes-validations": [{"rule": "!has(self.spec.name) || self.spec.name != 'worse'", "message": "root rule"}],
            "properties": {
                "spec": {"type": "object", "properties": {
                    "name": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'bad'", "message": "name must not be bad"}]},
                    "note": {"type": "string"},
                    "size": {"type": "integer", "x-kubernetes-validations": [{"rule": "self != oldSelf", "message": "size must change"}]}
                }},
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
            }
        }))
        .expect("test schema compiles")
    }

    #[test]
    fn rules_in_an_unchanged_top_level_field_ratchet_unless_they_use_old_self() {
        let schema = ratcheting_schema();
        let bad = json!({"spec": {"name": "bad"}, "status": {"ready": false}});
        let name_error = "spec.name: Invalid value: \"string\": name must not be bad";
        // A create evaluates every rule.
        assert_eq!(fields(&schema.validate(&bad, None)), [name_error]);
        // A status write leaves the spec as it was: its rule's failure is dropped.
        let status_write = json!({"spec": {"name": "bad"}, "status": {"ready": true}});
        assert_eq!(
            fields(&schema.validate(&status_write, Some(&bad))),
            Vec::<String>::new()
        );
        // A spec write evaluates the spec's rules, even where the failing field kept its value.
        let spec_write = json!({"spec": {"name": "bad", "note": "n"}, "status": {"ready": false}});
        assert_eq!(
            fields(&schema.validate(&spec_write, Some(&bad))),
            [name_error]
        );
        // A transition rule in an unchanged field is evaluated.
        let sized = json!({"spec": {"size": 1}, "status": {"ready": false}});
        let resized = json!({"spec": {"size": 1}, "status": {"ready": true}});
        assert_eq!(
            fields(&schema.validate(&resized, Some(&sized))),
            ["spec.size: Invalid value: \"integer\": size must change"]
        );
        // So is a rule on the root, which changed.
        let worse = json!({"spec": {"name": "worse"}, "status": {"ready": false}});
        let worse_status = json!({"spec": {"name": "worse"}, "status": {"ready": true}});
        assert_eq!(
            fields(&schema.validate(&worse_status, Some(&worse))),
            ["<nil>: Invalid value: \"object\": root rule"]
        );
        // One variant per set of unchanged fields, compiled once: the spec's (three status
        // writes) and the status's (the spec write).
        let variants = schema.ratcheted.lock().unwrap();
        let mut unchanged: Vec<&Vec<String>> = variants.keys().collect();
        unchanged.sort();
        assert_eq!(
            unchanged,
            [&vec!["spec".to_owned()], &vec!["status".to_owned()]]
        );
    }
}
