//! `Status` errors as the API server returns them: the one error type of the request path, and
//! the conversions from the errors of the modules it calls.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::admission::{self, Rejection};
use crate::defaults;
use crate::registry::ResourceType;
use crate::schema::FieldError;

/// A failed API request, rendered as a `meta/v1 Status` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` (`NotFound`, `Conflict`, ...).
    pub reason: String,
    /// Human-readable message, as kubectl prints it.
    pub message: String,
    /// `details` (name, group, kind, causes), if any.
    pub details: Option<Box<Value>>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// Warnings (from admission webhooks) sent as `Warning` headers with the error.
    pub warnings: Vec<String>,
}

impl ApiError {
    /// An error with the given code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
            warnings: Vec::new(),
        }
    }

    /// The error a `Status` (as admission webhooks deny with) describes.
    pub fn from_status(status: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> Self {
        let mut err = Self::new(
            status
                .code
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(500),
            // A webhook's denial without a reason keeps none (`ToStatusErr`).
            status.reason.as_deref().unwrap_or(""),
            status.message.clone().unwrap_or_default(),
        );
        err.details = status
            .details
            .as_ref()
            .and_then(|d| serde_json::to_value(d).ok())
            .map(Box::new);
        err
    }

    fn with_details(mut self, rt: &ResourceType, name: &str) -> Self {
        self.details = Some(Box::new(
            json!({"name": name, "group": rt.group, "kind": rt.plural}),
        ));
        self
    }

    /// 404 for a missing object.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(rt, name)
    }

    /// 409 when creating an object that exists.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .with_details(rt, name)
    }

    /// 409 for a write based on a stale resourceVersion.
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                rt.qualified()
            ),
        )
        .with_details(rt, name)
    }

    /// 422 with one cause per field error.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<FieldError>) -> Self {
        let kind = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let joined = causes
            .iter()
            .map(|cause| format!("{}: {}", cause.field, cause.message))
            .collect::<Vec<_>>();
        let summary = if joined.len() == 1 {
            joined[0].clone()
        } else {
            format!("[{}]", joined.join(", "))
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {summary}"),
        );
        err.details = Some(Box::new(json!({
            "name": name,
            "group": rt.group,
            "kind": rt.kind,
            "causes": causes.iter().map(|cause| json!({
                "reason": cause.reason, "message": cause.message, "field": cause.field,
            })).collect::<Vec<_>>(),
        })));
        err
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403 for a forbidden operation.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 500 for a failure inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 405 for a verb the resource does not support.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 422 for a JSON patch that does not apply to the object.
    pub fn patch_failed(reason: impl std::fmt::Display) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {reason}"),
        )
    }

    /// The error with `earlier` warnings (gathered before it happened) sent ahead of its own.
    pub fn with_earlier_warnings(mut self, earlier: &[String]) -> Self {
        self.warnings.splice(0..0, earlier.iter().cloned());
        self
    }

    /// 415 for a patch content type the server does not know.
    pub fn unsupported_media_type(rt: &ResourceType) -> Self {
        // Custom resources have no strategic merge patch (`customresource_handler.go`).
        let accepted = if rt.crd.is_some() {
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        } else {
            "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
        };
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            ),
        )
    }

    /// 504 for a watch from a resourceVersion the server has not reached
    /// (`storage.NewTooLargeResourceVersionError`).
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut err = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        err.details = Some(Box::new(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        })));
        err
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // `reason` is `omitempty` in Go's `metav1.Status`.
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(details) = &self.details {
            status["details"] = (**details).clone();
        }
        if let Some(secs) = self.retry_after {
            let details = status
                .as_object_mut()
                .map(|o| o.entry("details").or_insert_with(|| json!({})));
            if let Some(details) = details {
                details["retryAfterSeconds"] = json!(secs);
            }
        }
        status
    }
}

impl From<defaults::Error> for ApiError {
    fn from(e: defaults::Error) -> Self {
        let (reason, code) = e.reason_and_code();
        ApiError::new(code, reason, e.to_string())
    }
}

impl From<admission::Error> for ApiError {
    fn from(e: admission::Error) -> Self {
        ApiError::from_status(&e.status())
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> Self {
        let mut err = ApiError::from(rejection.error);
        err.warnings = rejection.warnings;
        err
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_status().to_string();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for w in &self.warnings {
            if let Ok(v) = HeaderValue::from_str(&crate::admission::warning_header_value(w)) {
                resp.headers_mut().append(header::WARNING, v);
            }
        }
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}
