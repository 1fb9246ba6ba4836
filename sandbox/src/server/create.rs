//! CREATE (POST): server-owned fields cleared, the write pipeline, then the object stored.

use std::sync::Arc;

use serde_json::{Value, json};

use super::context::Ctx;
use super::write::{
    admit, after_commit, after_write, allocated_ip, check_identity, crd_status, release_unstored,
};
use crate::admission::Operation;
use crate::schema::FieldError;
use crate::status::ApiError;
use crate::store::{EventType, meta_mut, meta_str, now};

/// A namespace object as the API server creates it.
pub(crate) fn new_namespace(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": now(),
            "labels": {"kubernetes.io/metadata.name": name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Creates the object; the answer is the stored object, shared with the store.
pub(super) async fn create(ctx: &mut Ctx, mut obj: Value) -> Result<Arc<Value>, ApiError> {
    if ctx.path.sub.is_some() {
        return Err(ApiError::method_not_allowed(
            "create is not allowed on a subresource",
        ));
    }
    check_identity(ctx, &mut obj)?;
    let meta = meta_mut(&mut obj);
    for server_owned in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
        "selfLink",
    ] {
        meta.remove(server_owned);
    }
    let named = |field: &str| {
        meta.get(field)
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
    };
    // With only generateName, the name is made after the mutating webhooks, which see it empty
    // (as the real server's reviews do).
    if !named("name") && !named("generateName") {
        return Err(ApiError::invalid(
            &ctx.rt,
            "",
            vec![FieldError::new(
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            )],
        ));
    }
    let obj = admit(ctx, Operation::Create, obj, None).await?;
    let allocated = allocated_ip(ctx, &obj, None);
    let result = commit_create(ctx, obj);
    if result.is_err() || ctx.dry_run {
        release_unstored(ctx, allocated);
    }
    result
}

fn commit_create(ctx: &mut Ctx, mut obj: Value) -> Result<Arc<Value>, ApiError> {
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let mut state = ctx.inner.store.lock();
    if ctx.rt.namespaced {
        let ns_res = (String::new(), "namespaces".to_string());
        match state.get(&ns_res, "", &ctx.ns) {
            None => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("namespaces \"{}\" not found", ctx.ns),
                ));
            }
            Some(n) if meta_str(n, "deletionTimestamp").is_some() => {
                return Err(ApiError::forbidden(format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                    ctx.rt.qualified(),
                    ctx.ns
                )));
            }
            Some(_) => {}
        }
    }
    if state.get(&ctx.rt.storage(), &ctx.ns, &name).is_some() {
        return Err(ApiError::already_exists(&ctx.rt, &name));
    }
    if ctx.rt.kind == "Namespace" && ctx.rt.group.is_empty() {
        let meta = meta_mut(&mut obj);
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
        obj["status"] = json!({"phase": "Active"});
    }
    if ctx.rt.group == "apiextensions.k8s.io" && ctx.rt.plural == "customresourcedefinitions" {
        obj["status"] = crd_status(&obj);
    }
    if ctx.dry_run {
        return Ok(Arc::new(obj));
    }
    let stored = state.put(&ctx.rt, obj, EventType::Added);
    after_write(ctx, &mut state, &stored);
    drop(state);
    after_commit(ctx, &stored);
    Ok(stored)
}
