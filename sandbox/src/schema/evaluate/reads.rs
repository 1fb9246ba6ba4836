//! The fields of `self` (or `oldSelf`) a node's rules read. A rule on an object that only
//! selects fields of it needs only those converted to CEL values: at the root, where `self` is
//! the whole resource, converting all of it on every write cost more than running the rules.

use cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, IdedExpr};

/// The fields of the variable `var` that `exprs` select, by CEL name, sorted; None when one of
/// them uses the variable otherwise (compares it, passes it to a function, iterates it, ...),
/// which needs the whole value.
pub(super) fn fields_read<'a>(
    exprs: impl IntoIterator<Item = &'a IdedExpr>,
    var: &str,
) -> Option<Vec<&'a str>> {
    let mut fields = Vec::new();
    for expr in exprs {
        if !visit(expr, var, &mut fields) {
            return None;
        }
    }
    fields.sort_unstable();
    fields.dedup();
    Some(fields)
}

/// Whether `expr` uses `var` only by selecting fields of it, which are added to `fields`.
fn visit<'a>(expr: &'a IdedExpr, var: &str, fields: &mut Vec<&'a str>) -> bool {
    match &expr.expr {
        Expr::Ident(name) => name != var,
        Expr::Select(select) => match &select.operand.expr {
            Expr::Ident(name) if name == var => {
                fields.push(&select.field);
                true
            }
            _ => visit(&select.operand, var, fields),
        },
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(&call.args)
            .all(|e| visit(e, var, fields)),
        Expr::List(list) => list.elements.iter().all(|e| visit(e, var, fields)),
        Expr::Map(map) => entries(&map.entries, var, fields),
        Expr::Struct(object) => entries(&object.entries, var, fields),
        // A comprehension variable of the same name hides it: give up rather than track scopes.
        Expr::Comprehension(c) => {
            c.iter_var != var
                && c.iter_var2.as_deref() != Some(var)
                && c.accu_var != var
                && [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ]
                .into_iter()
                .all(|e| visit(e, var, fields))
        }
        Expr::Literal(_) | Expr::Unspecified => true,
    }
}

fn entries<'a>(entries: &'a [IdedEntryExpr], var: &str, fields: &mut Vec<&'a str>) -> bool {
    entries.iter().all(|entry| match &entry.expr {
        EntryExpr::MapEntry(e) => visit(&e.key, var, fields) && visit(&e.value, var, fields),
        EntryExpr::StructField(f) => visit(&f.value, var, fields),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(rule: &str, var: &str) -> Option<Vec<String>> {
        let program = cel::Program::compile(rule).expect("a valid rule");
        fields_read([program.expression()], var)
            .map(|fields| fields.into_iter().map(String::from).collect())
    }

    #[test]
    fn fields_selected_from_the_variable_are_all_a_rule_reads() {
        let rule = "size(self.metadata.name) <= 63 && has(self.spec) && self.spec.x == oldSelf.y";
        assert_eq!(
            read(rule, "self"),
            Some(vec!["metadata".into(), "spec".into()])
        );
        assert_eq!(read(rule, "oldSelf"), Some(vec!["y".into()]));
        assert_eq!(read("1 == 1", "self"), Some(vec![]));
    }

    #[test]
    fn any_other_use_of_the_variable_needs_all_of_it() {
        for rule in [
            "self >= oldSelf",
            "size(self) > 0",
            "self.matches('^a$')",
            "self.all(k, k != 'x')",
            "[1].all(self, self > 0)",
            "self[\"spec\"] == 1",
            "self.spec == self",
        ] {
            assert_eq!(read(rule, "self"), None, "{rule}");
        }
    }
}
