//! `deploy/monitoring/prometheusrule.yaml`: a PrometheusRule whose `spec` is a Prometheus rules
//! file, every expression of which parses as PromQL and names only series the operator exports.

use std::{collections::BTreeMap, collections::BTreeSet, path::Path};

use promql_parser::{
    parser::{self, Expr},
    util::{ExprVisitor, walk_expr},
};
use serde::Deserialize;

/// A PrometheusRule: its `spec` is the rules file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PrometheusRule {
    api_version: String,
    kind: String,
    spec: RuleFile,
}

/// The rules file format, as strict as Prometheus' loader: unknown keys are errors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn rules() -> RuleFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let rule: PrometheusRule =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        (rule.api_version.as_str(), rule.kind.as_str()),
        ("monitoring.coreos.com/v1", "PrometheusRule")
    );
    rule.spec
}

/// Every sample name `/metrics` can show: each family with its type's suffixes.
fn exported_series() -> BTreeSet<String> {
    let parts = myapp_operator::run::Parts::new();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &parts.registry).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_count", "_sum"],
            "info" => &["_info"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
    }
    names
}

struct Selectors(Vec<String>);

impl ExprVisitor for Selectors {
    type Error = ();
    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, ()> {
        match expr {
            Expr::VectorSelector(v) => self.0.extend(v.name.clone()),
            Expr::MatrixSelector(m) => self.0.extend(m.vs.name.clone()),
            _ => {}
        }
        Ok(true)
    }
}

#[test]
fn every_alert_expression_parses_and_names_only_exported_series() {
    let exported = exported_series();
    let file = rules();
    assert!(!file.groups.is_empty());
    let mut alerts = BTreeSet::new();
    for group in &file.groups {
        assert!(!group.name.is_empty());
        if let Some(interval) = &group.interval {
            promql_parser::util::parse_duration(interval).unwrap();
        }
        for rule in &group.rules {
            assert!(alerts.insert(rule.alert.clone()), "{} twice", rule.alert);
            assert!(
                rule.alert.starts_with(|c: char| c.is_ascii_uppercase())
                    && rule.alert.chars().all(|c| c.is_ascii_alphanumeric()),
                "{}: alert names are CamelCase",
                rule.alert
            );
            let expr = parser::parse(&rule.expr)
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", rule.alert, rule.expr));
            let mut selectors = Selectors(Vec::new());
            walk_expr(&mut selectors, &expr).unwrap();
            assert!(!selectors.0.is_empty(), "{} reads no series", rule.alert);
            for name in &selectors.0 {
                assert!(
                    exported.contains(name),
                    "{} reads {name}, which /metrics does not export: {exported:?}",
                    rule.alert
                );
            }
            if let Some(for_) = &rule.for_ {
                promql_parser::util::parse_duration(for_)
                    .unwrap_or_else(|e| panic!("{}: for {for_}: {e}", rule.alert));
            }
            assert!(
                matches!(
                    rule.labels.get("severity").map(String::as_str),
                    Some("warning" | "critical")
                ),
                "{}: severity warning or critical",
                rule.alert
            );
            for key in ["summary", "description"] {
                assert!(
                    rule.annotations.contains_key(key),
                    "{}: no {key}",
                    rule.alert
                );
            }
        }
    }
    for wanted in [
        "MyAppWebhookErrors",
        "MyAppReconcileErrors",
        "MyAppWebhookCertificateExpiresSoon",
        "MyAppOperatorNoLeader",
    ] {
        assert!(alerts.contains(wanted), "{wanted} missing: {alerts:?}");
    }
}
