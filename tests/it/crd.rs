//! The generated CRD: committed copy is current, constraints are present, and the schema with its
//! CEL rules accepts and rejects what it should (evaluated locally with kube-sandbox's schema
//! module, which runs the CEL rules with kube-cel).

use std::{collections::BTreeSet, path::Path};

use kube::CustomResourceExt;
use kube_sandbox::schema::{CrdSchema, FieldError};
use myapp_operator::crd::{self, MyApp};
use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn schema_json() -> Value {
    let crd = serde_json::to_value(MyApp::crd()).expect("CRD serializes");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn crd_schema() -> CrdSchema {
    CrdSchema::from_crd(&MyApp::crd(), "v1").expect("the MyApp schema and its CEL rules compile")
}

/// Validates a MyApp given as JSON the way the API server does: prune, default, validate.
fn admit(mut object: Value) -> Vec<String> {
    let schema = crd_schema();
    schema.prune(&mut object);
    schema.apply_defaults(&mut object);
    schema
        .validate(&object, None)
        .iter()
        .map(FieldError::to_string)
        .collect()
}

fn myapp(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "MyApp", "metadata": {"name": "web"}, "spec": spec})
}

fn read_yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

#[test]
fn committed_crd_yaml_matches_the_generated_one() {
    let committed = std::fs::read_to_string(root().join("deploy/base/crd.yaml"))
        .expect("deploy/base/crd.yaml exists");
    let generated = crd::crd_yaml().expect("CRD renders as YAML");
    assert!(
        committed == generated,
        "deploy/base/crd.yaml is stale: regenerate it with `cargo run -q -- crd > deploy/base/crd.yaml` and commit it"
    );
}

#[test]
fn crd_names_scope_and_subresources_are_as_documented() {
    let crd = serde_json::to_value(MyApp::crd()).unwrap();
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], "myapps.example.com");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "MyApp");
    assert_eq!(spec["names"]["plural"], "myapps");
    assert_eq!(spec["names"]["shortNames"], json!(["mya"]));
    assert_eq!(spec["names"]["categories"], json!(["all"]));
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1");
    assert_eq!(version["subresources"]["status"], json!({}));
    assert_eq!(
        version["subresources"]["scale"],
        json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
               "labelSelectorPath": ".status.selector"})
    );
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Replicas", "Available", "Phase", "Image", "Age"]);
    // An autoscaled MyApp has no spec.replicas: the column shows the count its Deployment runs.
    assert_eq!(
        version["additionalPrinterColumns"][0]["jsonPath"],
        ".status.replicas"
    );
}

/// Every `description` in `value`, at any depth, with its JSON path.
fn descriptions(value: &Value, path: String, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if let ("description", Value::String(text)) = (key.as_str(), child) {
                    out.push((path.clone(), text.clone()));
                } else {
                    descriptions(child, format!("{path}.{key}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                descriptions(child, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn kubectl_explain_gets_paragraphs_not_the_doc_comments_line_breaks() {
    let mut found = Vec::new();
    descriptions(&schema_json(), String::new(), &mut found);
    let image = found
        .iter()
        .find(|(path, _)| path == ".properties.spec.properties.image")
        .expect("spec.image has a description");
    assert!(
        image.1.starts_with("Container image reference, `[registry[:port]/]repository[:tag][@digest]`, for example `ghcr.io/example/web:1.4.2`. Pin"),
        "{image:?}"
    );
    for (path, text) in &found {
        let single_breaks = text.replace("\n\n", "");
        assert!(!single_breaks.contains('\n'), "{path}: {text:?}");
        assert_eq!(text.trim(), text, "{path}");
    }
}

#[test]
fn schema_carries_every_constraint() {
    let s = schema_json();
    let spec = &s["properties"]["spec"];
    assert_eq!(spec["required"], json!(["image", "port"]));
    let replicas = &spec["properties"]["replicas"];
    assert_eq!(
        (replicas["minimum"].as_f64(), replicas["maximum"].as_f64()),
        (Some(0.0), Some(1000.0))
    );
    let port = &spec["properties"]["port"];
    assert_eq!(
        (port["minimum"].as_f64(), port["maximum"].as_f64()),
        (Some(1.0), Some(65535.0))
    );
    let image = &spec["properties"]["image"];
    assert_eq!(
        (image["minLength"].as_u64(), image["maxLength"].as_u64()),
        (Some(1), Some(512))
    );
    assert!(
        image["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("matches(")
    );
    let env = &spec["properties"]["env"];
    assert_eq!(env["x-kubernetes-list-type"], "map");
    assert_eq!(env["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(env["maxItems"].as_u64(), Some(crd::MAX_ENV as u64));
    let name = &env["items"]["properties"]["name"];
    assert_eq!(name["pattern"], crd::ENV_NAME_PATTERN);
    assert_eq!(
        name["maxLength"].as_u64(),
        Some(crd::MAX_ENV_NAME_LEN as u64)
    );
    assert_eq!(
        env["items"]["properties"]["value"]["maxLength"].as_u64(),
        Some(crd::MAX_ENV_VALUE_LEN as u64)
    );
    assert_eq!(s["x-kubernetes-validations"][0]["rule"], crd::NAME_RULE);

    let status = &s["properties"]["status"]["properties"];
    for field in [
        "availableReplicas",
        "replicas",
        "phase",
        "observedGeneration",
        "conditions",
        "selector",
    ] {
        assert!(
            status.get(field).is_some(),
            "status.{field} is in the schema"
        );
    }
    assert_eq!(
        status["phase"]["enum"],
        json!(["Pending", "Progressing", "Running", "Degraded"])
    );
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"],
        json!(["type"])
    );
}

#[test]
fn every_field_has_a_description_for_kubectl_explain() {
    fn walk(schema: &Value, path: &str, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, child) in props {
                let child_path = format!("{path}.{name}");
                if child
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    missing.push(child_path.clone());
                }
                walk(child, &child_path, missing);
                if let Some(items) = child.get("items") {
                    walk(items, &child_path, missing);
                }
            }
        }
    }
    let mut missing = Vec::new();
    walk(&schema_json(), "", &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:?}"
    );
}

#[test]
fn schema_accepts_valid_specs() {
    assert_eq!(
        admit(myapp(json!({"image": "nginx", "port": 80}))),
        Vec::<String>::new()
    );
    assert_eq!(
        admit(myapp(
            json!({"replicas": 0, "image": "localhost:5000/a/b-c__d:v1.0_rc", "port": 65535,
                            "env": [{"name": "A"}, {"name": "b.c-d_e", "value": ""}]})
        )),
        Vec::<String>::new()
    );
}

#[test]
fn schema_rejects_each_bad_value_naming_the_field() {
    let cases = [
        (
            json!({"replicas": -1, "image": "nginx", "port": 80}),
            "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
        ),
        (
            json!({"replicas": 1001, "image": "nginx", "port": 80}),
            "spec.replicas: Invalid value: 1001: spec.replicas in body should be less than or equal to 1000",
        ),
        (
            json!({"image": "nginx", "port": 0}),
            "spec.port: Invalid value: 0: spec.port in body should be greater than or equal to 1",
        ),
        (
            json!({"image": "nginx", "port": 70000}),
            "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535",
        ),
        (
            json!({"image": "", "port": 80}),
            "spec.image: Invalid value: \"\": spec.image in body should be at least 1 chars long",
        ),
        (
            json!({"image": "x".repeat(513), "port": 80}),
            "spec.image: Too long: may not be more than 512 bytes",
        ),
        (json!({"port": 80}), "spec.image: Required value"),
        (json!({"image": "nginx"}), "spec.port: Required value"),
        (
            json!({"image": "nginx", "port": 80, "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
            "spec.env[1]: Duplicate value: map[string]interface {}{\"name\":\"A\"}",
        ),
        (
            json!({"image": "nginx", "port": 80, "env": [{"name": "1A"}]}),
            "spec.env[0].name: Invalid value: \"1A\": spec.env[0].name in body should match '^[-._a-zA-Z][-._a-zA-Z0-9]*$'",
        ),
        (
            json!({"image": "nginx", "port": 80, "env": [{"name": "A", "value": "v".repeat(8193)}]}),
            "spec.env[0].value: Too long: may not be more than 8192 bytes",
        ),
        (
            json!({"image": "nginx", "port": 80, "env": (0..65).map(|i| json!({"name": format!("V{i}")})).collect::<Vec<_>>()}),
            "spec.env: Too many: 65: must have at most 64 items",
        ),
    ];
    for (spec, expected) in cases {
        let errors = admit(myapp(spec.clone()));
        assert!(
            errors.contains(&expected.to_owned()),
            "spec {spec}\nexpected {expected}\ngot {errors:?}"
        );
    }
}

#[test]
fn cel_image_rule_accepts_references_and_rejects_others() {
    let good = [
        "nginx",
        "nginx:1.27",
        "library/nginx:latest",
        "ghcr.io/example/web:1.4.2",
        "localhost:5000/team/app",
        "registry.example.com:443/a/b/c:tag_1.0-x",
        "app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "quay.io/org/app:v2@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "[::1]:5000/app:1",
        "[2001:db8::5]/team/app",
        "a_b/c",
    ];
    for image in good {
        assert_eq!(
            admit(myapp(json!({"image": image, "port": 80}))),
            Vec::<String>::new(),
            "{image}"
        );
    }
    let bad = [
        "Nginx",
        "my app",
        "nginx:",
        "nginx@",
        "nginx:-tag",
        "nginx@sha256:short",
        "-leading/app",
        "host:port/app",
        "a//b",
        "team/UPPER:1",
        "a.b_c/app",
        "[ab]/app",
        "[::1]5000/app",
        "[::1]",
    ];
    for image in bad {
        let errors = admit(myapp(json!({"image": image, "port": 80})));
        let names_the_value = format!(
            "spec.image: Invalid value: \"string\": spec.image \"{image}\" is not an image reference: use one such as"
        );
        assert!(
            errors.len() == 1 && errors[0].starts_with(&names_the_value),
            "{image}: {errors:?}"
        );
    }
}

#[test]
fn cel_name_rule_requires_a_dns_1035_label() {
    for name in ["web", "a", "web-2", &"a".repeat(63)] {
        let mut obj = myapp(json!({"image": "nginx", "port": 80}));
        obj["metadata"]["name"] = json!(name);
        assert_eq!(admit(obj), Vec::<String>::new(), "{name}");
    }
    for name in ["web.v2", "2web", "web-", &"a".repeat(64)] {
        let mut obj = myapp(json!({"image": "nginx", "port": 80}));
        obj["metadata"]["name"] = json!(name);
        let errors = admit(obj);
        assert!(
            errors.len() == 1 && errors[0].contains("metadata.name must be a DNS-1035 label"),
            "{name}: {errors:?}"
        );
    }
}

#[test]
fn valid_examples_deserialize_and_pass_the_schema() {
    for file in ["myapp.yaml", "myapp-autoscaled.yaml"] {
        let value = read_yaml(&root().join("deploy/examples").join(file));
        let app: MyApp =
            serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!app.spec.image.is_empty(), "{file}");
        assert_eq!(admit(value), Vec::<String>::new(), "{file}");
    }
}

/// Invalid examples only the webhook rejects (see the table in `src/admission.rs`).
const WEBHOOK_ONLY_EXAMPLES: &[&str] = &["invalid-image-digest-wrong-length.yaml"];

#[test]
fn webhook_only_examples_pass_the_schema() {
    for file in WEBHOOK_ONLY_EXAMPLES {
        let errors = admit(read_yaml(&root().join("deploy/examples").join(file)));
        assert_eq!(
            errors,
            Vec::<String>::new(),
            "{file} is caught by the schema: move it to the schema table"
        );
    }
}

#[test]
fn each_invalid_example_is_rejected_for_the_reason_in_its_name() {
    let expected = [
        (
            "invalid-replicas-negative.yaml",
            "spec.replicas: Invalid value: -1:",
        ),
        ("invalid-port-zero.yaml", "spec.port: Invalid value: 0:"),
        (
            "invalid-port-too-large.yaml",
            "spec.port: Invalid value: 70000:",
        ),
        // minLength does not stop the CEL rules (only type, required, enum and size errors do,
        // as kube-apiserver's `hasBlockingErr`), so the image rule reports the empty value too.
        (
            "invalid-image-empty.yaml",
            "spec.image: Invalid value: \"\": spec.image in body should be at least 1 chars long",
        ),
        (
            "invalid-image-not-a-reference.yaml",
            "spec.image: Invalid value: \"string\": spec.image \"Example/My App:1.0\" is not an image reference",
        ),
        (
            "invalid-env-duplicate-name.yaml",
            "spec.env[1]: Duplicate value:",
        ),
        (
            "invalid-env-bad-name.yaml",
            "spec.env[0].name: Invalid value: \"1ST_VAR\":",
        ),
        (
            "invalid-name-not-dns-label.yaml",
            "<nil>: Invalid value: \"object\": metadata.name must be a DNS-1035 label",
        ),
    ];
    let on_disk: BTreeSet<String> = std::fs::read_dir(root().join("deploy/examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("invalid-") && !WEBHOOK_ONLY_EXAMPLES.contains(&n.as_str()))
        .collect();
    let covered: BTreeSet<String> = expected.iter().map(|(f, _)| (*f).to_owned()).collect();
    assert_eq!(
        on_disk, covered,
        "every invalid example has an expected error here"
    );

    for (file, message) in expected {
        let errors = admit(read_yaml(&root().join("deploy/examples").join(file)));
        let also = match file {
            "invalid-image-empty.yaml" => {
                vec![
                    "spec.image: Invalid value: \"string\": spec.image \"\" is not an image reference",
                ]
            }
            _ => vec![],
        };
        assert!(
            errors.len() == 1 + also.len()
                && errors[0].starts_with(message)
                && also.iter().zip(&errors[1..]).all(|(a, e)| e.starts_with(a)),
            "{file}: expected an error starting with {message:?} (and {also:?}), got {errors:?}"
        );
    }
}
