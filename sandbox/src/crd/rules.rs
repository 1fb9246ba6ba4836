//! `x-kubernetes-validations` of a CRD schema: the rule fields' own checks, compiling each rule
//! (parse, field references, bool result) and its static cost against the per-expression and
//! per-CRD limits, with the cardinality multiplier (apiextensions-apiserver
//! `pkg/apis/apiextensions/validation/validation.go`, `cel_validation.go`,
//! `pkg/apiserver/schema/cel/compilation.go`).

use std::rc::Rc;

use cel::common::ast::IdedExpr;
use serde_json::Value;

use super::cost::{self, CheckError};
use super::errors::{forbidden, invalid, not_supported, quote, required};
use super::types::{self, Decl, MAX_REQUEST_SIZE_BYTES};
use crate::schema::FieldError;

/// `StaticEstimatedCostLimit`: the most one rule may cost (times its cardinality).
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;
/// `StaticEstimatedCRDCostLimit`: the most all rules of one schema may cost together.
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;

/// Where a schema node sits for CEL: its declaration and how many times it can occur in one
/// object (`CELSchemaContext.MaxCardinality`; `None` once an unbounded list or map is above).
#[derive(Clone, Debug)]
pub(super) struct CelScope {
    decl: Option<Rc<Decl>>,
    cardinality: Option<u64>,
    /// `extractMaxElements` of this node: how many children each occurrence has.
    own_max: Option<u64>,
}

impl CelScope {
    /// The scope of a version's root schema.
    pub(super) fn root(schema: &Value) -> Self {
        CelScope {
            decl: types::decl(schema, true),
            cardinality: Some(1),
            own_max: max_elements(schema),
        }
    }

    fn child(&self, schema: &Value, decl: Option<Rc<Decl>>) -> Option<Self> {
        let cardinality = match (self.cardinality, self.own_max) {
            (Some(c), Some(m)) => Some(c.saturating_mul(m)),
            _ => None,
        };
        let embedded = schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
        Some(CelScope {
            decl: decl.or_else(|| types::decl(schema, embedded)),
            cardinality,
            own_max: max_elements(schema),
        })
    }

    pub(super) fn property(&self, name: &str, schema: &Value) -> Option<Self> {
        let decl = match self.decl.as_ref().map(|d| &d.ty) {
            Some(types::Ty::Object(fields)) => {
                types::escape(name).and_then(|n| fields.get(&n).cloned())
            }
            _ => None,
        };
        self.child(schema, decl)
    }

    pub(super) fn items(&self, schema: &Value) -> Option<Self> {
        let decl = match self.decl.as_ref().map(|d| &d.ty) {
            Some(types::Ty::List(e)) => e.clone(),
            _ => None,
        };
        self.child(schema, decl)
    }

    pub(super) fn additional(&self, schema: &Value) -> Option<Self> {
        let decl = match self.decl.as_ref().map(|d| &d.ty) {
            Some(types::Ty::Map(e)) => e.clone(),
            _ => None,
        };
        self.child(schema, decl)
    }
}

/// `extractMaxElements`.
fn max_elements(schema: &Value) -> Option<u64> {
    let int = |key: &str| {
        schema
            .get(key)
            .and_then(Value::as_i64)
            .map(|n| n.max(0) as u64)
    };
    match schema.get("type").and_then(Value::as_str) {
        Some("object") if schema.get("additionalProperties").is_some() => int("maxProperties"),
        Some("array") => int("maxItems"),
        _ => Some(1),
    }
}

/// `maxCardinality`: how many values of the smallest serialized size fit in one request.
pub fn max_cardinality(min_size: u64) -> u64 {
    MAX_REQUEST_SIZE_BYTES / (min_size + 1)
}

/// The sum of a schema's rule costs and the most expensive ones (`TotalCost`).
#[derive(Default)]
pub(super) struct TotalCost {
    total: u64,
    most_expensive: Vec<(String, u64)>,
    /// Every rule's cost, for reporting.
    pub(super) all: Vec<(String, u64)>,
}

impl TotalCost {
    fn observe(&mut self, path: String, cost: u64) {
        self.total = self.total.saturating_add(cost);
        self.all.push((path.clone(), cost));
        if cost < STATIC_ESTIMATED_CRD_COST_LIMIT / 100 {
            return;
        }
        self.most_expensive.push((path, cost));
        self.most_expensive.sort_by_key(|e| std::cmp::Reverse(e.1));
        self.most_expensive.truncate(4);
    }

    /// The errors of a schema whose rules cost more than the per-CRD limit together.
    pub(super) fn errors(&self, schema_path: &str) -> Option<Vec<FieldError>> {
        if self.total <= STATIC_ESTIMATED_CRD_COST_LIMIT {
            return None;
        }
        let mut errors: Vec<FieldError> = self
            .most_expensive
            .iter()
            .map(|(path, _)| {
                forbidden(
                    path,
                    "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
                )
            })
            .collect();
        errors.push(forbidden(
            schema_path,
            &cost_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                self.total,
                STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
        Some(errors)
    }
}

/// `getCostErrorMessage`.
pub fn cost_message(name: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_owned()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{name} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

/// The checks of a rule's own fields, before any compiling.
pub(super) fn check_rule_fields(rule: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let text = |key: &str| rule.get(key).and_then(Value::as_str);
    let has_newline = |s: &str| s.contains(['\n', '\r']);
    let expr = text("rule").unwrap_or("").trim();
    let message = text("message");
    let trimmed_message = message.unwrap_or("").trim();
    if expr.is_empty() {
        errors.push(required(&format!("{path}.rule"), "rule is not specified"));
    } else if message.is_some_and(|m| !m.is_empty()) && trimmed_message.is_empty() {
        errors.push(invalid(
            &format!("{path}.message"),
            &quote(message.unwrap_or("")),
            "message must be non-empty if specified",
        ));
    } else if has_newline(trimmed_message) {
        errors.push(invalid(
            &format!("{path}.message"),
            &quote(message.unwrap_or("")),
            "message must not contain line breaks",
        ));
    } else if has_newline(expr) && trimmed_message.is_empty() {
        errors.push(required(
            &format!("{path}.message"),
            "message must be specified if rule contains line breaks",
        ));
    }
    if let Some(m) = text("messageExpression")
        && !m.is_empty()
        && m.trim().is_empty()
    {
        errors.push(required(
            &format!("{path}.messageExpression"),
            "messageExpression must be non-empty if specified",
        ));
    }
    const REASONS: &[&str] = &[
        "FieldValueDuplicate",
        "FieldValueForbidden",
        "FieldValueInvalid",
        "FieldValueRequired",
    ];
    if let Some(reason) = text("reason")
        && !REASONS.contains(&reason)
    {
        errors.push(not_supported(&format!("{path}.reason"), reason, REASONS));
    }
    if let Some(field_path) = text("fieldPath") {
        if !field_path.is_empty() && field_path.trim().is_empty() {
            errors.push(invalid(
                &format!("{path}.fieldPath"),
                &quote(field_path),
                "fieldPath must be non-empty if specified",
            ));
        }
        if has_newline(field_path) {
            errors.push(invalid(
                &format!("{path}.fieldPath"),
                &quote(field_path),
                "fieldPath must not contain line breaks",
            ));
        }
    }
}

/// Compiles the rules of one schema node and checks their costs.
/// `uncorrelatable` is the path of a list above whose elements old and new objects cannot be
/// matched through (where `oldSelf` has no meaning).
pub(super) fn compile_all(
    rules: &[Value],
    scope: &CelScope,
    path: &str,
    uncorrelatable: Option<&str>,
    total: &mut TotalCost,
    errors: &mut Vec<FieldError>,
) {
    let Some(decl) = &scope.decl else {
        return;
    };
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("{path}.x-kubernetes-validations[{i}]");
        let source = rule.get("rule").and_then(Value::as_str).unwrap_or("");
        match compile(source, decl) {
            Ok(estimate) => {
                let cardinality = scope
                    .cardinality
                    .unwrap_or_else(|| max_cardinality(decl.min_size));
                let cost = if estimate.cost.max == 0 {
                    0
                } else {
                    estimate.cost.max.saturating_mul(cardinality)
                };
                if cost > STATIC_ESTIMATED_COST_LIMIT {
                    errors.push(forbidden(
                        &format!("{at}.rule"),
                        &cost_message("estimated rule cost", cost, STATIC_ESTIMATED_COST_LIMIT),
                    ));
                }
                total.observe(format!("{at}.rule"), cost);
                if matches!(estimate.result, Some(ref t) if *t != types::Ty::Bool) {
                    errors.push(invalid(
                        &format!("{at}.rule"),
                        &go_rule(rule),
                        "cel expression must evaluate to a bool",
                    ));
                }
                let uses_old_self = uses(source, "oldSelf");
                if uses_old_self && let Some(list) = uncorrelatable {
                    errors.push(invalid(
                        &format!("{at}.rule"),
                        &quote(source),
                        &format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {list}"),
                    ));
                } else if !uses_old_self
                    && let Some(optional) = rule.get("optionalOldSelf").and_then(Value::as_bool)
                {
                    errors.push(invalid(
                        &format!("{at}.optionalOldSelf"),
                        &optional.to_string(),
                        "may not be set if oldSelf is not used in rule",
                    ));
                }
            }
            Err(detail) => errors.push(invalid(
                &format!("{at}.rule"),
                &go_rule(rule),
                &format!("compilation failed: {detail}"),
            )),
        }
        if let Some(expr) = rule
            .get("messageExpression")
            .and_then(Value::as_str)
            .filter(|m| !m.trim().is_empty())
        {
            match compile(expr, decl) {
                Ok(estimate) => {
                    if estimate.cost.max > STATIC_ESTIMATED_COST_LIMIT {
                        errors.push(forbidden(
                            &format!("{at}.messageExpression"),
                            &cost_message(
                                "estimated messageExpression cost",
                                estimate.cost.max,
                                STATIC_ESTIMATED_COST_LIMIT,
                            ),
                        ));
                    }
                    total.observe(format!("{at}.messageExpression"), estimate.cost.max);
                    if matches!(estimate.result, Some(ref t) if *t != types::Ty::String) {
                        errors.push(invalid(
                            &format!("{at}.messageExpression"),
                            &go_rule(rule),
                            "messageExpression must evaluate to a string",
                        ));
                    }
                }
                Err(detail) => errors.push(invalid(
                    &format!("{at}.messageExpression"),
                    &go_rule(rule),
                    &format!("messageExpression compilation failed: {detail}"),
                )),
            }
        }
    }
}

/// Whether the (parsable) expression reads the variable `name`.
fn uses(source: &str, name: &str) -> bool {
    fn walk(e: &IdedExpr, name: &str) -> bool {
        use cel::common::ast::{EntryExpr, Expr};
        match &e.expr {
            Expr::Ident(n) => n == name,
            Expr::Select(s) => walk(&s.operand, name),
            Expr::Call(c) => {
                c.target.as_deref().is_some_and(|t| walk(t, name))
                    || c.args.iter().any(|a| walk(a, name))
            }
            Expr::List(l) => l.elements.iter().any(|a| walk(a, name)),
            Expr::Map(m) => m.entries.iter().any(|en| match &en.expr {
                EntryExpr::MapEntry(m) => walk(&m.key, name) || walk(&m.value, name),
                EntryExpr::StructField(f) => walk(&f.value, name),
            }),
            Expr::Struct(s) => s.entries.iter().any(|en| match &en.expr {
                EntryExpr::MapEntry(m) => walk(&m.key, name) || walk(&m.value, name),
                EntryExpr::StructField(f) => walk(&f.value, name),
            }),
            Expr::Comprehension(c) => [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]
            .iter()
            .any(|x| walk(x, name)),
            Expr::Literal(_) | Expr::Unspecified => false,
        }
    }
    cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .parse(source)
        .is_ok_and(|e| walk(&e, name))
}

/// Parses and checks `source` with `self` declared as `decl`; the error is cel-go's issue text.
pub fn compile(source: &str, decl: &Rc<Decl>) -> Result<cost::Estimate, String> {
    let expr = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .parse(source)
        .map_err(|e| e.to_string().replace("\n|", "\n |"))?;
    cost::estimate(&expr, &[("self", decl.clone()), ("oldSelf", decl.clone())])
        .map_err(|e| issue(source, &e))
}

/// A checker error worded as cel-go prints it, located at the select's `.` or the call's
/// position when one is known (the first place its text appears).
fn issue(source: &str, e: &CheckError) -> String {
    let offset = match (&e.field, &e.at) {
        (Some(f), _) => source.find(&format!(".{f}")),
        (None, Some((text, into))) => source.find(text.as_str()).map(|at| at + into),
        (None, None) => None,
    }
    .unwrap_or(0);
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    let text = source.lines().nth(line - 1).unwrap_or("");
    format!(
        "ERROR: <input>:{line}:{column}: {}\n | {text}\n | {}^",
        e.message,
        ".".repeat(column - 1)
    )
}

/// A rule as Go's `%#v` prints the internal `ValidationRule` in `Invalid value:`. Pointers that
/// are set print as an address there; a fixed one stands in for it.
fn go_rule(rule: &Value) -> String {
    let text = |key: &str| quote(rule.get(key).and_then(Value::as_str).unwrap_or(""));
    let pointer = |key: &str, ty: &str| {
        if rule.get(key).is_some_and(|v| !v.is_null()) {
            format!("(*{ty})(0xc000000000)")
        } else {
            format!("(*{ty})(nil)")
        }
    };
    format!(
        "apiextensions.ValidationRule{{Rule:{}, Message:{}, MessageExpression:{}, Reason:{}, FieldPath:{}, OptionalOldSelf:{}}}",
        text("rule"),
        text("message"),
        text("messageExpression"),
        pointer("reason", "apiextensions.FieldValueErrorReason"),
        text("fieldPath"),
        pointer("optionalOldSelf", "bool"),
    )
}
