//! The upstream CRDs vendored under `tests/data/crds/` (provenance and licence beside them).

use std::path::PathBuf;

/// The text of `tests/data/crds/<path>`.
pub fn vendored_crd(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/crds")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Creates the vendored CRD at `path` through `client` and gives its served (first) version's
/// API resource.
pub async fn install_vendored_crd(client: &kube::Client, path: &str) -> kube::core::ApiResource {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&vendored_crd(path)).expect("a vendored CRD parses");
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    crds.create(&Default::default(), &crd)
        .await
        .unwrap_or_else(|e| panic!("create {path}: {e}"));
    let version = &crd.spec.versions[0].name;
    kube::core::ApiResource {
        group: crd.spec.group.clone(),
        version: version.clone(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

/// Applies the vendored CRD at `path` with `kubectl apply --server-side` (a big CRD's
/// client-side apply is refused for its annotation's size, as on a cluster).
pub async fn apply_vendored_crd(kubectl: &kube_sandbox::testing::Kubectl, path: &str) {
    let name = path.rsplit('/').next().unwrap_or(path);
    let file = kubectl.file(name, &vendored_crd(path));
    kubectl
        .ok(&[
            "apply",
            "--server-side",
            "-f",
            kube_sandbox::testing::path_str(&file),
        ])
        .await;
}
