//! OpenAPI v3 schemas of the built-in kinds (what `kubectl explain` and kubectl's apply read),
//! derived from k8s-openapi's `schemars` output, plus the strategic-merge extensions
//! (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`) k8s-openapi does not carry,
//! from the `patchStrategy`/`patchMergeKey` tags of `k8s.io/api`, written here.

use k8s_openapi::api::{
    admissionregistration, apps, authentication, authorization, coordination, core, discovery,
    events, rbac,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

/// The schema names (k8s-openapi's, as kube-apiserver names them) of the built-in kinds of one
/// group/version, with every definition they reference: `components.schemas` of its document.
pub struct Components {
    /// `kind` -> schema name (`Deployment` -> `io.k8s.api.apps.v1.Deployment`).
    pub kinds: Vec<(String, String)>,
    /// Schema name -> schema.
    pub schemas: Map<String, Value>,
}

fn add<T: JsonSchema>(generator: &mut SchemaGenerator) -> String {
    generator.subschema_for::<T>();
    T::schema_name().into_owned()
}

/// The schema of a built-in kind, registered in `generator`; None for a kind the sandbox
/// serves without a k8s-openapi type.
fn register(generator: &mut SchemaGenerator, group: &str, kind: &str) -> Option<String> {
    let g = generator;
    Some(match (group, kind) {
        ("", "Namespace") => add::<core::v1::Namespace>(g),
        ("", "ConfigMap") => add::<core::v1::ConfigMap>(g),
        ("", "Secret") => add::<core::v1::Secret>(g),
        ("", "Service") => add::<core::v1::Service>(g),
        ("", "ServiceAccount") => add::<core::v1::ServiceAccount>(g),
        ("", "Pod") => add::<core::v1::Pod>(g),
        ("", "Endpoints") => add::<core::v1::Endpoints>(g),
        ("", "Event") => add::<core::v1::Event>(g),
        ("discovery.k8s.io", "EndpointSlice") => add::<discovery::v1::EndpointSlice>(g),
        ("apps", "Deployment") => add::<apps::v1::Deployment>(g),
        ("apps", "ReplicaSet") => add::<apps::v1::ReplicaSet>(g),
        ("events.k8s.io", "Event") => add::<events::v1::Event>(g),
        ("coordination.k8s.io", "Lease") => add::<coordination::v1::Lease>(g),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => add::<CustomResourceDefinition>(g),
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            add::<admissionregistration::v1::ValidatingWebhookConfiguration>(g)
        }
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            add::<admissionregistration::v1::MutatingWebhookConfiguration>(g)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            add::<admissionregistration::v1::ValidatingAdmissionPolicy>(g)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            add::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(g)
        }
        ("rbac.authorization.k8s.io", "ClusterRole") => add::<rbac::v1::ClusterRole>(g),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            add::<rbac::v1::ClusterRoleBinding>(g)
        }
        ("rbac.authorization.k8s.io", "Role") => add::<rbac::v1::Role>(g),
        ("rbac.authorization.k8s.io", "RoleBinding") => add::<rbac::v1::RoleBinding>(g),
        ("authorization.k8s.io", "SelfSubjectAccessReview") => {
            add::<authorization::v1::SelfSubjectAccessReview>(g)
        }
        ("authorization.k8s.io", "SubjectAccessReview") => {
            add::<authorization::v1::SubjectAccessReview>(g)
        }
        ("authentication.k8s.io", "SelfSubjectReview") => {
            add::<authentication::v1::SelfSubjectReview>(g)
        }
        _ => return None,
    })
}

/// The `patchStrategy`/`patchMergeKey` of a list field of a definition (`k8s.io/api` tags):
/// (strategy, merge key; empty for a list of scalars merged as a set).
fn patch_meta(definition: &str, field: &str) -> Option<(&'static str, &'static str)> {
    let container = definition.ends_with(".core.v1.Container")
        || definition.ends_with(".core.v1.EphemeralContainer");
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "imagePullSecrets"
        | "schedulingGates" => ("merge", "name"),
        "volumes" | "resourceClaims" if definition.ends_with(".core.v1.PodSpec") => {
            ("merge,retainKeys", "name")
        }
        "env" if container => ("merge", "name"),
        "volumeMounts" if container => ("merge", "mountPath"),
        "volumeDevices" if container => ("merge", "devicePath"),
        "ports" if container => ("merge", "containerPort"),
        "ports" if definition.ends_with(".core.v1.ServiceSpec") => ("merge", "port"),
        "hostAliases" => ("merge", "ip"),
        "webhooks" if definition.contains(".admissionregistration.") => ("merge", "name"),
        "topologySpreadConstraints" => ("merge", "topologyKey"),
        "conditions" if definition.contains(".api.") => ("merge", "type"),
        "ownerReferences" => ("merge", "uid"),
        "finalizers" if definition.ends_with(".meta.v1.ObjectMeta") => ("merge", ""),
        _ => return None,
    })
}

fn add_patch_meta(name: &str, schema: &mut Value) {
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (field, property) in properties.iter_mut() {
        let Some((strategy, key)) = patch_meta(name, field) else {
            continue;
        };
        if property.get("type").and_then(Value::as_str) != Some("array") {
            continue;
        }
        property["x-kubernetes-patch-strategy"] = json!(strategy);
        if !key.is_empty() {
            property["x-kubernetes-patch-merge-key"] = json!(key);
        }
    }
}

/// The schemas of the built-in `kinds` of `group`/`version`, for its OpenAPI v3 document.
pub fn components<'a>(
    group: &str,
    version: &str,
    kinds: impl IntoIterator<Item = &'a str>,
) -> Components {
    let mut generator = SchemaGenerator::new(SchemaSettings::openapi3());
    let mut named = Vec::new();
    for kind in kinds {
        if let Some(name) = register(&mut generator, group, kind) {
            named.push((kind.to_owned(), name));
        }
    }
    let mut schemas = generator.take_definitions(true);
    for (name, schema) in schemas.iter_mut() {
        add_patch_meta(name, schema);
    }
    for (kind, name) in &named {
        if let Some(schema) = schemas.get_mut(name).and_then(Value::as_object_mut) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "version": version, "kind": kind}]),
            );
        }
    }
    Components {
        kinds: named,
        schemas,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_schema_describes_its_fields_and_merges_containers_by_name() {
        let components = components("apps", "v1", ["Deployment"]);
        assert_eq!(
            components.kinds,
            [(
                "Deployment".to_owned(),
                "io.k8s.api.apps.v1.Deployment".to_owned()
            )]
        );
        let schemas = &components.schemas;
        let spec = &schemas["io.k8s.api.apps.v1.DeploymentSpec"];
        assert_eq!(spec["properties"]["replicas"]["type"], "integer");
        assert!(
            spec["properties"]["replicas"]["description"]
                .as_str()
                .unwrap()
                .contains("Number of desired pods")
        );
        let pod_spec = &schemas["io.k8s.api.core.v1.PodSpec"];
        assert_eq!(
            pod_spec["properties"]["containers"]["x-kubernetes-patch-merge-key"],
            "name"
        );
        let container = &schemas["io.k8s.api.core.v1.Container"];
        assert_eq!(
            container["properties"]["ports"]["x-kubernetes-patch-merge-key"],
            "containerPort"
        );
        let refs = serde_json::to_string(schemas).unwrap();
        assert!(!refs.contains("#/$defs"), "refs point into components");
        assert_eq!(
            schemas["io.k8s.api.apps.v1.Deployment"]["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
    }
}
