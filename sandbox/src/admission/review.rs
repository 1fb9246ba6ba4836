//! The `AdmissionReview` a webhook gets, and the checks its answer must pass.

use base64::Engine as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde::Deserialize;
use serde_json::{Value, json};

use super::attributes::AdmissionAttributes;
use super::errors::Error;

/// A review answer that passed the API server's checks.
pub(super) struct Verdict {
    pub(super) allowed: bool,
    pub(super) status: Option<Status>,
    pub(super) patch: Option<Vec<u8>>,
    pub(super) warnings: Vec<String>,
}

#[derive(Deserialize)]
struct ReviewAnswer {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<ReviewResponse>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewResponse {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    #[serde(default)]
    status: Option<Value>,
    #[serde(default)]
    patch: Option<String>,
    #[serde(default)]
    patch_type: Option<String>,
    #[serde(default)]
    warnings: Option<Vec<String>>,
}

/// Checks an answer as `VerifyAdmissionResponse` does and decodes its patch.
pub(super) fn verify_answer(body: &[u8], uid: &str, mutating: bool) -> Result<Verdict, Error> {
    let answer: ReviewAnswer =
        serde_json::from_slice(body).map_err(|source| Error::DecodeReview { source })?;
    let verify = |reason: String| Error::VerifyReview { reason };
    let response = answer
        .response
        .ok_or_else(|| verify("webhook response was absent".to_owned()))?;
    if response.uid != uid {
        return Err(verify(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.uid
        )));
    }
    if answer.api_version != "admission.k8s.io/v1" || answer.kind != "AdmissionReview" {
        return Err(verify(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            answer.api_version, answer.kind
        )));
    }
    // The patch is base64 in JSON; bad base64 is a decoding failure of the whole answer.
    let patch = match response.patch.as_deref() {
        Some(text) => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| verify(format!("response.patch is not base64: {e}")))?,
        None => Vec::new(),
    };
    let patch = if mutating {
        match (patch.is_empty(), response.patch_type.as_deref()) {
            (true, None) => None,
            (false, None) => {
                return Err(verify(
                    "webhook returned response.patch but not response.patchType".to_owned(),
                ));
            }
            (true, Some(_)) => {
                return Err(verify(
                    "webhook returned response.patchType but not response.patch".to_owned(),
                ));
            }
            (false, Some("JSONPatch")) => Some(patch),
            (false, Some(other)) => {
                return Err(verify(format!(
                    "webhook returned invalid response.patchType of {other:?}"
                )));
            }
        }
    } else {
        if !patch.is_empty() {
            return Err(verify(
                "validating webhooks may not return patches".to_owned(),
            ));
        }
        if response.patch_type.is_some() {
            return Err(verify(
                "validating webhooks may not return patchType".to_owned(),
            ));
        }
        None
    };
    let status = match response.status {
        Some(mut status) => {
            // The embedded status's own apiVersion/kind are not checked by the real server.
            if let Some(map) = status.as_object_mut() {
                map.remove("apiVersion");
                map.remove("kind");
            }
            Some(
                serde_json::from_value::<Status>(status)
                    .map_err(|source| Error::DecodeReview { source })?,
            )
        }
        None => None,
    };
    Ok(Verdict {
        allowed: response.allowed,
        status,
        patch,
        warnings: response.warnings.unwrap_or_default(),
    })
}

/// The real server decodes the patched object into the request's type: it must stay an object
/// of the same apiVersion and kind.
pub(super) fn check_patched(before: &Value, after: &Value) -> Result<(), String> {
    if !after.is_object() {
        return Err("the patched object is not a JSON object".to_owned());
    }
    for field in ["apiVersion", "kind"] {
        let was = before.get(field);
        if was.is_some() && after.get(field) != was {
            return Err(format!("the patch changes {field}"));
        }
    }
    Ok(())
}

/// The `request` of an `AdmissionReview` for `object` (the current, possibly mutated, object).
pub(super) fn review_request(
    uid: &str,
    request: &AdmissionAttributes,
    object: Option<&Value>,
) -> Value {
    let mut review = json!({
        "uid": uid,
        "kind": request.kind,
        "resource": request.resource,
        "requestKind": request.kind,
        "requestResource": request.resource,
        "operation": request.operation.as_str(),
        "userInfo": request.user_info,
        "object": object,
        "oldObject": request.old_object,
        "dryRun": request.dry_run,
        "options": request.options,
    });
    if let Some(map) = review.as_object_mut() {
        if let Some(sub) = request.sub_resource.as_deref().filter(|s| !s.is_empty()) {
            map.insert("subResource".to_owned(), json!(sub));
            map.insert("requestSubResource".to_owned(), json!(sub));
        }
        if !request.name.is_empty() {
            map.insert("name".to_owned(), json!(request.name));
        }
        if let Some(namespace) = request.namespace.as_deref().filter(|s| !s.is_empty()) {
            map.insert("namespace".to_owned(), json!(namespace));
        }
    }
    review
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patched_objects_keep_their_kind() {
        let before = json!({"apiVersion": "v1", "kind": "Service"});
        assert!(
            check_patched(
                &before,
                &json!({"apiVersion": "v1", "kind": "Service", "x": 1})
            )
            .is_ok()
        );
        assert!(check_patched(&before, &json!({"apiVersion": "v1", "kind": "Pod"})).is_err());
        assert!(check_patched(&before, &json!([1])).is_err());
    }

    #[test]
    fn answers_are_verified_like_the_api_server() {
        let ok = |response: Value| {
            serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response
            }))
            .unwrap()
        };
        let reason = |body: Vec<u8>, mutating: bool| match verify_answer(&body, "u1", mutating) {
            Err(Error::VerifyReview { reason }) => reason,
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("answer accepted"),
        };
        assert!(verify_answer(&ok(json!({"uid": "u1", "allowed": true})), "u1", false).is_ok());
        assert!(reason(ok(json!({"uid": "u2", "allowed": true})), false).contains("response.uid"));
        let patch = base64::engine::general_purpose::STANDARD.encode("[]");
        assert!(
            reason(
                ok(json!({"uid": "u1", "allowed": true, "patch": patch})),
                true
            )
            .contains("not response.patchType")
        );
        assert!(
            reason(
                ok(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch"})),
                true
            )
            .contains("not response.patch")
        );
        assert!(
            reason(
                ok(json!({"uid": "u1", "allowed": true, "patch": patch, "patchType": "JSONPatch"})),
                false
            )
            .contains("may not return patches")
        );
        let wrong_kind = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": true}
        }))
        .unwrap();
        assert!(reason(wrong_kind, false).contains("expected webhook response"));
        assert!(
            reason(
                b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}".to_vec(),
                false
            )
            .contains("absent")
        );
    }
}
