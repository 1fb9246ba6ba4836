//! The errors of the schema path: a schema that cannot be prepared, and one violation of it.

/// Why a schema could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The CRD does not serve the requested version.
    #[error("the CRD does not have version {0:?}")]
    MissingVersion(String),
    /// The version has no `openAPIV3Schema` (the API server requires one).
    #[error("version {0:?} has no openAPIV3Schema")]
    MissingSchema(String),
    /// The schema does not serialize to JSON.
    #[error("failed to read the openAPIV3Schema: {0}")]
    ReadSchema(#[source] serde_json::Error),
    /// A `pattern` is not a regular expression.
    #[error("invalid pattern {pattern:?} at {path}: {source}")]
    CompilePattern {
        path: String,
        pattern: String,
        #[source]
        source: regex::Error,
    },
    /// A CEL rule does not compile.
    #[error("invalid CEL rule at {path}: {message}")]
    CompileRule { path: String, message: String },
}

/// One violation, shaped like the API server's `StatusCause`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, e.g. `spec.env[1].name` (empty for the object itself).
    pub field: String,
    /// Machine-readable reason: `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: String,
    /// What is wrong, e.g. `Invalid value: -1: spec.replicas in body should be greater than or equal to 0`.
    pub message: String,
}

impl FieldError {
    /// A field error from its parts.
    pub fn new(
        field: impl Into<String>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "<nil>: {}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}
