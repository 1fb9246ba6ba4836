//! `x-kubernetes-validations` evaluated on a write as kube-apiserver 1.33 does it
//! (apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go`, `validateExpressions`):
//! over kube-cel's compiled programs, in a context of the Kubernetes CEL libraries whose
//! `matches` uses the schema's compiled constant patterns (`matches.rs`).
//!
//! Walked here rather than by kube-cel's `Validator` because the API server's wording and
//! semantics differ from it where a rule author sees them: a rule that fails to evaluate is
//! `Invalid value: "<type>": <cel-go error> evaluating rule: <message or rule>` (an absent field
//! is `no such key: <field>`); the value of every rule error is the schema node's `type`; a
//! list item's `oldSelf` is the old item with the same keys of a `map` list and absent in other
//! lists; `oldSelf` of an `optionalOldSelf` rule is an optional; only `allOf` branches hold
//! rules that run.
//!
//! Not modelled: the runtime cost budgets (per call and per object), and ratcheting below the
//! top-level fields (see `CrdSchema::validate`).

mod matches;
mod reads;
mod value;

use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr};
use cel::objects::OptionalValue;
use cel::{Context, ExecutionError, Value as Cel};
use kube::core::cel::{CompilationResult, CompiledSchema, KubeCelExt as _};
use serde_json::Value;

use super::errors::FieldError;
use super::value::join;
pub(crate) use matches::Patterns;

/// `MaxEvaluatedMessageExpressionSizeBytes` (k8s.io/apiserver `pkg/apis/cel/config.go`).
const MAX_MESSAGE_EXPRESSION_BYTES: usize = 5 * 1024;

/// The evaluation context of one schema's rules.
pub(crate) struct Rules {
    context: Context<'static>,
    patterns: Arc<Patterns>,
}

impl Rules {
    /// The context for the rules of `compiled`, their constant patterns compiled.
    pub(crate) fn new(compiled: &CompiledSchema) -> Self {
        let mut programs = Vec::new();
        programs_of(compiled, &mut programs);
        let patterns = Arc::new(Patterns::collect(programs.iter().map(|p| p.expression())));
        let mut context = Context::default().with_all();
        matches::register(&mut context, patterns.clone());
        Rules { context, patterns }
    }

    /// How many regular expressions `matches` has compiled (constant patterns once).
    pub(crate) fn pattern_compilations(&self) -> usize {
        self.patterns.compilations()
    }

    /// The failures of the rules in `compiled` (the program tree of `schema`) on `object`, a
    /// whole resource as rules see it, with `old` the stored one on update.
    pub(crate) fn evaluate(
        &self,
        compiled: &CompiledSchema,
        schema: &Value,
        object: &Value,
        old: Option<&Value>,
    ) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let node = Node {
            compiled,
            schema,
            path: String::new(),
        };
        self.walk(&node, object, old, &mut errors);
        errors
    }

    fn walk(&self, node: &Node, value: &Value, old: Option<&Value>, errors: &mut Vec<FieldError>) {
        // Only non-null values are validated: a rule on a nullable field never sees null.
        if value.is_null() {
            return;
        }
        if !node.compiled.validations.is_empty() {
            self.rules_at(node, value, old.filter(|o| !o.is_null()), errors);
        }
        let branches = node.schema.get("allOf").and_then(Value::as_array);
        for (compiled, schema) in node
            .compiled
            .all_of
            .iter()
            .zip(branches.into_iter().flatten())
        {
            let branch = Node {
                compiled,
                schema,
                path: node.path.clone(),
            };
            self.walk(&branch, value, old, errors);
        }
        match value {
            Value::Array(items) => {
                let (Some(compiled), Some(schema)) =
                    (&node.compiled.items, node.schema.get("items"))
                else {
                    return;
                };
                let keys = map_keys(node.schema);
                for (i, item) in items.iter().enumerate() {
                    let old_item = keys.as_ref().and_then(|keys| {
                        old?.as_array()?
                            .iter()
                            .find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
                    });
                    let child = Node {
                        compiled,
                        schema,
                        path: format!("{}[{i}]", node.path),
                    };
                    self.walk(&child, item, old_item, errors);
                }
            }
            Value::Object(fields) => {
                let properties = node.schema.get("properties");
                let additional = node
                    .schema
                    .get("additionalProperties")
                    .filter(|a| a.is_object());
                for (key, field) in fields {
                    let declared = node
                        .compiled
                        .properties
                        .get(key)
                        .zip(properties.and_then(|p| p.get(key)));
                    let child = declared.or_else(|| {
                        node.compiled
                            .additional_properties
                            .as_deref()
                            .zip(additional)
                    });
                    if let Some((compiled, schema)) = child {
                        let child = Node {
                            compiled,
                            schema,
                            path: join(&node.path, key),
                        };
                        self.walk(&child, field, old.and_then(|o| o.get(key)), errors);
                    }
                }
            }
            _ => {}
        }
    }

    /// `validateExpressions`: the rules of one node.
    fn rules_at(
        &self,
        node: &Node,
        value: &Value,
        old: Option<&Value>,
        errors: &mut Vec<FieldError>,
    ) {
        let ty = node
            .schema
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let this = converted(node, value, "self");
        let old = old.map(|o| converted(node, o, "oldSelf"));
        let mut scope = self.context.new_inner_scope();
        scope.add_variable_from_value("self", this);
        if let Some(old) = &old {
            scope.add_variable_from_value("oldSelf", old.clone());
        }
        for compiled in &node.compiled.validations {
            // The CRD's rules compiled when it was written (`CrdSchema::from_value`).
            let Ok(rule) = compiled else { continue };
            let optional_old_self = rule.rule.optional_old_self == Some(true);
            if rule.is_transition_rule && old.is_none() && !optional_old_self {
                continue;
            }
            let optional_scope;
            let activation = if optional_old_self {
                let mut s = scope.new_inner_scope();
                let optional = match &old {
                    Some(old) => OptionalValue::of(old.clone()),
                    None => OptionalValue::none(),
                };
                s.add_variable_from_value("oldSelf", Cel::Opaque(Arc::new(optional)));
                optional_scope = s;
                &optional_scope
            } else {
                &scope
            };
            match rule.program.execute(activation) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => {
                    let path = match rule.rule.field_path.as_deref() {
                        Some(p) if !p.is_empty() => join(&node.path, p.trim_start_matches('.')),
                        _ => node.path.clone(),
                    };
                    // The message expression sees `oldSelf` as a plain value.
                    let detail = message(rule, &scope);
                    errors.push(failure(&path, ty, &detail, rule.rule.reason.as_deref()));
                }
                // A rule is checked to be a bool when the CRD is written; a value of the
                // wrong type at run time is an overload cel-go would not have found.
                Ok(_) => errors.push(runtime_error(&node.path, ty, rule, &no_such_overload())),
                Err(e) => {
                    let e = unmask(&e, rule.program.expression(), activation);
                    errors.push(runtime_error(&node.path, ty, rule, &e));
                }
            }
        }
    }
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules").finish_non_exhaustive()
    }
}

/// A schema node with its compiled rules and where it sits in the object.
struct Node<'a> {
    compiled: &'a CompiledSchema,
    schema: &'a Value,
    path: String,
}

/// `value`, bound to `var` in the rules of `node`, as they see it: an object only with the
/// fields they select of it when that is all they do with it.
fn converted(node: &Node, value: &Value, var: &str) -> Cel {
    if !value.is_object() {
        return value::to_cel(value, node.schema);
    }
    let programs = node.compiled.validations.iter().flatten().flat_map(|rule| {
        std::iter::once(&rule.program)
            .chain(&rule.message_program)
            .map(cel::Program::expression)
    });
    match reads::fields_read(programs, var) {
        Some(fields) => value::fields_to_cel(value, node.schema, &fields),
        None => value::to_cel(value, node.schema),
    }
}

/// Every compiled program of the tree (rules and message expressions).
fn programs_of<'a>(node: &'a CompiledSchema, out: &mut Vec<&'a cel::Program>) {
    for rule in node.validations.iter().flatten() {
        out.push(&rule.program);
        out.extend(&rule.message_program);
    }
    let children = node
        .properties
        .values()
        .chain(node.items.as_deref())
        .chain(node.additional_properties.as_deref())
        .chain(&node.all_of)
        .chain(&node.one_of)
        .chain(&node.any_of);
    for child in children {
        programs_of(child, out);
    }
}

/// The keys of a `map` list: only its items correlate with old ones (`makeMapList`).
fn map_keys(schema: &Value) -> Option<Vec<&str>> {
    (schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map"))
        .then(|| super::value::strings(schema, "x-kubernetes-list-map-keys"))
}

/// `ruleErrorString`: the rule's message, else the rule.
fn rule_error_string(rule: &CompilationResult) -> &str {
    match rule.rule.message.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() => m,
        _ => rule.rule.rule.trim(),
    }
}

/// `ruleMessageOrDefault`.
fn message_or_default(rule: &CompilationResult) -> String {
    match rule.rule.message.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => format!("failed rule: {}", rule_error_string(rule)),
    }
}

/// The detail of a failed rule: its `messageExpression` when that evaluates to a usable
/// string (`evalMessageExpression`), else its message.
fn message(rule: &CompilationResult, scope: &Context) -> String {
    if let Some(program) = &rule.message_program
        && let Ok(Cel::String(s)) = program.execute(scope)
    {
        let trimmed = s.trim();
        if !trimmed.is_empty()
            && !trimmed.contains('\n')
            && trimmed.len() <= MAX_MESSAGE_EXPRESSION_BYTES
        {
            return trimmed.to_owned();
        }
    }
    message_or_default(rule)
}

/// `fieldErrorForReason`, the value being the node's type.
fn failure(path: &str, ty: &str, detail: &str, reason: Option<&str>) -> FieldError {
    let quoted = quote(ty);
    match reason {
        Some("FieldValueForbidden") => {
            FieldError::new(path, "FieldValueForbidden", format!("Forbidden: {detail}"))
        }
        Some("FieldValueRequired") => FieldError::new(
            path,
            "FieldValueRequired",
            format!("Required value: {detail}"),
        ),
        Some("FieldValueDuplicate") => FieldError::new(
            path,
            "FieldValueDuplicate",
            format!("Duplicate value: {quoted}"),
        ),
        _ => FieldError::new(
            path,
            "FieldValueInvalid",
            format!("Invalid value: {quoted}: {detail}"),
        ),
    }
}

/// Go's `%q` of a schema type name (plain ASCII, so JSON's quoting is the same).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn no_such_overload() -> ExecutionError {
    ExecutionError::NoSuchOverload
}

/// A rule that failed to evaluate, worded as `validateExpressions` words it.
fn runtime_error(path: &str, ty: &str, rule: &CompilationResult, e: &ExecutionError) -> FieldError {
    let text = cel_go_error(e);
    let detail = if text.starts_with("no such overload") {
        format!(
            "'{text}': call arguments did not match a supported operator, function or macro signature for rule: {}",
            rule_error_string(rule)
        )
    } else {
        format!("{text} evaluating rule: {}", rule_error_string(rule))
    };
    let quoted = quote(ty);
    FieldError::new(
        path,
        "FieldValueInvalid",
        format!("Invalid value: {quoted}: {detail}"),
    )
}

/// The `cel` crate's runtime error as cel-go words the same failure (`common/types/err.go`,
/// `interpreter/attributes.go`).
fn cel_go_error(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::IndexOutOfBounds(index) => format!("index out of bounds: {}", plain(index)),
        ExecutionError::DivisionByZero(_) => "division by zero".into(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".into(),
        ExecutionError::Overflow(_, operand, _) => match operand {
            Cel::UInt(_) => "unsigned integer overflow",
            Cel::Duration(_) => "duration overflow",
            Cel::Timestamp(_) => "timestamp overflow",
            _ => "integer overflow",
        }
        .into(),
        ExecutionError::NoSuchOverload
        | ExecutionError::UnsupportedBinaryOperator(..)
        | ExecutionError::UnsupportedUnaryOperator(..)
        | ExecutionError::ValuesNotComparable(..)
        | ExecutionError::UnexpectedType { .. }
        | ExecutionError::UnsupportedTargetType { .. }
        | ExecutionError::NotSupportedAsMethod { .. }
        | ExecutionError::InvalidArgumentCount { .. } => "no such overload".into(),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        // Something kube-cel does not implement (a macro or library the `cel` crate lacks):
        // not an error the API server would give, so it says what is missing.
        ExecutionError::UndeclaredReference(name) => {
            format!("the sandbox's CEL engine does not support '{name}'")
        }
        other => other.to_string(),
    }
}

fn plain(v: &Cel) -> String {
    match v {
        Cel::Int(i) => i.to_string(),
        Cel::UInt(u) => u.to_string(),
        Cel::String(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}

/// The error behind the `cel` crate's `Missing argument or target`, which it reports when
/// evaluating the argument of a global call (`size(self.x)`) fails, whatever the failure: the
/// first such argument in `expr` that fails on its own, evaluated again in `activation`.
/// Arguments that read comprehension variables cannot be evaluated alone and are passed over.
fn unmask(e: &ExecutionError, expr: &IdedExpr, activation: &Context) -> ExecutionError {
    fn find(expr: &IdedExpr, activation: &Context) -> Option<ExecutionError> {
        let Expr::Call(call) = &expr.expr else {
            return children(expr).find_map(|c| find(c, activation));
        };
        if call.target.is_none()
            && let Some(arg) = call.args.first()
        {
            match Cel::resolve(arg, activation) {
                Err(ExecutionError::MissingArgumentOrTarget) => {
                    if let Some(found) = find(arg, activation) {
                        return Some(found);
                    }
                }
                Err(ExecutionError::UndeclaredReference(_)) | Ok(_) => {}
                Err(e) => return Some(e),
            }
        }
        children(expr).find_map(|c| find(c, activation))
    }
    if !matches!(e, ExecutionError::MissingArgumentOrTarget) {
        return e.clone();
    }
    find(expr, activation).unwrap_or_else(|| e.clone())
}

/// The direct sub-expressions of `e` that a call's arguments can be in.
fn children(e: &IdedExpr) -> Box<dyn Iterator<Item = &IdedExpr> + '_> {
    use cel::common::ast::EntryExpr;
    match &e.expr {
        Expr::Call(c) => Box::new(c.target.as_deref().into_iter().chain(&c.args)),
        Expr::Select(s) => Box::new(std::iter::once(&*s.operand)),
        Expr::List(l) => Box::new(l.elements.iter()),
        Expr::Map(m) => Box::new(m.entries.iter().flat_map(|en| match &en.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Comprehension(c) => Box::new(
            [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]
            .into_iter(),
        ),
        _ => Box::new(std::iter::empty()),
    }
}

#[cfg(test)]
mod tests;
