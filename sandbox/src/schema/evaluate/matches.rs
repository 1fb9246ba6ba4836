//! `matches()` with constant patterns compiled once per schema, as kube-apiserver's programs do:
//! k8s.io/apiserver `pkg/cel/environment/base.go` builds them with `cel.OptOptimize`, which makes
//! cel-go compile the literal pattern of every `matches` call when the program is planned
//! (`interpreter/optimizations.go`, `MatchesRegexOptimization`). A pattern computed at run time
//! is compiled on each call there too, and so here.
//!
//! The `cel` crate's own `matches` compiles its pattern on every call. Overriding the function
//! in the evaluation context (rather than patching the `cel` crate or kube-cel) keeps the
//! dependencies as published; the table is built from the parsed rules, so it is immutable
//! and read without a lock, and it holds only the patterns written in the CRD (a cache filled
//! at run time would also grow with patterns taken from objects).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::extractors::This;
use cel::{Context, ExecutionError, FunctionContext};
use regex::Regex;

/// The compiled constant patterns of a schema's rules.
#[derive(Default)]
pub(crate) struct Patterns {
    constant: HashMap<String, Result<Regex, String>>,
    /// How many times a pattern was compiled, constant or not.
    compiled: AtomicUsize,
}

impl Patterns {
    /// The constant patterns of `matches` calls in `exprs`, each compiled once.
    pub(crate) fn collect<'a>(exprs: impl IntoIterator<Item = &'a IdedExpr>) -> Self {
        let mut found = Vec::new();
        for expr in exprs {
            constant_patterns(expr, &mut found);
        }
        let patterns = Patterns::default();
        let mut constant = HashMap::new();
        for pattern in found {
            if !constant.contains_key(pattern) {
                let compiled = patterns.compile(pattern);
                constant.insert(pattern.to_owned(), compiled);
            }
        }
        Patterns {
            constant,
            compiled: patterns.compiled,
        }
    }

    /// How many patterns were compiled so far.
    pub(crate) fn compilations(&self) -> usize {
        self.compiled.load(Ordering::Relaxed)
    }

    fn compile(&self, pattern: &str) -> Result<Regex, String> {
        self.compiled.fetch_add(1, Ordering::Relaxed);
        Regex::new(pattern).map_err(|e| format!("'{pattern}' not a valid regex:\n{e}"))
    }

    fn is_match(
        &self,
        ftx: &FunctionContext,
        text: &str,
        pattern: &str,
    ) -> Result<bool, ExecutionError> {
        let compiled;
        let regex = match self.constant.get(pattern) {
            Some(found) => found,
            None => {
                compiled = self.compile(pattern);
                &compiled
            }
        };
        match regex {
            Ok(re) => Ok(re.is_match(text)),
            Err(message) => Err(ftx.error(message)),
        }
    }
}

/// Replaces `matches` in `context` with one that looks its pattern up in `patterns` first.
pub(crate) fn register(context: &mut Context<'static>, patterns: Arc<Patterns>) {
    context.add_function(
        "matches",
        move |ftx: &FunctionContext,
              This(text): This<Arc<String>>,
              pattern: Arc<String>|
              -> Result<bool, ExecutionError> { patterns.is_match(ftx, &text, &pattern) },
    );
}

/// The literal patterns of `s.matches('re')` and `matches(s, 're')` in `e`.
fn constant_patterns<'a>(e: &'a IdedExpr, out: &mut Vec<&'a str>) {
    let literal = |e: Option<&'a IdedExpr>| match e.map(|e| &e.expr) {
        Some(Expr::Literal(LiteralValue::String(s))) => Some(s.inner()),
        _ => None,
    };
    match &e.expr {
        Expr::Call(call) => {
            if call.func_name == "matches" {
                let pattern = match &call.target {
                    Some(_) => literal(call.args.first()),
                    None => literal(call.args.get(1)),
                };
                out.extend(pattern);
            }
            for child in call.target.as_deref().into_iter().chain(&call.args) {
                constant_patterns(child, out);
            }
        }
        Expr::Select(s) => constant_patterns(&s.operand, out),
        Expr::List(l) => l.elements.iter().for_each(|i| constant_patterns(i, out)),
        Expr::Map(m) => m.entries.iter().for_each(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => {
                constant_patterns(&m.key, out);
                constant_patterns(&m.value, out);
            }
            EntryExpr::StructField(f) => constant_patterns(&f.value, out),
        }),
        Expr::Struct(s) => s.entries.iter().for_each(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => {
                constant_patterns(&m.key, out);
                constant_patterns(&m.value, out);
            }
            EntryExpr::StructField(f) => constant_patterns(&f.value, out),
        }),
        Expr::Comprehension(c) => {
            for part in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                constant_patterns(part, out);
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}
