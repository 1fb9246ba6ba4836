//! Answering a request: allowed (with a patch and warnings), denied with the violations as
//! causes, or a [`Failure`] as an HTTP error or a denial; each answer tagged for the metrics.

use axum::{
    body::Body,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use tracing::error;

use super::{
    envelope::{MAX_ECHO_CHARS, bounded, quoted, shorten},
    request::{API_VERSION, Failure, KIND, Parsed, too_large},
    rule::Violation,
    wire::{CauseOut, DetailsOut, Empty, ResponseOut, ReviewOut, StatusOut},
};
use crate::metrics::{Decision, ReviewCode};

/// The longest object name Kubernetes allows (a DNS-1123 subdomain).
const MAX_NAME_BYTES: usize = 253;

impl Failure {
    pub(super) fn into_response(self, uid: &str) -> Response {
        let decision = if self.code >= 500 {
            Decision::Error
        } else if self.http == StatusCode::OK {
            Decision::Denied
        } else {
            Decision::Error
        };
        let mut response = json_response(
            self.http,
            &ReviewOut {
                api_version: API_VERSION,
                kind: KIND,
                response: ResponseOut {
                    uid,
                    allowed: false,
                    status: Some(StatusOut {
                        metadata: Empty {},
                        status: "Failure",
                        code: self.code,
                        reason: self.reason,
                        message: self.message,
                        details: None,
                    }),
                    patch: None,
                    patch_type: None,
                    warnings: Vec::new(),
                },
            },
        );
        if matches!(
            self.http,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
        ) {
            // The rest of the body was not read: the connection cannot be reused.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        tag(&mut response, decision, self.code);
        response
    }
}

fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            Body::from(bytes),
        )
            .into_response(),
        // Our own types always serialise; this keeps the handler total anyway.
        Err(error) => {
            error!(%error, "Failed to serialise an admission answer");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

fn tag(response: &mut Response, decision: Decision, code: u16) {
    response.extensions_mut().insert(decision);
    response.extensions_mut().insert(ReviewCode(code));
}

pub(super) fn allowed(uid: &str, patch: Option<String>, warnings: Vec<String>) -> Response {
    let decision = if patch.is_some() {
        Decision::Patched
    } else {
        Decision::Allowed
    };
    let patch_type = patch.as_ref().map(|_| "JSONPatch");
    let mut response = json_response(
        StatusCode::OK,
        &ReviewOut {
            api_version: API_VERSION,
            kind: KIND,
            response: ResponseOut {
                uid,
                allowed: true,
                status: None,
                patch,
                patch_type,
                warnings: bounded(warnings),
            },
        },
    );
    tag(&mut response, decision, 200);
    response
}

pub(super) fn denied(
    request: &Parsed<'_>,
    violations: Vec<Violation>,
    warnings: Vec<String>,
) -> Response {
    let qualified = if request.group.is_empty() {
        request.kind.to_string()
    } else {
        format!("{}.{}", request.kind, request.group)
    };
    let qualified = shorten(qualified, MAX_ECHO_CHARS);
    let listed = if violations.len() == 1 {
        violations[0].to_string()
    } else {
        let all: Vec<String> = violations.iter().map(Violation::to_string).collect();
        format!("[{}]", all.join(", "))
    };
    let message = format!("{qualified} {} is invalid: {listed}", quoted(&request.name));
    let causes = violations
        .into_iter()
        .map(|v| CauseOut {
            reason: v.reason,
            message: v.message,
            field: v.field,
        })
        .collect();
    let mut response = json_response(
        StatusCode::OK,
        &ReviewOut {
            api_version: API_VERSION,
            kind: KIND,
            response: ResponseOut {
                uid: &request.uid,
                allowed: false,
                status: Some(StatusOut {
                    metadata: Empty {},
                    status: "Failure",
                    code: 422,
                    reason: "Invalid",
                    message,
                    details: Some(DetailsOut {
                        name: legal(&request.name),
                        group: legal(&request.group),
                        kind: legal(&request.kind),
                        causes,
                    }),
                }),
                patch: None,
                patch_type: None,
                warnings: bounded(warnings),
            },
        },
    );
    tag(&mut response, Decision::Denied, 422);
    response
}

/// A name, group or kind for `status.details`, which only legal ones are: none is longer than
/// 253 bytes. A longer one is left out there, and echoed (cut) in the message.
fn legal(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        name.to_owned()
    } else {
        String::new()
    }
}

/// The body of a 413 answer (for the server's early check of `Content-Length`).
pub(crate) fn too_large_response() -> Response {
    too_large().into_response("")
}
