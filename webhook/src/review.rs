//! `AdmissionReview` plumbing: typed rules in, route handlers out.
//!
//! [`validating`] and [`mutating`] turn a plain function over a typed object into an axum
//! [`MethodRouter`] that speaks `admission.k8s.io/v1`. The answers to bad input are listed in the
//! crate documentation.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
};

use axum::{
    extract::Request,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::MethodRouter,
};
use base64::Engine as _;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tracing::{debug, error, info};

use crate::patch;

mod answer;
mod envelope;
mod lists;
mod object;
mod pruned;
mod request;
mod rule;
mod wire;

pub(crate) use answer::too_large_response;
use answer::{allowed, denied};
use envelope::shorten;
pub use envelope::{MAX_ECHO_CHARS, MAX_MESSAGE_CHARS, MAX_WARNING_CHARS, MAX_WARNINGS, quoted};
pub use lists::{Bounded, at_most};
pub use object::MAX_MEMBERS;
use object::Object;
pub(crate) use request::BodyTimedOut;
pub use request::MAX_BODY_BYTES;
use request::{
    Failure, Parsed, panic_failure, parse_review, read_body, required, short_type_name, typed,
};
pub use rule::{Context, Operation, Verdict, Violation};

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
    // from the typed value directly rather than written out and parsed back, which would
    // serialise and parse every mutated object twice. The typed value holds only what the rule's type reads
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
