//! Shared test fixtures: a small custom resource and a sandbox client.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResource, CustomResourceExt};
use kube_sandbox::Sandbox;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The test kind: a Widget owns one ConfigMap holding its spec.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sandbox.test",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wd",
    category = "all",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.observed_replicas"
    ),
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#
)]
pub struct WidgetSpec {
    /// How many; never negative.
    #[schemars(range(min = 0, max = 10))]
    pub replicas: i32,
    /// Free text copied into the child ConfigMap.
    pub message: String,
    /// Optional colour, defaulted by the schema.
    #[serde(default = "default_colour")]
    #[schemars(default = "default_colour")]
    pub colour: String,
}

fn default_colour() -> String {
    "blue".into()
}

/// What the controller reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WidgetStatus {
    /// The replicas seen in the last reconcile.
    pub observed_replicas: i32,
}

/// A sandbox and a kube client on its in-process router.
pub fn client(sandbox: &Sandbox) -> Client {
    Client::new(sandbox.router(), "default")
}

/// Installs the Widget CRD.
pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Widget::crd())
        .await
        .expect("create the Widget CRD");
}

/// A Widget named `name`.
pub fn widget(name: &str, replicas: i32, message: &str) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            replicas,
            message: message.into(),
            colour: "red".into(),
        },
    )
}
