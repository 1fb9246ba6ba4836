//! Gateway API's safe-upgrades ValidatingAdmissionPolicy and Binding (vendored in
//! `tests/data/crds/gateway-api/` with their provenance): they install with kubectl, client-side
//! and server-side, and refuse what upstream means them to refuse, with the API server's texts.

use crate::support::kubectl::{served_kubectl, stderr, stdout};

use kube_sandbox::Sandbox;
use kube_sandbox::testing::{Kubectl, path_str};
use serde_json::{Value, json};

/// The Gateway API bundle's policy and binding.
const SAFE_UPGRADES: &str =
    include_str!("../../data/crds/gateway-api/gateway.networking.k8s.io_vap_safeupgrades.yaml");

/// A CRD in Gateway API's group, stamped with a bundle version and channel.
fn gateway_crd(version: &str, channel: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.gateway.networking.k8s.io", "annotations": {
            "gateway.networking.k8s.io/bundle-version": version,
            "gateway.networking.k8s.io/channel": channel}},
        "spec": {
            "group": "gateway.networking.k8s.io", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object"}}}]
        }
    })
}

#[tokio::test]
async fn gateway_apis_safe_upgrades_policy_installs_and_refuses_what_it_is_meant_to() {
    for (flags, verb) in [
        (&[][..], "created"),
        (&["--server-side"][..], "serverside-applied"),
    ] {
        let sandbox = Sandbox::new();
        let Some((_served, k)) = served_kubectl(&sandbox).await else {
            return;
        };
        let bundle = k.file("vap.yaml", SAFE_UPGRADES);
        let out = k
            .run(&[&["apply", "-f", path_str(&bundle)], flags].concat())
            .await;
        assert_eq!(
            stdout(&out),
            format!(
                "validatingadmissionpolicy.admissionregistration.k8s.io/safe-upgrades.gateway.networking.k8s.io {verb}\nvalidatingadmissionpolicybinding.admissionregistration.k8s.io/safe-upgrades.gateway.networking.k8s.io {verb}\n"
            ),
            "{flags:?}: {}",
            stderr(&out)
        );
        safe_upgrades_refuse_what_they_are_meant_to(&k).await;
    }
}

async fn apply_crd(k: &Kubectl, crd: Value) -> std::process::Output {
    let file = k.file("crd.json", &crd.to_string());
    k.run(&["apply", "-f", path_str(&file)]).await
}

async fn safe_upgrades_refuse_what_they_are_meant_to(k: &Kubectl) {
    let policy = "ValidatingAdmissionPolicy 'safe-upgrades.gateway.networking.k8s.io' with binding 'safe-upgrades.gateway.networking.k8s.io' denied request";
    let old = apply_crd(k, gateway_crd("v1.4.0", "standard")).await;
    assert!(!old.status.success());
    assert_eq!(
        stderr(&old),
        format!(
            "The customresourcedefinitions \"gadgets.gateway.networking.k8s.io\" is invalid: : {policy}: Installing CRDs with version before v1.5.0 is prohibited by default. Uninstall ValidatingAdmissionPolicy safe-upgrades.gateway.networking.k8s.io to install older versions.\n"
        )
    );
    let current = apply_crd(k, gateway_crd("v1.6.1", "standard")).await;
    assert!(current.status.success(), "{}", stderr(&current));
    let experimental = apply_crd(k, gateway_crd("v1.6.1", "experimental")).await;
    assert!(!experimental.status.success());
    assert!(
        stderr(&experimental).contains(&format!(
            "{policy}: Installing experimental CRDs on top of standard channel CRDs is prohibited by default."
        )),
        "{}",
        stderr(&experimental)
    );
    // Release candidates and other groups pass.
    let candidate = apply_crd(k, gateway_crd("v1.7.0-rc1", "standard")).await;
    assert!(candidate.status.success(), "{}", stderr(&candidate));
    let mut other = gateway_crd("v0.1.0", "standard");
    other["metadata"]["name"] = json!("gadgets.example.com");
    other["spec"]["group"] = json!("example.com");
    let other = apply_crd(k, other).await;
    assert!(other.status.success(), "{}", stderr(&other));
}
