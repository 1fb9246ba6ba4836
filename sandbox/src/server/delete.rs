//! DELETE and DELETE of a collection: preconditions, finalizers, propagation, dry runs.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::context::{Ctx, Selectors, json_response, parse_body, read_current};
use super::write::{admission_attributes, rejected, webhook_configurations};
use crate::admission::Operation;
use crate::rollout;
use crate::status::ApiError;
use crate::store::{Propagation, meta_str};

/// DELETE through the webhooks (object null, oldObject the stored object).
async fn admit_delete(ctx: &mut Ctx, current: &Value, options: &Value) -> Result<(), ApiError> {
    let (mutating, validating) = webhook_configurations(ctx);
    if mutating.is_empty() && validating.is_empty() {
        return Ok(());
    }
    let mut attributes = admission_attributes(ctx, Operation::Delete, None, Some(current.clone()));
    attributes.options = Some(review_options(options));
    let admitted = ctx
        .inner
        .admission
        .admit(&mutating, &validating, &attributes)
        .await
        .map_err(|r| rejected(ctx, r))?;
    ctx.warnings.extend(admitted.warnings);
    Ok(())
}

/// The fields of `meta.k8s.io/v1` `DeleteOptions`, as a review carries them.
const DELETE_OPTIONS: [&str; 5] = [
    "gracePeriodSeconds",
    "preconditions",
    "orphanDependents",
    "propagationPolicy",
    "dryRun",
];

/// `DeleteOptions` as the handler decodes them, from the body when there is one and else from
/// the query: with a body, query parameters such as `dryRun` are not read
/// (`apiserver/pkg/endpoints/handlers/delete.go`).
fn delete_options(ctx: &Ctx, body: &[u8]) -> Result<Value, ApiError> {
    if !body.is_empty() {
        return parse_body(body);
    }
    let mut options = json!({});
    for (field, value) in &ctx.query {
        let value = match field.as_str() {
            "gracePeriodSeconds" => json!(
                value
                    .parse::<i64>()
                    .map_err(|e| { ApiError::bad_request(format!("gracePeriodSeconds: {e}")) })?
            ),
            "orphanDependents" => json!(value == "true"),
            "propagationPolicy" => json!(value),
            "dryRun" => json!([value]),
            _ => continue,
        };
        options[field] = value;
    }
    Ok(options)
}

/// Options as a review carries them: the known fields, typed `meta.k8s.io/v1` `DeleteOptions`.
fn review_options(options: &Value) -> Value {
    let mut review = json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"});
    for field in DELETE_OPTIONS {
        if let Some(value) = options.get(field).filter(|v| !v.is_null()) {
            review[field] = value.clone();
        }
    }
    review
}

/// Answers a DELETE of the object the URL names (the body, if any, is its DeleteOptions).
pub(super) async fn delete_request(ctx: &mut Ctx, body: &[u8]) -> Result<Response, ApiError> {
    let options = delete_options(ctx, body)?;
    ctx.dry_run = options
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    let policy = propagation(ctx, &options)?;
    let deleted = delete(ctx, &options, policy).await?;
    if policy != Propagation::Background && !ctx.dry_run {
        // The garbage collector finishes a foreground or orphaning delete after the answer.
        let (store, res, ns) = (ctx.inner.store.clone(), ctx.rt.storage(), ctx.ns.clone());
        let name = ctx.name().to_string();
        tokio::spawn(async move { store.lock().collect_deleting(&res, &ns, &name) });
    }
    if !ctx.dry_run {
        rollout::dependent_deleted(&ctx.inner.rollout, &ctx.inner.store, &deleted);
    }
    let still_there = ctx
        .inner
        .store
        .lock()
        .get(&ctx.rt.storage(), &ctx.ns, ctx.name())
        .is_some();
    if still_there || ctx.dry_run {
        return Ok(ctx.respond(StatusCode::OK, &deleted));
    }
    // Gone at once: the API server answers a Success Status (kube: Either::Right).
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": ctx.name(),
            "group": ctx.rt.group,
            "kind": ctx.rt.plural,
            "uid": meta_str(&deleted, "uid"),
        },
    });
    Ok(json_response(StatusCode::OK, &status, &ctx.warnings))
}

/// The propagation policy of a DELETE, from its options or query (`orphanDependents` is the
/// deprecated spelling of `Orphan`), as `rest.BeforeDelete` checks it.
fn propagation(ctx: &Ctx, options: &Value) -> Result<Propagation, ApiError> {
    let policy = options
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| ctx.query.get("propagationPolicy").map(String::as_str));
    let orphan_dependents = options.get("orphanDependents").and_then(Value::as_bool);
    if let (Some(policy), Some(_)) = (policy, orphan_dependents) {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"{policy}\": orphanDependents and deletionPropagation cannot be both set"
            ),
        ));
    }
    match (policy, orphan_dependents) {
        (Some("Foreground"), _) => Ok(Propagation::Foreground),
        (Some("Orphan"), _) | (None, Some(true)) => Ok(Propagation::Orphan),
        (Some("Background") | None, _) => Ok(Propagation::Background),
        (Some(other), _) => Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            ),
        )),
    }
}

async fn delete(ctx: &mut Ctx, options: &Value, policy: Propagation) -> Result<Value, ApiError> {
    if ctx.path.sub.is_some() {
        return Err(ApiError::method_not_allowed(
            "delete is not allowed on a subresource",
        ));
    }
    // `delete_request` has read the options' dryRun into `ctx.dry_run`.
    let dry_run = ctx.dry_run;
    let name = ctx.name().to_string();
    let stored = read_current(ctx).ok_or_else(|| ApiError::not_found(&ctx.rt, &name))?;
    admit_delete(ctx, &stored, options).await?;
    let mut state = ctx.inner.store.lock();
    let current = state
        .get(&ctx.rt.storage(), &ctx.ns, &name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&ctx.rt, &name))?;
    if let Some(uid) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
        && meta_str(&current, "uid") != Some(uid)
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                ctx.rt.qualified(),
                meta_str(&current, "uid").unwrap_or("")
            ),
        ));
    }
    if let Some(rv) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && meta_str(&current, "resourceVersion") != Some(rv)
    {
        return Err(ApiError::conflict(&ctx.rt, &name));
    }
    if dry_run {
        return Ok(current);
    }
    state
        .delete_propagating(&ctx.rt.storage(), &ctx.ns, &name, policy)
        .ok_or_else(|| ApiError::not_found(&ctx.rt, &name))
}

pub(super) async fn delete_collection(ctx: &mut Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::from_request(ctx)?;
    let mut state = ctx.inner.store.lock();
    let targets: Vec<(String, String)> = state
        .list(&ctx.rt.storage(), ctx.path.namespace.as_deref())
        .into_iter()
        .filter(|o| selectors.matches(o))
        .map(|o| {
            (
                meta_str(o, "namespace").unwrap_or("").to_string(),
                meta_str(o, "name").unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut items = Vec::new();
    for (ns, name) in targets {
        let deleted = if ctx.dry_run {
            state.get(&ctx.rt.storage(), &ns, &name).cloned()
        } else {
            state.delete(&ctx.rt.storage(), &ns, &name, false)
        };
        if let Some(obj) = deleted {
            items.push(ctx.present(&obj).into_owned());
        }
    }
    let list = json!({
        "apiVersion": ctx.rt.api_version(),
        "kind": format!("{}List", ctx.rt.kind),
        "metadata": {"resourceVersion": state.rv.to_string()},
        "items": items,
    });
    Ok(json_response(StatusCode::OK, &list, &ctx.warnings))
}
