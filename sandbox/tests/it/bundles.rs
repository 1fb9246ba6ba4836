//! The four real-world CRD bundles vendored under `tests/data/crds/` install with the real
//! kubectl as on kube-apiserver 1.33: `kubectl apply -f <bundle>` creates every CRD whose
//! last-applied-configuration annotation fits the API server's limit and refuses the others;
//! `kubectl apply --server-side -f <bundle>` applies them all over the client-side apply but
//! what conflicts with it, and all of them alone; the CRDs are Established and listed, and
//! applying the bundle again server-side writes nothing.

use std::path::{Path, PathBuf};

use crate::support::kubectl::{served_kubectl, stderr, stdout};

use kube_sandbox::Sandbox;
use kube_sandbox::testing::{Kubectl, path_str};
use serde_json::Value;

/// `TotalAnnotationSizeLimitB` in apimachinery's `pkg/api/validation/objectmeta.go`: the sum of
/// the annotations' key and value lengths that `ValidateAnnotations` allows.
const ANNOTATIONS_LIMIT: usize = 262_144;

/// The annotation kubectl's client-side apply adds (`kubectl/pkg/util/apply.go`).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The field error `ValidateAnnotations` gives, as `field.Error` prints a `TooLong` one
/// (`apimachinery/pkg/util/validation/field/errors.go`).
const TOO_LONG: &str = "metadata.annotations: Too long: may not be more than 262144 bytes";

/// One vendored bundle and the CRDs whose client-side apply 1.33 refuses.
///
/// Client-side apply stores the object as kubectl sends it, encoded as compact JSON by Go's
/// `encoding/json` (`<`, `>` and `&` escaped as `\u003c` ..., a newline after), in the
/// last-applied-configuration annotation of the object it creates; the annotation then counts
/// towards the limit with its key and the bundle's own annotations. The YAML file's size says
/// little: indentation and block scalars shrink in JSON, so cert-manager's 272,526-byte
/// challenges file makes a 124,516-byte annotation. The sums, as `last_applied_bytes` computes
/// them (the test checks them against this table):
///
/// | Bundle | Over 262,144 | Under |
/// |---|---|---|
/// | prometheus-operator | prometheuses 485,005; prometheusagents 414,009; scrapeconfigs 378,465; alertmanagerconfigs 361,987; alertmanagers 351,892; thanosrulers 346,381 | servicemonitors 42,761; podmonitors 42,126; probes 41,968; prometheusrules 8,588 |
/// | gateway-api | none | httproutes 244,797 the largest |
/// | cert-manager | none | clusterissuers 146,676 the largest |
/// | argo-cd | none | applications 197,643 the largest |
///
/// Server-side over client-side: kube-apiserver lets kubectl's server-side apply take what its
/// client-side apply set without a conflict only where the live object still holds the value of
/// the last-applied annotation (`lastAppliedManager`). A ValidatingAdmissionPolicy's and its
/// Binding's `resourceRules` are atomic lists, and the server defaults each rule's `scope` to
/// `*` on decode (`SetDefaults_Rule` in `pkg/apis/admissionregistration/v1/defaults.go`); Gateway
/// API's rules leave `scope` out, so the live lists differ from the annotation's, and both
/// conflict with the client-side manager (`conflicts`).
struct Bundle {
    dir: &'static str,
    too_big: &'static [&'static str],
    conflicts: &'static [Conflict],
}

/// A server-side apply over the client-side apply that conflicts: the object as kubectl's name
/// printer shows it, and the field.
struct Conflict {
    object: &'static str,
    field: &'static str,
}

const PROMETHEUS_OPERATOR: Bundle = Bundle {
    dir: "prometheus-operator",
    too_big: &[
        "alertmanagerconfigs.monitoring.coreos.com",
        "alertmanagers.monitoring.coreos.com",
        "prometheusagents.monitoring.coreos.com",
        "prometheuses.monitoring.coreos.com",
        "scrapeconfigs.monitoring.coreos.com",
        "thanosrulers.monitoring.coreos.com",
    ],
    conflicts: &[],
};
const GATEWAY_API: Bundle = Bundle {
    dir: "gateway-api",
    too_big: &[],
    conflicts: &[
        Conflict {
            object: "validatingadmissionpolicy.admissionregistration.k8s.io/safe-upgrades.gateway.networking.k8s.io",
            field: ".spec.matchConstraints.resourceRules",
        },
        Conflict {
            object: "validatingadmissionpolicybinding.admissionregistration.k8s.io/safe-upgrades.gateway.networking.k8s.io",
            field: ".spec.matchResources.resourceRules",
        },
    ],
};
const CERT_MANAGER: Bundle = Bundle {
    dir: "cert-manager",
    too_big: &[],
    conflicts: &[],
};
const ARGO_CD: Bundle = Bundle {
    dir: "argo-cd",
    too_big: &[],
    conflicts: &[],
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_operators_bundle_installs_as_on_kube_apiserver_1_33() {
    installs_as_on_kube_apiserver_1_33(&PROMETHEUS_OPERATOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_apis_bundle_with_its_policy_installs_as_on_kube_apiserver_1_33() {
    installs_as_on_kube_apiserver_1_33(&GATEWAY_API).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_managers_bundle_installs_as_on_kube_apiserver_1_33() {
    installs_as_on_kube_apiserver_1_33(&CERT_MANAGER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_cds_bundle_installs_as_on_kube_apiserver_1_33() {
    installs_as_on_kube_apiserver_1_33(&ARGO_CD).await;
}

/// A document of the bundle: the file it is in and the object.
struct Document {
    file: PathBuf,
    object: Value,
}

impl Document {
    fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().expect("a name")
    }

    fn is_crd(&self) -> bool {
        self.object["kind"] == "CustomResourceDefinition"
    }

    /// kubectl's `name` printer: `<kind>.<group>/<name>`, the kind in lower case.
    fn printed(&self) -> String {
        let kind = self.object["kind"].as_str().expect("a kind").to_lowercase();
        let api_version = self.object["apiVersion"].as_str().expect("an apiVersion");
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        format!("{kind}.{group}/{}", self.name())
    }
}

fn bundle_dir(bundle: &Bundle) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/crds")
        .join(bundle.dir)
}

/// The bundle's documents in the order kubectl reads a directory: its files by name, then
/// the documents in each file.
fn documents(dir: &Path) -> Vec<Document> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the bundle's folder")
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(&file).expect("a vendored file");
            let objects: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
            objects
                .into_iter()
                .filter(|object| !object.is_null())
                .map(move |object| Document {
                    file: file.clone(),
                    object,
                })
        })
        .collect()
}

/// The annotations' total size `ValidateAnnotations` sees when kubectl's client-side apply
/// creates `object`: its own annotations plus the last-applied-configuration, which is Go's
/// `json.Encoder` output (HTML characters escaped, a trailing newline). Numbers and other
/// escapes are written alike by serde_json and Go for these files.
fn last_applied_bytes(object: &Value) -> usize {
    let json = object.to_string();
    let html = json.matches(['<', '>', '&']).count();
    let own: usize = object["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| key.len() + value.as_str().map_or(0, str::len))
        .sum();
    LAST_APPLIED.len() + json.len() + 5 * html + 1 + own
}

async fn installs_as_on_kube_apiserver_1_33(bundle: &Bundle) {
    let dir = bundle_dir(bundle);
    let documents = documents(&dir);
    let over: Vec<&str> = documents
        .iter()
        .filter(|doc| last_applied_bytes(&doc.object) > ANNOTATIONS_LIMIT)
        .map(Document::name)
        .collect();
    assert_eq!(over, bundle.too_big, "the sizes in `Bundle`'s table");

    let everything: String = documents
        .iter()
        .map(|doc| format!("{} serverside-applied\n", doc.printed()))
        .collect();
    let server_side = ["apply", "--server-side", "-f", path_str(&dir)];

    // Client-side first; then server-side over what it made, which kubectl moves from its
    // client-side manager to its server-side one, and the refused CRDs.
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    client_side_apply_refuses_only_the_too_big(&k, &dir, &documents, bundle.too_big).await;
    let out = k.run(&server_side).await;
    let conflicting = |doc: &Document| bundle.conflicts.iter().any(|c| c.object == doc.printed());
    let applied: String = documents
        .iter()
        .filter(|doc| !conflicting(doc))
        .map(|doc| format!("{} serverside-applied\n", doc.printed()))
        .collect();
    let code = if bundle.conflicts.is_empty() { 0 } else { 1 };
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(code), applied),
        "{}",
        stderr(&out)
    );
    for conflict in bundle.conflicts {
        let said = format!(
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using \
             admissionregistration.k8s.io/v1: {}",
            conflict.field
        );
        assert!(stderr(&out).contains(&said), "{said}\n{}", stderr(&out));
    }

    // Server-side alone, on a new server: every document applies, every CRD is Established
    // and listed, and applying the bundle again writes nothing.
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let out = k.run(&server_side).await;
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), everything.clone()),
        "{}",
        stderr(&out)
    );
    let crds: Vec<&str> = documents
        .iter()
        .filter(|doc| doc.is_crd())
        .map(Document::name)
        .collect();
    established_and_listed(&k, &crds).await;
    let versions = ["get", "-f", path_str(&dir), "-o", RESOURCE_VERSIONS];
    let before = k.ok(&versions).await;
    let out = k.run(&server_side).await;
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), everything),
        "{}",
        stderr(&out)
    );
    assert_eq!(k.ok(&versions).await, before, "the second apply wrote");
}

/// Each object's name and resourceVersion, one per line.
const RESOURCE_VERSIONS: &str =
    "jsonpath={range .items[*]}{.metadata.name} {.metadata.resourceVersion}{\"\\n\"}{end}";

/// `kubectl apply -f <dir>`: the objects that fit are created, each refusal is reported, and
/// the exit code is 1 when anything was refused.
async fn client_side_apply_refuses_only_the_too_big(
    k: &Kubectl,
    dir: &Path,
    documents: &[Document],
    too_big: &[&str],
) {
    let out = k.run(&["apply", "-f", path_str(dir)]).await;
    let created: String = documents
        .iter()
        .filter(|doc| !too_big.contains(&doc.name()))
        .map(|doc| format!("{} created\n", doc.printed()))
        .collect();
    // The API server's `Invalid` Status (`apierrors.NewInvalid`: `<Kind>.<group> "<name>" is
    // invalid: <errors>`) as kubectl reports it: `AddSourceToErr` prefixes the file
    // (`error when creating "<file>": `), and several errors print one `Error from server
    // (<reason>): ...` line each (`MultipleErrors` in `kubectl/pkg/cmd/util/helpers.go`); a
    // lone one prints as `The <Kind> "<name>" is invalid: <errors>` from the Status' details.
    let refused: Vec<&Document> = documents
        .iter()
        .filter(|doc| too_big.contains(&doc.name()))
        .collect();
    let expected_stderr: String = match refused.as_slice() {
        [] => String::new(),
        [one] => format!(
            "The CustomResourceDefinition \"{}\" is invalid: {TOO_LONG}\n",
            one.name()
        ),
        several => several
            .iter()
            .map(|doc| {
                format!(
                    "Error from server (Invalid): error when creating \"{}\": \
                     CustomResourceDefinition.apiextensions.k8s.io \"{}\" is invalid: {TOO_LONG}\n",
                    path_str(&doc.file),
                    doc.name()
                )
            })
            .collect(),
    };
    let code = if refused.is_empty() { 0 } else { 1 };
    assert_eq!(
        (out.status.code(), stdout(&out), stderr(&out)),
        (Some(code), created, expected_stderr)
    );
}

/// Every CRD of the bundle is Established, and `kubectl get crd` lists exactly them.
async fn established_and_listed(k: &Kubectl, crds: &[&str]) {
    let established = k
        .ok(&[
            "get",
            "crd",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} \
             {.status.conditions[?(@.type==\"Established\")].status}{\"\\n\"}{end}",
        ])
        .await;
    let mut expected: Vec<String> = crds.iter().map(|name| format!("{name} True")).collect();
    expected.sort();
    assert_eq!(established.lines().collect::<Vec<_>>(), expected);

    let table = k.ok(&["get", "crd"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "CREATED", "AT"], "{table}");
    let listed: Vec<&str> = lines
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    let mut names = crds.to_vec();
    names.sort();
    assert_eq!(listed, names, "{table}");
}
