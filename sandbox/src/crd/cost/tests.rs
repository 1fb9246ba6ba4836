//! Cost cases from cel-go's own tests (`checker/cost_test.go`, v0.23.2, `TestCost`) and from
//! apiextensions-apiserver's (`pkg/apiserver/schema/cel/compilation_test.go`, v0.33,
//! `TestCostEstimation`), each under the name it has there.

use std::rc::Rc;

use serde_json::{Value, json};

use super::{Cost, estimate};
use crate::crd::rules::compile;
use crate::crd::types::{self, Decl, Ty};

/// A variable of cel-go's test, with its size hint (`testCostEstimator`) if it has one.
fn var(ty: Ty, hint: Option<u64>) -> Rc<Decl> {
    Rc::new(Decl {
        ty,
        max_elements: hint.unwrap_or(0),
        min_size: 0,
        sized: hint.is_some(),
    })
}

fn cel_go(expr: &str, vars: &[(&str, Rc<Decl>)]) -> (u64, u64) {
    let parsed = cel::parser::Parser::new().parse(expr).expect("parses");
    let Cost { min, max } = estimate(&parsed, vars).expect("checks").cost;
    (min, max)
}

#[test]
fn literal_cases_cost_what_cel_go_estimates() {
    let cases: &[(&str, &str, (u64, u64))] = &[
        ("const", r#""Hello World!""#, (0, 0)),
        ("create list", "[1, 2, 3]", (10, 10)),
        ("create map", r#"{"a": 1, "b": 2, "c": 3}"#, (30, 30)),
        (
            "all comprehension on literal",
            "[1, 2, 3].all(x, true)",
            (20, 20),
        ),
        (
            "variable cost function with constant",
            "'123'.matches('[0-9]')",
            (2, 2),
        ),
        ("or", "true || false", (0, 0)),
        ("and", "true && false", (0, 0)),
        ("lt", "1 < 2", (1, 1)),
        ("eq", "1 == 2", (1, 1)),
        ("in", "2 in [1, 2, 3]", (13, 13)),
        ("plus", "1 + 1", (1, 1)),
        ("ternary", "true ? 1 : 2", (0, 0)),
        ("string size", r#"size("123")"#, (1, 1)),
        ("bytes size", r#"size(b"123")"#, (1, 1)),
        ("int to string conversion", "string(1)", (1, 1)),
        (
            "nested subexpression operators",
            "((5 != 6) == (1 == 2)) == ((3 <= 4) == (9 != 9))",
            (7, 7),
        ),
        (
            ".filter list literal",
            "[1,2,3,4,5].filter(x, x % 2 == 0)",
            (41, 101),
        ),
        (".map list literal", "[1,2,3,4,5].map(x, x)", (86, 86)),
        (
            ".map.filter list literal",
            "[1,2,3,4,5].map(x, x).filter(x, x % 2 == 0)",
            (117, 177),
        ),
        (
            ".map.exists list literal",
            "[1,2,3,4,5].map(x, x).exists(x, x == 5) == true",
            (108, 118),
        ),
        (
            ".map.map list literal",
            "[1,2,3,4,5].map(x, x).map(x, x)",
            (162, 162),
        ),
        (
            ".map list literal selection",
            "[1,2,3,4,5].map(x, x)[4]",
            (87, 87),
        ),
        (
            "nested array selection",
            "[[1,2],[1,2],[1,2],[1,2],[1,2]][4]",
            (61, 61),
        ),
        (
            "nested map selection",
            "{'a': [1,2], 'b': [1,2], 'c': [1,2], 'd': [1,2], 'e': [1,2]}.b",
            (81, 81),
        ),
        (
            "comprehension on nested list",
            "[[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]].all(y, y.all(y, y == 1))",
            (76, 136),
        ),
        (
            "comprehension on transformed nested list",
            "[1,2,3,4,5].map(x, [x, x]).all(y, y.all(y, y == 1))",
            (157, 217),
        ),
        (
            "comprehension chaining with concat",
            "[1,2,3,4,5].map(x, x).map(x, x) + [1]",
            (173, 173),
        ),
        (
            "nested comprehension",
            "[1,2,3].all(i, i in [1,2,3].map(j, j + j))",
            (20, 230),
        ),
        (
            "nested dyn comprehension",
            "dyn([1,2,3]).all(i, i in dyn([1,2,3]).map(j, j + j))",
            (21, 234),
        ),
    ];
    for (name, expr, wanted) in cases {
        assert_eq!(
            cel_go(expr, &[]),
            *wanted,
            "cel-go TestCost case {name:?}: {expr}"
        );
    }
}

#[test]
fn cases_over_sized_variables_cost_what_cel_go_estimates() {
    let int_list = |hint| var(Ty::List(Some(var(Ty::Int, None))), hint);
    let string = |hint| var(Ty::String, hint);
    let bytes = |hint| var(Ty::Bytes, hint);
    let boolean = || var(Ty::Bool, None);
    let nested = var(Ty::List(Some(int_list(Some(10)))), Some(50));
    let all_types = var(
        Ty::Object([("single_int32".to_owned(), var(Ty::Int, None))].into()),
        None,
    );
    let all_map = var(Ty::Map(Some(all_types.clone())), Some(10));
    type Vars<'a> = Vec<(&'a str, Rc<Decl>)>;
    let cases: Vec<(&str, &str, Vars, (u64, u64))> = vec![
        ("identity", "input", vec![("input", int_list(None))], (1, 1)),
        (
            "select: map",
            "input['key']",
            vec![("input", var(Ty::Map(Some(string(None))), None))],
            (2, 2),
        ),
        (
            "select: field",
            "input.single_int32",
            vec![("input", all_types.clone())],
            (2, 2),
        ),
        (
            "select: field test only",
            "has(input.single_int32)",
            vec![("input", all_types.clone())],
            (2, 2),
        ),
        (
            "all comprehension",
            "input.all(x, true)",
            vec![("input", int_list(Some(100)))],
            (2, 302),
        ),
        (
            "nested all comprehension",
            "input.all(x, x.all(y, true))",
            vec![("input", nested)],
            (2, 1752),
        ),
        (
            "variable cost function",
            "input.matches('[0-9]')",
            vec![("input", string(Some(500)))],
            (3, 103),
        ),
        (
            "or accumulated branch cost",
            "a || b || c || d",
            vec![
                ("a", boolean()),
                ("b", boolean()),
                ("c", boolean()),
                ("d", boolean()),
            ],
            (1, 4),
        ),
        (
            "bytes to string conversion",
            "string(input)",
            vec![("input", bytes(Some(500)))],
            (1, 51),
        ),
        (
            "bytes to string conversion equality",
            "string(input) == string(input)",
            vec![("input", bytes(Some(500)))],
            (3, 152),
        ),
        (
            "string to bytes conversion",
            "bytes(input)",
            vec![("input", string(Some(500)))],
            (1, 51),
        ),
        (
            "string to bytes conversion equality",
            "bytes(input) == bytes(input)",
            vec![("input", string(Some(500)))],
            (3, 302),
        ),
        (
            "contains",
            "input.contains(arg1)",
            vec![("input", string(Some(500))), ("arg1", string(Some(500)))],
            (2, 2502),
        ),
        (
            "matches",
            r"input.matches('\\d+a\\d+b')",
            vec![("input", string(Some(500)))],
            (3, 103),
        ),
        (
            "startsWith",
            "input.startsWith(arg1)",
            vec![("input", string(None)), ("arg1", string(Some(500)))],
            (2, 52),
        ),
        (
            "endsWith",
            "input.endsWith(arg1)",
            vec![("input", string(None)), ("arg1", string(Some(500)))],
            (2, 52),
        ),
        (
            "size receiver",
            "input.size()",
            vec![("input", string(None))],
            (2, 2),
        ),
        (
            "ternary eval",
            "(x > 2 ? input1 : input2).all(y, true)",
            vec![
                ("x", var(Ty::Int, None)),
                ("input1", int_list(Some(1))),
                ("input2", int_list(Some(1))),
            ],
            (4, 7),
        ),
        (
            "comprehension over map",
            "input.all(k, input[k].single_int32 > 3)",
            vec![("input", all_map)],
            (2, 82),
        ),
        (
            "list concat",
            "(list1 + list2).all(x, true)",
            vec![("list1", int_list(Some(10))), ("list2", int_list(Some(10)))],
            (4, 64),
        ),
        (
            "str concat",
            r#""abcdefg".contains(str1 + str2)"#,
            vec![("str1", string(Some(10))), ("str2", string(Some(10)))],
            (2, 6),
        ),
        (
            "list size comparison",
            "list1.size() == list2.size()",
            vec![("list1", int_list(None)), ("list2", int_list(None))],
            (5, 5),
        ),
        (
            "timestamp equality check",
            "timestamp1 == timestamp2",
            vec![
                ("timestamp1", var(Ty::Timestamp, None)),
                ("timestamp2", var(Ty::Timestamp, None)),
            ],
            (3, 3),
        ),
    ];
    for (name, expr, vars, wanted) in cases {
        assert_eq!(
            cel_go(expr, &vars),
            wanted,
            "cel-go TestCost case {name:?}: {expr}"
        );
    }
}

/// `genArrayWithRule`, `genMapWithRule`, `genStringWithRule`, `genObjectArrayWithRule`.
fn array(item: Value, max_items: Option<i64>) -> Value {
    let mut s = json!({"type": "array", "items": item});
    if let Some(n) = max_items {
        s["maxItems"] = json!(n);
    }
    s
}

fn map(value: Value, max_properties: Option<i64>) -> Value {
    let mut s = json!({"type": "object", "additionalProperties": value});
    if let Some(n) = max_properties {
        s["maxProperties"] = json!(n);
    }
    s
}

fn string(max_length: Option<i64>) -> Value {
    let mut s = json!({"type": "string"});
    if let Some(n) = max_length {
        s["maxLength"] = json!(n);
    }
    s
}

fn object_item() -> Value {
    json!({"type": "object", "required": ["required"], "properties": {
        "required": {"type": "string"}, "optional": {"type": "string"}}})
}

fn max_cost(schema: &Value, rule: &str) -> u64 {
    let decl = types::decl(schema, false).expect("declares");
    compile(rule, &decl).expect("compiles").cost.max
}

#[test]
fn schema_cases_cost_what_apiextensions_estimates() {
    let number = || json!({"type": "number"});
    let boolean = || json!({"type": "boolean"});
    let int_or_string = || json!({"x-kubernetes-int-or-string": true});
    let format = |f: &str| json!({"type": "string", "format": f});
    type Gen = Box<dyn Fn(Option<i64>) -> Value>;
    let cases: Vec<(&str, Gen, &str, u64, i64, u64)> = vec![
        (
            "number array with all",
            Box::new(move |m| array(number(), m)),
            "self.all(x, true)",
            4718591,
            10,
            32,
        ),
        (
            "string array with all",
            Box::new(|m| array(string(None), m)),
            "self.all(x, true)",
            3145727,
            20,
            62,
        ),
        (
            "boolean array with all",
            Box::new(move |m| array(boolean(), m)),
            "self.all(x, true)",
            1887437,
            5,
            17,
        ),
        (
            "array of number arrays with all",
            Box::new(move |m| array(array(number(), None), m)),
            "self.all(x, true)",
            3145727,
            100,
            302,
        ),
        (
            "array of objects with all",
            Box::new(|m| array(object_item(), m)),
            "self.all(x, true)",
            555128,
            50,
            152,
        ),
        (
            "map of numbers with all",
            Box::new(move |m| map(number(), m)),
            "self.all(x, true)",
            1348169,
            10,
            32,
        ),
        (
            "map of strings with all",
            Box::new(|m| map(string(None), m)),
            "self.all(x, true)",
            1179647,
            3,
            11,
        ),
        (
            "map of booleans with all",
            Box::new(move |m| map(boolean(), m)),
            "self.all(x, true)",
            943718,
            100,
            302,
        ),
        (
            "string with contains",
            Box::new(string),
            "self.contains('test')",
            314574,
            10,
            5,
        ),
        (
            "string with startsWith",
            Box::new(string),
            "self.startsWith('test')",
            2,
            15,
            2,
        ),
        (
            "concat string",
            Box::new(string),
            r#"size(self + "hello") > size("hello")"#,
            314578,
            4,
            7,
        ),
        (
            "index of array with numbers",
            Box::new(move |m| array(number(), m)),
            "self[1] == 0.0",
            2,
            5000,
            2,
        ),
        (
            "index of array with strings",
            Box::new(|m| array(string(None), m)),
            "self[1] == self[1]",
            314577,
            8,
            314577,
        ),
        (
            "regex matches simple",
            Box::new(string),
            r#"self.matches("x")"#,
            314574,
            50,
            22,
        ),
        (
            "regex matches empty string",
            Box::new(string),
            r#""".matches("(((((((((())))))))))[0-9]")"#,
            7,
            10,
            7,
        ),
        (
            "regex matches empty regex",
            Box::new(string),
            r#"self.matches("")"#,
            1,
            100,
            1,
        ),
        (
            "set string maxLength to zero",
            Box::new(string),
            r#"self == "x""#,
            2,
            0,
            1,
        ),
        (
            "set maxLength greater than estimated maxLength",
            Box::new(move |m| array(number(), m)),
            "self.all(x, x == 0.0)",
            6291454,
            3 * 1024 * 2048,
            25165826,
        ),
        (
            "int-or-string array with all",
            Box::new(move |m| array(int_or_string(), m)),
            "self.all(x, true)",
            4718591,
            10,
            32,
        ),
        (
            "index of array with int-or-strings",
            Box::new(move |m| array(int_or_string(), m)),
            "self[0] == 5",
            3,
            10,
            3,
        ),
        (
            "index of array of objects",
            Box::new(|m| array(object_item(), m)),
            "self[0] == null",
            2,
            422,
            2,
        ),
        (
            "index of array of array of numnbers",
            Box::new(move |m| array(array(number(), None), m)),
            "self[0][0] == -1.0",
            3,
            51,
            3,
        ),
        (
            "duration array with all",
            Box::new(move |m| array(format("duration"), m)),
            "self.all(x, true)",
            2359295,
            5,
            17,
        ),
        (
            "index of duration array",
            Box::new(move |m| array(format("duration"), m)),
            "self[0].getHours() == 2",
            4,
            525,
            4,
        ),
        (
            "date array with all",
            Box::new(move |m| array(format("date"), m)),
            "self.all(x, true)",
            725936,
            15,
            47,
        ),
        (
            "date-time array with all",
            Box::new(move |m| array(format("date-time"), m)),
            "self.all(x, true)",
            428963,
            25,
            77,
        ),
        (
            "map of int-or-strings with all",
            Box::new(move |m| map(int_or_string(), m)),
            "self.all(x, true)",
            1348169,
            15,
            47,
        ),
    ];
    for (name, generate, rule, calc, set_max, set_cost) in cases {
        assert_eq!(
            max_cost(&generate(None), rule),
            calc,
            "TestCostEstimation {name:?} without limits"
        );
        assert_eq!(
            max_cost(&generate(Some(set_max)), rule),
            set_cost,
            "TestCostEstimation {name:?} with {set_max}"
        );
    }
}

#[test]
fn quadratic_loops_exceed_the_per_rule_limit_without_bounds() {
    // TestCostEstimation "O(n^2) loop with numbers": over the limit unbounded, 352 with 10 items.
    let numbers = |m| array(json!({"type": "number"}), m);
    let rule = "self.all(x, self.all(y, true))";
    assert!(max_cost(&numbers(None), rule) > crate::crd::rules::STATIC_ESTIMATED_COST_LIMIT);
    assert_eq!(max_cost(&numbers(Some(10)), rule), 352);
    let cubic = "self.all(x, self.all(y, self.all(z, true)))";
    assert_eq!(max_cost(&numbers(Some(10)), cubic), 3552);
}

#[test]
fn field_references_are_checked_against_the_schema() {
    let schema = json!({"type": "object", "properties": {"replicas": {"type": "integer"}}});
    let decl = types::decl(&schema, true).expect("declares");
    assert!(compile("self.replicas >= 0 && self.metadata.name != ''", &decl).is_ok());
    let error = compile("self.replica >= 0", &decl).unwrap_err();
    assert!(
        error.starts_with("ERROR: <input>:1:5: undefined field 'replica'"),
        "{error}"
    );
    assert!(compile("self.?replicas.orValue(0) >= 0", &decl).is_ok());
    let error = compile("self.?replica.orValue(0) >= 0", &decl).unwrap_err();
    assert!(error.contains("undefined field 'replica'"), "{error}");
    let error = compile("other >= 0", &decl).unwrap_err();
    assert!(error.contains("undeclared reference to 'other'"), "{error}");
}
