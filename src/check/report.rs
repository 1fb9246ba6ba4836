//! What `check` found: checks in groups, rendered for people or machines.

use serde::Serialize;

/// Where the docs for each group are.
pub const DOCS: &str = "deploy/README.md";

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works now, needs attention soon.
    Warn,
    /// Broken: `check` exits non-zero.
    Fail,
    /// Not applicable here (cert-manager not installed) or blocked by an earlier failure.
    Skip,
}

impl Status {
    fn symbol(self) -> &'static str {
        match self {
            Status::Ok => "✓",
            Status::Warn => "‼",
            Status::Fail => "×",
            Status::Skip => "–",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Stable identifier (`webhook.ca-bundle.validating`), for scripts and tests.
    pub id: String,
    /// The outcome.
    pub status: Status,
    /// What was found, in a sentence.
    pub message: String,
    /// What to do about it (failures and warnings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Where it is explained (failures and warnings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docs: Option<String>,
}

impl Check {
    /// A passed check.
    pub fn ok(id: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            status: Status::Ok,
            message: message.into(),
            hint: None,
            docs: None,
        }
    }

    /// A failed check with its fix and the README section (`#anchor`) about it.
    pub fn fail(
        id: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
        anchor: &str,
    ) -> Self {
        Self {
            id: id.into(),
            status: Status::Fail,
            message: message.into(),
            hint: Some(hint.into()),
            docs: Some(format!("{DOCS}#{anchor}")),
        }
    }

    /// A warning: like [`Check::fail`] without failing the run.
    pub fn warn(
        id: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
        anchor: &str,
    ) -> Self {
        Self {
            status: Status::Warn,
            ..Self::fail(id, message, hint, anchor)
        }
    }

    /// A check that did not apply or could not run.
    pub fn skip(id: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: Status::Skip,
            ..Self::ok(id, message)
        }
    }
}

/// The checks of one area.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    /// Heading: API, RBAC, Webhook, cert-manager, Controller, Children.
    pub name: &'static str,
    /// Its checks, in order.
    pub checks: Vec<Check>,
}

/// Everything `check` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Whether no check failed (warnings allowed).
    pub passed: bool,
    /// The groups, in order.
    pub groups: Vec<Group>,
}

impl Report {
    /// The report of `groups`: passed unless a check failed.
    pub fn new(groups: Vec<Group>) -> Self {
        let passed = groups
            .iter()
            .flat_map(|g| &g.checks)
            .all(|c| c.status != Status::Fail);
        Self { passed, groups }
    }

    /// All checks of all groups.
    pub fn checks(&self) -> impl Iterator<Item = &Check> {
        self.groups.iter().flat_map(|g| &g.checks)
    }

    /// The report for people: a heading per group, a line per check, hint and docs under
    /// each failure and warning, a summary line.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for group in &self.groups {
            out.push_str(group.name);
            out.push('\n');
            for check in &group.checks {
                out.push_str(&format!("  {} {}\n", check.status.symbol(), check.message));
                if let Some(hint) = &check.hint {
                    out.push_str(&format!("      hint: {hint}\n"));
                }
                if let Some(docs) = &check.docs {
                    out.push_str(&format!("      see:  {docs}\n"));
                }
            }
            out.push('\n');
        }
        let count = |status| self.checks().filter(|c| c.status == status).count();
        out.push_str(&format!(
            "{} passed, {} warnings, {} failed, {} skipped: {}\n",
            count(Status::Ok),
            count(Status::Warn),
            count(Status::Fail),
            count(Status::Skip),
            if self.passed {
                "the installation is healthy"
            } else {
                "fix the failures above"
            }
        ));
        out
    }

    /// The report for machines.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_fails_the_report_and_a_warning_does_not() {
        let group = |checks| Group {
            name: "API",
            checks,
        };
        let warned = Report::new(vec![group(vec![
            Check::ok("a", "fine"),
            Check::warn("b", "soon", "renew", "webhook"),
        ])]);
        assert!(warned.passed);
        let failed = Report::new(vec![group(vec![Check::fail("c", "bad", "fix", "api")])]);
        assert!(!failed.passed);
        let text = failed.text();
        assert!(text.contains("  × bad\n      hint: fix\n      see:  deploy/README.md#api\n"));
        assert!(
            text.ends_with("0 passed, 0 warnings, 1 failed, 0 skipped: fix the failures above\n")
        );
        let json: serde_json::Value = serde_json::from_str(&failed.json()).unwrap();
        assert_eq!(json["passed"], false);
        assert_eq!(json["groups"][0]["checks"][0]["status"], "fail");
        assert_eq!(
            json["groups"][0]["checks"][0]["docs"],
            "deploy/README.md#api"
        );
    }
}
