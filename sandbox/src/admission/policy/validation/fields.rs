//! Field paths and field errors worded as apimachinery's `field.Error` prints them
//! (`ErrorBody`: `Required value`, `Invalid value: <value>`, `Unsupported value: ...`), and the
//! name checks of `apimachinery/pkg/util/validation`.

use std::fmt;

use crate::schema::FieldError;

/// A field path (`spec.validations[0].expression`).
#[derive(Clone, Debug)]
pub(super) struct Path(String);

impl Path {
    pub(super) fn new(root: &str) -> Self {
        Path(root.to_owned())
    }

    pub(super) fn child(&self, name: &str) -> Self {
        Path(format!("{}.{name}", self.0))
    }

    pub(super) fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn with_detail(body: String, detail: &str) -> String {
    if detail.is_empty() {
        body
    } else {
        format!("{body}: {detail}")
    }
}

pub(super) fn required(path: &Path, detail: &str) -> FieldError {
    FieldError::new(
        path.to_string(),
        "FieldValueRequired",
        with_detail("Required value".to_owned(), detail),
    )
}

/// `value` as Go prints it (see [`quote`], [`go_strings`]).
pub(super) fn invalid(path: &Path, value: &str, detail: &str) -> FieldError {
    FieldError::new(
        path.to_string(),
        "FieldValueInvalid",
        with_detail(format!("Invalid value: {value}"), detail),
    )
}

pub(super) fn not_supported(path: &Path, value: &str, supported: &[&str]) -> FieldError {
    let listed: Vec<String> = supported.iter().map(|s| quote(s)).collect();
    FieldError::new(
        path.to_string(),
        "FieldValueNotSupported",
        format!(
            "Unsupported value: {}: supported values: {}",
            quote(value),
            listed.join(", ")
        ),
    )
}

pub(super) fn duplicate(path: &Path, value: &str) -> FieldError {
    FieldError::new(
        path.to_string(),
        "FieldValueDuplicate",
        format!("Duplicate value: {value}"),
    )
}

pub(super) fn forbidden(path: &Path, detail: &str) -> FieldError {
    FieldError::new(
        path.to_string(),
        "FieldValueForbidden",
        with_detail("Forbidden".to_owned(), detail),
    )
}

/// A string as Go's `%q` prints it (the same as Rust's `{:?}` for printable text).
pub(super) fn quote(s: &str) -> String {
    format!("{s:?}")
}

/// A slice of a string type as Go's `%#v` prints it: `[]string{"a", "b"}`.
pub(super) fn go_strings(ty: &str, items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[]{ty}{{{}}}", items.join(", "))
}

/// `validateResources`: the wildcard rules of a rule's `resources`.
pub(super) fn resources(resources: &[String], path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if resources.is_empty() {
        errors.push(required(path, ""));
    }
    let mut with_wildcard_sub: Vec<&str> = Vec::new();
    let mut sub_with_wildcard_res: Vec<&str> = Vec::new();
    let (mut double, mut single, mut without_sub) = (false, false, false);
    for (i, item) in resources.iter().enumerate() {
        if item.is_empty() {
            errors.push(required(&path.index(i), ""));
            continue;
        }
        double |= item == "*/*";
        single |= item == "*";
        let Some((res, sub)) = item.split_once('/') else {
            without_sub = item != "*";
            continue;
        };
        if with_wildcard_sub.contains(&res) {
            errors.push(invalid(
                &path.index(i),
                &quote(item),
                &format!("if '{res}/*' is present, must not specify {item}"),
            ));
        }
        if sub_with_wildcard_res.contains(&sub) {
            errors.push(invalid(
                &path.index(i),
                &quote(item),
                &format!("if '*/{sub}' is present, must not specify {item}"),
            ));
        }
        if sub == "*" {
            with_wildcard_sub.push(res);
        }
        if res == "*" {
            sub_with_wildcard_res.push(sub);
        }
    }
    if resources.len() > 1 && double {
        errors.push(invalid(
            path,
            &go_strings("string", resources),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if single && without_sub {
        errors.push(invalid(
            path,
            &go_strings("string", resources),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
    errors
}

const QUALIFIED_NAME_MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// `IsQualifiedName`'s messages (an optional DNS-subdomain prefix, a name part of at most 63).
pub(super) fn qualified_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else if let Some(message) = dns_subdomain(prefix) {
                errors.push(format!("prefix part {message}"));
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_MESSAGE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 characters".to_owned());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let valid = name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'));
    if !valid {
        errors.push(format!("name part {QUALIFIED_NAME_MESSAGE}"));
    }
    errors
}

/// `IsDNS1123Subdomain`'s message, if `value` is not one.
pub(super) fn dns_subdomain(value: &str) -> Option<String> {
    if value.len() > 253 {
        return Some("must be no more than 253 characters".to_owned());
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let label = |l: &str| {
        !l.is_empty()
            && l.starts_with(alnum)
            && l.ends_with(alnum)
            && l.chars().all(|c| alnum(c) || c == '-')
    };
    if value.split('.').all(label) {
        return None;
    }
    Some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_owned())
}
