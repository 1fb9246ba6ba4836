//! `allOf`, `anyOf`, `oneOf` and `not` as kube-openapi evaluates them
//! (`schemaPropsValidator.Validate` in `pkg/validation/validate/schema_props.go`).
//!
//! Every alternative is validated at the node's own path. When no `anyOf` alternative (or not
//! exactly one `oneOf` alternative) holds, the junctor's message comes first, followed by the
//! errors of the failing alternative that counted the most applicable checks (the first of
//! equals; `Result.MatchCount`), so a Gateway address of type `IPAddress` with an invalid value
//! reports the `IPAddress` branch's errors rather than the other branch's `not`. `allOf` keeps
//! every branch's errors and puts its own message after them; `not` adds only its message.

use serde_json::Value;

use super::result::{Outcome, Problem, quote};

/// The junctors' errors for `data` at `name`, counted as kube-openapi counts them;
/// `validate` checks `data` against one alternative at the same path.
pub(super) fn check(
    validate: &dyn Fn(&Value, &Value) -> Outcome,
    schema: &Value,
    data: &Value,
    name: &str,
) -> Outcome {
    let mut out = Outcome::default();
    let branches = |key: &str| {
        schema
            .get(key)
            .and_then(Value::as_array)
            .filter(|b| !b.is_empty())
    };
    if let Some(any_of) = branches("anyOf") {
        let mut best: Option<Outcome> = None;
        let mut success = None;
        for branch in any_of {
            let result = validate(branch, data);
            if result.is_valid() {
                success = Some(result);
                best = None;
                break;
            }
            if best.as_ref().is_none_or(|b| result.matches > b.matches) {
                best = Some(result);
            }
        }
        if success.is_none() {
            out.add(Problem::composite(format!(
                "{} must validate at least one schema (anyOf)",
                quote(name)
            )));
        }
        if let Some(chosen) = best.or(success) {
            out.merge(chosen);
        }
    }
    if let Some(one_of) = branches("oneOf") {
        let mut best: Option<Outcome> = None;
        let mut first_success = None;
        let mut valid = 0;
        for branch in one_of {
            let result = validate(branch, data);
            if result.is_valid() {
                valid += 1;
                best = None;
                first_success.get_or_insert(result);
                continue;
            }
            if valid == 0 && best.as_ref().is_none_or(|b| result.matches > b.matches) {
                best = Some(result);
            }
        }
        if valid == 1 {
            out.merge(first_success.unwrap_or_default());
        } else {
            let found = if valid == 0 {
                "Found none valid".to_owned()
            } else {
                format!("Found {valid} valid alternatives")
            };
            out.add(Problem::composite(format!(
                "{} must validate one and only one schema (oneOf). {found}",
                quote(name)
            )));
            if let Some(best) = best {
                out.merge(best);
            }
        }
    }
    if let Some(all_of) = branches("allOf") {
        let mut valid = 0;
        for branch in all_of {
            let result = validate(branch, data);
            valid += usize::from(result.is_valid());
            out.merge(result);
        }
        if valid != all_of.len() {
            let none = if valid == 0 { ". None validated" } else { "" };
            out.add(Problem::composite(format!(
                "{} must validate all the schemas (allOf){none}",
                quote(name)
            )));
        }
    }
    if let Some(not) = schema.get("not").filter(|n| n.is_object())
        && validate(not, data).is_valid()
    {
        out.add(Problem::composite(format!(
            "{} must not validate the schema (not)",
            quote(name)
        )));
    }
    out.matches += 1;
    out
}
