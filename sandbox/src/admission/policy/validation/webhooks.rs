//! `ValidateMutatingWebhookConfiguration`, `ValidateValidatingWebhookConfiguration` and their
//! `...Update` forms (`pkg/apis/admissionregistration/validation/validation.go`), with
//! `apiserver/pkg/util/webhook/validation.go` for the client config. An update relaxes what the
//! stored object already breaks (side effects, review versions, unique names) and skips match
//! conditions that did not change, as the real update validation does.

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, MutatingWebhook};
use serde_json::Value;

use super::fields::{
    Path, dns_subdomain, duplicate, go_strings, invalid, not_supported, quote, required,
};
use super::rules::{label_selector, match_conditions, rule_with_operations};
use crate::schema::FieldError;

const NO_SIDE_EFFECTS: &[&str] = &["None", "NoneOnDryRun"];
const SIDE_EFFECTS: &[&str] = &["None", "NoneOnDryRun", "Some", "Unknown"];
const REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// What the update form relaxes, from the stored configuration (all strict on create).
struct Options {
    require_no_side_effects: bool,
    require_recognized_review_version: bool,
    require_unique_names: bool,
    /// The stored webhooks' match conditions, when an update leaves them all as they were.
    unchanged_conditions: bool,
}

fn webhooks(config: &Value) -> Vec<Value> {
    config
        .get("webhooks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn strings(webhook: &Value, key: &str) -> Vec<String> {
    webhook
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn options(new: &[Value], old: Option<&[Value]>) -> Options {
    let Some(old) = old else {
        return Options {
            require_no_side_effects: true,
            require_recognized_review_version: true,
            require_unique_names: true,
            unchanged_conditions: false,
        };
    };
    let mut names: Vec<&str> = Vec::new();
    let unique = old.iter().all(|w| {
        let name = w.get("name").and_then(Value::as_str).unwrap_or("");
        let seen = names.contains(&name);
        names.push(name);
        !seen
    });
    let conditions = |w: &Value| w.get("matchConditions").cloned();
    Options {
        require_no_side_effects: old.iter().all(|w| {
            w.get("sideEffects")
                .and_then(Value::as_str)
                .is_some_and(|s| NO_SIDE_EFFECTS.contains(&s))
        }),
        require_recognized_review_version: old.iter().all(|w| {
            let versions = strings(w, "admissionReviewVersions");
            versions.is_empty()
                || versions
                    .iter()
                    .any(|v| REVIEW_VERSIONS.contains(&v.as_str()))
        }),
        require_unique_names: unique,
        unchanged_conditions: new.len() == old.len()
            && new
                .iter()
                .zip(old)
                .all(|(n, o)| conditions(n) == conditions(o)),
    }
}

/// The field errors of a webhook configuration; `old` is the stored one on an update.
pub(super) fn validate(config: &Value, old: Option<&Value>, mutating: bool) -> Vec<FieldError> {
    let hooks = webhooks(config);
    let old_hooks = old.map(webhooks);
    let options = options(&hooks, old_hooks.as_deref());
    let mut errors = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, raw) in hooks.iter().enumerate() {
        let path = Path::new("webhooks").index(i);
        errors.extend(webhook(raw, &options, mutating, &path));
        errors.extend(review_versions(
            &strings(raw, "admissionReviewVersions"),
            options.require_recognized_review_version,
            &path.child("admissionReviewVersions"),
        ));
        let name = raw.get("name").and_then(Value::as_str).unwrap_or("");
        if options.require_unique_names && !name.is_empty() {
            if names.iter().any(|n| n == name) {
                errors.push(duplicate(&path.child("name"), &quote(name)));
            } else {
                names.push(name.to_owned());
            }
        }
    }
    errors
}

/// `validateMutatingWebhook` / `validateValidatingWebhook`.
fn webhook(raw: &Value, options: &Options, mutating: bool, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    // The `caBundle` is not checked, and Go's base64 reads the line breaks PEM-wrapped bundles
    // carry, which the typed decode would refuse.
    let mut typed = raw.clone();
    if let Some(config) = typed.get_mut("clientConfig").and_then(Value::as_object_mut) {
        config.remove("caBundle");
    }
    let hook: MutatingWebhook = match serde_json::from_value(typed) {
        Ok(hook) => hook,
        Err(e) => {
            return vec![invalid(path, &quote(&e.to_string()), "cannot be decoded")];
        }
    };
    errors.extend(fully_qualified_name(&hook.name, &path.child("name")));
    for (i, rule) in hook.rules.iter().flatten().enumerate() {
        errors.extend(rule_with_operations(rule, &path.child("rules").index(i)));
    }
    let enums: [(&str, Option<&str>, &[&str]); 2] = [
        (
            "failurePolicy",
            hook.failure_policy.as_deref(),
            &["Fail", "Ignore"],
        ),
        (
            "matchPolicy",
            hook.match_policy.as_deref(),
            &["Equivalent", "Exact"],
        ),
    ];
    for (field, value, supported) in enums {
        if let Some(value) = value.filter(|v| !supported.contains(v)) {
            errors.push(not_supported(&path.child(field), value, supported));
        }
    }
    let allowed = if options.require_no_side_effects {
        NO_SIDE_EFFECTS
    } else {
        SIDE_EFFECTS
    };
    match raw.get("sideEffects").and_then(Value::as_str) {
        None => errors.push(required(
            &path.child("sideEffects"),
            &format!("must specify one of {}", allowed.join(", ")),
        )),
        Some(s) if !allowed.contains(&s) => {
            errors.push(not_supported(&path.child("sideEffects"), s, allowed));
        }
        Some(_) => {}
    }
    if let Some(timeout) = hook.timeout_seconds.filter(|t| !(1..=30).contains(t)) {
        errors.push(invalid(
            &path.child("timeoutSeconds"),
            &timeout.to_string(),
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    for (field, selector) in [
        ("namespaceSelector", &hook.namespace_selector),
        ("objectSelector", &hook.object_selector),
    ] {
        if let Some(selector) = selector {
            errors.extend(label_selector(selector, &path.child(field)));
        }
    }
    if mutating
        && let Some(policy) = hook
            .reinvocation_policy
            .as_deref()
            .filter(|p| !["IfNeeded", "Never"].contains(p))
    {
        errors.push(not_supported(
            &path.child("reinvocationPolicy"),
            policy,
            &["IfNeeded", "Never"],
        ));
    }
    errors.extend(client_config(raw, &path.child("clientConfig")));
    if !options.unchanged_conditions {
        let conditions: &[MatchCondition] = hook.match_conditions.as_deref().unwrap_or_default();
        errors.extend(match_conditions(conditions, &path.child("matchConditions")));
    }
    errors
}

/// `IsFullyQualifiedName`: a DNS subdomain of at least three labels.
fn fully_qualified_name(name: &str, path: &Path) -> Option<FieldError> {
    if name.is_empty() {
        return Some(required(path, ""));
    }
    if let Some(message) = dns_subdomain(name) {
        return Some(invalid(path, &quote(name), &message));
    }
    (name.split('.').count() < 3).then(|| {
        invalid(
            path,
            &quote(name),
            "should be a domain with at least three segments separated by dots",
        )
    })
}

/// `validateAdmissionReviewVersions`.
fn review_versions(versions: &[String], require_recognized: bool, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if versions.is_empty() {
        errors.push(required(
            path,
            &format!("must specify one of {}", REVIEW_VERSIONS.join(", ")),
        ));
        return errors;
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, version) in versions.iter().enumerate() {
        if seen.contains(&version.as_str()) {
            errors.push(invalid(
                &path.index(i),
                &quote(version),
                "duplicate version",
            ));
            continue;
        }
        seen.push(version);
        if let Some(message) = dns1035_label(version) {
            errors.push(invalid(&path.index(i), &quote(version), &message));
        }
    }
    if require_recognized
        && !versions
            .iter()
            .any(|v| REVIEW_VERSIONS.contains(&v.as_str()))
    {
        errors.push(invalid(
            path,
            &go_strings("string", versions),
            &format!(
                "must include at least one of {}",
                REVIEW_VERSIONS.join(", ")
            ),
        ));
    }
    errors
}

/// `IsDNS1035Label`'s messages, joined as the caller reports each.
fn dns1035_label(value: &str) -> Option<String> {
    let mut messages = Vec::new();
    if value.len() > 63 {
        messages.push("must be no more than 63 characters".to_owned());
    }
    let bytes = value.as_bytes();
    let well_formed = bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !well_formed {
        messages.push("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_owned());
    }
    (!messages.is_empty()).then(|| messages.join("; "))
}

/// Exactly one of `url` and `service`, each checked as `ValidateWebhookURL` (https only) and
/// `ValidateWebhookService` check them.
fn client_config(raw: &Value, path: &Path) -> Vec<FieldError> {
    let config = raw.get("clientConfig").unwrap_or(&Value::Null);
    let url = config.get("url").and_then(Value::as_str);
    let service = config.get("service").filter(|s| s.is_object());
    match (url, service) {
        (Some(url), None) => webhook_url(url, &path.child("url")),
        (None, Some(service)) => webhook_service(service, &path.child("service")),
        _ => vec![required(path, "exactly one of url or service is required")],
    }
}

fn webhook_url(url: &str, path: &Path) -> Vec<FieldError> {
    const FORM: &str = "; desired format: https://host[/path]";
    let mut errors = Vec::new();
    let (rest, fragment) = url.split_once('#').unwrap_or((url, ""));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    // Go's `url.Parse`: a scheme is a letter then letters, digits, `+`, `-` or `.`, before `:`.
    let scheme_end = rest.find(':').filter(|&end| {
        let scheme = &rest[..end];
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    let (scheme, rest) = match scheme_end {
        Some(end) => (rest[..end].to_ascii_lowercase(), &rest[end + 1..]),
        None => (String::new(), rest),
    };
    let (user, host) = match rest.strip_prefix("//") {
        Some(authority) => {
            let authority = authority.split('/').next().unwrap_or("");
            match authority.rsplit_once('@') {
                Some((user, host)) => (Some(user), host),
                None => (None, authority),
            }
        }
        None => (None, ""),
    };
    if scheme != "https" {
        errors.push(invalid(
            path,
            &quote(&scheme),
            &format!("'https' is the only allowed URL scheme{FORM}"),
        ));
    }
    if host.is_empty() {
        errors.push(invalid(
            path,
            "\"\"",
            &format!("host must be provided{FORM}"),
        ));
    }
    if let Some(user) = user {
        errors.push(invalid(
            path,
            &quote(user),
            "user information is not permitted in the URL",
        ));
    }
    if !fragment.is_empty() {
        errors.push(invalid(
            path,
            &quote(fragment),
            "fragments are not permitted in the URL",
        ));
    }
    if !query.is_empty() {
        errors.push(invalid(
            path,
            &quote(query),
            "query parameters are not permitted in the URL",
        ));
    }
    errors
}

fn webhook_service(service: &Value, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let text = |key: &str| service.get(key).and_then(Value::as_str).unwrap_or("");
    if text("name").is_empty() {
        errors.push(required(&path.child("name"), "service name is required"));
    }
    if text("namespace").is_empty() {
        errors.push(required(
            &path.child("namespace"),
            "service namespace is required",
        ));
    }
    // Defaulted to 443 on decode, so absent only when it was not a number.
    let port = service.get("port").and_then(Value::as_i64).unwrap_or(0);
    if !(1..=65535).contains(&port) {
        errors.push(invalid(
            &path.child("port"),
            &port.to_string(),
            "port is not valid: must be between 1 and 65535, inclusive",
        ));
    }
    let Some(url_path) = service.get("path").and_then(Value::as_str) else {
        return errors;
    };
    if url_path.is_empty() || url_path == "/" {
        return errors;
    }
    let at = path.child("path");
    if url_path == "//" {
        errors.push(invalid(
            &at,
            &quote(url_path),
            "segment[0] may not be empty",
        ));
        return errors;
    }
    if !url_path.starts_with('/') {
        errors.push(invalid(&at, &quote(url_path), "must start with a '/'"));
    }
    // Go drops the first byte whatever it is, and one trailing `/`.
    let trimmed = url_path.get(1..).unwrap_or("");
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    for (i, step) in trimmed.split('/').enumerate() {
        if step.is_empty() {
            errors.push(invalid(
                &at,
                &quote(url_path),
                &format!("segment[{i}] may not be empty"),
            ));
        } else if let Some(message) = dns_subdomain(step) {
            errors.push(invalid(
                &at,
                &quote(url_path),
                &format!("segment[{i}]: {message}"),
            ));
        }
    }
    errors
}
