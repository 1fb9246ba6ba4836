//! CustomResourceDefinitions kube-apiserver 1.33 refuses, refused here with its 422 and field
//! paths; and the CRDs this project ships, accepted.

use crate::support::fixtures::client;
use crate::support::kubectl::served_kubectl;

use kube::core::Status;
use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;
use serde_json::{Value, json};

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const SPEC: &str = "spec.validation.openAPIV3Schema.properties[spec]";

/// A Gadget CRD whose `spec` has `spec_schema` (the root schema is fixed around it).
fn gadget_crd(spec_schema: Value) -> Value {
    gadget_crd_with_root(json!({"type": "object", "properties": {"spec": spec_schema}}))
}

fn gadget_crd_with_root(root: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.sandbox.test"},
        "spec": {
            "group": "sandbox.test", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": root}}]
        }
    })
}

fn replicas_spec() -> Value {
    json!({"type": "object", "properties": {"replicas": {"type": "integer"}}})
}

fn post(body: &Value) -> axum::http::Request<Vec<u8>> {
    axum::http::Request::builder()
        .method("POST")
        .uri(CRDS)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap()
}

/// Creates `crd` in a new sandbox; the refusal's Status, or what was created.
async fn create(crd: &Value) -> Result<Box<Status>, String> {
    let sandbox = Sandbox::new();
    match client(&sandbox).request_text(post(crd)).await {
        Err(kube::Error::Api(status)) => Ok(status),
        Err(other) => Err(format!("not an API error: {other}")),
        Ok(body) => Err(format!("created: {body}")),
    }
}

/// The causes of a 422 `Invalid` refusal of the Gadget CRD, as (field, message).
async fn refused(crd: &Value) -> Vec<(String, String)> {
    let status = create(crd).await.expect("the CRD is refused");
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    assert!(
        status.message.starts_with(
            "CustomResourceDefinition.apiextensions.k8s.io \"gadgets.sandbox.test\" is invalid: "
        ),
        "{}",
        status.message
    );
    let details = status.details.expect("details");
    assert_eq!(details.kind, "CustomResourceDefinition");
    details
        .causes
        .into_iter()
        .map(|c| (c.field, c.message))
        .collect()
}

fn only_cause(causes: &[(String, String)]) -> (&str, &str) {
    assert_eq!(causes.len(), 1, "{causes:#?}");
    (causes[0].0.as_str(), causes[0].1.as_str())
}

#[tokio::test]
async fn a_cel_rule_that_does_not_compile_to_a_bool_is_refused() {
    // (case, rule, how the message starts, what it holds, how it ends)
    let cases = [
        (
            "a rule that does not parse",
            "self.replicas >",
            "Invalid value: apiextensions.ValidationRule{Rule:\"self.replicas >\", Message:\"\"",
            ": compilation failed: ERROR: <input>:1:",
            "",
        ),
        (
            "a rule naming a field the schema does not declare",
            "self.replica >= 0",
            "",
            "",
            "compilation failed: ERROR: <input>:1:5: undefined field 'replica'\n | self.replica >= 0\n | ....^",
        ),
        (
            "a rule that is not a bool",
            "self.replicas + 1",
            "",
            "",
            ": cel expression must evaluate to a bool",
        ),
    ];
    for (case, rule, starts, holds, ends) in cases {
        let mut spec = replicas_spec();
        spec["x-kubernetes-validations"] = json!([{ "rule": rule }]);
        let causes = refused(&gadget_crd(spec)).await;
        let (field, message) = only_cause(&causes);
        assert_eq!(
            field,
            format!("{SPEC}.x-kubernetes-validations[0].rule"),
            "{case}"
        );
        assert!(
            message.starts_with(starts) && message.contains(holds) && message.ends_with(ends),
            "{case}: {message}"
        );
    }
}

#[tokio::test]
async fn a_cel_rule_with_a_type_error_is_refused_with_the_checkers_words() {
    // (case, rule, cel-go's error after `compilation failed: `)
    let cases = [
        (
            "an operator over a string and an int",
            "self.name + 1 == 'a1'",
            "ERROR: <input>:1:11: found no matching overload for '_+_' applied to '(string, int)'\n | self.name + 1 == 'a1'\n | ..........^",
        ),
        (
            "a function no library declares",
            "fakeFunction('abc') == 'ABC'",
            "ERROR: <input>:1:1: undeclared reference to 'fakeFunction' (in container '')\n | fakeFunction('abc') == 'ABC'\n | ^",
        ),
        (
            "a known function with too few arguments",
            "self.name.startsWith()",
            "ERROR: <input>:1:21: found no matching overload for 'startsWith' applied to 'string.()'\n | self.name.startsWith()\n | ....................^",
        ),
    ];
    for (case, rule, error) in cases {
        let spec = json!({"type": "object", "properties": {"name": {"type": "string"}},
                          "x-kubernetes-validations": [{ "rule": rule }]});
        let causes = refused(&gadget_crd(spec)).await;
        let (field, message) = only_cause(&causes);
        assert_eq!(
            field,
            format!("{SPEC}.x-kubernetes-validations[0].rule"),
            "{case}"
        );
        assert!(
            message.ends_with(&format!(": compilation failed: {error}")),
            "{case}: {message}"
        );
    }
}

#[tokio::test]
async fn a_cel_rule_estimated_over_the_per_rule_budget_is_refused() {
    // Unbounded strings in an unbounded list, compared pairwise.
    let spec = json!({"type": "object",
        "properties": {"names": {"type": "array", "items": {"type": "string"}}},
        "x-kubernetes-validations": [{"rule": "self.names.all(x, self.names.all(y, x == y))"}]});
    let causes = refused(&gadget_crd(spec)).await;
    // Over the per-CRD budget too: the rule is named again as its main contributor.
    let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
    let rule = format!("{SPEC}.x-kubernetes-validations[0].rule");
    assert_eq!(
        fields,
        [
            rule.as_str(),
            rule.as_str(),
            "spec.validation.openAPIV3Schema"
        ]
    );
    let message = &causes[0].1;
    assert!(
        message.starts_with("Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"),
        "{message}"
    );
}

#[tokio::test]
async fn a_rule_under_an_unbounded_list_costs_as_many_times_as_a_request_can_hold_items() {
    let names = |max_items: Option<u64>| {
        let mut list = json!({"type": "array", "items": {"type": "string", "maxLength": 100,
            "x-kubernetes-validations": [{"rule": "self.contains('a')"}]}});
        if let Some(n) = max_items {
            list["maxItems"] = json!(n);
        }
        gadget_crd(json!({"type": "object", "properties": {"names": list}}))
    };
    // 41 per item; an unbounded list of strings holds 3 MiB / 3 of them.
    let causes = refused(&names(None)).await;
    let (field, message) = only_cause(&causes);
    assert_eq!(
        field,
        format!("{SPEC}.properties[names].items.x-kubernetes-validations[0].rule")
    );
    assert!(
        message.contains("exceeds budget by factor of 4.3x"),
        "{message}"
    );
    assert!(
        create(&names(Some(100)))
            .await
            .unwrap_err()
            .starts_with("created")
    );
}

#[tokio::test]
async fn rules_that_each_fit_but_together_exceed_the_per_crd_budget_are_refused() {
    // Each rule costs about 8.8 million (an unbounded string scanned for a 280-character one).
    let needle = "x".repeat(280);
    let mut properties = serde_json::Map::new();
    for i in 0..12 {
        properties.insert(
            format!("s{i}"),
            json!({"type": "string", "x-kubernetes-validations": [{"rule": format!("!self.contains('{needle}')")}]}),
        );
    }
    let causes = refused(&gadget_crd(
        json!({"type": "object", "properties": properties}),
    ))
    .await;
    let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields.len(), 5, "{causes:#?}");
    assert!(
        fields[..4]
            .iter()
            .all(|f| f.ends_with("x-kubernetes-validations[0].rule"))
    );
    assert_eq!(fields[4], "spec.validation.openAPIV3Schema");
    assert!(
        causes[4].1.starts_with("Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of 1.0"),
        "{}",
        causes[4].1
    );
}

#[tokio::test]
async fn a_root_schema_with_fields_status_extraction_would_lose_is_refused_with_a_status_subresource()
 {
    let mut crd = gadget_crd_with_root(
        json!({"type": "object", "properties": {"spec": replicas_spec()},
        "anyOf": [{"required": ["spec"]}]}),
    );
    crd["spec"]["versions"][0]["subresources"] = json!({"status": {}});
    let causes = refused(&crd).await;
    let (field, message) = only_cause(&causes);
    assert_eq!(field, "spec.validation.openAPIV3Schema");
    assert!(message.ends_with("XPreserveUnknownFields XValidations] fields are allowed at the root of the schema if the status subresource is enabled"), "{message}");
}

#[tokio::test]
async fn a_crd_with_one_schema_error_is_refused_naming_its_field() {
    let transition_rule = json!({"type": "object", "properties": {"ports": {"type": "array", "maxItems": 8, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 15}},
        "x-kubernetes-validations": [{"rule": "self.name == oldSelf.name"}]}}}});
    let list_map = json!({"type": "object", "properties": {"ports": {
        "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}});
    let mut printer_column = gadget_crd(replicas_spec());
    printer_column["spec"]["versions"][0]["additionalPrinterColumns"] =
        json!([{"name": "Replicas", "type": "integer", "jsonPath": "spec.replicas"}]);
    // (case, CRD, the field, the message)
    let cases: Vec<(&str, Value, String, String)> = vec![
        (
            "a transition rule inside an atomic list",
            gadget_crd(transition_rule),
            format!("{SPEC}.properties[ports].items.x-kubernetes-validations[0].rule"),
            format!("Invalid value: \"self.name == oldSelf.name\": oldSelf cannot be used on the uncorrelatable portion of the schema within {SPEC}.properties[ports]"),
        ),
        (
            "a non-structural schema",
            gadget_crd(json!({"type": "object", "properties": {"replicas": {"minimum": 0}}})),
            format!("{SPEC}.properties[replicas].type"),
            "Required value: must not be empty for specified object fields".into(),
        ),
        (
            "a list-map key that is neither required nor defaulted",
            gadget_crd(list_map),
            format!("{SPEC}.properties[ports].items.properties[name].default"),
            "Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property".into(),
        ),
        (
            "a printer column whose JSON path does not start with a dot",
            printer_column,
            "spec.additionalPrinterColumns[0].JSONPath".into(),
            "Invalid value: \"spec.replicas\": must be a simple json path starting with .".into(),
        ),
    ];
    for (case, crd, field, message) in cases {
        let causes = refused(&crd).await;
        assert_eq!(
            only_cause(&causes),
            (field.as_str(), message.as_str()),
            "{case}"
        );
    }
}

#[tokio::test]
async fn scale_paths_outside_spec_and_status_are_refused() {
    let mut crd = gadget_crd(replicas_spec());
    crd["spec"]["versions"][0]["subresources"] = json!({"scale": {
        "specReplicasPath": ".status.replicas", "statusReplicasPath": "status.replicas",
        "labelSelectorPath": ".metadata.labels"}});
    let causes = refused(&crd).await;
    assert_eq!(
        causes,
        [
            (
                "spec.subresources.scale.specReplicasPath",
                "Invalid value: \".status.replicas\": should be a json path under .spec"
            ),
            (
                "spec.subresources.scale.statusReplicasPath",
                "Invalid value: \"status.replicas\": must be a simple json path starting with ."
            ),
            (
                "spec.subresources.scale.labelSelectorPath",
                "Invalid value: \".metadata.labels\": should be a json path under either .spec or .status"
            ),
        ]
        .map(|(f, m)| (f.to_owned(), m.to_owned()))
    );
}

#[tokio::test]
async fn a_metadata_schema_beyond_name_and_generate_name_is_refused() {
    let root = json!({"type": "object", "properties": {
        "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
        "spec": replicas_spec()}});
    let causes = refused(&gadget_crd_with_root(root)).await;
    assert_eq!(
        only_cause(&causes),
        (
            "spec.validation.openAPIV3Schema.properties[metadata]",
            "Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"
        )
    );
    let allowed = json!({"type": "object", "properties": {
        "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}},
        "spec": replicas_spec()}});
    assert!(
        create(&gadget_crd_with_root(allowed))
            .await
            .unwrap_err()
            .starts_with("created")
    );
}

#[tokio::test]
async fn a_default_that_violates_its_own_schema_is_refused() {
    let spec = json!({"type": "object", "properties": {
        "replicas": {"type": "integer", "minimum": 0, "default": -1}}});
    let causes = refused(&gadget_crd(spec)).await;
    let field = format!("{SPEC}.properties[replicas].default");
    assert_eq!(
        only_cause(&causes),
        (
            field.as_str(),
            format!("Invalid value: -1: {field} in body should be greater than or equal to 0")
                .as_str()
        )
    );
    let spec = json!({"type": "object", "properties": {
        "tls": {"type": "object", "properties": {"on": {"type": "boolean"}}, "default": {"on": true, "extra": 1}}}});
    let causes = refused(&gadget_crd(spec)).await;
    assert_eq!(
        only_cause(&causes).0,
        format!("{SPEC}.properties[tls].default")
    );
    assert!(
        only_cause(&causes)
            .1
            .ends_with(": must not have unknown fields")
    );
}

#[tokio::test]
async fn versions_with_different_schemas_are_reported_per_version() {
    let mut crd = gadget_crd(json!({"type": "object", "properties": {"replicas": {}}}));
    let mut v2 = crd["spec"]["versions"][0].clone();
    v2["name"] = json!("v2");
    v2["storage"] = json!(false);
    v2["schema"]["openAPIV3Schema"] = json!({"type": "object"});
    crd["spec"]["versions"].as_array_mut().unwrap().push(v2);
    let causes = refused(&crd).await;
    assert_eq!(
        only_cause(&causes).0,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[replicas].type"
    );
}

#[tokio::test]
async fn an_update_that_makes_a_crd_invalid_is_refused() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let created = client
        .request_text(post(&gadget_crd(replicas_spec())))
        .await
        .unwrap();
    let mut crd: Value = serde_json::from_str(&created).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"] =
        json!({"minimum": 0});
    let request = axum::http::Request::builder()
        .method("PUT")
        .uri(format!("{CRDS}/gadgets.sandbox.test"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&crd).unwrap())
        .unwrap();
    match client.request_text(request).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422);
            assert!(
                status
                    .message
                    .contains("properties[replicas].type: Required value"),
                "{}",
                status.message
            );
        }
        other => panic!("not refused: {other:?}"),
    }
}

/// `deploy/base/crd.yaml`, which a test of the operator keeps equal to the CRD it generates.
fn deployed_crd() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/crd.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/base/crd.yaml");
    serde_saphyr::from_str(&text).expect("deploy/base/crd.yaml is YAML")
}

#[tokio::test]
async fn the_deployed_crd_is_accepted() {
    let crd = deployed_crd();
    let created = create(&crd).await.unwrap_err();
    assert!(created.starts_with("created"), "{created}");
}

#[test]
fn the_deployed_crds_rules_cost_well_under_the_limits() {
    let (errors, costs) = kube_sandbox::crd::validate_with_costs(&deployed_crd());
    assert!(errors.is_empty(), "{errors:#?}");
    for (path, cost) in &costs {
        println!("{cost:>10}  {path}");
    }
    let find = |suffix: &str| {
        costs
            .iter()
            .find(|(p, _)| p.ends_with(suffix))
            .map(|(_, c)| *c)
            .unwrap_or_else(|| panic!("no rule at {suffix}: {costs:?}"))
    };
    // The name rule scans `metadata.name`, which the schema cannot bound (3 MiB as far as the
    // estimator knows): about a fifth of the per-rule limit.
    let name_rule = find("openAPIV3Schema.x-kubernetes-validations[0].rule");
    assert!((1_000_000..3_000_000).contains(&name_rule), "{name_rule}");
    // The image rule scans at most 512 characters.
    let image_rule = find("properties[image].x-kubernetes-validations[0].rule");
    assert!(image_rule < 50_000, "{image_rule}");
    let total: u64 = costs.iter().map(|(_, c)| c).sum();
    assert!(total < 10_000_000, "{total}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_non_structural_crd_prints_the_api_servers_refusal() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let crd = gadget_crd(json!({"type": "object", "properties": {"replicas": {"minimum": 0}}}));
    let file = k.file("crd.json", &crd.to_string());
    let wanted = format!(
        "The CustomResourceDefinition \"gadgets.sandbox.test\" is invalid: {SPEC}.properties[replicas].type: Required value: must not be empty for specified object fields"
    );
    for extra in [&[][..], &["--server-side"][..]] {
        let mut args = vec!["apply", "-f", path_str(&file)];
        args.extend(extra);
        let out = k.run(&args).await;
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&wanted), "{extra:?}: {stderr}");
    }
}
