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

use std::collections::HashMap;
use std::rc::Rc;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};

use super::types::{Decl, Ty};

/// `[min, max]` of a cost, saturating at `u64::MAX` as cel-go's does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub min: u64,
    pub max: u64,
}

/// `[min, max]` of a size (string length, list or map entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size {
    min: u64,
    max: u64,
}

const UNKNOWN: Size = Size {
    min: 0,
    max: u64::MAX,
};
const STRING_TRAVERSAL: f64 = 0.1;
const REGEX_LENGTH: f64 = 0.25;

impl Cost {
    fn fixed(n: u64) -> Self {
        Cost { min: n, max: n }
    }
    fn add(self, o: Cost) -> Cost {
        Cost {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    fn mul(self, o: Cost) -> Cost {
        Cost {
            min: self.min.saturating_mul(o.min),
            max: self.max.saturating_mul(o.max),
        }
    }
    fn union(self, o: Cost) -> Cost {
        Cost {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
}

impl Size {
    fn fixed(n: u64) -> Self {
        Size { min: n, max: n }
    }
    fn add(self, o: Size) -> Size {
        Size {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    fn mul(self, o: Size) -> Size {
        Size {
            min: self.min.saturating_mul(o.min),
            max: self.max.saturating_mul(o.max),
        }
    }
    fn union(self, o: Size) -> Size {
        Size {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
    fn times_cost(self, c: Cost) -> Cost {
        Cost {
            min: self.min.saturating_mul(c.min),
            max: self.max.saturating_mul(c.max),
        }
    }
    fn factor(self, f: f64) -> Cost {
        Cost {
            min: by_factor(self.min, f),
            max: by_factor(self.max, f),
        }
    }
}

/// `multiplyByCostFactor`: rounded up, saturating.
fn by_factor(x: u64, f: f64) -> u64 {
    let product = (x as f64 * f).ceil();
    if product >= 18_446_744_073_709_551_616.0 {
        u64::MAX
    } else {
        product as u64
    }
}

/// The container kind and entry sizes of a list or map built in the expression.
#[derive(Clone, Copy, Debug)]
struct Entry {
    list: bool,
    key: Size,
    val: Size,
}

impl Entry {
    fn union(a: Option<Entry>, b: Option<Entry>) -> Option<Entry> {
        let (a, b) = (a?, b?);
        Some(Entry {
            list: a.list,
            key: a.key.union(b.key),
            val: a.val.union(b.val),
        })
    }
}

/// What the walk knows of one expression.
#[derive(Clone, Debug)]
struct Info {
    ty: Ty,
    /// The schema node the expression reads (cel-go's field path, resolved).
    decl: Option<Rc<Decl>>,
    /// A computed size (literals, call results).
    size: Option<Size>,
    /// A local variable's size, used last.
    var_size: Option<Size>,
    entry: Option<Entry>,
}

impl Info {
    fn of(ty: Ty) -> Self {
        Info {
            ty,
            decl: None,
            size: None,
            var_size: None,
            entry: None,
        }
    }

    fn from_decl(decl: &Rc<Decl>) -> Self {
        Info {
            decl: Some(decl.clone()),
            ..Info::of(decl.ty.clone())
        }
    }

    /// `computeSize`, then unknown.
    fn size(&self) -> Size {
        self.size
            .or_else(|| {
                let decl = self.decl.as_ref().filter(|d| d.sized)?;
                Some(Size {
                    min: 0,
                    max: decl.max_elements,
                })
            })
            .or_else(|| scalar(&self.ty).then(|| Size::fixed(1)))
            .or(self.var_size)
            .unwrap_or(UNKNOWN)
    }

    fn element(&self) -> Option<Rc<Decl>> {
        match &self.ty {
            Ty::List(e) | Ty::Map(e) => e.clone(),
            _ => None,
        }
    }
}

fn scalar(ty: &Ty) -> bool {
    matches!(
        ty,
        Ty::Bool | Ty::Double | Ty::Duration | Ty::Int | Ty::Timestamp | Ty::Uint
    )
}

/// A compile error: what cel-go's checker would say, with the expression it is about.
#[derive(Debug, PartialEq, Eq)]
pub struct CheckError {
    pub message: String,
    /// The selected field, for locating the error in the source.
    pub field: Option<String>,
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
            }),
        },
        Ty::Map(Some(value)) if operand.decl.is_some() => Ok(Info::from_decl(value)),
        Ty::Map(Some(value)) => Ok(Info::of(value.ty.clone())),
        _ => Ok(Info::of(Ty::Dyn)),
    }
}

/// `functionCost` with the Kubernetes library's `EstimateCallCost` consulted first. Returns the
/// call's own cost (arguments included, target not) and what is known of its result.
fn function_cost(
    name: &str,
    target: Option<&Info>,
    args: &[Info],
    arg_costs: &[Cost],
    args_sum: Cost,
) -> (Cost, Info) {
    let o1 = Cost::fixed(1).add(args_sum);
    let arg = |i: usize| args.get(i).map(Info::size).unwrap_or(UNKNOWN);
    let ty_of = |i: usize| args.get(i).map(|a| a.ty.clone()).unwrap_or(Ty::Dyn);
    let stringish = |t: &Ty| matches!(t, Ty::String | Ty::Bytes);
    let plain = |ty: Ty| Info::of(ty);
    let sized = |ty: Ty, size: Size| {
        let mut info = Info::of(ty);
        info.size = Some(size);
        info
    };
    if let Some(t) = target {
        let ts = t.size();
        match name {
            "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" => {
                let result = match name {
                    "isSorted" => Ty::Bool,
                    "indexOf" | "lastIndexOf" => Ty::Int,
                    _ => t.element().map(|d| d.ty.clone()).unwrap_or(Ty::Dyn),
                };
                let cost = match &t.ty {
                    Ty::List(elem) => {
                        let mut el = Cost::fixed(1);
                        if let Some(d) = elem.as_ref().filter(|d| stringish(&d.ty)) {
                            el = el.add(
                                Size {
                                    min: 0,
                                    max: d.max_elements,
                                }
                                .factor(STRING_TRAVERSAL),
                            );
                        }
                        ts.times_cost(el)
                    }
                    _ => ts.factor(STRING_TRAVERSAL),
                };
                return (cost.add(args_sum), plain(result));
            }
            "lowerAscii" | "upperAscii" | "substring" | "trim" => {
                return (
                    ts.factor(STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::String, ts),
                );
            }
            "replace" if args.len() >= 2 => {
                let (from, with) = (arg(0), arg(1));
                let (mut count, mut kept) = (Size::fixed(0), Size::fixed(0));
                if from.min == 0 {
                    count.max = ts.max.saturating_add(1);
                    kept.max = ts.max;
                } else if with.max <= from.min {
                    kept.max = ts.max;
                } else {
                    count.max = (ts.max as f64 / from.min as f64).ceil() as u64;
                }
                if from.max == 0 {
                    count.min = ts.min.saturating_add(1);
                    kept.min = ts.min;
                } else if from.max <= with.min {
                    kept.min = ts.min;
                } else {
                    count.min = (ts.min as f64 / from.max as f64).ceil() as u64;
                }
                let size = count.mul(with).add(kept);
                return (
                    ts.factor(2.0 * STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::String, size),
                );
            }
            "split" => {
                let max = match args.get(1).map(|a| a.ty.clone()) {
                    Some(Ty::Int) => args[1].size.map(|_| ts.max).unwrap_or(ts.max),
                    _ => ts.max,
                };
                let string = Rc::new(Decl::simple(Ty::String, 2));
                return (
                    ts.factor(2.0 * STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::List(Some(string)), Size { min: 0, max }),
                );
            }
            "join" => {
                let elem = t.element().map(|d| Size {
                    min: 0,
                    max: d.max_elements,
                });
                let mut size = elem.map(|e| ts.mul(e)).unwrap_or(Size::fixed(0));
                if !args.is_empty() {
                    let separators = Size {
                        min: ts.min.saturating_sub(1),
                        max: ts.max.saturating_sub(1),
                    };
                    size = size.add(arg(0).mul(separators));
                }
                return (
                    size.factor(STRING_TRAVERSAL).add(args_sum),
                    sized(Ty::String, size),
                );
            }
            "find" | "findAll" if !args.is_empty() => {
                let str_cost = ts.add(Size::fixed(1)).factor(STRING_TRAVERSAL);
                let re_cost = arg(0).factor(REGEX_LENGTH);
                let ty = if name == "find" {
                    Ty::String
                } else {
                    Ty::List(None)
                };
                return (
                    str_cost.mul(re_cost).add(args_sum),
                    sized(
                        ty,
                        Size {
                            min: 0,
                            max: ts.max,
                        },
                    ),
                );
            }
            "matches" if args.len() == 1 => {
                let str_cost = ts.add(Size::fixed(1)).factor(STRING_TRAVERSAL);
                let re_cost = arg(0).factor(REGEX_LENGTH);
                return (str_cost.mul(re_cost).add(args_sum), plain(Ty::Bool));
            }
            "contains" if args.len() == 1 && !matches!(t.ty, Ty::List(_) | Ty::Map(_)) => {
                let cost = ts
                    .factor(STRING_TRAVERSAL)
                    .mul(arg(0).factor(STRING_TRAVERSAL));
                return (cost.add(args_sum), plain(Ty::Bool));
            }
            "startsWith" | "endsWith" if args.len() == 1 => {
                return (
                    arg(0).factor(STRING_TRAVERSAL).add(args_sum),
                    plain(Ty::Bool),
                );
            }
            "format" => return (ts.factor(STRING_TRAVERSAL).add(args_sum), plain(Ty::String)),
            "size" => return (o1, plain(Ty::Int)),
            "charAt" => return (o1, plain(Ty::String)),
            _ => {}
        }
    }
    match name {
        "url" | "quantity" | "isQuantity" | "isURL" | "semver" | "isSemver" | "ip" | "cidr"
        | "isIP" | "isCIDR"
            if args.len() == 1 && target.is_none() =>
        {
            let ty = if name.starts_with("is") {
                Ty::Bool
            } else {
                Ty::Dyn
            };
            (arg(0).factor(STRING_TRAVERSAL).add(args_sum), plain(ty))
        }
        "_&&_" | "_||_" if arg_costs.len() == 2 => {
            let (lhs, rhs) = (arg_costs[0], arg_costs[1]);
            (
                Cost {
                    min: lhs.min,
                    max: lhs.add(rhs).max,
                },
                plain(Ty::Bool),
            )
        }
        "_?_:_" if args.len() == 3 => {
            let size = arg(1).union(arg(2));
            let ty = if args[1].ty == args[2].ty {
                args[1].ty.clone()
            } else {
                Ty::Dyn
            };
            let mut info = sized(ty, size);
            info.entry = Entry::union(args[1].entry, args[2].entry);
            (arg_costs[0].add(arg_costs[1].union(arg_costs[2])), info)
        }
        "_==_" | "_!=_" => (compare(arg(0), arg(1)).add(args_sum), plain(Ty::Bool)),
        "_<_" | "_>_" | "_<=_" | "_>=_" => {
            let (a, b) = (ty_of(0), ty_of(1));
            let cost = if stringish(&a) || stringish(&b) {
                compare(arg(0), arg(1)).add(args_sum)
            } else if a == Ty::Dyn && b == Ty::Dyn {
                o1.union(compare(arg(0), arg(1)).add(args_sum))
            } else {
                o1
            };
            (cost, plain(Ty::Bool))
        }
        "_+_" if args.len() == 2 => {
            let size = arg(0).add(arg(1));
            let entry = Entry::union(args[0].entry, args[1].entry);
            let string = size.factor(STRING_TRAVERSAL).add(args_sum);
            let (a, b) = (ty_of(0), ty_of(1));
            let known = if a == Ty::Dyn { b.clone() } else { a.clone() };
            let (cost, ty) = match known {
                Ty::String | Ty::Bytes => (string, known),
                Ty::List(_) => (o1, list_union(&a, &b)),
                Ty::Dyn => (o1.union(string), Ty::Dyn),
                other => (o1, other),
            };
            let mut info = Info::of(ty);
            if matches!(info.ty, Ty::String | Ty::Bytes | Ty::List(_) | Ty::Dyn) {
                info.size = Some(size);
            }
            info.entry = entry;
            (cost, info)
        }
        "@in" if args.len() == 2 => {
            let cost = match args[1].ty {
                Ty::Map(_) => o1,
                _ => arg(1).factor(1.0).add(args_sum),
            };
            (cost, plain(Ty::Bool))
        }
        "_[_]" if args.len() == 2 => {
            let container = &args[0];
            let mut info = match (container.element(), container.decl.is_some()) {
                (Some(decl), true) => Info::from_decl(&decl),
                (Some(decl), false) => Info::of(decl.ty.clone()),
                (None, _) => Info::of(Ty::Dyn),
            };
            if let Some(entry) = container.entry {
                info.size = Some(entry.val);
            }
            (o1, info)
        }
        "bytes" if matches!(ty_of(0), Ty::String) => {
            let size = arg(0);
            (
                size.factor(STRING_TRAVERSAL).add(args_sum),
                sized(
                    Ty::Bytes,
                    Size {
                        min: size.min,
                        max: size.max.saturating_mul(4),
                    },
                ),
            )
        }
        "string" if matches!(ty_of(0), Ty::Bytes) => {
            let size = arg(0);
            (
                size.factor(STRING_TRAVERSAL).add(args_sum),
                sized(
                    Ty::String,
                    Size {
                        min: size.min / 4,
                        max: size.max,
                    },
                ),
            )
        }
        "matches" | "!_" | "@not_strictly_false" | "has" => (o1, plain(Ty::Bool)),
        "size" | "int" => (o1, plain(Ty::Int)),
        "uint" => (o1, plain(Ty::Uint)),
        "double" => (o1, plain(Ty::Double)),
        "string" => (o1, plain(Ty::String)),
        "bytes" => (o1, plain(Ty::Bytes)),
        "duration" => (o1, plain(Ty::Duration)),
        "timestamp" => (o1, plain(Ty::Timestamp)),
        "-_" | "_-_" | "_*_" | "_/_" | "_%_" => (o1, plain(numeric(&ty_of(0), &ty_of(1)))),
        _ => (o1, plain(Ty::Dyn)),
    }
}

/// Equality and ordering of strings, bytes and containers: a traversal of the smaller side.
fn compare(lhs: Size, rhs: Size) -> Cost {
    let smallest = lhs.max.min(rhs.max);
    let min = u64::from(smallest > 0);
    Size { min, max: smallest }.factor(STRING_TRAVERSAL)
}

fn list_union(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::List(Some(x)), Ty::List(Some(y))) if x.ty == y.ty => a.clone(),
        (Ty::List(Some(_)), Ty::List(None)) => a.clone(),
        (Ty::List(None), Ty::List(Some(_))) => b.clone(),
        _ => Ty::List(None),
    }
}

fn numeric(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Dyn, other) | (other, Ty::Dyn) => other.clone(),
        (Ty::Timestamp, Ty::Timestamp) => Ty::Duration,
        (x, _) => x.clone(),
    }
}

#[cfg(test)]
mod tests;
