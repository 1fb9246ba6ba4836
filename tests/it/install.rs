//! The whole `deploy/` applied into the sandbox with the real `kubectl apply -k deploy/`, then
//! the webhook configurations given their CA as cert-manager's CA injector would, the webhook
//! served locally behind the Service the configurations name, and the operator started as the
//! Deployment would start it (leader election on, Lease in `myapp-system`). The examples then
//! go through the API server's admission chain as a user's `kubectl apply` does.
//!
//! What the sandbox cannot prove here (cert-manager issuing, the pod running under the
//! ServiceAccount with RBAC enforced, Pod Security admission) is listed in deploy/README.md.

mod rendered;

use crate::support::converge;
use crate::support::operator;

use converge::eventually;
use operator::Operator;

use kube_sandbox::testing as kubectl;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{Api, Client, api::PostParams};
use kube_sandbox::{Sandbox, admission::ServiceRef};
use myapp_operator::{
    admission::AdmissionConfig,
    certs,
    crd::{EnvVar, MyApp, Phase},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use kubectl::{Kubectl, path_str};

const SERVICE: (&str, &str) = ("myapp-system", "myapp-operator-webhook");

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A kind reduced to what an apply needs: group, version, names, and a schema that keeps any
/// field. Used for cert-manager's kinds (the real CRDs come with cert-manager) and for the
/// built-in kinds the sandbox does not serve (see [`UNSERVED_BUILTINS`]).
fn stand_in_crd(group: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                // Free-form spec and status. (A root-level preserve-unknown-fields would say
                // the same, but the sandbox's pruning ignores it at the root.)
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    }))
    .unwrap()
}

/// Built-in kinds in `deploy/` that the sandbox does not serve: without them kubectl fails
/// ("the server could not find the requested resource"). Stood in by CRDs so that the apply
/// goes through; their objects are stored, not enforced (a real cluster's job).
const UNSERVED_BUILTINS: &[(&str, &str, &str)] = &[
    ("policy", "PodDisruptionBudget", "poddisruptionbudgets"),
    ("networking.k8s.io", "NetworkPolicy", "networkpolicies"),
];

/// What cert-manager's CA injector does for `cert-manager.io/inject-ca-from`: read the
/// configuration, set `caBundle` on every webhook, write it back (an update).
async fn inject_ca(client: &Client, ca_pem: &str) {
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let mut config = mutating.get("myapp-operator").await.unwrap();
    assert_eq!(
        config.metadata.annotations.as_ref().unwrap()["cert-manager.io/inject-ca-from"],
        "myapp-system/myapp-operator-webhook"
    );
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(bundle.clone());
    }
    mutating
        .replace("myapp-operator", &PostParams::default(), &config)
        .await
        .unwrap();
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let mut config = validating.get("myapp-operator").await.unwrap();
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(bundle.clone());
    }
    validating
        .replace("myapp-operator", &PostParams::default(), &config)
        .await
        .unwrap();
}

/// The webhook as the pod serves it, with a certificate for the Service's DNS names.
async fn serve_webhook(
    dir: &std::path::Path,
    stop: &CancellationToken,
) -> (webhook::ServerHandle, String) {
    let bundle = certs::generate(&certs::service_sans(SERVICE.1, SERVICE.0)).unwrap();
    let cert_dir = dir.join("certs");
    bundle.write_to(&cert_dir).unwrap();
    let admission = AdmissionConfig {
        default_env: vec![EnvVar {
            name: "TEAM".into(),
            value: "shop".into(),
        }],
        ..AdmissionConfig::default()
    };
    let mut config = webhook::ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), &cert_dir);
    // The pod drains for seconds so Endpoints can catch up; nothing here routes by Endpoints.
    config.drain_delay = Duration::ZERO;
    let server = webhook::serve(
        config,
        myapp_operator::admission::router(admission),
        webhook::Metrics::new(),
        stop.clone().cancelled_owned(),
    )
    .await
    .expect("webhook serves");
    (server, bundle.ca_pem)
}

/// Each invalid example, and what `kubectl apply` must print for it: the field and the
/// reason, from the CRD schema or (for what only it checks) the validating webhook.
const INVALID: &[(&str, &[&str])] = &[
    (
        "invalid-replicas-negative.yaml",
        &["spec.replicas: Invalid value: -1"],
    ),
    ("invalid-port-zero.yaml", &["spec.port: Invalid value: 0"]),
    (
        "invalid-port-too-large.yaml",
        &["spec.port: Invalid value: 70000"],
    ),
    (
        "invalid-image-empty.yaml",
        &["spec.image: Invalid value: \"\""],
    ),
    (
        "invalid-image-not-a-reference.yaml",
        &["is not an image reference: use one such as"],
    ),
    (
        "invalid-image-digest-wrong-length.yaml",
        &[
            // The webhook's 422 Status passes through: kubectl prints it as the API's own.
            "The MyApp \"web\" is invalid: spec.image",
            "sha256 needs 64 and sha512 128 lower-case hex digits",
        ],
    ),
    (
        "invalid-env-duplicate-name.yaml",
        &["spec.env[1]: Duplicate value"],
    ),
    (
        "invalid-env-bad-name.yaml",
        &["spec.env[0].name: Invalid value"],
    ),
    (
        "invalid-name-not-dns-label.yaml",
        &["metadata.name must be a DNS-1035 label"],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_deploy_directory_installs_admits_rejects_and_reconciles() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sandbox = Sandbox::builder()
        .deployment_controller(true)
        .rollout_delay(Duration::from_millis(50))
        .build();
    let served = sandbox
        .serve(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let Some(kubectl) = Kubectl::new(&served.kubeconfig()) else {
        return;
    };
    let client = crate::support::install::client_for(&served.kubeconfig()).await;

    // cert-manager is installed first; its CRDs are all that applying certificates.yaml needs.
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let stand_ins = [
        ("cert-manager.io", "Issuer", "issuers"),
        ("cert-manager.io", "Certificate", "certificates"),
    ];
    for (group, kind, plural) in stand_ins.iter().chain(UNSERVED_BUILTINS) {
        let crd = stand_in_crd(group, kind, plural);
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }

    let applied = kubectl
        .ok(&["apply", "-k", path_str(&repo("deploy"))])
        .await;
    for (kind, name) in [
        ("namespace", "myapp-system"),
        (
            "customresourcedefinition.apiextensions.k8s.io",
            "myapps.example.com",
        ),
        ("serviceaccount", "myapp-operator"),
        ("clusterrole.rbac.authorization.k8s.io", "myapp-operator"),
        (
            "role.rbac.authorization.k8s.io",
            "myapp-operator-leader-election",
        ),
        ("issuer.cert-manager.io", "myapp-operator-ca"),
        ("certificate.cert-manager.io", "myapp-operator-webhook"),
        ("deployment.apps", "myapp-operator"),
        ("poddisruptionbudget.policy", "myapp-operator"),
        ("service", "myapp-operator-webhook"),
        ("service", "myapp-operator-metrics"),
        (
            "mutatingwebhookconfiguration.admissionregistration.k8s.io",
            "myapp-operator",
        ),
        (
            "validatingwebhookconfiguration.admissionregistration.k8s.io",
            "myapp-operator",
        ),
        ("networkpolicy.networking.k8s.io", "myapp-operator"),
    ] {
        assert!(
            applied.contains(&format!("{kind}/{name} created")),
            "kubectl apply -k did not create {kind}/{name}:\n{applied}"
        );
    }

    // What the cluster does next: cert-manager fills the CA in, the pod serves the webhook
    // behind its Service.
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let (webhook, ca_pem) = serve_webhook(dir.path(), &stop).await;
    inject_ca(&client, &ca_pem).await;
    sandbox.admission().register_service(
        ServiceRef::new(SERVICE.0, SERVICE.1, 443),
        webhook.local_addr(),
    );

    // The operator as the Deployment runs it: leader election on, Lease in its namespace.
    let operator = Operator::start(
        client.clone(),
        "install-test",
        true,
        Duration::from_secs(300),
    );

    for (file, expected) in INVALID {
        let example = repo("deploy/examples").join(file);
        let out = kubectl.run(&["apply", "-f", path_str(&example)]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file} was admitted");
        for text in *expected {
            assert!(stderr.contains(text), "{file}: {text:?} not in: {stderr}");
        }
    }

    for file in ["myapp.yaml", "myapp-autoscaled.yaml"] {
        let example = repo("deploy/examples").join(file);
        kubectl.ok(&["apply", "-f", path_str(&example)]).await;
    }
    let apps = Api::<MyApp>::namespaced(client.clone(), "default");
    for name in ["web", "api"] {
        let app = eventually(&format!("{name} is Running"), || async {
            let app = apps.get(name).await.ok()?;
            let status = app.status.as_ref()?;
            (status.phase == Some(Phase::Running)
                && status.observed_generation == app.metadata.generation)
                .then_some(app)
        })
        .await;
        assert!(
            app.spec
                .env
                .iter()
                .any(|e| e.name == "TEAM" && e.value == "shop"),
            "{name} was not defaulted by the mutating webhook: {:?}",
            app.spec.env
        );
    }
    let listed = kubectl.ok(&["get", "myapps"]).await;
    assert!(listed.contains("web") && listed.contains("api"), "{listed}");

    // With the webhook down (failurePolicy Fail), a label-only update still goes through
    // (the matchConditions leave it out of the chain) while a spec change is refused.
    stop.cancel();
    operator.stop().await;
    let _ = webhook.wait().await;
    kubectl
        .ok(&["label", "myapp", "web", "tier=frontend"])
        .await;
    let out = kubectl
        .run(&[
            "patch",
            "myapp",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":4}}"#,
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("failed calling webhook"),
        "a spec change was admitted without the webhook: {stderr}"
    );
    let _ = served.shutdown().await;
}
