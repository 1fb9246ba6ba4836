//! Installing `deploy/` into a sandbox the way `kubectl apply` does, as the admin.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use serde_json::Value;

/// A client for a kubeconfig's current context.
pub async fn client_for(kubeconfig: &str) -> Client {
    kube_sandbox::client_for(kubeconfig).await.unwrap()
}

/// Every YAML document of `deploy/<file>`, as JSON values.
pub fn deploy_documents(file: &str) -> Vec<Value> {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The documents of `deploy/base/rbac.yaml`: the ServiceAccount, the roles and their bindings.
pub fn rbac_documents() -> Vec<Value> {
    deploy_documents("base/rbac.yaml")
}

/// Creates each document as `client` (kubectl's create of a manifest).
pub async fn apply(client: &Client, documents: Vec<Value>) {
    for doc in documents {
        let api_version = doc["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
        let resource = ApiResource::from_gvk(&gvk);
        let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let object: DynamicObject = serde_json::from_value(doc).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }
}
