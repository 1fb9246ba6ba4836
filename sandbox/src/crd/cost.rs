//! Static cost estimation of a CEL rule, as cel-go's checker (`checker/cost.go`, v0.23) runs it
//! when kube-apiserver compiles a CRD's rules, with apiextensions' size estimator (sizes from the
//! schema's `maxLength`/`maxItems`/`maxProperties`, else what fits in a 3 MiB request:
//! `pkg/apiserver/schema/cel/compilation.go`) and the Kubernetes library's call costs
//! (k8s.io/apiserver `pkg/cel/library/cost.go`).
//!
//! cel-go estimates over a type-checked AST. There is no CEL type checker in Rust, so the types
//! it needs (which overload a call picks, whether a select reads a map or an object) are derived
//! here from the schema and the literals; what stays unknown is `dyn` and costs as the union of
//! every overload, as cel-go costs a call with several candidate overloads. The same walk
//! reports the compile errors a type checker would find in field references: undeclared
//! variables and fields the schema does not declare.

mod bounds;
mod functions;
mod info;

use std::collections::HashMap;
use std::rc::Rc;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};

use super::types::{Decl, Ty};
pub use bounds::Cost;
use bounds::Size;
use functions::function_cost;
use info::{Entry, Info, scalar};

/// A compile error: what cel-go's checker would say, with the expression it is about.
#[derive(Debug, PartialEq, Eq)]
pub struct CheckError {
    pub message: String,
    /// The selected field, for locating the error in the source.
    pub field: Option<String>,
    /// Else the text the error points into, and how far into it.
    pub at: Option<(String, usize)>,
}

/// The result of estimating one expression.
#[derive(Debug)]
pub struct Estimate {
    pub cost: Cost,
    /// The type of the result, when known (a rule must yield a bool).
    pub result: Option<Ty>,
}

/// Estimates `expr` with `vars` declared (`self` and `oldSelf` for a rule).
pub fn estimate(expr: &IdedExpr, vars: &[(&str, Rc<Decl>)]) -> Result<Estimate, CheckError> {
    let mut coster = Coster {
        locals: HashMap::new(),
    };
    for (name, decl) in vars {
        coster.push(name, Info::from_decl(decl));
    }
    let (cost, info) = coster.cost(expr)?;
    Ok(Estimate {
        cost,
        result: (info.ty != Ty::Dyn).then_some(info.ty),
    })
}

struct Coster {
    locals: HashMap<String, Vec<Info>>,
}

impl Coster {
    fn cost(&mut self, e: &IdedExpr) -> Result<(Cost, Info), CheckError> {
        match &e.expr {
            Expr::Literal(lit) => Ok((Cost::fixed(0), literal(lit))),
            Expr::Ident(name) => Ok((Cost::fixed(1), self.ident(name)?)),
            Expr::Select(sel) => {
                let (operand_cost, operand) = self.cost(&sel.operand)?;
                let info = select(&operand, &sel.field)?;
                if sel.test {
                    return Ok((Cost::fixed(1).add(operand_cost), Info::of(Ty::Bool)));
                }
                let extra = match operand.ty {
                    Ty::Map(_) | Ty::Object(_) => 1,
                    _ => 0,
                };
                Ok((operand_cost.add(Cost::fixed(extra)), info))
            }
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args),
            Expr::List(list) => {
                let mut sum = Cost::fixed(0);
                let mut val = if list.elements.is_empty() {
                    Size::fixed(0)
                } else {
                    Size {
                        min: u64::MAX,
                        max: 0,
                    }
                };
                let mut elem: Option<Ty> = None;
                for item in &list.elements {
                    let (c, info) = self.cost(item)?;
                    sum = sum.add(c);
                    val = val.union(info.size());
                    elem = Some(match elem {
                        Some(t) if t != info.ty => Ty::Dyn,
                        _ => info.ty,
                    });
                }
                let decl = elem.map(|ty| Rc::new(Decl::simple(ty, 0)));
                let mut info = Info::of(Ty::List(None));
                info.size = Some(Size::fixed(list.elements.len() as u64));
                info.entry = Some(Entry {
                    list: true,
                    key: Size::fixed(1),
                    val,
                });
                // Element types of literal lists matter for overloads; sizes come from `entry`.
                info.ty = Ty::List(decl.filter(|d| d.ty != Ty::Dyn));
                Ok((sum.add(Cost::fixed(10)), info))
            }
            Expr::Map(map) => {
                let mut sum = Cost::fixed(0);
                let empty = map.entries.is_empty();
                let start = if empty {
                    Size::fixed(0)
                } else {
                    Size {
                        min: u64::MAX,
                        max: 0,
                    }
                };
                let (mut key, mut val) = (start, start);
                for entry in &map.entries {
                    if let cel::common::ast::EntryExpr::MapEntry(m) = &entry.expr {
                        let (kc, ki) = self.cost(&m.key)?;
                        let (vc, vi) = self.cost(&m.value)?;
                        sum = sum.add(kc).add(vc);
                        key = key.union(ki.size());
                        val = val.union(vi.size());
                    }
                }
                let mut info = Info::of(Ty::Map(None));
                info.size = Some(Size::fixed(map.entries.len() as u64));
                info.entry = Some(Entry {
                    list: false,
                    key,
                    val,
                });
                Ok((sum.add(Cost::fixed(30)), info))
            }
            Expr::Struct(s) => {
                let mut sum = Cost::fixed(0);
                for entry in &s.entries {
                    if let cel::common::ast::EntryExpr::StructField(f) = &entry.expr {
                        sum = sum.add(self.cost(&f.value)?.0);
                    }
                }
                Ok((sum.add(Cost::fixed(40)), Info::of(Ty::Dyn)))
            }
            Expr::Comprehension(comp) => self.comprehension(comp),
            Expr::Unspecified => Ok((Cost::fixed(0), Info::of(Ty::Dyn))),
        }
    }

    fn ident(&self, name: &str) -> Result<Info, CheckError> {
        if let Some(info) = self.locals.get(name).and_then(|stack| stack.last()) {
            return Ok(info.clone());
        }
        Err(CheckError {
            message: format!("undeclared reference to '{name}' (in container '')"),
            field: None,
            at: None,
        })
    }

    fn push(&mut self, name: &str, info: Info) {
        self.locals.entry(name.to_owned()).or_default().push(info);
    }

    fn pop(&mut self, name: &str) {
        if let Some(stack) = self.locals.get_mut(name) {
            stack.pop();
        }
    }

    fn comprehension(
        &mut self,
        comp: &cel::common::ast::ComprehensionExpr,
    ) -> Result<(Cost, Info), CheckError> {
        let (range_cost, range) = self.cost(&comp.iter_range)?;
        let (init_cost, init) = self.cost(&comp.accu_init)?;
        let mut sum = range_cost.add(init_cost);
        let mut accu = init.clone();
        accu.decl = None;
        accu.var_size = Some(init.size());
        accu.size = None;
        self.push(&comp.accu_var, accu);
        // The iteration variable: list items, or map keys (strings of no declared size).
        let list = match (&range.ty, range.entry) {
            (_, Some(entry)) => entry.list,
            (Ty::Map(_), None) => false,
            _ => true,
        };
        let mut var = if list {
            match range.element() {
                Some(decl) => Info::from_decl(&decl),
                None => Info::of(Ty::Dyn),
            }
        } else {
            let key = Rc::new(Decl::simple(Ty::String, 2));
            match &range.decl {
                Some(_) => Info::from_decl(&key),
                None => Info::of(Ty::String),
            }
        };
        if range.decl.is_none() {
            var.decl = None;
        }
        var.var_size = range.entry.map(|e| if e.list { e.val } else { e.key });
        self.push(&comp.iter_var, var);
        if let Some(second) = &comp.iter_var2 {
            self.push(second, Info::of(Ty::Dyn));
        }
        let (loop_cost, _) = self.cost(&comp.loop_cond)?;
        let (step_cost, step) = self.cost(&comp.loop_step)?;
        self.pop(&comp.iter_var);
        if let Some(second) = &comp.iter_var2 {
            self.pop(second);
        }
        let (result_cost, result) = self.cost(&comp.result)?;
        self.pop(&comp.accu_var);
        let count = range.size();
        sum = sum
            .add(result_cost)
            .add(count.times_cost(step_cost.add(loop_cost)));
        let mut info = Info::of(result.ty.clone());
        match &comp.accu_init.expr {
            Expr::Literal(lit) => info.size = literal(lit).size,
            Expr::List(_) | Expr::Map(_) => {
                info.size = Some(count);
                info.entry = step.entry;
                if let Ty::List(_) = step.ty {
                    info.ty = step.ty.clone();
                }
            }
            _ => {}
        }
        Ok((sum, info))
    }

    fn call(
        &mut self,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> Result<(Cost, Info), CheckError> {
        let mut arg_costs = Vec::with_capacity(args.len());
        let mut arg_infos = Vec::with_capacity(args.len());
        for arg in args {
            let (c, info) = self.cost(arg)?;
            arg_costs.push(c);
            arg_infos.push(info);
        }
        // `a.?f` (Kubernetes enables CEL optionals): the field must exist all the same.
        if name == "_?._"
            && let (
                Some(operand),
                Some(IdedExpr {
                    expr: Expr::Literal(LiteralValue::String(field)),
                    ..
                }),
            ) = (arg_infos.first(), args.get(1))
        {
            select(operand, field.inner())?;
        }
        if name == "dyn" && target.is_none() && args.len() == 1 {
            let mut info = arg_infos.remove(0);
            info.ty = Ty::Dyn;
            return Ok((Cost::fixed(1).add(arg_costs[0]), info));
        }
        let (target_cost, target_info) = match target {
            Some(t) => {
                let (c, i) = self.cost(t)?;
                (c, Some(i))
            }
            None => (Cost::fixed(0), None),
        };
        let arg_types: Vec<Ty> = arg_infos.iter().map(|a| a.ty.clone()).collect();
        super::check::call(name, target_info.as_ref().map(|t| &t.ty), &arg_types).map_err(|e| {
            CheckError {
                message: e.message,
                field: None,
                at: Some(e.at),
            }
        })?;
        let args_sum = arg_costs.iter().fold(Cost::fixed(0), |a, c| a.add(*c));
        let (fn_cost, mut info) =
            function_cost(name, target_info.as_ref(), &arg_infos, &arg_costs, args_sum);
        if info.size.is_none() && info.decl.is_none() && scalar(&info.ty) {
            info.size = Some(Size::fixed(1));
        }
        Ok((target_cost.add(fn_cost), info))
    }
}

fn literal(lit: &LiteralValue) -> Info {
    let (ty, size) = match lit {
        LiteralValue::Boolean(_) => (Ty::Bool, 1),
        LiteralValue::Int(_) => (Ty::Int, 1),
        LiteralValue::UInt(_) => (Ty::Uint, 1),
        LiteralValue::Double(_) => (Ty::Double, 1),
        LiteralValue::Null => (Ty::Null, 1),
        LiteralValue::String(s) => (Ty::String, s.inner().chars().count() as u64),
        LiteralValue::Bytes(b) => (Ty::Bytes, b.inner().len() as u64),
    };
    let mut info = Info::of(ty);
    info.size = Some(Size::fixed(size));
    info
}

fn select(operand: &Info, field: &str) -> Result<Info, CheckError> {
    match &operand.ty {
        Ty::Object(fields) => match fields.get(field) {
            Some(decl) if operand.decl.is_some() => Ok(Info::from_decl(decl)),
            Some(decl) => Ok(Info::of(decl.ty.clone())),
            None => Err(CheckError {
                message: format!("undefined field '{field}'"),
                field: Some(field.to_owned()),
                at: None,
            }),
        },
        Ty::Map(Some(value)) if operand.decl.is_some() => Ok(Info::from_decl(value)),
        Ty::Map(Some(value)) => Ok(Info::of(value.ty.clone())),
        _ => Ok(Info::of(Ty::Dyn)),
    }
}

#[cfg(test)]
mod tests;
