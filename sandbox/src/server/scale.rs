//! The `/scale` subresource: GET, PUT and PATCH of the Scale view of an object.

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::context::{Ctx, json_response, media_type, not_found_path, parse_body, read_current};
use super::patch::{PatchKind, parse_patch_body};
use super::update::{Commit, WRITE_RETRIES, commit_checked};
use super::write::admit_scale;
use crate::patch;
use crate::schema::FieldError;
use crate::status::ApiError;
use crate::store::meta_str;

/// GET, PUT and PATCH of `/scale`: the Scale view of the object; writes set its replicas
/// through the update path (generation, schema validation), admitted as a `Scale`
/// (see [`admit_scale`]).
pub(super) async fn scale_request(
    ctx: &mut Ctx,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let Some(paths) = crate::scale::paths(&ctx.rt).cloned() else {
        return Err(not_found_path());
    };
    let write = match *method {
        Method::GET => None,
        Method::PUT => Some((None, parse_body(body)?)),
        Method::PATCH => {
            let content_type = media_type(headers);
            let kind = match content_type.as_str() {
                "application/json-patch+json" => PatchKind::Json,
                "application/merge-patch+json" | "application/apply-patch+yaml" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                _ => return Err(ApiError::unsupported_media_type(&ctx.rt)),
            };
            let doc = parse_patch_body(kind, body)?;
            Some((Some(kind), doc))
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )));
        }
    };
    for _ in 0..WRITE_RETRIES {
        let old = read_current(ctx).ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
        let current = crate::scale::to_scale(&paths, &old);
        let Some((kind, doc)) = &write else {
            return Ok(json_response(StatusCode::OK, &current, &[]));
        };
        let requested = match kind {
            None => doc.clone(),
            Some(PatchKind::Json) => {
                patch::json_patch(&current, doc).map_err(ApiError::patch_failed)?
            }
            Some(PatchKind::Strategic) => {
                let mut s = current.clone();
                patch::strategic_merge_patch(&mut s, doc);
                s
            }
            Some(_) => {
                let mut s = current.clone();
                patch::merge_patch(&mut s, doc);
                s
            }
        };
        if let Some(rv) = meta_str(&requested, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(&ctx.rt, ctx.name()));
        }
        let (rt, name) = (ctx.rt.clone(), ctx.name().to_owned());
        let replicas_of = |scale: &Value| -> Result<i64, ApiError> {
            let Some(replicas) = scale.pointer("/spec/replicas").and_then(Value::as_i64) else {
                return Err(ApiError::invalid(
                    &rt,
                    &name,
                    vec![FieldError::new(
                        "spec.replicas",
                        "FieldValueRequired",
                        "Required value: an integer is required",
                    )],
                ));
            };
            if replicas < 0 {
                return Err(ApiError::invalid(
                    &rt,
                    &name,
                    vec![FieldError::new(
                        "spec.replicas",
                        "FieldValueInvalid",
                        format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                    )],
                ));
            }
            Ok(replicas)
        };
        replicas_of(&requested)?;
        let apply = |scale: &Value| {
            let mut new = Value::clone(&old);
            crate::scale::set_replicas(&paths, &mut new, replicas_of(scale)?);
            Ok(new)
        };
        let mut new = admit_scale(ctx, requested.clone(), &current, &old, apply).await?;
        ctx.writer().updated(&old, &mut new);
        match commit_checked(ctx, &old, new)? {
            Commit::Done(_, stored) => {
                let scale = crate::scale::to_scale(&paths, &stored);
                return Ok(json_response(StatusCode::OK, &scale, &ctx.warnings));
            }
            Commit::Stale => continue,
        }
    }
    Err(ApiError::conflict(&ctx.rt, ctx.name()))
}
