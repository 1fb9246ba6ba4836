//! The review resources, answered and never stored: `SelfSubjectAccessReview` and
//! `SubjectAccessReview` (authorization.k8s.io/v1, `kubectl auth can-i`) by the same authorizer
//! requests meet, and `SelfSubjectReview` (authentication.k8s.io/v1, `kubectl auth whoami`).
//!
//! Real sources: `pkg/registry/authorization/selfsubjectaccessreview/rest.go`,
//! `pkg/registry/authorization/subjectaccessreview/rest.go`,
//! `pkg/registry/authorization/util/helpers.go` (spec to attributes) and
//! `pkg/registry/authentication/selfsubjectreview/rest.go`.

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::access::policy;
use super::context::{Ctx, json_response, media_type, parse_body};
use super::protobuf;
use crate::authn::UserInfo;
use crate::rbac::Attributes;
use crate::registry::ResourceType;
use crate::schema::FieldError;
use crate::status::ApiError;

/// Whether `rt` is a review resource (answered, not stored).
pub(super) fn is_review(rt: &ResourceType) -> bool {
    matches!(
        (rt.group.as_str(), rt.plural.as_str()),
        (
            "authorization.k8s.io",
            "selfsubjectaccessreviews" | "subjectaccessreviews"
        ) | ("authentication.k8s.io", "selfsubjectreviews")
    )
}

/// Answers a review: `create` is the only verb a review resource has.
pub(super) fn review(
    ctx: &Ctx,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    if *method != Method::POST || ctx.path.name.is_some() {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        )));
    }
    let content_type = media_type(headers);
    // kubectl's typed clientset sends these as protobuf (its answer may be JSON: it accepts both).
    let mut obj = if content_type.contains("protobuf") {
        protobuf::decode_review(&ctx.rt.kind, body).map_err(ApiError::bad_request)?
    } else if body.is_empty() {
        json!({})
    } else {
        parse_body(body)?
    };
    let status = match ctx.rt.plural.as_str() {
        "selfsubjectreviews" => json!({"userInfo": ctx.attrs.user.to_api()}),
        "selfsubjectaccessreviews" => access_review(ctx, &obj, ctx.attrs.user.clone())?,
        _ => {
            let spec = &obj["spec"];
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            };
            let user = UserInfo {
                username: spec["user"].as_str().unwrap_or("").to_string(),
                uid: spec["uid"].as_str().unwrap_or("").to_string(),
                groups: strings(&spec["groups"]),
                extra: spec["extra"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), strings(v)))
                    .collect(),
            };
            if user.username.is_empty() && user.groups.is_empty() {
                return Err(invalid(
                    ctx,
                    "spec.user",
                    "\"\"",
                    "at least one of user or group must be specified",
                ));
            }
            access_review(ctx, &obj, user)?
        }
    };
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(ctx.rt.api_version()));
        m.insert("kind".into(), json!(ctx.rt.kind));
        m.insert("metadata".into(), json!({"creationTimestamp": null}));
        m.insert("status".into(), status);
    }
    Ok(json_response(StatusCode::CREATED, &obj, &[]))
}

fn invalid(ctx: &Ctx, field: &str, value: &str, detail: &str) -> ApiError {
    ApiError::invalid(
        &ctx.rt,
        "",
        vec![FieldError::new(
            field,
            "FieldValueInvalid",
            format!("Invalid value: {value}: {detail}"),
        )],
    )
}

/// The status of an access review of `user` doing what the review's spec describes.
fn access_review(ctx: &Ctx, obj: &Value, user: UserInfo) -> Result<Value, ApiError> {
    let spec = &obj["spec"];
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    let attrs = match (
        spec.get("resourceAttributes").filter(|v| v.is_object()),
        spec.get("nonResourceAttributes").filter(|v| v.is_object()),
    ) {
        (Some(r), None) => {
            let mut attrs = Attributes::resource(
                user,
                &text(r, "verb"),
                &text(r, "group"),
                &text(r, "resource"),
            )
            .namespace(&text(r, "namespace"))
            .subresource(&text(r, "subresource"))
            .name(&text(r, "name"));
            attrs.api_version = text(r, "version");
            attrs
        }
        (None, Some(n)) => Attributes::non_resource(user, &text(n, "verb"), &text(n, "path")),
        _ => {
            return Err(invalid(
                ctx,
                "spec.resourceAttributes",
                "\"null\"",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    let decision = if attrs.user.is_privileged() {
        crate::rbac::Decision {
            allowed: true,
            reason: String::new(),
        }
    } else {
        policy(&ctx.inner).authorize(&attrs)
    };
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    Ok(status)
}
