//! The call errors of cel-go's type checker (`checker/checker.go`, v0.23) that the types the cost
//! walk derives can show: a function no library declares (`undeclared reference to 'f' (in
//! container '')`), a known function called with a number of arguments none of its overloads
//! takes, and an operator applied to operands of known types it has no overload for (`found no
//! matching overload for '_+_' applied to '(string, int)'`, worded by `checker/errors.go` and
//! `checker/format.go`).
//!
//! Only what is certain is refused: an operand or argument of unknown type (`dyn`, a library
//! type such as a quantity) matches every overload, and functions are known by name and arity
//! across cel-go's standard library, its extensions and the Kubernetes libraries
//! (k8s.io/apiserver `pkg/cel/library`) that a CRD rule may call in 1.33.

use super::types::Ty;

/// Why a call does not type-check, and the text that locates it in the rule.
pub(super) struct CallError {
    pub(super) message: String,
    /// The text cel-go's position points into, and how far into it.
    pub(super) at: (String, usize),
}

/// Functions by name: the argument counts (target excluded) of their member and global forms.
/// `usize::MAX` stands for any count.
const FUNCTIONS: &[(&str, &[usize], &[usize])] = &[
    // cel-go standard library and macros the parser may leave as calls.
    ("size", &[0], &[1]),
    ("contains", &[1], &[]),
    ("startsWith", &[1], &[]),
    ("endsWith", &[1], &[]),
    ("matches", &[1], &[2]),
    ("has", &[], &[1]),
    ("all", &[2, 3], &[]),
    ("exists", &[2, 3], &[]),
    ("exists_one", &[2, 3], &[]),
    ("existsOne", &[2, 3], &[]),
    ("map", &[2, 3], &[]),
    ("filter", &[2], &[]),
    ("transformList", &[2, 3], &[]),
    ("transformMap", &[2, 3], &[]),
    ("transformMapEntry", &[2, 3], &[]),
    ("int", &[], &[1]),
    ("uint", &[], &[1]),
    ("double", &[], &[1]),
    ("string", &[], &[1]),
    ("bytes", &[], &[1]),
    ("bool", &[], &[1]),
    ("dyn", &[], &[1]),
    ("type", &[], &[1]),
    ("duration", &[], &[1]),
    ("timestamp", &[], &[1]),
    ("getFullYear", &[0, 1], &[]),
    ("getMonth", &[0, 1], &[]),
    ("getDayOfYear", &[0, 1], &[]),
    ("getDayOfMonth", &[0, 1], &[]),
    ("getDate", &[0, 1], &[]),
    ("getDayOfWeek", &[0, 1], &[]),
    ("getHours", &[0, 1], &[]),
    ("getMinutes", &[0, 1], &[]),
    ("getSeconds", &[0, 1], &[]),
    ("getMilliseconds", &[0, 1], &[]),
    // Optionals.
    ("hasValue", &[0], &[]),
    ("value", &[0], &[]),
    ("or", &[1], &[]),
    ("orValue", &[1], &[]),
    ("optMap", &[2], &[]),
    ("optFlatMap", &[2], &[]),
    // cel-go strings and lists extensions, Kubernetes lists and regex libraries.
    ("charAt", &[1], &[]),
    ("indexOf", &[1, 2], &[]),
    ("lastIndexOf", &[1, 2], &[]),
    ("lowerAscii", &[0], &[]),
    ("upperAscii", &[0], &[]),
    ("replace", &[2, 3], &[]),
    ("split", &[1, 2], &[]),
    ("substring", &[1, 2], &[]),
    ("trim", &[0], &[]),
    ("join", &[0, 1], &[]),
    ("reverse", &[0], &[]),
    ("format", &[1], &[]),
    ("quote", &[], &[1]),
    ("isSorted", &[0], &[]),
    ("sum", &[0], &[]),
    ("min", &[0], &[]),
    ("max", &[0], &[]),
    ("distinct", &[0], &[]),
    ("flatten", &[0, 1], &[]),
    ("slice", &[2], &[]),
    ("sort", &[0], &[]),
    ("sortBy", &[2], &[]),
    ("find", &[1], &[]),
    ("findAll", &[1, 2], &[]),
    // Kubernetes url, quantity, ip/cidr, semver and format libraries.
    ("url", &[], &[1]),
    ("isURL", &[], &[1]),
    ("getScheme", &[0], &[]),
    ("getHost", &[0], &[]),
    ("getHostname", &[0], &[]),
    ("getPort", &[0], &[]),
    ("getEscapedPath", &[0], &[]),
    ("getQuery", &[0], &[]),
    ("quantity", &[], &[1]),
    ("isQuantity", &[], &[1]),
    ("sign", &[0], &[]),
    ("isInteger", &[0], &[]),
    ("asInteger", &[0], &[]),
    ("asApproximateFloat", &[0], &[]),
    ("add", &[1], &[]),
    ("sub", &[1], &[]),
    ("isGreaterThan", &[1], &[]),
    ("isLessThan", &[1], &[]),
    ("compareTo", &[1], &[]),
    ("ip", &[0], &[1]),
    ("isIP", &[], &[1]),
    ("cidr", &[], &[1]),
    ("isCIDR", &[], &[1]),
    ("family", &[0], &[]),
    ("isUnspecified", &[0], &[]),
    ("isLoopback", &[0], &[]),
    ("isLinkLocalMulticast", &[0], &[]),
    ("isLinkLocalUnicast", &[0], &[]),
    ("isGlobalUnicast", &[0], &[]),
    ("containsIP", &[1], &[]),
    ("containsCIDR", &[1], &[]),
    ("masked", &[0], &[]),
    ("prefixLength", &[0], &[]),
    ("semver", &[], &[1, 2]),
    ("isSemver", &[], &[1, 2]),
    ("major", &[0], &[]),
    ("minor", &[0], &[]),
    ("patch", &[0], &[]),
    ("validate", &[1], &[]),
];

/// The check of a call (operator or function) whose target and arguments have the given types.
pub(super) fn call(name: &str, target: Option<&Ty>, args: &[Ty]) -> Result<(), CallError> {
    if name.starts_with('_') || name.starts_with('@') || name.ends_with('_') {
        return operator(name, args);
    }
    let Some((_, member, global)) = FUNCTIONS.iter().find(|(n, _, _)| *n == name) else {
        // Namespaced functions (`sets.contains`, `math.greatest`, ...) are not told apart.
        if name.contains('.') {
            return Ok(());
        }
        return Err(CallError {
            message: format!("undeclared reference to '{name}' (in container '')"),
            at: located(name, target.is_some()),
        });
    };
    let counts = if target.is_some() { member } else { global };
    if counts.contains(&args.len()) || counts.contains(&usize::MAX) {
        return Ok(());
    }
    let mut signature = String::new();
    if let Some(t) = target {
        signature.push_str(&format_type(t));
        signature.push('.');
    }
    let list: Vec<String> = args.iter().map(format_type).collect();
    signature.push_str(&format!("({})", list.join(", ")));
    Err(CallError {
        message: format!("found no matching overload for '{name}' applied to '{signature}'"),
        at: located(name, target.is_some()),
    })
}

/// cel-go points a call at its `(` when it has a target, at its name otherwise.
fn located(name: &str, member: bool) -> (String, usize) {
    if member {
        (format!(".{name}("), name.len() + 1)
    } else {
        (format!("{name}("), 0)
    }
}

/// The operators of cel-go's standard library over the types this walk knows.
fn operator(name: &str, args: &[Ty]) -> Result<(), CallError> {
    use Ty::{Bool, Bytes, Double, Duration, Int, List, Null, Timestamp, Uint};
    if args.iter().any(|t| !known(t)) {
        return Ok(());
    }
    let numeric = |t: &Ty| matches!(t, Int | Uint | Double);
    let same = |a: &Ty, b: &Ty| std::mem::discriminant(a) == std::mem::discriminant(b);
    let ok = match (name, args) {
        ("_+_", [a, b]) => {
            (same(a, b)
                && matches!(
                    a,
                    Int | Uint | Double | Ty::String | Bytes | List(_) | Duration
                ))
                || matches!((a, b), (Timestamp, Duration) | (Duration, Timestamp))
        }
        ("_-_", [a, b]) => {
            (same(a, b) && matches!(a, Int | Uint | Double | Duration | Timestamp))
                || matches!((a, b), (Timestamp, Duration))
        }
        ("_*_" | "_/_", [a, b]) => same(a, b) && numeric(a),
        ("_%_", [a, b]) => same(a, b) && matches!(a, Int | Uint),
        ("_<_" | "_<=_" | "_>_" | "_>=_", [a, b]) => {
            (numeric(a) && numeric(b))
                || (same(a, b) && matches!(a, Ty::String | Bytes | Bool | Timestamp | Duration))
        }
        // Equality takes any two values of one type; numbers and null are left alone.
        ("_==_" | "_!=_", [a, b]) => {
            same(a, b) || numeric(a) && numeric(b) || matches!(a, Null) || matches!(b, Null)
        }
        ("_&&_" | "_||_", [a, b]) => matches!((a, b), (Bool, Bool)),
        ("!_", [a]) => matches!(a, Bool),
        ("-_", [a]) => matches!(a, Int | Double),
        _ => true,
    };
    if ok {
        return Ok(());
    }
    let list: Vec<String> = args.iter().map(format_type).collect();
    let symbol = match name {
        "_+_" => "+",
        "_-_" | "-_" => "-",
        "_*_" => "*",
        "_/_" => "/",
        "_%_" => "%",
        "_<_" => "<",
        "_<=_" => "<=",
        "_>_" => ">",
        "_>=_" => ">=",
        "_==_" => "==",
        "_!=_" => "!=",
        "_&&_" => "&&",
        "_||_" => "||",
        _ => "!",
    };
    Err(CallError {
        message: format!(
            "found no matching overload for '{name}' applied to '({})'",
            list.join(", ")
        ),
        at: (symbol.to_owned(), 0),
    })
}

/// Whether the type is one whose overloads are certain here.
fn known(t: &Ty) -> bool {
    matches!(
        t,
        Ty::Bool
            | Ty::Int
            | Ty::Uint
            | Ty::Double
            | Ty::String
            | Ty::Bytes
            | Ty::Duration
            | Ty::Timestamp
            | Ty::Null
            | Ty::List(_)
            | Ty::Map(_)
    )
}

/// `FormatCELType`.
fn format_type(t: &Ty) -> String {
    match t {
        Ty::Bool => "bool".into(),
        Ty::Int => "int".into(),
        Ty::Uint => "uint".into(),
        Ty::Double => "double".into(),
        Ty::String => "string".into(),
        Ty::Bytes => "bytes".into(),
        Ty::Duration => "duration".into(),
        Ty::Timestamp => "timestamp".into(),
        Ty::Null => "null".into(),
        Ty::List(e) => format!(
            "list({})",
            e.as_ref().map_or("dyn".into(), |d| format_type(&d.ty))
        ),
        Ty::Map(v) => format!(
            "map(string, {})",
            v.as_ref().map_or("dyn".into(), |d| format_type(&d.ty))
        ),
        Ty::Object(_) => "object".into(),
        Ty::Dyn => "dyn".into(),
    }
}

#[cfg(test)]
mod tests;
