//! Label and field selectors of list and watch requests.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(key: &str, rest: &str, term: &str) -> Result<(String, Vec<String>), String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            format!("unable to parse requirement: {term:?}: expected a set in parentheses")
        })?;
    let values = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    Ok((key.trim().to_string(), values))
}

impl LabelSelector {
    /// Parses the selector syntax (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                let (k, vs) = parse_set(k, rest, &term)?;
                Requirement::NotIn(k, vs)
            } else if let Some((k, rest)) = term.split_once(" in ") {
                let (k, vs) = parse_set(k, rest, &term)?;
                Requirement::In(k, vs)
            } else if term.contains(['<', '>', '(', ')', ' ']) {
                return Err(format!("unable to parse requirement: {term:?}"));
            } else {
                Requirement::Exists(term.clone())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_labels(obj.pointer("/metadata/labels"))
    }

    /// Whether a `metadata.labels` value matches.
    pub fn matches_labels(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` (`metadata.name=x,metadata.namespace!=y`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses the selector; each term is `path=value`, `path==value` or `path!=value`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, equal, value) = if let Some((p, v)) = term.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, true, v)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, true, v)
            } else {
                return Err(format!(
                    "invalid selector: {term:?}; can't understand {term:?}"
                ));
            };
            terms.push((path.trim().to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The field paths the selector names (`metadata.name`).
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(path, _, _)| path.as_str())
    }

    /// The selector with each field label rewritten by `convert` (a resource's field-label
    /// conversion), or the first error it gives.
    pub fn convert_labels(
        self,
        convert: impl Fn(&str) -> Result<String, String>,
    ) -> Result<Self, String> {
        let terms = self
            .0
            .into_iter()
            .map(|(path, equal, value)| Ok((convert(&path)?, equal, value)))
            .collect::<Result<_, String>>()?;
        Ok(FieldSelector(terms))
    }

    /// Whether an object's fields match, read as JSON paths. A missing field compares as the
    /// empty string.
    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_fields(|path| {
            let pointer = format!("/{}", path.replace('.', "/"));
            match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            }
        })
    }

    /// Whether the values `field` gives for the selector's labels match.
    pub fn matches_fields(&self, field: impl Fn(&str) -> String) -> bool {
        self.0
            .iter()
            .all(|(path, equal, value)| (field(path) == *value) == *equal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_handles_every_operator() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (sel, expected) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj),
                expected,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a > 1").is_err());
    }

    #[test]
    fn field_selector_matches_metadata_name() {
        let obj = json!({"metadata": {"name": "x", "namespace": "ns"}});
        assert!(
            FieldSelector::parse("metadata.name=x")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            !FieldSelector::parse("metadata.name=y")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            FieldSelector::parse("metadata.namespace!=other")
                .unwrap()
                .matches(&obj)
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
