//! What a rule sees and returns: the operation, the request's context, and the verdict with its
//! violations in the form of Kubernetes' field errors.

use std::fmt;

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
    /// A value that breaks a rule; `value` is shown as given (show strings with [`quoted`](super::quoted),
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
