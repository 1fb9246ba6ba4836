//! The shape of the source tree, kept by tests rather than by review: no file of a crate
//! imports from a file that imports from it (directly or around a circle), and no file holds
//! more than 800 lines of code before its tests.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use regex::Regex;

const CRATES: [&str; 3] = ["src", "webhook/src", "sandbox/src"];
const MAX_CODE_LINES: usize = 800;

/// A module path inside its crate: `["server", "create"]` for `server/create.rs`, `[]` for
/// `lib.rs`.
type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files
        .into_iter()
        // A binary's root is a crate of its own: it reaches the library through its public API.
        .filter(|file| file.strip_prefix(root).unwrap() != Path::new("main.rs"))
        .map(|file| {
            let relative = file.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts == ["lib"] || parts.last().unwrap() == "mod" {
                parts.pop();
            }
            (parts, file)
        })
        .collect()
}

/// The code of a file before its `#[cfg(test)]` module, without comments and string contents.
fn code(text: &str) -> String {
    let text = Regex::new(r"//[^\n]*").unwrap().replace_all(text, "");
    let text = Regex::new(r"(?s)/\*.*?\*/").unwrap().replace_all(&text, "");
    let text = Regex::new(r#""(?:\\.|[^"\\])*""#)
        .unwrap()
        .replace_all(&text, "\"\"");
    // A visibility, not a use.
    let text = Regex::new(r"pub\(in [^)]*\)")
        .unwrap()
        .replace_all(&text, "pub");
    let tests = Regex::new(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s*)?mod \w+\s*\{").unwrap();
    match tests.find(&text) {
        Some(m) => text[..m.start()].to_owned(),
        None => text.into_owned(),
    }
}

/// `a::{b, c::{d, e}}` as `[a::b, a::c::d, a::c::e]`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![path.trim().to_owned()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.rfind('}').unwrap()]);
    let mut items = vec![String::new()];
    let mut depth = 0;
    for c in inner.chars() {
        match c {
            ',' if depth == 0 => items.push(String::new()),
            _ => {
                depth += i32::from(c == '{') - i32::from(c == '}');
                items.last_mut().unwrap().push(c);
            }
        }
    }
    items
        .iter()
        .filter(|item| !item.trim().is_empty())
        .flat_map(|item| expand(item).into_iter().map(|p| format!("{prefix}{p}")))
        .collect()
}

/// The module file a path from `here` names, if it names one of the crate's.
fn resolve(files: &BTreeMap<Module, PathBuf>, here: &Module, path: &str) -> Option<Module> {
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut base, mut rest) = match *segments.first()? {
        "crate" => (Vec::new(), &segments[1..]),
        "super" | "self" => {
            let mut base = here.clone();
            let mut rest = &segments[..];
            while let Some(&s) = rest.first().filter(|s| **s == "super" || **s == "self") {
                if s == "super" {
                    base.pop();
                }
                rest = &rest[1..];
            }
            (base, rest)
        }
        child if files.contains_key(&[here.clone(), vec![child.to_owned()]].concat()) => {
            (here.clone(), &segments[..])
        }
        _ => return None,
    };
    while let Some(s) = rest.first() {
        let next = [base.clone(), vec![(*s).to_owned()]].concat();
        if !files.contains_key(&next) {
            break;
        }
        base = next;
        rest = &rest[1..];
    }
    Some(base)
}

fn imports(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let files = modules(root);
    let uses = Regex::new(r"\buse\s+([^;]+);").unwrap();
    let inline = Regex::new(r"\b((?:crate|super|self)(?:::\w+)+)").unwrap();
    let child = Regex::new(r"(?:^|[^\w:])(\w+)::").unwrap();
    files
        .iter()
        .map(|(module, file)| {
            let code = code(&std::fs::read_to_string(file).unwrap());
            let mut targets = BTreeSet::new();
            for m in uses.captures_iter(&code) {
                targets.extend(
                    expand(&m[1])
                        .iter()
                        .filter_map(|p| resolve(&files, module, p)),
                );
            }
            for m in inline.captures_iter(&code) {
                targets.extend(resolve(&files, module, &m[1]));
            }
            for m in child.captures_iter(&code) {
                let named = [module.clone(), vec![m[1].to_owned()]].concat();
                if files.contains_key(&named) {
                    targets.insert(named);
                }
            }
            targets.remove(module);
            (module.clone(), targets)
        })
        .collect()
}

/// The import circles of a graph: its strongly connected components of more than one file.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<BTreeSet<Module>> {
    // Two files are on a circle when each reaches the other.
    let reach = |from: &Module| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Module, BTreeSet<Module>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<BTreeSet<Module>> = Vec::new();
    for (m, reached) in &reaches {
        let circle: BTreeSet<Module> = reached
            .iter()
            .filter(|other| reaches[other].contains(*m))
            .cloned()
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

#[test]
fn no_file_of_a_crate_imports_around_a_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    for krate in CRATES {
        let graph = imports(&workspace.join(krate));
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        assert!(edges > 10, "{krate}: the scan finds the imports ({edges})");
        let found = circles(&graph);
        assert!(found.is_empty(), "{krate}: import circles {found:?}");
    }
}

#[test]
fn the_circle_check_sees_a_circle_through_use_and_inline_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("server")).unwrap();
    for (file, text) in [
        ("lib.rs", "mod a; mod b; mod server;"),
        ("a.rs", "use crate::{b::Thing, server};"),
        ("b.rs", "pub fn f() { crate::a::g() }"),
        ("server.rs", "mod watch; fn r() { watch::w() }"),
        (
            "server/watch.rs",
            "use super::State;\n#[cfg(test)]\nmod tests { use crate::a; }",
        ),
    ] {
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    let found = circles(&imports(dir.path()));
    let names: Vec<Vec<String>> = found
        .iter()
        .map(|c| c.iter().map(|m| m.join("/")).collect())
        .collect();
    assert_eq!(names, [vec!["a", "b"], vec!["server", "server/watch"]]);
}

#[test]
fn no_source_file_holds_more_than_800_lines_of_code_before_its_tests() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut largest = (0, PathBuf::new());
    for krate in CRATES {
        for (_, file) in modules(&workspace.join(krate)) {
            let lines = code(&std::fs::read_to_string(&file).unwrap())
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count();
            assert!(
                lines <= MAX_CODE_LINES,
                "{}: {lines} lines of code",
                file.display()
            );
            largest = largest.max((lines, file));
        }
    }
    assert!(largest.0 > 100, "the count sees code: {largest:?}");
}
