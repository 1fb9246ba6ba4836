//! The install as kubectl renders it: `deploy/` (with cert-manager), its release rendering
//! `deploy/install.yaml`, and `deploy/without-cert-manager/`. Every webhook gets its CA by
//! construction, proven by adding entries the manifests do not have; both installs apply with
//! `--dry-run=server` against `dev`'s API server.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use base64::Engine as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, api::PostParams};
use kube_sandbox::testing::{Kubectl, path_str};
use myapp_operator::{
    certs,
    dev::{Environment, Options},
};
use serde_json::{Value, json};

use super::{SERVICE, UNSERVED_BUILTINS, repo, stand_in_crd};

const WEBHOOK_KINDS: [&str; 2] = [
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];
const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// `kubectl kustomize <dir>`: kubectl's built-in kustomize, no server contacted.
fn render(kubectl: &Kubectl, dir: &Path) -> Vec<Value> {
    documents(&block_on(kubectl.ok(&["kustomize", path_str(dir)])))
}

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn identity(d: &Value) -> (String, String, String) {
    let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        field(&d["kind"]),
        field(&d["metadata"]["namespace"]),
        field(&d["metadata"]["name"]),
    )
}

/// (kind, namespace, name) of every document in the files `deploy/kustomization.yaml` lists,
/// directories (`base`) included.
fn listed_objects(dir: &Path) -> BTreeSet<(String, String, String)> {
    let kustomization: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut out = BTreeSet::new();
    for resource in kustomization["resources"].as_array().unwrap() {
        let path = dir.join(resource.as_str().unwrap());
        if path.is_dir() {
            out.extend(listed_objects(&path));
        } else {
            let text = std::fs::read_to_string(path).unwrap();
            out.extend(documents(&text).iter().map(identity));
        }
    }
    out
}

/// A copy of `deploy/` to change, with a fresh CA and serving certificate in
/// `without-cert-manager/` as `myapp-operator certs --out` writes them.
struct Copy {
    _dir: tempfile::TempDir,
    deploy: PathBuf,
    bundle: certs::Bundle,
}

impl Copy {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let deploy = dir.path().join("deploy");
        copy_tree(&repo("deploy"), &deploy);
        let bundle = certs::generate(&certs::service_sans(SERVICE.1, SERVICE.0)).unwrap();
        bundle
            .write_to(&deploy.join("without-cert-manager"))
            .unwrap();
        Self {
            _dir: dir,
            deploy,
            bundle,
        }
    }

    /// Adds a webhook entry to each configuration in `base/webhooks.yaml`, and a third
    /// configuration of its own: what a later release might add.
    fn add_webhooks(&self) {
        let path = self.deploy.join("base/webhooks.yaml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        let entry = |name: &str| {
            json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"service": {"name": SERVICE.1, "namespace": SERVICE.0, "path": "/later"}},
                "rules": [{"apiGroups": ["example.com"], "apiVersions": ["v1"],
                           "operations": ["DELETE"], "resources": ["myapps"]}],
            })
        };
        let mut docs = documents(&text);
        for doc in &mut docs {
            let name = format!("later.{}", doc["kind"].as_str().unwrap().to_lowercase());
            doc["webhooks"].as_array_mut().unwrap().push(entry(&name));
        }
        docs.push(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "myapp-operator-later"},
            "webhooks": [entry("third.myapps.example.com")],
        }));
        text = docs
            .iter()
            .map(|d| serde_json::to_string(d).unwrap())
            .collect::<Vec<_>>()
            .join("\n---\n");
        std::fs::write(&path, text).unwrap();
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Every webhook entry of every configuration in `docs`: (configuration, entry name, entry).
fn webhook_entries(docs: &[Value]) -> Vec<(String, String, Value)> {
    docs.iter()
        .filter(|d| WEBHOOK_KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
        .flat_map(|d| {
            let configuration = format!("{} {}", d["kind"], d["metadata"]["name"]);
            d["webhooks"].as_array().unwrap().iter().map(move |w| {
                (
                    configuration.clone(),
                    w["name"].as_str().unwrap().to_owned(),
                    w.clone(),
                )
            })
        })
        .collect()
}

/// Each entry's caBundle verifies `serving` for the Service's name, as the API server checks
/// it when it calls the webhook. The bundle is base64 as the API takes it; kustomize wraps
/// long values, and the API server's decoder skips the line breaks.
fn assert_every_bundle_verifies(docs: &[Value], serving: &str) -> usize {
    let host = format!("{}.{}.svc", SERVICE.1, SERVICE.0);
    let entries = webhook_entries(docs);
    for (configuration, name, entry) in &entries {
        let encoded = entry["clientConfig"]["caBundle"]
            .as_str()
            .unwrap_or_else(|| panic!("webhook {name} of {configuration} has no caBundle"))
            .replace(['\n', '\r'], "");
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        myapp_operator::check::verifies(&bundle, serving.as_bytes(), &host)
            .unwrap_or_else(|e| panic!("webhook {name} of {configuration}: {e}"));
    }
    entries.len()
}

#[test]
fn kubectl_kustomize_renders_every_listed_object_without_a_server() {
    let Some(kubectl) = Kubectl::new("") else {
        return;
    };
    let rendered: BTreeSet<_> = render(&kubectl, &repo("deploy"))
        .iter()
        .map(identity)
        .collect();
    let kinds: BTreeSet<&str> = rendered.iter().map(|(kind, _, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Certificate",
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Issuer",
            "MutatingWebhookConfiguration",
            "Namespace",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingWebhookConfiguration",
        ]
        .into_iter()
        .collect()
    );
    assert_eq!(rendered, listed_objects(&repo("deploy")));
}

/// `deploy/install.yaml` is what a release publishes: `deploy/` rendered, naming the image of
/// this version. It cannot drift from `deploy/`.
#[test]
fn the_release_manifest_is_the_rendered_install_naming_this_versions_image() {
    let Some(kubectl) = Kubectl::new("") else {
        return;
    };
    let rendered = render(&kubectl, &repo("deploy"));
    let release = documents(&std::fs::read_to_string(repo("deploy/install.yaml")).unwrap());
    assert!(
        rendered == release,
        "deploy/install.yaml is stale: kubectl kustomize deploy > deploy/install.yaml"
    );
    let images: Vec<&str> = release
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
        })
        .map(|c| c["image"].as_str().unwrap())
        .collect();
    assert_eq!(
        images,
        [format!(
            "ghcr.io/example/myapp-operator:{}",
            env!("CARGO_PKG_VERSION")
        )],
        "the release names the image of its own version (deploy/base/deployment.yaml)"
    );
}

#[test]
fn with_cert_manager_every_webhook_configuration_asks_for_the_ca_even_one_added_later() {
    let Some(kubectl) = Kubectl::new("") else {
        return;
    };
    let copy = Copy::new();
    copy.add_webhooks();
    let rendered = render(&kubectl, &copy.deploy);
    let configurations: Vec<&Value> = rendered
        .iter()
        .filter(|d| WEBHOOK_KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(configurations.len(), 3);
    for configuration in configurations {
        assert_eq!(
            configuration["metadata"]["annotations"][INJECT_CA_FROM],
            "myapp-system/myapp-operator-webhook",
            "{}",
            identity(configuration).2
        );
    }
}

#[test]
fn without_cert_manager_every_webhook_gets_the_ca_even_one_added_later() {
    let Some(kubectl) = Kubectl::new("") else {
        return;
    };
    // As shipped: the three webhooks.
    let copy = Copy::new();
    let rendered = render(&kubectl, &copy.deploy.join("without-cert-manager"));
    assert_eq!(
        assert_every_bundle_verifies(&rendered, &copy.bundle.cert_pem),
        3
    );
    let expected: BTreeSet<_> = listed_objects(&repo("deploy"))
        .into_iter()
        .filter(|(kind, _, _)| kind != "Issuer" && kind != "Certificate")
        .collect();
    let got: BTreeSet<_> = rendered.iter().map(identity).collect();
    assert_eq!(
        got, expected,
        "everything but cert-manager's objects, and no CA Secret"
    );
    for doc in &rendered {
        assert!(
            doc["metadata"]["annotations"].get(INJECT_CA_FROM).is_none(),
            "{:?} asks for cert-manager's injector",
            identity(doc)
        );
    }

    // With an entry more in each configuration and a configuration more: all six get it.
    copy.add_webhooks();
    let rendered = render(&kubectl, &copy.deploy.join("without-cert-manager"));
    assert_eq!(
        assert_every_bundle_verifies(&rendered, &copy.bundle.cert_pem),
        6
    );

    // A CA that did not sign the serving certificate is told apart.
    let other = certs::generate(&certs::service_sans(SERVICE.1, SERVICE.0)).unwrap();
    let host = format!("{}.{}.svc", SERVICE.1, SERVICE.0);
    assert!(
        myapp_operator::check::verifies(
            other.ca_pem.as_bytes(),
            copy.bundle.cert_pem.as_bytes(),
            &host
        )
        .is_err()
    );
}

/// Both installs, with `kubectl apply --dry-run=server` against `dev`'s API server (HTTPS, a
/// token, the webhook in the chain). PodDisruptionBudget and NetworkPolicy, which the sandbox
/// does not serve, are stood in by CRDs; cert-manager's kinds come from its real CRDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_installs_apply_with_dry_run_server_against_dev() {
    let state = tempfile::tempdir().unwrap();
    let env = Environment::start(Options::ephemeral(state.path().to_owned()))
        .await
        .unwrap();
    let kubeconfig = std::fs::read_to_string(&env.kubeconfig_path).unwrap();
    let Some(kubectl) = Kubectl::new(&kubeconfig) else {
        return;
    };
    let client = env.client().await.unwrap();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for (group, kind, plural) in UNSERVED_BUILTINS {
        crds.create(&PostParams::default(), &stand_in_crd(group, kind, plural))
            .await
            .unwrap();
    }
    let copy = Copy::new();

    // Without cert-manager: every webhook of what the server would store trusts the
    // certificate the pods would serve.
    let out = kubectl
        .ok(&[
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-k",
            path_str(&copy.deploy.join("without-cert-manager")),
        ])
        .await;
    let stored = applied_items(&out);
    assert_eq!(
        assert_every_bundle_verifies(&stored, &copy.bundle.cert_pem),
        3
    );

    // With cert-manager, once its CRDs are installed (server-side: the Issuer CRD is too big
    // for the annotation client-side apply writes).
    let cert_manager = repo("tests/data/cert-manager");
    kubectl
        .ok(&["apply", "--server-side", "-f", path_str(&cert_manager)])
        .await;
    for crd in ["certificates.cert-manager.io", "issuers.cert-manager.io"] {
        kubectl
            .ok(&["wait", "--for=condition=Established", &format!("crd/{crd}")])
            .await;
    }
    let out = kubectl
        .ok(&[
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-k",
            path_str(&repo("deploy")),
        ])
        .await;
    let stored = applied_items(&out);
    let kinds: BTreeSet<&str> = stored.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains("Certificate") && kinds.contains("Issuer"),
        "{kinds:?}"
    );
    for configuration in stored
        .iter()
        .filter(|d| WEBHOOK_KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
    {
        assert_eq!(
            configuration["metadata"]["annotations"][INJECT_CA_FROM],
            "myapp-system/myapp-operator-webhook"
        );
    }
    env.shutdown().await;
}

/// The objects `kubectl apply -o json` printed: a List of them, or one object.
fn applied_items(out: &str) -> Vec<Value> {
    let value: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    match value["items"].as_array() {
        Some(items) => items.clone(),
        None => vec![value],
    }
}

/// The heredoc bodies deploy/README.md writes into `path` (`cat > path` and `cat >> path`), in
/// order: what a user following it ends up with.
fn readme_heredocs(path: &str) -> String {
    let readme = std::fs::read_to_string(repo("deploy/README.md")).unwrap();
    let mut written = String::new();
    for opening in [
        format!("cat > {path} <<'EOF'\n"),
        format!("cat >> {path} <<'EOF'\n"),
    ] {
        let body =
            &readme[readme.find(&opening).unwrap_or_else(|| panic!("{opening}")) + opening.len()..];
        written.push_str(&body[..body.find("\nEOF\n").expect("the heredoc's end") + 1]);
    }
    written
}

/// deploy/README.md's own overlay, as a user types it beside `deploy/`: it names their image
/// and their resources, and changes nothing else.
#[test]
fn the_readmes_overlay_names_the_users_image_and_resources_and_changes_nothing_else() {
    let Some(kubectl) = Kubectl::new("") else {
        return;
    };
    let copy = Copy::new();
    let overlay = copy.deploy.parent().unwrap().join("my-install");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        readme_heredocs("my-install/kustomization.yaml"),
    )
    .unwrap();
    let rendered = render(&kubectl, &overlay);
    let shipped = render(&kubectl, &copy.deploy);
    let container = |docs: &[Value]| -> Value {
        docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]
            ["containers"][0]
            .clone()
    };
    assert_eq!(
        container(&rendered)["image"],
        "registry.example.com/myapp-operator:0.1.0"
    );
    assert_eq!(
        container(&rendered)["resources"],
        json!({"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}})
    );
    let without_container = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .cloned()
            .map(|mut d| {
                if d["kind"] == "Deployment" {
                    d["spec"]["template"]["spec"]["containers"][0]["image"] = Value::Null;
                    d["spec"]["template"]["spec"]["containers"][0]["resources"] = Value::Null;
                }
                d
            })
            .collect()
    };
    assert_eq!(without_container(&rendered), without_container(&shipped));
}
