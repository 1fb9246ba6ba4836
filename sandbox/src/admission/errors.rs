//! Why a request was not admitted, and the `Status` the API server answers with.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

/// Why a request was not admitted, or why calling a webhook failed.
///
/// The chain returns [`Error::Denied`], [`Error::DryRunUnsupported`], [`Error::CallWebhook`]
/// (wrapping one of the call failures below), [`Error::ParseSelector`], [`Error::DecodePatch`] or
/// [`Error::ApplyPatch`]; [`Error::status`] turns any of them into the API server's answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A webhook answered `allowed: false`; `status` is what the client gets.
    #[error("{}", .status.message.as_deref().unwrap_or("admission webhook denied the request"))]
    Denied {
        /// The webhook's name.
        webhook: String,
        /// The denial as the API server answers it.
        status: Box<Status>,
    },
    /// A ValidatingAdmissionPolicy's Deny action refused the request; `status` is what the
    /// client gets.
    #[error("{}", .status.message.as_deref().unwrap_or("denied by a ValidatingAdmissionPolicy"))]
    PolicyDenied {
        /// The policy's name.
        policy: String,
        /// The binding's name (none for a policy that failed before any binding).
        binding: Option<String>,
        /// The denial as the API server answers it.
        status: Box<Status>,
    },
    /// A matching webhook has side effects and the request is a dry run.
    #[error("admission webhook \"{webhook}\" does not support dry run")]
    DryRunUnsupported {
        /// The webhook's name.
        webhook: String,
    },
    /// Calling a webhook failed or its answer was invalid, and its failurePolicy is Fail.
    #[error("failed calling webhook \"{webhook}\": {source}")]
    CallWebhook {
        /// The webhook's name.
        webhook: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// A webhook's namespaceSelector or objectSelector is not a valid label selector.
    #[error("webhook \"{webhook}\" has an invalid label selector: {reason}")]
    ParseSelector {
        /// The webhook's name.
        webhook: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A mutating webhook returned a patch that is not an RFC 6902 JSON Patch.
    #[error("webhook \"{webhook}\" returned an invalid JSON patch: {source}")]
    DecodePatch {
        /// The webhook's name.
        webhook: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// A mutating webhook returned a patch that does not apply to the object.
    #[error("webhook \"{webhook}\" returned a JSON patch that does not apply: {source}")]
    ApplyPatch {
        /// The webhook's name.
        webhook: String,
        /// The failed operation.
        #[source]
        source: json_patch::PatchError,
    },
    /// A mutating webhook's patch has nothing to apply to (DELETE), or turned the object into
    /// something that is not the same kind.
    #[error("webhook \"{webhook}\" returned a JSON patch with an invalid result: {reason}")]
    CheckPatchedObject {
        /// The webhook's name.
        webhook: String,
        /// What is wrong with the result.
        reason: String,
    },
    /// A matchCondition is not valid CEL or did not evaluate to a boolean.
    #[error("failed to evaluate match condition \"{condition}\": {reason}")]
    EvaluateMatchCondition {
        /// The condition's name.
        condition: String,
        /// The parse or evaluation error.
        reason: String,
    },
    /// The client config names no address the sandbox can dial.
    #[error("failed to call webhook: {reason}")]
    ResolveWebhook {
        /// Why (an unregistered service, a URL that is not `https://host[:port]/...`).
        reason: String,
    },
    /// The client config's caBundle holds no usable certificate.
    #[error("failed to call webhook: invalid caBundle: {reason}")]
    LoadCaBundle {
        /// What is wrong with it.
        reason: String,
    },
    /// The webhook does not accept `admission.k8s.io/v1` reviews.
    #[error("webhook does not accept v1 AdmissionReview (admissionReviewVersions: {versions:?})")]
    NegotiateReviewVersion {
        /// The versions the configuration lists.
        versions: Vec<String>,
    },
    /// The TCP connection to the webhook failed.
    #[error("failed to call webhook: Post \"{url}\": dial tcp {address}: {source}")]
    ConnectWebhook {
        /// The URL called.
        url: String,
        /// The address dialled.
        address: String,
        /// The connection error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (untrusted certificate, wrong name, ...).
    #[error("failed to call webhook: Post \"{url}\": tls: {source}")]
    TlsHandshake {
        /// The URL called.
        url: String,
        /// The handshake error.
        #[source]
        source: std::io::Error,
    },
    /// Sending the review or reading the answer's head failed.
    #[error("failed to call webhook: Post \"{url}\": {source}")]
    SendReview {
        /// The URL called.
        url: String,
        /// The HTTP error.
        #[source]
        source: hyper::Error,
    },
    /// Reading the answer's body failed or it was too large.
    #[error("failed to call webhook: Post \"{url}\": reading the response: {source}")]
    ReadReview {
        /// The URL called.
        url: String,
        /// The body error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The webhook did not answer within its timeoutSeconds.
    #[error("failed to call webhook: Post \"{url}\": context deadline exceeded ({seconds}s)")]
    TimeOut {
        /// The URL called.
        url: String,
        /// The webhook's timeoutSeconds.
        seconds: i32,
    },
    /// The webhook answered with an HTTP status outside 2xx.
    #[error("failed to call webhook: the server responded with the status code {code}: {body}")]
    WebhookStatus {
        /// The HTTP status code.
        code: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The answer is not an `AdmissionReview` document.
    #[error("received invalid webhook response: {source}")]
    DecodeReview {
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The answer is an `AdmissionReview` the API server does not accept.
    #[error("received invalid webhook response: {reason}")]
    VerifyReview {
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// The `Status` the API server answers with; its `code` is the HTTP status.
    pub fn status(&self) -> Status {
        match self {
            Error::Denied { status, .. } | Error::PolicyDenied { status, .. } => (**status).clone(),
            Error::DryRunUnsupported { .. } => failure(400, "BadRequest", self.to_string(), None),
            _ => {
                // As apierrors.NewInternalError: the cause repeats the bare message.
                let message = self.to_string();
                let details = StatusDetails {
                    causes: Some(vec![StatusCause {
                        message: Some(message.clone()),
                        ..StatusCause::default()
                    }]),
                    ..StatusDetails::default()
                };
                failure(
                    500,
                    "InternalError",
                    format!("Internal error occurred: {message}"),
                    Some(details),
                )
            }
        }
    }
}

/// A `Status` with `status: Failure`.
fn failure(code: i32, reason: &str, message: String, details: Option<StatusDetails>) -> Status {
    Status {
        code: Some(code),
        details,
        message: Some(message),
        reason: Some(reason.to_owned()),
        status: Some("Failure".to_owned()),
        ..Status::default()
    }
}

/// A request the chain did not admit, with the warnings webhooks gave before it ended.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejection {
    /// Why.
    #[source]
    pub error: Error,
    /// Warnings to send as `Warning` headers all the same.
    pub warnings: Vec<String>,
}

impl Rejection {
    /// The `Status` to answer with ([`Error::status`]).
    pub fn status(&self) -> Status {
        self.error.status()
    }
}

/// The denial a client sees, as `ToStatusErr` builds it.
pub(super) fn denial(webhook: &str, status: Option<Status>) -> Error {
    let mut status = status.unwrap_or_default();
    let denied_by = format!("admission webhook {webhook:?} denied the request");
    if status.code.is_none_or(|code| code < 400) {
        status.code = Some(400);
    }
    if status
        .status
        .as_deref()
        .is_none_or(|s| s.is_empty() || s == "Success")
    {
        status.status = Some("Failure".to_owned());
    }
    status.message = Some(
        match (status.message.as_deref(), status.reason.as_deref()) {
            (Some(message), _) if !message.is_empty() => format!("{denied_by}: {message}"),
            (_, Some(reason)) if !reason.is_empty() => format!("{denied_by}: {reason}"),
            _ => format!("{denied_by} without explanation"),
        },
    );
    Error::Denied {
        webhook: webhook.to_owned(),
        status: Box::new(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_raise_the_code_and_name_the_webhook() {
        let status = Status {
            code: Some(200),
            message: Some("replicas must be >= 0".to_owned()),
            reason: Some("Invalid".to_owned()),
            ..Status::default()
        };
        let status = denial("validate.example.com", Some(status)).status();
        assert_eq!(status.code, Some(400));
        assert_eq!(status.status.as_deref(), Some("Failure"));
        assert_eq!(status.reason.as_deref(), Some("Invalid"));
        assert_eq!(
            status.message.as_deref(),
            Some(
                "admission webhook \"validate.example.com\" denied the request: replicas must be >= 0"
            )
        );
        let bare = denial("v", None).status();
        assert_eq!(
            bare.message.as_deref(),
            Some("admission webhook \"v\" denied the request without explanation")
        );
    }
}
