//! `dev`'s peak memory with the real-world CRD bundles the sandbox vendors (Gateway API,
//! cert-manager, prometheus-operator, Argo CD: 28 CRDs, about 7 MB of YAML) installed and 100
//! objects of each bundle's main kinds created: the real binary as a child process, its
//! high-water mark read from `/proc/<pid>/status`.

use crate::dev::{printed, start_dev};

use kube_sandbox::testing::{Kubectl, path_str};

/// The bound on `dev`'s `VmHWM`: three runs of the debug build the test runs peaked at 152,
/// 153 and 154 MiB (about 43 MiB of it before anything is installed). The headroom, a fifth,
/// is for allocator and scheduling noise.
const PEAK_LIMIT_MIB: u64 = 185;

/// Objects created of each kind.
const EACH: usize = 100;

/// The bundles, as vendored under `sandbox/tests/data/crds/`.
const BUNDLES: [&str; 4] = [
    "gateway-api",
    "cert-manager",
    "prometheus-operator",
    "argo-cd",
];

/// A valid minimal object of each bundle's main kinds, named `{name}`.
const OBJECTS: [&str; 8] = [
    "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: {name}\nspec:\n  \
     gatewayClassName: example\n  listeners:\n  - name: http\n    port: 80\n    protocol: HTTP\n",
    "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\nspec:\n  \
     parentRefs:\n  - name: gw-0\n  rules:\n  - backendRefs:\n    - name: web\n      port: 80\n",
    "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata:\n  name: {name}\nspec:\n  selfSigned: {}\n",
    "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata:\n  name: {name}\nspec:\n  \
     secretName: {name}-tls\n  dnsNames:\n  - {name}.example.com\n  issuerRef:\n    name: issuer-0\n",
    "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: {name}\nspec:\n  \
     selector:\n    matchLabels:\n      app: web\n  endpoints:\n  - port: metrics\n",
    "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: {name}\nspec:\n  \
     groups:\n  - name: web\n    rules:\n    - alert: WebDown\n      expr: up{job=\"web\"} == 0\n",
    "apiVersion: argoproj.io/v1alpha1\nkind: AppProject\nmetadata:\n  name: {name}\nspec:\n  \
     sourceRepos:\n  - '*'\n  destinations:\n  - server: https://kubernetes.default.svc\n    namespace: '*'\n",
    "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: {name}\nspec:\n  \
     project: default\n  source:\n    repoURL: https://github.com/argoproj/argocd-example-apps\n    \
     path: guestbook\n    targetRevision: HEAD\n  destination:\n    server: https://kubernetes.default.svc\n    \
     namespace: default\n",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_four_crd_bundles_and_100_objects_of_each_main_kind_stays_under_its_peak() {
    let state = tempfile::tempdir().unwrap();
    let dev = start_dev(state.path());
    let kubeconfig = std::fs::read_to_string(printed(&dev, "export KUBECONFIG=")).unwrap();
    let Some(k) = Kubectl::new(&kubeconfig) else {
        return;
    };
    let crds = format!("{}/sandbox/tests/data/crds", env!("CARGO_MANIFEST_DIR"));
    for bundle in BUNDLES {
        k.ok(&["apply", "--server-side", "-f", &format!("{crds}/{bundle}")])
            .await;
    }
    k.ok(&["wait", "--for=condition=Established", "crd", "--all"])
        .await;
    for template in OBJECTS {
        let kind = template
            .lines()
            .find_map(|line| line.strip_prefix("kind: "))
            .unwrap();
        let prefix = match kind {
            "Gateway" => "gw",
            other => &other.to_lowercase(),
        };
        let documents: Vec<String> = (0..EACH)
            .map(|i| template.replace("{name}", &format!("{prefix}-{i}")))
            .collect();
        let file = k.file(&format!("{kind}.yaml"), &documents.join("---\n"));
        let created = k.ok(&["create", "-f", path_str(&file)]).await;
        assert_eq!(created.lines().count(), EACH, "{kind}: {created}");
    }

    let peak = peak_mib(dev.child.id());
    println!("dev's VmHWM with the four bundles and {EACH} objects of 8 kinds: {peak} MiB");
    assert!(
        peak <= PEAK_LIMIT_MIB,
        "dev's peak memory {peak} MiB is over {PEAK_LIMIT_MIB} MiB"
    );
}

/// `VmHWM` (the peak resident set) of process `pid`, in MiB.
fn peak_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kib / 1024
}
