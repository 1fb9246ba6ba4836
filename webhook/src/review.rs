//! `AdmissionReview` plumbing: typed rules in, route handlers out.
//!
//! [`validating`] and [`mutating`] turn a plain function over a typed object into an axum
//! [`MethodRouter`] that speaks `admission.k8s.io/v1`. The answers to bad input are listed in the
//! crate documentation.

use std::{
    any::type_name,
    borrow::Cow,
    fmt,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
};

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::MethodRouter,
};
use base64::Engine as _;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tracing::{debug, error, info};

use crate::{
    metrics::{Decision, ReviewCode},
    patch,
};

mod envelope;
mod lists;
mod object;
mod pruned;
mod wire;

pub use envelope::{MAX_ECHO_CHARS, MAX_MESSAGE_CHARS, MAX_WARNING_CHARS, MAX_WARNINGS, quoted};
use envelope::{bounded, readable_uid, shorten};
pub use lists::{Bounded, at_most};
pub use object::MAX_MEMBERS;
use object::Object;
use wire::{CauseOut, DetailsOut, Empty, ResponseOut, ReviewIn, ReviewOut, StatusOut};

/// The largest request body accepted, as controller-runtime: the API server accepts writes of up
/// to 3 MiB and a review may carry both the object and the old object.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

const API_VERSION: &str = "admission.k8s.io/v1";
/// The longest object name Kubernetes allows (a DNS-1123 subdomain).
const MAX_NAME_BYTES: usize = 253;
const KIND: &str = "AdmissionReview";

/// The operation being admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A create.
    Create,
    /// An update (the rule also gets the old object).
    Update,
    /// A delete: always allowed, never patched, no rule runs.
    Delete,
    /// A connect (exec, attach, port-forward): always allowed, no rule runs.
    Connect,
}

impl Operation {
    /// The name the API server sends: `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }
}

/// What a rule may want to know about the request besides the objects.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// The request's uid (echoed in the answer by the plumbing).
    pub uid: &'a str,
    /// CREATE or UPDATE (rules never see DELETE or CONNECT).
    pub operation: Operation,
    /// The object's name; empty on a CREATE with `generateName`.
    pub name: &'a str,
    /// The object's namespace; empty for cluster-scoped objects.
    pub namespace: &'a str,
    /// The subresource, empty for the main resource.
    pub sub_resource: &'a str,
    /// Whether the API server will persist nothing. Rules have no side effects, so this only
    /// matters to rules that log.
    pub dry_run: bool,
}

/// One violated rule, with the field it is about, in the form of Kubernetes' field errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Field path, `spec.env[2].name` style.
    pub field: String,
    /// The cause type (`FieldValueInvalid`, `FieldValueRequired`...).
    pub reason: &'static str,
    /// The message, `Invalid value: -1: must be ...` style.
    pub message: String,
}

impl Violation {
    /// A value that breaks a rule; `value` is shown as given (show strings with [`quoted`],
    /// which also cuts long ones).
    pub fn invalid(field: impl Into<String>, value: impl fmt::Display, detail: &str) -> Self {
        Self::new(
            field,
            "FieldValueInvalid",
            format!("Invalid value: {value}: {detail}"),
        )
    }

    /// A missing value.
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_owned()
        } else {
            format!("Required value: {detail}")
        };
        Self::new(field, "FieldValueRequired", message)
    }

    /// A value that must be unique and is not.
    pub fn duplicate(field: impl Into<String>, value: impl fmt::Display) -> Self {
        Self::new(
            field,
            "FieldValueDuplicate",
            format!("Duplicate value: {value}"),
        )
    }

    /// A value longer than allowed.
    pub fn too_long(field: impl Into<String>, max_bytes: usize) -> Self {
        Self::new(
            field,
            "FieldValueTooLong",
            format!("Too long: may not be more than {max_bytes} bytes"),
        )
    }

    /// A list with more items than allowed.
    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self::new(
            field,
            "FieldValueTooMany",
            format!("Too many: {actual}: must have at most {max} items"),
        )
    }

    /// A change or value that is not allowed at all.
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self::new(field, "FieldValueForbidden", format!("Forbidden: {detail}"))
    }

    fn new(field: impl Into<String>, reason: &'static str, message: String) -> Self {
        Self {
            field: field.into(),
            reason,
            message,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// What a validating rule returns: every violation at once, and warnings for legal but
/// suspicious input. No violations means allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Reasons to deny; empty to allow.
    pub violations: Vec<Violation>,
    /// Shown by kubectl whether or not the request is allowed.
    pub warnings: Vec<String>,
}

// === Answers ===

/// A failure to judge the request, answered either as an HTTP error (the envelope was unusable)
/// or as a denial carrying the uid (the envelope was fine, its content was not).
struct Failure {
    http: StatusCode,
    code: u16,
    reason: &'static str,
    message: String,
}

impl Failure {
    fn http(http: StatusCode, reason: &'static str, message: String) -> Self {
        Self {
            http,
            code: http.as_u16(),
            reason,
            message,
        }
    }

    fn denial(code: StatusCode, reason: &'static str, message: String) -> Self {
        Self {
            http: StatusCode::OK,
            code: code.as_u16(),
            reason,
            message,
        }
    }

    fn into_response(self, uid: &str) -> Response {
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

fn allowed(uid: &str, patch: Option<String>, warnings: Vec<String>) -> Response {
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

fn denied(request: &Parsed<'_>, violations: Vec<Violation>, warnings: Vec<String>) -> Response {
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

// === Request handling ===

/// The parts of a request every handler needs, borrowed from the body where possible.
struct Parsed<'a> {
    uid: Cow<'a, str>,
    operation: Operation,
    name: Cow<'a, str>,
    namespace: Cow<'a, str>,
    sub_resource: Cow<'a, str>,
    group: Cow<'a, str>,
    kind: Cow<'a, str>,
    dry_run: bool,
    object: Option<Object<'a>>,
    old_object: Option<Object<'a>>,
}

impl Parsed<'_> {
    /// One debug line per admitted request: there are many, and nobody asks about them.
    fn log_admitted(&self, patched: bool) {
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

    fn context(&self) -> Context<'_> {
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
async fn read_body(request: Request) -> Result<axum::body::Bytes, Failure> {
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
    // limit): collecting the frames and then joining them held the body twice. Reserving is
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
fn too_large() -> Failure {
    Failure::http(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        format!("request entity is too large; limit is {MAX_BODY_BYTES} bytes"),
    )
}

/// The body of a 413 answer (for the server's early check of `Content-Length`).
pub(crate) fn too_large_response() -> Response {
    too_large().into_response("")
}

/// Parses the envelope. `Err` carries the uid when one was readable.
fn parse_review(body: &[u8]) -> Result<Parsed<'_>, (Failure, String)> {
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
fn typed<T: DeserializeOwned>(object: &Object<'_>, which: &str, kind: &str) -> Result<T, Failure> {
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

fn short_type_name<T>() -> &'static str {
    let full = type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

fn required<'o, 'a>(
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

fn panic_failure(payload: &(dyn std::any::Any + Send), uid: &str) -> Failure {
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

/// Reads and parses the request; on failure returns the finished error response.
async fn envelope(request: Request) -> Result<axum::body::Bytes, Response> {
    read_body(request).await.map_err(|f| f.into_response(""))
}

// === Validating ===

/// A route handler for a validating webhook over objects of type `T`.
///
/// On CREATE the rule gets the new object; on UPDATE also the old one. DELETE and CONNECT are
/// allowed without running the rule. Violations become a denial with code 422, reason
/// `Invalid`, and one cause per violation; warnings are passed through (cut to
/// [`MAX_WARNING_CHARS`], at most [`MAX_WARNINGS`]). A panicking rule is answered with code 500.
pub fn validating<T, F>(rule: F) -> MethodRouter
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(&T, Option<&T>, &Context<'_>) -> Verdict + Send + Sync + 'static,
{
    let rule = Arc::new(rule);
    axum::routing::post(move |request: Request| {
        let rule = rule.clone();
        async move {
            let body = match envelope(request).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            off_the_workers(body, move |body| validate_body(body, &*rule)).await
        }
    })
}

fn validate_body<T, F>(body: &[u8], rule: &F) -> Response
where
    T: DeserializeOwned,
    F: Fn(&T, Option<&T>, &Context<'_>) -> Verdict,
{
    let request = match parse_review(body) {
        Ok(request) => request,
        Err((failure, uid)) => return failure.into_response(&uid),
    };
    let (new, old) = match request.operation {
        Operation::Delete | Operation::Connect => return allowed(&request.uid, None, Vec::new()),
        Operation::Create => {
            match required(request.object.as_ref(), "request.object", "CREATE")
                .and_then(|raw| typed::<T>(raw, "request.object", &request.kind))
            {
                Ok(new) => (new, None),
                Err(failure) => return failure.into_response(&request.uid),
            }
        }
        Operation::Update => {
            let parsed = required(request.object.as_ref(), "request.object", "UPDATE")
                .and_then(|raw| typed::<T>(raw, "request.object", &request.kind))
                .and_then(|new| {
                    required(request.old_object.as_ref(), "request.oldObject", "UPDATE")
                        .and_then(|raw| typed::<T>(raw, "request.oldObject", &request.kind))
                        .map(|old| (new, Some(old)))
                });
            match parsed {
                Ok(pair) => pair,
                Err(failure) => return failure.into_response(&request.uid),
            }
        }
    };
    let context = request.context();
    match catch_unwind(AssertUnwindSafe(|| rule(&new, old.as_ref(), &context))) {
        Ok(verdict) if verdict.violations.is_empty() => {
            request.log_admitted(false);
            allowed(&request.uid, None, verdict.warnings)
        }
        Ok(verdict) => {
            // Denials are what an admin asks about ("why was my apply refused?"): at info,
            // with every reason, as the user was told them.
            let reasons: Vec<String> = verdict
                .violations
                .iter()
                .map(Violation::to_string)
                .collect();
            info!(
                uid = %request.uid,
                operation = request.operation.as_str(),
                kind = %request.kind,
                namespace = %request.namespace,
                name = %shorten(request.name.to_string(), MAX_ECHO_CHARS),
                reasons = %reasons.join("; "),
                "Denied"
            );
            denied(&request, verdict.violations, verdict.warnings)
        }
        Err(payload) => panic_failure(&*payload, &request.uid).into_response(&request.uid),
    }
}

// === Mutating ===

/// A route handler for a mutating webhook over objects of type `T`.
///
/// The rule edits the typed object in place; the answer carries the add-only JSON Patch (see
/// [`crate::patch`]) from the raw request object to the edited one, or no patch when nothing
/// changed. DELETE and CONNECT are allowed without a patch. A rule whose edit is not add-only,
/// or that panics, is answered with code 500 and no patch.
pub fn mutating<T, F>(rule: F) -> MethodRouter
where
    T: DeserializeOwned + Serialize + Send + 'static,
    F: Fn(&mut T, &Context<'_>) + Send + Sync + 'static,
{
    let rule = Arc::new(rule);
    axum::routing::post(move |request: Request| {
        let rule = rule.clone();
        async move {
            let body = match envelope(request).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            off_the_workers(body, move |body| mutate_body(body, &*rule)).await
        }
    })
}

/// Bodies from this size on are reviewed on the blocking pool. Parsing and judging one at the
/// size limit takes tens of milliseconds; on an async worker it would hold up every small
/// review queued behind it (two workers on two cores: two big reviews stall all the rest).
/// The work is O(n) in the body, so it never outlives its request by much.
const OFFLOAD_BYTES: usize = 256 * 1024;

async fn off_the_workers(
    body: axum::body::Bytes,
    review: impl FnOnce(&[u8]) -> Response + Send + 'static,
) -> Response {
    if body.len() < OFFLOAD_BYTES {
        return review(&body);
    }
    match tokio::task::spawn_blocking(move || review(&body)).await {
        Ok(response) => response,
        // Rules' panics are caught inside; this is the runtime shutting down.
        Err(error) => {
            error!(%error, "Review task did not finish");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}

fn mutate_body<T, F>(body: &[u8], rule: &F) -> Response
where
    T: DeserializeOwned + Serialize,
    F: Fn(&mut T, &Context<'_>),
{
    let request = match parse_review(body) {
        Ok(request) => request,
        Err((failure, uid)) => return failure.into_response(&uid),
    };
    let operation = match request.operation {
        Operation::Delete | Operation::Connect => return allowed(&request.uid, None, Vec::new()),
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
    };
    match patch_for(&request, operation, rule) {
        Ok(patch) => {
            request.log_admitted(patch.is_some());
            allowed(&request.uid, patch, Vec::new())
        }
        Err(failure) => failure.into_response(&request.uid),
    }
}

fn patch_for<T, F>(
    request: &Parsed<'_>,
    operation: &str,
    rule: &F,
) -> Result<Option<String>, Failure>
where
    T: DeserializeOwned + Serialize,
    F: Fn(&mut T, &Context<'_>),
{
    let raw_object = required(request.object.as_ref(), "request.object", operation)?;
    let mut object: T = match typed(raw_object, "request.object", &request.kind) {
        Ok(object) => object,
        Err(failure) => {
            // Mutating webhooks run before the API server's schema validation: an object the
            // rule's type cannot read is admitted unchanged, so its author gets the schema's own
            // message (`spec.port: Required value`) rather than a Rust parse error. Validating
            // webhooks run after it, so there the same object is denied.
            debug!(uid = %request.uid, reason = %failure.message, "Admitted unchanged: the object does not parse");
            return Ok(None);
        }
    };
    let internal = |message: String| {
        Failure::denial(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    };
    // As value trees, which the patch walk needs whenever the rule changed something, made
    // from the typed value directly: writing it out and parsing it back took a fifth of the
    // mutating route's time. The typed value holds only what the rule's type reads
    // (lists within its limits), so its tree is bounded by the type, not by the body.
    let tree = |object: &T, what: &str| {
        serde_json::to_value(object)
            .map_err(|e| internal(format!("failed to serialise the {what} object: {e}")))
    };
    let before = tree(&object, "typed")?;
    let context = request.context();
    catch_unwind(AssertUnwindSafe(|| rule(&mut object, &context)))
        .map_err(|payload| panic_failure(&*payload, &request.uid))?;
    let after = tree(&object, "mutated")?;
    drop(object);
    if before == after {
        // The common case once defaults are in place: no need to look at the raw object.
        return Ok(None);
    }
    // The type was read from the object's members, so it had them; and a type read from a
    // JSON object serialises as one, unless it is a rule's own oddity.
    let (Object::Members(members), Value::Object(wanted)) = (raw_object, &after) else {
        return Err(internal(format!(
            "{} does not serialise as a JSON object",
            short_type_name::<T>()
        )));
    };
    let raw = pruned::pruned(members, wanted).map_err(|e| {
        Failure::denial(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("request.object is not JSON: {e}"),
        )
    })?;
    let ops = patch::add_only(&before, after, &raw).map_err(|e| {
        error!(uid = %request.uid, error = %e, "Mutation is not add-only");
        internal(e.to_string())
    })?;
    if ops.is_empty() {
        return Ok(None);
    }
    let json = serde_json::to_vec(&ops)
        .map_err(|e| internal(format!("failed to serialise the patch: {e}")))?;
    Ok(Some(base64::engine::general_purpose::STANDARD.encode(json)))
}
