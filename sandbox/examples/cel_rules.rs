//! Timed loop: the schema and CEL validation of one MyApp (the workspace's `deploy/base/crd.yaml`,
//! whose image and name rules call `matches()` with long constant patterns), as the sandbox
//! runs it on every write, beside kube-cel's `Validator` over the same compiled rules (which
//! compiles each pattern on every call).
//!
//! `cargo run --release -p kube-sandbox --example cel_rules [-- <iterations>]`

use std::time::Instant;

use kube::core::cel::{Validator, compile_schema};
use kube_sandbox::schema::CrdSchema;
use serde_json::{Value, json};

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let crd: Value = serde_saphyr::from_str(include_str!("../../deploy/base/crd.yaml"))
        .expect("deploy/base/crd.yaml parses");
    let schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    let object = json!({
        "apiVersion": "example.com/v1", "kind": "MyApp",
        "metadata": {"name": "web-frontend"},
        "spec": {"replicas": 3, "image": "registry.example.com/team/web-frontend:1.2.3", "port": 8080}
    });

    let sandbox = CrdSchema::from_value(schema.clone()).expect("the MyApp schema compiles");
    let start = Instant::now();
    for _ in 0..iterations {
        assert!(sandbox.validate(&object, None).is_empty());
    }
    let ours = start.elapsed() / iterations;

    let compiled = compile_schema(&schema);
    let validator = Validator::new();
    let start = Instant::now();
    for _ in 0..iterations {
        assert!(
            validator
                .validate_compiled(&compiled, &object, None)
                .is_ok()
        );
    }
    let kube_cel = start.elapsed() / iterations;

    println!("iterations: {iterations}");
    println!("CrdSchema::validate (schema checks + rules): {ours:?} per object");
    println!("kube-cel Validator (rules only):            {kube_cel:?} per object");
    println!(
        "patterns compiled by CrdSchema: {}",
        sandbox.pattern_compilations()
    );
}
