//! Small helpers over values and paths, worded as the API server prints them.

use serde_json::Value;

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Values as the API server prints them in messages: strings quoted, numbers bare.
pub(super) fn render(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

pub(super) fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        x.to_string()
    }
}

/// The strings of the list `schema[key]` (`required`, `x-kubernetes-list-map-keys`): empty when
/// absent, non-strings skipped.
pub(crate) fn strings<'a>(schema: &'a Value, key: &str) -> Vec<&'a str> {
    schema
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// CEL's reserved words: never a property's or a variable's name as written (cel-go's
/// `parser.reservedIds`, which `apiservercel.Escape` and `isCELIdentifier` both consult).
pub(crate) const CEL_RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// `apiservercel.Escape`: the CEL name of a property, `None` if it has none.
pub(crate) fn escape(name: &str) -> Option<String> {
    if CEL_RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut out = String::new();
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    let first = out.chars().next()?;
    (first.is_ascii_alphabetic() || first == '_').then_some(out)
}
