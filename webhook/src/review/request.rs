//! Reading a request: the body (content type, size, deadline), the `AdmissionReview` envelope,
//! and the objects as the rule's type. Every way this fails is a [`Failure`].

use std::{any::type_name, borrow::Cow, fmt};

use axum::{
    extract::Request,
    http::{StatusCode, header},
};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use tracing::{debug, error};

use super::{
    envelope::{MAX_ECHO_CHARS, MAX_MESSAGE_CHARS, quoted, readable_uid, shorten},
    object::Object,
    rule::{Context, Operation},
    wire::ReviewIn,
};

/// The largest request body accepted, as controller-runtime: the API server accepts writes of up
/// to 3 MiB and a review may carry both the object and the old object.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

pub(super) const API_VERSION: &str = "admission.k8s.io/v1";
pub(super) const KIND: &str = "AdmissionReview";

/// A failure to judge the request, answered either as an HTTP error (the envelope was unusable)
/// or as a denial carrying the uid (the envelope was fine, its content was not).
pub(super) struct Failure {
    pub(super) http: StatusCode,
    pub(super) code: u16,
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Failure {
    pub(super) fn http(http: StatusCode, reason: &'static str, message: String) -> Self {
        Self {
            http,
            code: http.as_u16(),
            reason,
            message,
        }
    }

    pub(super) fn denial(code: StatusCode, reason: &'static str, message: String) -> Self {
        Self {
            http: StatusCode::OK,
            code: code.as_u16(),
            reason,
            message,
        }
    }
}

/// The parts of a request every handler needs, borrowed from the body where possible.
pub(super) struct Parsed<'a> {
    pub(super) uid: Cow<'a, str>,
    pub(super) operation: Operation,
    pub(super) name: Cow<'a, str>,
    pub(super) namespace: Cow<'a, str>,
    pub(super) sub_resource: Cow<'a, str>,
    pub(super) group: Cow<'a, str>,
    pub(super) kind: Cow<'a, str>,
    pub(super) dry_run: bool,
    pub(super) object: Option<Object<'a>>,
    pub(super) old_object: Option<Object<'a>>,
}

impl Parsed<'_> {
    /// One debug line per admitted request: there are many, and nobody asks about them.
    pub(super) fn log_admitted(&self, patched: bool) {
        debug!(
            uid = %self.uid,
            operation = self.operation.as_str(),
            kind = %self.kind,
            namespace = %self.namespace,
            name = %shorten(self.name.to_string(), MAX_ECHO_CHARS),
            patched,
            "Admitted"
        );
    }

    pub(super) fn context(&self) -> Context<'_> {
        Context {
            uid: &self.uid,
            operation: self.operation,
            name: &self.name,
            namespace: &self.namespace,
            sub_resource: &self.sub_resource,
            dry_run: self.dry_run,
        }
    }
}

/// Reads the body of a POST: content type, size, and that it is not empty.
pub(super) async fn read_body(request: Request) -> Result<axum::body::Bytes, Failure> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(Failure::http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "contentType={}, expected application/json",
                quoted(content_type)
            ),
        ));
    }
    // One buffer, sized from `Content-Length` (the server has already refused one over the
    // limit): collecting the frames and then joining them would hold the body twice. Reserving is
    // not touching: a client that declares 7 MiB and sends less costs what it sent.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = Vec::with_capacity(declared.min(MAX_BODY_BYTES));
    let mut frames = Limited::new(request.into_body(), MAX_BODY_BYTES);
    while let Some(frame) = frames.frame().await {
        if let Ok(data) = frame.map_err(body_failure)?.into_data() {
            body.extend_from_slice(&data);
        }
    }
    if body.is_empty() {
        return Err(Failure::http(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "request body is empty".to_owned(),
        ));
    }
    Ok(body.into())
}

fn body_failure(error: Box<dyn std::error::Error + Send + Sync>) -> Failure {
    let mut causes = std::iter::successors(Some(&*error as &dyn std::error::Error), |e| e.source());
    if error.downcast_ref::<LengthLimitError>().is_some() {
        too_large()
    } else if causes.any(|cause| cause.is::<BodyTimedOut>()) {
        Failure::http(
            StatusCode::REQUEST_TIMEOUT,
            "Timeout",
            "request body not received within the body-read timeout".to_owned(),
        )
    } else {
        Failure::http(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("failed to read request body: {error}"),
        )
    }
}

/// The server's body-read deadline passed before the body was complete.
#[derive(Debug)]
pub(crate) struct BodyTimedOut;

impl fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("body-read timeout")
    }
}

impl std::error::Error for BodyTimedOut {}

/// The 413 answer, also used by the server before reading a body declared too large.
pub(super) fn too_large() -> Failure {
    Failure::http(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        format!("request entity is too large; limit is {MAX_BODY_BYTES} bytes"),
    )
}

/// Parses the envelope. `Err` carries the uid when one was readable.
pub(super) fn parse_review(body: &[u8]) -> Result<Parsed<'_>, (Failure, String)> {
    let bad = |message: String| Failure::http(StatusCode::BAD_REQUEST, "BadRequest", message);
    let review: ReviewIn<'_> = serde_json::from_slice(body).map_err(|e| {
        (
            bad(shorten(
                format!("failed to parse AdmissionReview: {e}"),
                MAX_MESSAGE_CHARS,
            )),
            readable_uid(body),
        )
    })?;
    let ReviewIn {
        api_version,
        kind,
        request,
    } = review;
    let request = request.ok_or_else(|| {
        (
            bad("AdmissionReview has no request".to_owned()),
            String::new(),
        )
    })?;
    let uid = match request.uid {
        Some(uid) if !uid.is_empty() => uid,
        _ => return Err((bad("request.uid is missing".to_owned()), String::new())),
    };
    if api_version.as_deref() != Some(API_VERSION) {
        let message = format!(
            "unsupported AdmissionReview apiVersion {}, expected {API_VERSION:?}",
            quoted(api_version.as_deref().unwrap_or(""))
        );
        return Err((bad(message), uid.into_owned()));
    }
    if kind.as_deref() != Some(KIND) {
        let message = format!(
            "unsupported kind {}, expected {KIND:?}",
            quoted(kind.as_deref().unwrap_or(""))
        );
        return Err((bad(message), uid.into_owned()));
    }
    let operation = match request.operation.as_deref() {
        Some("CREATE") => Operation::Create,
        Some("UPDATE") => Operation::Update,
        Some("DELETE") => Operation::Delete,
        Some("CONNECT") => Operation::Connect,
        other => {
            let message = format!(
                "unsupported operation {}, expected CREATE, UPDATE, DELETE or CONNECT",
                quoted(other.unwrap_or(""))
            );
            return Err((bad(message), uid.into_owned()));
        }
    };
    let kind = request.kind.unwrap_or_default();
    Ok(Parsed {
        uid,
        operation,
        name: request.name,
        namespace: request.namespace,
        sub_resource: request.sub_resource,
        group: kind.group,
        kind: kind.kind,
        dry_run: request.dry_run.unwrap_or(false),
        object: request.object,
        old_object: request.old_object,
    })
}

/// Reads an object as the rule's type; the error names the field that failed, and the
/// request's kind (the type's name when the request has none).
pub(super) fn typed<T: DeserializeOwned>(
    object: &Object<'_>,
    which: &str,
    kind: &str,
) -> Result<T, Failure> {
    T::deserialize(object.deserializer()).map_err(|_| {
        // Slow path only on failure: read again to learn the path of the bad field.
        let detail = match serde_path_to_error::deserialize::<_, T>(object.deserializer()) {
            Err(e) if e.path().iter().next().is_some() => format!("{}: {}", e.path(), e.inner()),
            Err(e) => e.inner().to_string(),
            Ok(_) => "inconsistent parse".to_owned(),
        };
        let kind = if kind.is_empty() {
            short_type_name::<T>()
        } else {
            kind
        };
        Failure::denial(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            shorten(
                format!("{which} does not parse as {kind}: {detail}"),
                MAX_MESSAGE_CHARS,
            ),
        )
    })
}

pub(super) fn short_type_name<T>() -> &'static str {
    let full = type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

pub(super) fn required<'o, 'a>(
    object: Option<&'o Object<'a>>,
    which: &str,
    operation: &str,
) -> Result<&'o Object<'a>, Failure> {
    object.ok_or_else(|| {
        Failure::denial(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("{which} is missing on {operation}"),
        )
    })
}

pub(super) fn panic_failure(payload: &(dyn std::any::Any + Send), uid: &str) -> Failure {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned());
    error!(%uid, panic = %detail, "Admission rule panicked");
    Failure::denial(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        shorten(
            format!("admission rule panicked: {detail}"),
            MAX_MESSAGE_CHARS,
        ),
    )
}
