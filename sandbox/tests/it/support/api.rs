//! Shorthands for the integration tests' requests: the objects they write most, a sandbox
//! with the Widget CRD, and reading refusals and the request log. Kept out of `fixtures`,
//! which `examples/bench_10k.rs` compiles too: there they would be dead code.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use kube::core::Status;
use kube_sandbox::Sandbox;
use serde_json::json;

use super::fixtures::{Widget, client, install_crd};

/// A client of `sandbox` with the Widget CRD installed, and the Widgets in `default`.
pub async fn with_widgets(sandbox: &Sandbox) -> (Client, Api<Widget>) {
    let client = client(sandbox);
    install_crd(&client).await;
    let widgets = Api::default_namespaced(client.clone());
    (client, widgets)
}

/// The manifest of a Widget, as YAML.
pub fn widget_yaml(name: &str, replicas: i32, message: &str) -> String {
    format!(
        "apiVersion: sandbox.test/v1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  message: {message}\n"
    )
}

/// An empty ConfigMap named `name`.
pub fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

/// A Deployment `name` of `replicas` Pods selected by `app: <name>`, one container `c` running
/// `image`.
pub fn deployment(name: &str, replicas: i32, image: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": image}]}},
        },
    }))
    .unwrap()
}

/// The Status the API server refused a request with; any other error fails the test.
pub fn api_error(err: kube::Error) -> Box<Status> {
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err}");
    };
    status
}

/// Checks that `result` is a refusal with the HTTP status `code`.
pub fn assert_refused<T: std::fmt::Debug>(result: &kube::Result<T>, code: u16) {
    assert!(
        matches!(result, Err(kube::Error::Api(s)) if s.code == code),
        "expected a {code}: {result:?}"
    );
}

/// How many requests with `verb` the sandbox's request log holds.
pub fn requests_with_verb(sandbox: &Sandbox, verb: &str) -> usize {
    let log = sandbox.faults().requests();
    log.iter().filter(|r| r.verb == verb).count()
}
