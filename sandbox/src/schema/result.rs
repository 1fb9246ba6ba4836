//! kube-openapi's validation `Result` (`pkg/validation/validate/result.go`) and the field
//! errors apiextensions makes of it (`kubeOpenAPIResultToFieldErrors` in
//! `pkg/apiserver/validation/validation.go`).

use serde_json::Value;

use super::errors::FieldError;

/// One error of kube-openapi's result, with what apiextensions needs to turn it into a field
/// error: which kind of field error, the `Name` (the path in the message), the value shown.
#[derive(Debug)]
pub(super) struct Problem {
    pub(super) kind: Kind,
    pub(super) name: String,
    pub(super) value: String,
    /// The kube-openapi message, also the text errors are deduplicated by (`Result.AddErrors`).
    pub(super) text: String,
}

#[derive(Debug)]
pub(super) enum Kind {
    Required,
    NotSupported(Vec<String>),
    TooLong(u64),
    TooMany(u64, u64),
    TypeInvalid,
    Invalid,
    /// An error that is not a `*errors.Validation` (the junctors' messages): reported at the
    /// validated value's own path with the value `""`.
    Composite,
}

impl Problem {
    pub(super) fn new(kind: Kind, name: &str, value: String, text: String) -> Self {
        Problem {
            kind,
            name: name.to_owned(),
            value,
            text,
        }
    }

    /// A junctor's message, which names its node with Go's `%q`.
    pub(super) fn composite(text: String) -> Self {
        Problem::new(Kind::Composite, "", String::new(), text)
    }

    /// The field error `kubeOpenAPIResultToFieldErrors` makes of it, under `prefix` (`status`
    /// for a status write, none for the whole object).
    pub(super) fn into_field_error(self, prefix: Option<&str>) -> FieldError {
        let name = self.name.trim_start_matches('.');
        let field = match (
            prefix,
            name.is_empty() || matches!(self.kind, Kind::Composite),
        ) {
            // A nil `*field.Path` prints as `<nil>`, in the message and the cause alike.
            (prefix, true) => prefix.unwrap_or("<nil>").to_owned(),
            (None, false) => name.to_owned(),
            (Some(prefix), false) => format!("{prefix}.{name}"),
        };
        let (reason, message) = match self.kind {
            Kind::Required => ("FieldValueRequired", "Required value".to_owned()),
            Kind::NotSupported(values) => {
                let quoted: Vec<String> = values.iter().map(|v| quote(v)).collect();
                let message = format!(
                    "Unsupported value: {}: supported values: {}",
                    self.value,
                    quoted.join(", ")
                );
                ("FieldValueNotSupported", message)
            }
            Kind::TooLong(max) => (
                "FieldValueTooLong",
                format!(
                    "Too long: may not be more than {max} {}",
                    if max == 1 { "byte" } else { "bytes" }
                ),
            ),
            Kind::TooMany(actual, max) => (
                "FieldValueTooMany",
                format!(
                    "Too many: {actual}: must have at most {max} {}",
                    if max == 1 { "item" } else { "items" }
                ),
            ),
            Kind::TypeInvalid => (
                "FieldValueTypeInvalid",
                format!("Invalid value: {}: {}", self.value, self.text),
            ),
            Kind::Invalid => (
                "FieldValueInvalid",
                format!("Invalid value: {}: {}", self.value, self.text),
            ),
            Kind::Composite => (
                "FieldValueInvalid",
                format!("Invalid value: \"\": {}", self.text),
            ),
        };
        FieldError::new(field, reason, message)
    }
}

/// Go's `%q` of a string (JSON quoting is the same for what paths and values hold).
pub(super) fn quote(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A value as a field error shows it: strings quoted, numbers and booleans bare.
pub(super) fn shown(v: &Value) -> String {
    match v {
        Value::Null => "\"null\"".into(),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

/// A kube-openapi `Result`: errors without repeats, and the count of checks that applied.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) problems: Vec<Problem>,
    pub(super) matches: usize,
}

impl Outcome {
    pub(super) fn counted(matches: usize) -> Self {
        Outcome {
            problems: Vec::new(),
            matches,
        }
    }

    pub(super) fn add(&mut self, problem: Problem) {
        if !self.problems.iter().any(|p| p.text == problem.text) {
            self.problems.push(problem);
        }
    }

    pub(super) fn merge(&mut self, other: Outcome) {
        for problem in other.problems {
            self.add(problem);
        }
        self.matches += other.matches;
    }

    pub(super) fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    pub(super) fn failed(problem: Problem) -> Self {
        let mut outcome = Outcome::default();
        outcome.add(problem);
        outcome
    }
}
