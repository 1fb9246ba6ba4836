//! Discovery (`/version`, `/api`, `/apis`, resource lists) and the OpenAPI v3 documents kubectl
//! needs for `--validate=strict`.

use serde_json::{Value, json};

use crate::registry::{Registry, ResourceType};

/// The minor version `/version` reports unless told: 1.33, the oldest the project supports.
pub const DEFAULT_MINOR: u32 = 33;

/// `GET /version`.
pub fn version(minor: u32) -> Value {
    json!({
        "major": "1",
        "minor": minor.to_string(),
        "gitVersion": format!("v1.{minor}.0-sandbox"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub fn api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    })
}

fn api_group(name: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv).unwrap_or(Value::Null),
    })
}

/// `GET /apis`.
pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .map(|(name, versions)| {
            let mut g = api_group(name, versions);
            if let Some(m) = g.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            g
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`, or None when the group is not served.
pub fn api_group_doc(registry: &Registry, group: &str) -> Option<Value> {
    let groups = registry.groups();
    let versions = groups.get(group)?;
    Some(api_group(group, versions))
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`, or None when nothing is served there.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types: Vec<&std::sync::Arc<ResourceType>> = registry
        .all()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in types {
        let mut r = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        if t.scale.is_some() {
            resources.push(json!({
                "name": format!("{}/scale", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        if t.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `GET /openapi/v3`: one entry per served group-version.
pub fn openapi_root(registry: &Registry, generation: u64) -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(String, String)> = registry
        .all()
        .map(|t| (t.group.clone(), t.version.clone()))
        .collect();
    gvs.dedup();
    for (group, version) in gvs {
        let path = gv_path(&group, &version);
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash=sandbox{generation}")}),
        );
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/{api/v1 | apis/g/v}`: per kind, a path whose `patch` operation carries
/// `x-kubernetes-group-version-kind` and a `fieldValidation` parameter, and the kind's schema.
pub fn openapi_gv(registry: &Registry, gv_path_requested: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let in_gv =
        |t: &&std::sync::Arc<ResourceType>| gv_path(&t.group, &t.version) == gv_path_requested;
    let builtin: Vec<_> = registry
        .all()
        .filter(in_gv)
        .filter(|t| t.crd.is_none())
        .collect();
    let components = builtin.first().map(|t| {
        crate::openapi::components(
            &t.group,
            &t.version,
            builtin.iter().map(|t| t.kind.as_str()),
        )
    });
    let (typed, mut schemas) = match components {
        Some(c) => (c.kinds, c.schemas),
        None => (Vec::new(), serde_json::Map::new()),
    };
    for t in registry.all().filter(in_gv) {
        let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
        let prefix = format!("/{}", gv_path(&t.group, &t.version));
        let item = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        paths.insert(
            item,
            json!({
                "get": {"x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk},
                "put": {"x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk,
                         "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation")]},
                "patch": {"x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk,
                           "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation"), param("force")]},
                "delete": {"x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk},
            }),
        );
        if t.crd.is_none() && typed.iter().any(|(kind, _)| *kind == t.kind) {
            continue;
        }
        let mut schema = t.schema.as_ref().map(|s| s.raw().clone()).unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        if let Some(m) = schema.as_object_mut() {
            m.insert("x-kubernetes-group-version-kind".into(), json!([gvk]));
        }
        let reverse_group: Vec<&str> = t.group.split('.').rev().collect();
        let schema_name = if t.group.is_empty() {
            format!("io.k8s.api.core.{}.{}", t.version, t.kind)
        } else {
            format!("{}.{}.{}", reverse_group.join("."), t.version, t.kind)
        };
        schemas.insert(schema_name, schema);
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{}.0-sandbox", DEFAULT_MINOR)},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
