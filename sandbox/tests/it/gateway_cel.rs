//! Gateway API's own validation cases (`tests/cel/*_test.go`, which its CI runs against
//! kube-apiserver 1.33 with the standard channel's CRDs), ported as data in
//! `tests/data/crds/gateway-api-cel-cases.yaml` and run here through the kube client as
//! upstream runs them: create; for an update case create then update; for a status case create
//! then write `/status`. A case is upstream's record of what 1.33 accepts and refuses, so a
//! failing one is the sandbox's fault: it is fixed, or kept as a known `gap:` in the data,
//! which must then still fail.

use crate::support::fixtures::client;
use crate::support::vendored::{install_vendored_crd, vendored_crd};

use std::collections::HashMap;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube_sandbox::Sandbox;
use serde::Deserialize;
use serde_json::{Value, json};

const CRDS: [&str; 4] = [
    "gateway-api/gateway.networking.k8s.io_gatewayclasses.yaml",
    "gateway-api/gateway.networking.k8s.io_gateways.yaml",
    "gateway-api/gateway.networking.k8s.io_httproutes.yaml",
    "gateway-api/gateway.networking.k8s.io_backendtlspolicies.yaml",
];

/// One upstream test function and its table.
#[derive(Deserialize)]
struct Test {
    file: String,
    test: String,
    kind: String,
    /// What Go's client sends as the status of a create (a zero struct it cannot omit).
    status: Option<Value>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    name: String,
    spec: Value,
    update: Option<Value>,
    status_update: Option<Value>,
    #[serde(default)]
    want_errors: Vec<String>,
    gap: Option<String>,
}

/// The kube client's answer to a case: the error message of the write that failed, if any.
async fn run(api: &Api<DynamicObject>, test: &Test, case: &Case, name: &str) -> Option<String> {
    let mut object = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": test.kind,
        "metadata": {"name": name},
        "spec": case.spec,
    });
    if let Some(status) = &test.status {
        object["status"] = status.clone();
    }
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let pp = PostParams::default();
    let mut created = match api.create(&pp, &object).await {
        Ok(created) => created,
        Err(error) => return Some(message(error)),
    };
    let written = if let Some(spec) = &case.update {
        created.data["spec"] = spec.clone();
        api.replace(name, &pp, &created).await
    } else if let Some(fields) = &case.status_update {
        for (field, value) in fields.as_object().unwrap() {
            created.data["status"][field] = value.clone();
        }
        api.replace_status(name, &pp, &created).await
    } else {
        return None;
    };
    written.err().map(message)
}

fn message(error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message,
        other => format!("not an API error: {other}"),
    }
}

/// Upstream's `celErrorStringMatches`: a substring, also with `more` read as `longer` (the
/// wording of the size errors changed between minors).
fn matches(got: &str, want: &str) -> bool {
    got.contains(want) || got.contains(&want.replace("more", "longer"))
}

/// Why `got` is not what the case expects, or `None` when it is.
fn mismatch(case: &Case, got: &Option<String>) -> Option<String> {
    match (got, case.want_errors.is_empty()) {
        (None, true) => None,
        (None, false) => Some(format!("accepted; want errors {:?}", case.want_errors)),
        (Some(got), true) => Some(format!("refused; want accepted: {got}")),
        (Some(got), false) => {
            let missing: Vec<&String> = case
                .want_errors
                .iter()
                .filter(|want| !matches(got, want))
                .collect();
            (!missing.is_empty()).then(|| format!("missing {missing:?} in: {got}"))
        }
    }
}

#[tokio::test]
async fn gateway_apis_own_validation_cases_answer_as_kube_apiserver_1_33() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let mut resources: HashMap<String, ApiResource> = HashMap::new();
    for crd in CRDS {
        let resource = install_vendored_crd(&client, crd).await;
        resources.insert(resource.kind.clone(), resource);
    }
    let tests: Vec<Test> =
        serde_saphyr::from_str(&vendored_crd("gateway-api-cel-cases.yaml")).unwrap();

    let (mut cases, mut gaps) = (0, Vec::new());
    let mut failures = Vec::new();
    for test in &tests {
        let resource = &resources[&test.kind];
        let api: Api<DynamicObject> = if test.kind == "GatewayClass" {
            Api::all_with(client.clone(), resource)
        } else {
            Api::namespaced_with(client.clone(), "default", resource)
        };
        for case in &test.cases {
            cases += 1;
            let got = run(&api, test, case, &format!("case-{cases}")).await;
            let at = format!("{} {}/{}", test.file, test.test, case.name);
            match (mismatch(case, &got), &case.gap) {
                (None, None) => {}
                (Some(why), None) => failures.push(format!("{at}: {why}")),
                (Some(_), Some(gap)) => gaps.push(format!("{at}: {gap}")),
                (None, Some(_)) => failures.push(format!("{at}: passes, drop its gap")),
            }
        }
    }
    eprintln!(
        "{cases} cases: {} as upstream, {} known gaps",
        cases - failures.len() - gaps.len(),
        gaps.len()
    );
    for gap in &gaps {
        eprintln!("known gap: {gap}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
