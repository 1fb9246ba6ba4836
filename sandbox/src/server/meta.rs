//! Object metadata checks every kind shares (apimachinery `pkg/api/validation/objectmeta.go`).

use serde_json::Value;

use crate::schema::FieldError;

/// `TotalAnnotationSizeLimitB`: the keys and values of an object's annotations together.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// What `ValidateObjectMetaAccessor` (and its update form) finds wrong in `obj`'s metadata, of
/// the checks modelled: the total size of the annotations, counted in bytes as Go's `len` does.
/// This is what refuses a client-side `kubectl apply` of a big object, whose
/// `kubectl.kubernetes.io/last-applied-configuration` holds the whole object again.
pub(super) fn object_meta_errors(obj: &Value) -> Vec<FieldError> {
    let size: usize = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(key, value)| key.len() + value.as_str().map_or(0, str::len))
        .sum();
    if size <= TOTAL_ANNOTATION_SIZE_LIMIT {
        return Vec::new();
    }
    vec![FieldError::new(
        "metadata.annotations",
        "FieldValueTooLong",
        format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with_annotation(bytes: usize) -> Value {
        json!({"metadata": {"annotations": {"k": "v".repeat(bytes - 1)}}})
    }

    #[test]
    fn annotations_up_to_the_limit_pass_and_one_byte_more_fails() {
        assert!(object_meta_errors(&with_annotation(TOTAL_ANNOTATION_SIZE_LIMIT)).is_empty());
        let errors = object_meta_errors(&with_annotation(TOTAL_ANNOTATION_SIZE_LIMIT + 1));
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
    }
}
