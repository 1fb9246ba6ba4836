//! PATCH: JSON patch, merge patch, strategic merge patch and server-side apply.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;

use super::access;
use super::context::{Ctx, read_current};
use super::create::create;
use super::update::{Commit, WRITE_RETRIES, commit_checked, merge_server_fields};
use super::write::{admit, check_identity};
use crate::admission::Operation;
use crate::managed;
use crate::patch;
use crate::schema::FieldError;
use crate::status::ApiError;
use crate::store::meta_str;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

pub(super) fn parse_patch_body(kind: PatchKind, body: &[u8]) -> Result<Value, ApiError> {
    let parsed = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(json_err) if kind == PatchKind::Apply => {
            let text = std::str::from_utf8(body)
                .map_err(|e| ApiError::bad_request(format!("the apply patch is not UTF-8: {e}")))?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| {
                ApiError::bad_request(format!("error decoding YAML: {e} (as JSON: {json_err})"))
            })?
        }
        Err(e) => {
            return Err(ApiError::bad_request(format!(
                "the patch is not valid JSON: {e}"
            )));
        }
    };
    match kind {
        PatchKind::Json if !parsed.is_array() => Err(ApiError::bad_request(
            "json patch must be an array of operations",
        )),
        PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply if !parsed.is_object() => {
            Err(ApiError::bad_request("the patch must be a JSON object"))
        }
        _ => Ok(parsed),
    }
}

/// What the field manager's `Apply` checks before merging (`structuredmerge.go`): the patch's
/// apiVersion is the endpoint's, it carries no managedFields, and it names a kind the type
/// converter knows (its error is a plain one, so a 500).
fn check_apply_identity(ctx: &Ctx, patch: &Value) -> Result<(), ApiError> {
    let expected = ctx.rt.api_version();
    let version = patch
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if version != expected {
        return Err(ApiError::bad_request(format!(
            "Incorrect version specified in apply patch. Specified patch version: {version}, expected: {expected}"
        )));
    }
    if patch
        .pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    let kind = patch.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != ctx.rt.kind {
        let gvk = format!("{expected}, Kind={kind}");
        return Err(ApiError::new(
            500,
            "",
            format!("failed to create typed patch object ({gvk}): no corresponding type for {gvk}"),
        ));
    }
    Ok(())
}

pub(super) async fn patch_object(
    ctx: &mut Ctx,
    content_type: &str,
    body: &[u8],
) -> Result<(StatusCode, Arc<Value>), ApiError> {
    let kind = match content_type {
        "application/json-patch+json" => PatchKind::Json,
        "application/merge-patch+json" => PatchKind::Merge,
        // kubectl sends strategic merge patches for built-in kinds; custom resources refuse
        // them, as on a real server.
        "application/strategic-merge-patch+json" if ctx.rt.crd.is_none() => PatchKind::Strategic,
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => PatchKind::Apply,
        _ => return Err(ApiError::unsupported_media_type(&ctx.rt)),
    };
    let patch_doc = parse_patch_body(kind, body)?;
    let manager = ctx.query.get("fieldManager").cloned().unwrap_or_default();
    if kind == PatchKind::Apply && manager.is_empty() {
        return Err(ApiError::invalid(
            &ctx.rt,
            "",
            vec![FieldError::new(
                "fieldManager",
                "FieldValueRequired",
                "Required value: is required for apply patch",
            )],
        ));
    }
    // After the options are validated (`ValidatePatchOptions`), as in the handler.
    if kind == PatchKind::Apply {
        check_apply_identity(ctx, &patch_doc)?;
        ctx.apply_config = Some(patch_doc.clone());
    }
    for _ in 0..WRITE_RETRIES {
        let Some(old) = read_current(ctx) else {
            if kind == PatchKind::Apply && ctx.path.sub.is_none() {
                access::authorize_create_on_apply(&ctx.inner, &ctx.attrs)?;
                let created = match create(ctx, patch_doc.clone()).await {
                    // Created by another writer since it was read: apply to that object, as
                    // the API server's storage retries an update that loses a create race.
                    Err(e) if e.reason == "AlreadyExists" => continue,
                    created => created?,
                };
                return Ok((StatusCode::CREATED, created));
            }
            return Err(ApiError::not_found(&ctx.rt, ctx.name()));
        };
        let mut patched = match kind {
            PatchKind::Merge => {
                let mut doc = Value::clone(&old);
                patch::merge_patch(&mut doc, &patch_doc);
                doc
            }
            PatchKind::Strategic => {
                let mut doc = Value::clone(&old);
                patch::strategic_merge_patch(&mut doc, &patch_doc);
                doc
            }
            PatchKind::Json => {
                patch::json_patch(&old, &patch_doc).map_err(ApiError::patch_failed)?
            }
            PatchKind::Apply => {
                let mut config = patch_doc.clone();
                check_identity(ctx, &mut config)?;
                let force = ctx.query.get("force").map(String::as_str) == Some("true");
                ctx.writer()
                    .apply(&old, &config, force)
                    .map_err(|conflicts| managed::conflict_error(&conflicts))?
            }
        };
        let requested_rv = meta_str(&patched, "resourceVersion").map(String::from);
        if requested_rv.is_some() && requested_rv.as_deref() != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(&ctx.rt, ctx.name()));
        }
        check_identity(ctx, &mut patched)?;
        let new = merge_server_fields(ctx, &old, patched);
        let new = admit(ctx, Operation::Update, new, Some(&old)).await?;
        match commit_checked(ctx, &old, new)? {
            Commit::Done(code, v) => return Ok((code, v)),
            Commit::Stale => continue,
        }
    }
    Err(ApiError::conflict(&ctx.rt, ctx.name()))
}
