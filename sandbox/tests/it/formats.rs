//! `format` and the `allOf`/`anyOf`/`oneOf`/`not` junctors on custom resource writes, with
//! Gateway API's vendored gateways CRD, whose addresses are `oneOf` an `IPAddress` branch
//! (`value` `anyOf` `ipv4`/`ipv6`) and a branch for every other type. The texts are
//! kube-apiserver 1.33's: kube-openapi's `schema_props.go` reports the junctor's message, then
//! the errors of the alternative that counted the most checks; the failed format is a type
//! error (`formats.go`, `FormatOf`), which stops the CEL rules (`hasBlockingErr`).

use crate::support::fixtures::client;
use crate::support::kubectl::{served_kubectl, stderr};
use crate::support::vendored::{apply_vendored_crd, install_vendored_crd};

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;
use serde_json::{Value, json};

const GATEWAYS: &str = "gateway-api/gateway.networking.k8s.io_gateways.yaml";

const RULES_SKIPPED: &str = "<nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

async fn gateways(sandbox: &Sandbox) -> (Api<DynamicObject>, ApiResource) {
    let client = client(sandbox);
    let resource = install_vendored_crd(&client, GATEWAYS).await;
    (Api::namespaced_with(client, "default", &resource), resource)
}

fn gateway(resource: &ApiResource, name: &str, addresses: Value) -> DynamicObject {
    let mut gateway = DynamicObject::new(name, resource);
    gateway.data = json!({"spec": {
        "gatewayClassName": "example",
        "addresses": addresses,
        "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]
    }});
    gateway
}

/// The message of the API server's 422 for a write `api` refused.
fn invalid_message(result: Result<DynamicObject, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => status.message,
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn a_gateway_ip_address_with_a_port_is_refused_with_the_api_servers_errors() {
    let sandbox = Sandbox::new();
    let (api, resource) = gateways(&sandbox).await;
    // Valid addresses of each branch are stored.
    let valid = json!([{"type": "IPAddress", "value": "10.0.0.1"},
                       {"type": "IPAddress", "value": "2001:db8::1"},
                       {"type": "Hostname", "value": "gw.example.com"}]);
    api.create(&PostParams::default(), &gateway(&resource, "ok", valid))
        .await
        .unwrap();
    let bad = json!([{"type": "IPAddress", "value": "1.2.3.4:8080"}]);
    let message = invalid_message(
        api.create(&PostParams::default(), &gateway(&resource, "gw", bad))
            .await,
    );
    let expected = [
        r#"<nil>: Invalid value: "": "spec.addresses[0]" must validate one and only one schema (oneOf). Found none valid"#,
        r#"<nil>: Invalid value: "": "spec.addresses[0].value" must validate at least one schema (anyOf)"#,
        r#"spec.addresses[0].value: Invalid value: "1.2.3.4:8080": spec.addresses[0].value in body must be of type ipv4: "1.2.3.4:8080""#,
        RULES_SKIPPED,
    ];
    assert_eq!(
        message,
        format!(
            "Gateway.gateway.networking.k8s.io \"gw\" is invalid: [{}]",
            expected.join(", ")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_gateway_with_a_bad_ip_address_fails_as_on_a_cluster() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    apply_vendored_crd(&k, GATEWAYS).await;
    let gw = k.file(
        "gw.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n\
         spec:\n  gatewayClassName: example\n  addresses:\n  - type: IPAddress\n    value: 1.2.3.4:8080\n\
         \x20 listeners:\n  - name: http\n    port: 80\n    protocol: HTTP\n",
    );
    let out = k.run(&["apply", "-f", path_str(&gw)]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    for line in [
        r#"The Gateway "gw" is invalid: "#,
        r#"* <nil>: Invalid value: "": "spec.addresses[0]" must validate one and only one schema (oneOf). Found none valid"#,
        r#"* <nil>: Invalid value: "": "spec.addresses[0].value" must validate at least one schema (anyOf)"#,
        r#"* spec.addresses[0].value: Invalid value: "1.2.3.4:8080": spec.addresses[0].value in body must be of type ipv4: "1.2.3.4:8080""#,
    ] {
        assert!(err.contains(line), "missing {line:?} in:\n{err}");
    }
}

#[tokio::test]
async fn a_status_write_is_validated_against_the_status_schema_with_relative_names() {
    let sandbox = Sandbox::new();
    let (api, resource) = gateways(&sandbox).await;
    api.create(&PostParams::default(), &gateway(&resource, "gw", json!([])))
        .await
        .unwrap();
    let status = |value: &str| {
        Patch::Merge(json!({"status": {"addresses": [{"type": "IPAddress", "value": value}]}}))
    };
    let params = PatchParams::default();
    api.patch_status("gw", &params, &status("10.0.0.1"))
        .await
        .unwrap();
    let message = invalid_message(
        api.patch_status("gw", &params, &status("10.0.0.1:80"))
            .await,
    );
    // `ValidateStatusUpdate` validates `status` alone: the junctors' errors are at `status`,
    // and the names inside the messages are relative to it.
    let expected = [
        r#"status: Invalid value: "": "addresses[0]" must validate one and only one schema (oneOf). Found none valid"#,
        r#"status: Invalid value: "": "addresses[0].value" must validate at least one schema (anyOf)"#,
        r#"status.addresses[0].value: Invalid value: "10.0.0.1:80": addresses[0].value in body must be of type ipv4: "10.0.0.1:80""#,
        RULES_SKIPPED,
    ];
    assert_eq!(
        message,
        format!(
            "Gateway.gateway.networking.k8s.io \"gw\" is invalid: [{}]",
            expected.join(", ")
        )
    );
}
