//! Field errors worded as k8s.io/apimachinery's `field.Error.ErrorBody` words them
//! (`pkg/util/validation/field/errors.go`): `Invalid value: <value>: <detail>`, `Required value`,
//! `Forbidden`, `Unsupported value`.

use crate::schema::FieldError;

/// Go's `%q` of a string, as field errors print a bad string value.
pub(crate) fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

pub(crate) fn invalid(path: &str, value: &str, detail: &str) -> FieldError {
    FieldError::new(
        path,
        "FieldValueInvalid",
        format!("Invalid value: {value}: {detail}"),
    )
}

pub(crate) fn required(path: &str, detail: &str) -> FieldError {
    let message = if detail.is_empty() {
        "Required value".to_owned()
    } else {
        format!("Required value: {detail}")
    };
    FieldError::new(path, "FieldValueRequired", message)
}

pub(crate) fn forbidden(path: &str, detail: &str) -> FieldError {
    FieldError::new(path, "FieldValueForbidden", format!("Forbidden: {detail}"))
}

pub(crate) fn not_supported(path: &str, value: &str, supported: &[&str]) -> FieldError {
    let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
    FieldError::new(
        path,
        "FieldValueNotSupported",
        format!(
            "Unsupported value: {}: supported values: {}",
            quote(value),
            list.join(", ")
        ),
    )
}
