//! kube-openapi's `SchemaValidator` (`pkg/validation/validate/schema.go`) as the API server
//! runs it over a custom resource; its result and the field errors made of it are
//! `result.rs`.
//!
//! Ported with the parts a reader of the errors sees: the validators of a node run in
//! kube-openapi's order (type, junctors, string, format, number, array, enum, object) and all
//! of them run, so a wrong type does not hide an enum error; a string reports only its first
//! failure (maxLength, minLength, pattern); errors with the same text are kept once; and every
//! node counts the checks that applied (`Result.MatchCount`), which is how `anyOf` and `oneOf`
//! choose the alternative whose errors they report (`junctors.rs`). Names in messages are
//! relative to the validated value (`spec.x` for an object, `conditions[0]` for a status).

use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::result::{Kind, Outcome, Problem, quote, shown};
use super::{formats, junctors, value::num};

/// The validator of one schema: its patterns compiled once, keyed by their text.
pub(super) struct Validator<'a> {
    pub(super) patterns: &'a HashMap<String, Regex>,
}

impl Validator<'_> {
    /// `SchemaValidator.Validate` of `data` against `schema`, `name` being its path.
    pub(super) fn validate(&self, schema: &Value, data: &Value, name: &str) -> Outcome {
        let format = schema
            .get("format")
            .and_then(Value::as_str)
            .and_then(|f| formats::supported(f).map(|normalized| (f, normalized)));
        let types = types(schema);
        let mut out = Outcome::default();
        if data.is_null() {
            out.merge(check_type(
                &types,
                schema,
                format.as_ref().map(|f| f.0),
                data,
                name,
            ));
            out.merge(check_enum(schema, data, name));
            return out;
        }
        let run = |out: &mut Outcome, result: Outcome| {
            out.merge(result);
            out.matches += 1;
        };
        if !types.is_empty() || format.is_some() {
            run(
                &mut out,
                check_type(&types, schema, format.as_ref().map(|f| f.0), data, name),
            );
        }
        let branch = |branch: &Value, data: &Value| self.validate(branch, data, name);
        run(&mut out, junctors::check(&branch, schema, data, name));
        if let Value::String(s) = data {
            run(&mut out, self.check_string(schema, s, name));
            if let Some((written, normalized)) = &format {
                let mut result = Outcome::default();
                if !formats::validates(normalized, s) {
                    result.add(Problem::new(
                        Kind::TypeInvalid,
                        name,
                        quote(s),
                        format!("{name} in body must be of type {written}: {}", quote(s)),
                    ));
                }
                run(&mut out, result);
            }
        }
        if let Value::Number(n) = data {
            run(
                &mut out,
                check_number(schema, n.as_f64().unwrap_or(f64::NAN), data, name),
            );
        }
        if let Value::Array(items) = data {
            run(&mut out, self.check_array(schema, items, name));
        }
        run(&mut out, check_enum(schema, data, name));
        if let Value::Object(map) = data {
            run(&mut out, self.check_object(schema, map, name));
        }
        out.matches += 1;
        out
    }

    fn check_string(&self, schema: &Value, s: &str, name: &str) -> Outcome {
        let len = s.chars().count() as u64;
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            let text = format!("{name} in body should be at most {max} chars long");
            return Outcome::failed(Problem::new(Kind::TooLong(max), name, quote(s), text));
        }
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            let text = format!("{name} in body should be at least {min} chars long");
            return Outcome::failed(Problem::new(Kind::Invalid, name, quote(s), text));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
            && let Some(re) = self.patterns.get(pattern)
            && !re.is_match(s)
        {
            let text = format!("{name} in body should match '{pattern}'");
            return Outcome::failed(Problem::new(Kind::Invalid, name, quote(s), text));
        }
        Outcome::default()
    }

    fn check_array(&self, schema: &Value, items: &[Value], name: &str) -> Outcome {
        let mut out = Outcome::counted(1);
        if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
            for (i, item) in items.iter().enumerate() {
                out.merge(self.validate(item_schema, item, &format!("{name}[{i}]")));
            }
        }
        let n = items.len() as u64;
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
            && n < min
        {
            let text = format!("{name} in body should have at least {min} items");
            out.add(Problem::new(Kind::Invalid, name, n.to_string(), text));
        }
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
            && n > max
        {
            let text = format!("{name} in body should have at most {max} items");
            out.add(Problem::new(
                Kind::TooMany(n, max),
                name,
                n.to_string(),
                text,
            ));
        }
        out
    }

    fn check_object(&self, schema: &Value, map: &Map<String, Value>, name: &str) -> Outcome {
        let mut out = Outcome::default();
        let n = map.len() as u64;
        if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
            && n < min
        {
            let text = format!("{name} in body should have at least {min} properties");
            out.add(Problem::new(Kind::Invalid, name, n.to_string(), text));
        }
        if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
            && n > max
        {
            let text = format!("{name} in body should have at most {max} properties");
            out.add(Problem::new(
                Kind::TooMany(n, max),
                name,
                n.to_string(),
                text,
            ));
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        let declared = |key: &str| properties.is_some_and(|p| p.contains_key(key));
        // Fields the root's `metadata` holds are the API server's, not the schema's.
        let skipped = |key: &str| name.is_empty() && key == "metadata";
        if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            for (key, value) in map.iter().filter(|(k, _)| !declared(k) && !skipped(k)) {
                out.merge(self.validate(additional, value, &format!("{name}.{key}")));
            }
        }
        for (key, value) in map.iter().filter(|(k, _)| !skipped(k)) {
            if let Some(child) = properties.and_then(|p| p.get(key)) {
                let child_name = if name.is_empty() {
                    key.clone()
                } else {
                    format!("{name}.{key}")
                };
                out.merge(self.validate(child, value, &child_name));
            }
        }
        for key in super::value::strings(schema, "required") {
            if !map.contains_key(key) {
                let required = format!("{name}.{key}");
                let text = format!("{required} in body is required");
                out.add(Problem::new(Kind::Required, &required, String::new(), text));
            }
        }
        out
    }
}

/// The schema's types as kube-openapi sees them: `x-kubernetes-int-or-string` is
/// `integer,string` (`ConvertJSONSchemaPropsWithPostProcess`).
fn types(schema: &Value) -> Vec<&str> {
    if schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return vec!["integer", "string"];
    }
    schema
        .get("type")
        .and_then(Value::as_str)
        .into_iter()
        .collect()
}

/// `typeValidator.Validate`, with the JSON type and Go format of the decoded value
/// (`schemaInfoForType`). A format is only the schema's when the API server supports it.
fn check_type(
    types: &[&str],
    schema: &Value,
    format: Option<&str>,
    data: &Value,
    name: &str,
) -> Outcome {
    let invalid = |expected: String, got: &str| {
        let text = format!("{name} in body must be of type {expected}: {}", quote(got));
        Outcome::failed(Problem::new(Kind::TypeInvalid, name, quote(got), text))
    };
    let has = |t: &str| types.contains(&t);
    if data.is_null() {
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
        if !types.is_empty() && !has("null") && !nullable {
            return invalid(types.join(","), "null");
        }
        return Outcome::counted(1);
    }
    let (json_type, go_format) = match data {
        Value::Bool(_) => ("boolean", ""),
        Value::String(_) => ("string", ""),
        Value::Number(n) if n.is_f64() => ("number", "float64"),
        Value::Number(_) => ("integer", "int64"),
        Value::Array(_) => ("array", ""),
        _ => ("object", ""),
    };
    let float_int = json_type == "number"
        && data
            .as_f64()
            .is_some_and(|f| f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0)
        && has("integer");
    let int_float = json_type == "integer" && has("number");
    let textual = data.is_string() || data.is_array();
    if let Some(format) = format {
        if !(textual || has(json_type) || go_format == format || float_int || int_float) {
            return invalid(format.to_owned(), go_format);
        }
        // kube-openapi leaves a string or an array for a formatted non-numeric type to the
        // format validator, which only reads strings.
        if !(has("number") || has("integer")) && textual {
            return Outcome::counted(1);
        }
    }
    if !(has(json_type) || float_int || int_float) {
        return invalid(types.join(","), json_type);
    }
    Outcome::counted(1)
}

/// `numberValidator`: the bounds, counted as one check whether or not they fail.
fn check_number(schema: &Value, x: f64, data: &Value, name: &str) -> Outcome {
    let mut out = Outcome::counted(1);
    let exclusive = |k: &str| schema.get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut fail = |text: String| out.add(Problem::new(Kind::Invalid, name, shown(data), text));
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        if exclusive("exclusiveMinimum") && x <= min {
            fail(format!(
                "{name} in body should be greater than {}",
                num(min)
            ));
        } else if x < min {
            fail(format!(
                "{name} in body should be greater than or equal to {}",
                num(min)
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        if exclusive("exclusiveMaximum") && x >= max {
            fail(format!("{name} in body should be less than {}", num(max)));
        } else if x > max {
            fail(format!(
                "{name} in body should be less than or equal to {}",
                num(max)
            ));
        }
    }
    out
}

/// `basicCommonValidator`: a value outside a non-empty `enum` (numbers compared by value; a
/// null matches nothing, as Go's reflection finds no type to convert it to).
fn check_enum(schema: &Value, data: &Value, name: &str) -> Outcome {
    let Some(allowed) = schema
        .get("enum")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
    else {
        return Outcome::default();
    };
    let same = |a: &Value| match (a, data) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Null, _) => false,
        (a, b) => a == b,
    };
    if !data.is_null() && allowed.iter().any(same) {
        return Outcome::default();
    }
    let values: Vec<String> = allowed
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    let text = format!("{name} in body should be one of [{}]", values.join(" "));
    Outcome::failed(Problem::new(
        Kind::NotSupported(values),
        name,
        shown(data),
        text,
    ))
}

#[cfg(test)]
mod tests;
