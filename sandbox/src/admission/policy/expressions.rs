//! A policy's CEL: `variables`, `matchConditions`, `validations` and their messages, over the
//! variables the API server declares (`apiserver/pkg/admission/plugin/cel/activation.go`,
//! `composition.go`, `condition.go`; `policy/validating/validator.go`).
//!
//! cel-go evaluates `variables.<name>` lazily, so a variable that fails only fails the
//! expressions that read it. Here every variable is evaluated once, in order, and an
//! expression that reads a failed one fails with that variable's error, as it would there.

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicySpec, Validation};
use kube::core::cel::KubeCelExt as _;
use kube::core::cel::cel::{Context, ExecutionError, Value as Cel};
use serde_json::{Value, json};

use crate::admission::attributes::AdmissionAttributes;
use crate::admission::matching::json_to_cel;
use crate::admission::review::review_request;

/// What the API server keeps of an evaluated message (`MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// One validation's verdict.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Decision {
    /// Passed, or failed to evaluate under `failurePolicy: Ignore`.
    Admit,
    /// Failed: handed to the binding's actions.
    Deny {
        /// The failure's message.
        message: String,
        /// The validation's `reason`; `None` for evaluation errors.
        reason: Option<String>,
    },
}

/// Parses with the syntax Kubernetes enables (optional fields `a.?b`).
pub(crate) fn parse(source: &str) -> Result<IdedExpr, String> {
    cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .parse(source)
        .map_err(|e| e.to_string().replace("\n|", "\n |"))
}

/// The validations' decisions for one request (none when a match condition is false).
pub(crate) fn evaluate(
    spec: &ValidatingAdmissionPolicySpec,
    request: &AdmissionAttributes,
) -> Vec<Decision> {
    let fail_closed = spec.failure_policy.as_deref() != Some("Ignore");
    let on_error = |message: String| {
        if fail_closed {
            Decision::Deny {
                message,
                reason: None,
            }
        } else {
            Decision::Admit
        }
    };
    let activation = Activation::new(spec, request);
    let mut errors = Vec::new();
    for condition in spec.match_conditions.iter().flatten() {
        match activation.eval(&condition.expression) {
            Ok(Cel::Bool(false)) => return Vec::new(),
            Ok(_) => {}
            Err(error) => errors.push(error),
        }
    }
    if !errors.is_empty() {
        // The matcher's aggregate error; under Ignore the policy does not apply.
        return if fail_closed {
            vec![on_error(aggregate(errors))]
        } else {
            Vec::new()
        };
    }
    spec.validations
        .iter()
        .flatten()
        .map(|validation| match activation.eval(&validation.expression) {
            Err(error) => on_error(error),
            Ok(Cel::Bool(true)) => Decision::Admit,
            Ok(_) => Decision::Deny {
                message: failure_message(&activation, validation),
                reason: Some(
                    validation
                        .reason
                        .clone()
                        .unwrap_or_else(|| "Invalid".to_owned()),
                ),
            },
        })
        .collect()
}

/// `messageExpression` when it gives a usable string, else `message`, else the expression.
fn failure_message(activation: &Activation, validation: &Validation) -> String {
    let evaluated = validation
        .message_expression
        .as_deref()
        .filter(|m| !m.trim().is_empty())
        .and_then(|m| match activation.eval(m) {
            Ok(Cel::String(s)) => Some(s.trim().to_owned()),
            _ => None,
        })
        .filter(|m| m.len() <= MAX_MESSAGE_BYTES && !m.contains('\n'))
        .unwrap_or_default();
    if !evaluated.is_empty() {
        return evaluated;
    }
    let message = validation.message.as_deref().unwrap_or("").trim();
    if !message.is_empty() {
        return message.to_owned();
    }
    format!("failed expression: {}", validation.expression.trim())
}

/// `utilerrors.NewAggregate(...).Error()`: one error bare, several in brackets, each once.
fn aggregate(errors: Vec<String>) -> String {
    let mut unique: Vec<String> = Vec::new();
    for error in errors {
        if !unique.contains(&error) {
            unique.push(error);
        }
    }
    if unique.len() == 1 {
        return unique.remove(0);
    }
    format!("[{}]", unique.join(", "))
}

/// The evaluation context of one request.
struct Activation {
    context: Context<'static>,
    /// Variables that failed, with their error.
    failed: HashMap<String, String>,
}

impl Activation {
    fn new(spec: &ValidatingAdmissionPolicySpec, request: &AdmissionAttributes) -> Self {
        let mut context = Context::default().with_all();
        let null = Value::Null;
        context.add_variable_from_value(
            "object",
            json_to_cel(request.object.as_ref().unwrap_or(&null)),
        );
        context.add_variable_from_value(
            "oldObject",
            json_to_cel(request.old_object.as_ref().unwrap_or(&null)),
        );
        context.add_variable_from_value("request", json_to_cel(&request_variable(request)));
        context.add_variable_from_value("namespaceObject", json_to_cel(&namespace_object(request)));
        context.add_variable_from_value("params", Cel::Null);
        let mut activation = Activation {
            context,
            failed: HashMap::new(),
        };
        let mut values: HashMap<String, Cel> = HashMap::new();
        activation.set_variables(&values);
        for variable in spec.variables.iter().flatten() {
            match activation.eval_raw(&variable.expression) {
                Ok(value) => {
                    values.insert(variable.name.clone(), value);
                    activation.set_variables(&values);
                }
                Err(error) => {
                    let error = format!(
                        "composited variable {:?} fails to evaluate: {error}",
                        variable.name
                    );
                    activation.failed.insert(variable.name.clone(), error);
                }
            }
        }
        activation
    }

    fn set_variables(&mut self, values: &HashMap<String, Cel>) {
        self.context
            .add_variable_from_value("variables", Cel::from(values.clone()));
    }

    /// Evaluates an expression; the error is worded as `activation.Evaluate` words it.
    fn eval(&self, source: &str) -> Result<Cel, String> {
        self.eval_raw(source)
            .map_err(|error| format!("expression '{source}' resulted in error: {error}"))
    }

    /// Evaluates an expression; the error is cel-go's own text.
    fn eval_raw(&self, source: &str) -> Result<Cel, String> {
        let expr = parse(source).map_err(|e| format!("compilation failed: {e}"))?;
        let mut read = Vec::new();
        variables_read(&expr, &mut read);
        if let Some(error) = read.iter().find_map(|name| self.failed.get(name)) {
            return Err(error.clone());
        }
        self.context.resolve(&expr).map_err(|e| go_error(&e))
    }
}

/// The `request` variable: the admission request without its objects and uid
/// (`CreateAdmissionRequest`).
fn request_variable(request: &AdmissionAttributes) -> Value {
    let mut value = review_request("", request, None);
    if let Some(map) = value.as_object_mut() {
        map.remove("object");
        map.remove("oldObject");
    }
    value
}

/// `namespaceObject`: the request's namespace with the metadata `CreateNamespaceObject` keeps;
/// null for cluster-scoped requests and for a Namespace itself.
fn namespace_object(request: &AdmissionAttributes) -> Value {
    let Some(namespace) = request
        .namespace_object
        .as_ref()
        .filter(|_| !request.is_namespace_resource())
    else {
        return Value::Null;
    };
    const KEPT: [&str; 12] = [
        "name",
        "generateName",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "finalizers",
    ];
    let metadata: serde_json::Map<String, Value> = namespace
        .get("metadata")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| KEPT.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "metadata": metadata,
        "spec": namespace.get("spec").cloned().unwrap_or_else(|| json!({})),
        "status": namespace.get("status").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The names `expr` reads as `variables.<name>`, in evaluation order.
fn variables_read(expr: &IdedExpr, out: &mut Vec<String>) {
    match &expr.expr {
        Expr::Select(select) => {
            if matches!(&select.operand.expr, Expr::Ident(n) if n == "variables") {
                out.push(select.field.clone());
            } else {
                variables_read(&select.operand, out);
            }
        }
        Expr::Call(call) => {
            call.target.iter().for_each(|t| variables_read(t, out));
            call.args.iter().for_each(|a| variables_read(a, out));
        }
        Expr::List(list) => list.elements.iter().for_each(|e| variables_read(e, out)),
        Expr::Map(map) => map.entries.iter().for_each(|e| entry_read(&e.expr, out)),
        Expr::Struct(s) => s.entries.iter().for_each(|e| entry_read(&e.expr, out)),
        Expr::Comprehension(c) => {
            for part in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                variables_read(part, out);
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn entry_read(entry: &EntryExpr, out: &mut Vec<String>) {
    match entry {
        EntryExpr::MapEntry(m) => {
            variables_read(&m.key, out);
            variables_read(&m.value, out);
        }
        EntryExpr::StructField(f) => variables_read(&f.value, out),
    }
}

/// An evaluation error in cel-go's words where the two interpreters meet the same failure.
fn go_error(error: &ExecutionError) -> String {
    match error {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::NoSuchOverload => "no such overload".to_owned(),
        ExecutionError::UndeclaredReference(name) => format!("undeclared reference to '{name}'"),
        ExecutionError::DivisionByZero(_) => "division by zero".to_owned(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_owned(),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => {
            let text = other.to_string();
            let mut chars = text.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_lowercase().chain(chars).collect()
            })
        }
    }
}
