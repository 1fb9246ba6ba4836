//! UPDATE (PUT): the stored object replaced, with optimistic concurrency and retries; the commit
//! step PATCH and `/scale` share.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::context::{Ctx, read_current};
use super::write::{
    admit, after_commit, after_write, allocated_ip, check_identity, crd_status, release_unstored,
};
use crate::admission::Operation;
use crate::schema::FieldError;
use crate::status::ApiError;
use crate::store::{EventType, finalizers, meta_mut, meta_str};

/// How often a write retries when the object changed between its read and its commit.
pub(super) const WRITE_RETRIES: usize = 5;

/// Builds the object a write of `incoming` over `old` stores: server-owned fields from `old`,
/// and only `.status` (status writes) or everything but `.status` (main-resource writes of a
/// kind with a status subresource). The managedFields sent stay for the field manager.
pub(super) fn merge_server_fields(ctx: &Ctx, old: &Value, mut incoming: Value) -> Value {
    if ctx.path.sub.as_deref() == Some("status") {
        let status = incoming.as_object_mut().and_then(|m| m.remove("status"));
        // What the write sends (or an apply computed) is judged by the field manager.
        let managed = incoming
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .and_then(|m| m.remove("managedFields"));
        // The stored object less what the write replaces, copied once: its status and, when
        // the write sends some, its managedFields are not copied only to be overwritten.
        let mut new = crate::managed::copy_without(old, &["status"], managed.is_some());
        match status {
            Some(status) => new["status"] = status,
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        if let Some(managed) = managed {
            meta_mut(&mut new).insert("managedFields".into(), managed);
        }
        return new;
    }
    let mut new = incoming;
    {
        let empty = serde_json::Map::new();
        let old_meta = old
            .get("metadata")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let meta = meta_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "name",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            match old_meta.get(field) {
                Some(v) => {
                    meta.insert(field.into(), v.clone());
                }
                None => {
                    meta.remove(field);
                }
            }
        }
    }
    if ctx.rt.status_subresource {
        match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    new
}

/// Whether anything but `metadata` and `status` differs (what raises `generation`). Compared
/// in place: copying both objects to strip those two copied their managedFields on every write.
fn spec_changed(old: &Value, new: &Value) -> bool {
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        return old != new;
    };
    let counted = |key: &&String| key.as_str() != "metadata" && key.as_str() != "status";
    old.keys().filter(counted).count() != new.keys().filter(counted).count()
        || old
            .iter()
            .filter(|(key, _)| counted(key))
            .any(|(key, value)| new.get(key) != Some(value))
}

/// Outcome of trying to store an update.
pub(super) enum Commit {
    /// The answer: the stored object, shared with the store.
    Done(StatusCode, Arc<Value>),
    /// The object changed since it was read; read again.
    Stale,
}

fn commit_update(ctx: &mut Ctx, old: &Arc<Value>, mut new: Value) -> Result<Commit, ApiError> {
    let name = ctx.name().to_string();
    let mut state = ctx.inner.store.lock();
    let Some(current) = state.get(&ctx.rt.storage(), &ctx.ns, &name) else {
        return Err(ApiError::not_found(&ctx.rt, &name));
    };
    if current.pointer("/metadata/resourceVersion") != old.pointer("/metadata/resourceVersion") {
        return Ok(Commit::Stale);
    }
    if meta_str(old, "deletionTimestamp").is_some() {
        let before = finalizers(old);
        if finalizers(&new).iter().any(|f| !before.contains(f)) {
            return Err(ApiError::invalid(
                &ctx.rt,
                &name,
                vec![FieldError::new(
                    "metadata.finalizers",
                    "FieldValueForbidden",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                )],
            ));
        }
    }
    if ctx.rt.generation && spec_changed(old, &new) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
    }
    if ctx.rt.group == "apiextensions.k8s.io" && ctx.rt.plural == "customresourcedefinitions" {
        new["status"] = crd_status(&new);
        if let Some(conditions) = old.pointer("/status/conditions") {
            new["status"]["conditions"] = conditions.clone();
        }
    }
    // Nothing but managedFields' times changed, judged on the object about to be stored
    // (after defaults and admission): the stored times stay and nothing is written
    // (`IgnoreManagedFieldsTimestampsTransformer`, the storage's last update transformer). An
    // apply whose merge differs from the stored object only until the defaults fill in again,
    // such as an atomic list the server defaulted inside, is such a write.
    let managed = "/metadata/managedFields";
    if new == **old
        || (new.pointer(managed) != old.pointer(managed)
            && crate::managed::same_but_times(old, &new))
    {
        return Ok(Commit::Done(StatusCode::OK, old.clone()));
    }
    if ctx.dry_run {
        return Ok(Commit::Done(StatusCode::OK, Arc::new(new)));
    }
    let deleting = meta_str(&new, "deletionTimestamp").is_some() && finalizers(&new).is_empty();
    let stored = state.put(&ctx.rt, new, EventType::Modified);
    if deleting {
        // The last finalizer went: the object goes, and watchers see it as DELETED.
        let removed = state
            .remove(&ctx.rt.storage(), &ctx.ns, &name, false)
            .map_or(stored, Arc::new);
        return Ok(Commit::Done(StatusCode::OK, removed));
    }
    after_write(ctx, &mut state, &stored);
    drop(state);
    after_commit(ctx, &stored);
    Ok(Commit::Done(StatusCode::OK, stored))
}

/// [`commit_update`], freeing a Service cluster IP that did not end up stored.
pub(super) fn commit_checked(
    ctx: &mut Ctx,
    old: &Arc<Value>,
    new: Value,
) -> Result<Commit, ApiError> {
    let allocated = allocated_ip(ctx, &new, Some(old));
    let outcome = commit_update(ctx, old, new);
    if !matches!(outcome, Ok(Commit::Done(..))) || ctx.dry_run {
        release_unstored(ctx, allocated);
    }
    outcome
}

pub(super) async fn update(
    ctx: &mut Ctx,
    mut body: Value,
) -> Result<(StatusCode, Arc<Value>), ApiError> {
    check_identity(ctx, &mut body)?;
    let precondition = meta_str(&body, "resourceVersion")
        .filter(|rv| !rv.is_empty())
        .map(String::from);
    // Custom resources do not allow unconditional updates (the registry store's
    // `AllowUnconditionalUpdate`); status and scale writes go through the same check.
    if precondition.is_none() && ctx.rt.crd.is_some() && read_current(ctx).is_some() {
        let kind = format!("{}.{}", ctx.rt.plural, ctx.rt.group);
        let mut err = ApiError::invalid(
            &ctx.rt,
            ctx.name(),
            vec![FieldError::new(
                "metadata.resourceVersion",
                "FieldValueInvalid",
                "Invalid value: 0: must be specified for an update",
            )],
        );
        err.message = format!(
            "{kind} \"{}\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update",
            ctx.name()
        );
        return Err(err);
    }
    for _ in 0..WRITE_RETRIES {
        let old = read_current(ctx).ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
        if let Some(rv) = &precondition
            && meta_str(&old, "resourceVersion") != Some(rv.as_str())
        {
            return Err(ApiError::conflict(&ctx.rt, ctx.name()));
        }
        let new = merge_server_fields(ctx, &old, body.clone());
        let new = admit(ctx, Operation::Update, new, Some(&old)).await?;
        match commit_checked(ctx, &old, new)? {
            Commit::Done(code, v) => return Ok((code, v)),
            Commit::Stale if precondition.is_some() => {
                return Err(ApiError::conflict(&ctx.rt, ctx.name()));
            }
            Commit::Stale => continue,
        }
    }
    Err(ApiError::conflict(&ctx.rt, ctx.name()))
}

#[cfg(test)]
mod tests {
    use super::spec_changed;
    use serde_json::json;

    #[test]
    fn only_fields_besides_metadata_and_status_change_the_spec() {
        let old =
            json!({"kind": "X", "metadata": {"name": "a"}, "spec": {"n": 1}, "status": {"s": 1}});
        let same = json!({"kind": "X", "metadata": {"name": "a", "labels": {"l": "v"}},
                          "spec": {"n": 1}, "status": {"s": 2}});
        assert!(!spec_changed(&old, &same));
        assert!(!spec_changed(&old, &json!({"kind": "X", "spec": {"n": 1}})));
        assert!(spec_changed(
            &old,
            &json!({"kind": "X", "metadata": {"name": "a"}, "spec": {"n": 2}})
        ));
        assert!(spec_changed(
            &old,
            &json!({"kind": "X", "spec": {"n": 1}, "data": {}})
        ));
        assert!(spec_changed(
            &old,
            &json!({"metadata": {"name": "a"}, "spec": {"n": 1}})
        ));
    }
}
