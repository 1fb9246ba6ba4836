//! The MyApp admission rules: plain functions over the typed spec, and the router that mounts
//! them on the webhook server.
//!
//! [`validate`] enforces everything the CRD schema and its CEL rules enforce (so a cluster whose
//! webhook is up never stores what the schema would reject, and users get one message listing
//! every problem), and more that the schema cannot say:
//!
//! | rule | schema / CEL | webhook only |
//! |------|--------------|--------------|
//! | `spec.replicas` in `0..=1000` | yes | the maximum is configurable lower (`--max-replicas`) |
//! | `spec.port` in `1..=65535` | yes | |
//! | `spec.image` an OCI reference | regex | stricter: repository name <= 255 bytes; `sha256`/`sha512` digests must be 64/128 lower-case hex; a bracketed registry host must be an IPv6 address; precise messages per part |
//! | `spec.env` names: pattern, 1..=128 | yes | also not `.`, `..` or starting with `..` (as Kubernetes' `IsEnvVarName`) |
//! | `spec.env` names unique | list-map key | reported on the name field, once per duplicate |
//! | `spec.env` at most 64, values <= 8192 | yes (values in characters) | values in bytes (stricter) |
//! | `metadata.name` a DNS-1035 label | CEL | |
//! | `/scale` writes: replicas as above | `0..=1000` (the CRD's scale path) | [`validate_scale`]: `--max-replicas` |
//!
//! On UPDATE the old spec is compared with the new one in one place: an over-the-maximum
//! `spec.replicas` that the update leaves unchanged is admitted with a warning (ratcheting), so
//! lowering `--max-replicas` never blocks unrelated edits of existing apps. The schema's own
//! bound (1000) never ratchets. Every other rule judges the new spec alone.
//!
//! Warnings (never denials): an image with no tag and no digest, a `:latest` tag, replicas 0,
//! replicas allowed only by ratcheting.
//!
//! [`default`] adds the env defaults configured with `--default-env NAME=VALUE`, after the
//! user's entries, never overriding a name the user set, and never beyond the env-count limit.
//! It adds nothing else: an absent `spec.replicas` means "scaled by someone else" and stays
//! absent. Running it on its own output changes nothing.
//!
//! The routes read no more than the rules judge, so a review at the body limit costs about the
//! body: the validating route reads the name and the spec with `spec.env` bounded
//! ([`ReviewedSpec`]: the first [`MAX_ENV`] entries kept, the rest only counted for the
//! denial), the mutating route reads `spec.env` alone and stops at entry `MAX_ENV + 1`
//! (admitting that object unchanged), and the scale route reads `spec.replicas` alone.

use std::sync::Arc;

use axum::Router;
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use serde::{Deserialize, Deserializer, Serialize};
use webhook::{
    Context, Operation, Verdict, Violation,
    review::{Bounded, at_most, quoted},
};

use crate::{
    crd::{
        EnvVar, MAX_ENV, MAX_ENV_NAME_LEN, MAX_ENV_VALUE_LEN, MAX_IMAGE_LEN, MAX_REPLICAS,
        MyAppSpec,
    },
    image::ImageRef,
    shard::{SHARD_LABEL, view::ShardView},
};

/// Path of the validating webhook (the deploy manifests point here).
pub const VALIDATE_PATH: &str = "/validate-myapp";
/// Path of the mutating webhook (the deploy manifests point here).
pub const MUTATE_PATH: &str = "/mutate-myapp";
/// Path of the validating webhook for the `/scale` subresource (the deploy manifests point
/// here).
pub const SCALE_PATH: &str = "/validate-myapp-scale";

/// What the operator is configured to enforce and inject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Highest `spec.replicas` admitted, at most [`MAX_REPLICAS`] (`--max-replicas`).
    pub max_replicas: i32,
    /// Env entries added to every MyApp that does not set the name (`--default-env`).
    pub default_env: Vec<EnvVar>,
    /// With sharding on, this replica's view of the ring: a MyApp being created without a
    /// shard label gets the shard the ring gives it.
    pub shards: Option<ShardView>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_replicas: MAX_REPLICAS,
            default_env: Vec::new(),
            shards: None,
        }
    }
}

impl AdmissionConfig {
    /// The limits [`validate`] applies; `max_replicas` is clamped into `0..=MAX_REPLICAS`.
    pub fn limits(&self) -> Limits {
        Limits {
            max_replicas: self.max_replicas.clamp(0, MAX_REPLICAS),
        }
    }
}

/// The configurable limits of [`validate`]. The others are the CRD's and not configurable: a
/// looser webhook would admit what the schema then rejects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Highest `spec.replicas` admitted.
    pub max_replicas: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_replicas: MAX_REPLICAS,
        }
    }
}

/// Parses one `--default-env NAME=VALUE`, refusing what [`validate`] would deny, so a bad flag
/// fails at start instead of on every admission. Usable as a clap `value_parser`.
pub fn parse_default_env(text: &str) -> Result<EnvVar, String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    if let Some(problem) = env_name_problem(name) {
        return Err(format!("env name {name:?}: {problem}"));
    }
    if value.len() > MAX_ENV_VALUE_LEN {
        return Err(format!(
            "env value of {name:?} is longer than {MAX_ENV_VALUE_LEN} bytes"
        ));
    }
    Ok(EnvVar {
        name: name.to_owned(),
        value: value.to_owned(),
    })
}

// === Validation ===

/// Every violation of the MyApp rules by `new` (with its field path), and warnings.
///
/// `old` is the stored spec on UPDATE; see the module documentation for the one rule that uses
/// it.
pub fn validate(new: &MyAppSpec, old: Option<&MyAppSpec>, limits: &Limits) -> Verdict {
    judge(
        &ReviewedSpec {
            replicas: new.replicas,
            image: new.image.clone(),
            port: new.port,
            env: new.env.clone().into(),
        },
        old.and_then(|o| o.replicas),
        limits,
    )
}

/// [`validate`] over the spec as the validating route reads it.
fn judge(new: &ReviewedSpec, old_replicas: Option<i32>, limits: &Limits) -> Verdict {
    let mut verdict = Verdict::default();
    replicas(new.replicas, old_replicas, limits, &mut verdict);
    port(new.port, &mut verdict);
    image(&new.image, &mut verdict);
    env(&new.env, &mut verdict);
    verdict
}

/// The CRD's CEL rule on the name, which names the child Service: a DNS-1035 label.
pub fn validate_name(name: &str) -> Option<Violation> {
    const DETAIL: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or \
                          '-', start with an alphabetic character, and end with an alphanumeric \
                          character";
    if name.len() > 63 {
        return Some(Violation::invalid(
            "metadata.name",
            quoted(name),
            "must be no more than 63 characters",
        ));
    }
    let bytes = name.as_bytes();
    let ok = bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    (!ok).then(|| Violation::invalid("metadata.name", quoted(name), DETAIL))
}

fn replicas(new: Option<i32>, old: Option<i32>, limits: &Limits, verdict: &mut Verdict) {
    let Some(replicas) = new else {
        return;
    };
    const FIELD: &str = "spec.replicas";
    if replicas < 0 {
        verdict.violations.push(Violation::invalid(
            FIELD,
            replicas,
            "must be greater than or equal to 0",
        ));
    } else if replicas > MAX_REPLICAS {
        verdict.violations.push(Violation::invalid(
            FIELD,
            replicas,
            &format!("must be less than or equal to {MAX_REPLICAS}"),
        ));
    } else if replicas > limits.max_replicas {
        if old == Some(replicas) {
            verdict.warnings.push(format!(
                "spec.replicas {replicas} is above the operator's maximum {}; kept because unchanged",
                limits.max_replicas
            ));
        } else {
            verdict.violations.push(Violation::invalid(
                FIELD,
                replicas,
                &format!(
                    "must be less than or equal to {} (the operator's --max-replicas)",
                    limits.max_replicas
                ),
            ));
        }
    } else if replicas == 0 {
        verdict
            .warnings
            .push("spec.replicas is 0: the app runs no pods".to_owned());
    }
}

fn port(port: i32, verdict: &mut Verdict) {
    if !(1..=65535).contains(&port) {
        verdict.violations.push(Violation::invalid(
            "spec.port",
            port,
            "must be between 1 and 65535, inclusive",
        ));
    }
}

fn image(image: &str, verdict: &mut Verdict) {
    const FIELD: &str = "spec.image";
    if image.is_empty() {
        verdict
            .violations
            .push(Violation::required(FIELD, "an image reference is required"));
        return;
    }
    if image.len() > MAX_IMAGE_LEN {
        verdict
            .violations
            .push(Violation::too_long(FIELD, MAX_IMAGE_LEN));
        return;
    }
    match ImageRef::parse(image) {
        Err(detail) => {
            verdict
                .violations
                .push(Violation::invalid(FIELD, quoted(image), &detail));
        }
        Ok(reference) => match (reference.tag, reference.digest) {
            (None, None) => verdict.warnings.push(
                "spec.image has no tag or digest, so it means :latest; pin a version".to_owned(),
            ),
            (Some("latest"), None) => verdict
                .warnings
                .push("spec.image uses :latest; pin a version or digest".to_owned()),
            _ => {}
        },
    }
}

fn env(env: &Bounded<EnvVar, MAX_ENV>, verdict: &mut Verdict) {
    let Some(env) = env.whole() else {
        // Refused before any per-entry work: a body at the size limit holds some 230,000
        // entries, and checking each (duplicates above all) would stall the server. Reading
        // them would cost as much, so only the first MAX_ENV were read and the rest counted.
        verdict
            .violations
            .push(Violation::too_many("spec.env", env.len(), MAX_ENV));
        return;
    };
    for (i, var) in env.iter().enumerate() {
        let field = format!("spec.env[{i}].name");
        if var.name.is_empty() {
            verdict
                .violations
                .push(Violation::required(field, "an env name is required"));
        } else if var.name.len() > MAX_ENV_NAME_LEN {
            verdict
                .violations
                .push(Violation::too_long(field, MAX_ENV_NAME_LEN));
        } else if let Some(problem) = env_name_problem(&var.name) {
            verdict
                .violations
                .push(Violation::invalid(field, quoted(&var.name), problem));
        } else if env[..i].iter().any(|earlier| earlier.name == var.name) {
            // Quadratic, but in at most MAX_ENV entries.
            verdict
                .violations
                .push(Violation::duplicate(field, quoted(&var.name)));
        }
        if var.value.len() > MAX_ENV_VALUE_LEN {
            verdict.violations.push(Violation::too_long(
                format!("spec.env[{i}].value"),
                MAX_ENV_VALUE_LEN,
            ));
        }
    }
}

/// Kubernetes' `IsEnvVarName`: the pattern, and no `.`/`..` path tricks.
fn env_name_problem(name: &str) -> Option<&'static str> {
    let bytes = name.as_bytes();
    let first_ok = bytes
        .first()
        .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'));
    let rest_ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !(first_ok && rest_ok) {
        return Some(
            "a valid environment variable name must consist of alphabetic characters, digits, \
             '_', '-', or '.', and must not start with a digit",
        );
    }
    match name {
        "." => Some("must not be '.'"),
        ".." => Some("must not be '..'"),
        _ if name.starts_with("..") => Some("must not start with '..'"),
        _ => None,
    }
}

// === Defaulting ===

/// Adds every configured env default whose name the spec does not set, after the user's
/// entries, stopping at the env-count limit. Idempotent.
pub fn default(spec: &mut MyAppSpec, defaults: &[EnvVar]) {
    default_env(&mut spec.env, defaults);
}

/// Labels a MyApp being created, and not labelled for a shard, with the shard `view` gives
/// it. Only on CREATE: nobody reconciles a MyApp yet, so no handshake is needed (a MyApp
/// that lost its label later is the sharder's, which knows whether its shard let it go).
/// Not with `generateName`: the name, which the ring hashes, is not chosen yet.
fn stamp_shard(object: &mut Defaulted, context: &Context<'_>, view: &ShardView) {
    if context.operation != Operation::Create || context.name.is_empty() {
        return;
    }
    let labels = &mut object.metadata.labels;
    if labels
        .as_ref()
        .and_then(|labels| labels.0.as_deref())
        .is_some_and(|shard| !shard.is_empty())
    {
        return;
    }
    if let Some(shard) = view.shard_for(context.namespace, context.name) {
        labels.get_or_insert_default().0 = Some(shard);
    }
}

/// [`default`] on the env list alone, which is all the mutating route reads.
fn default_env(env: &mut Vec<EnvVar>, defaults: &[EnvVar]) {
    for default in defaults {
        if env.len() >= MAX_ENV {
            break;
        }
        if !env.iter().any(|var| var.name == default.name) {
            env.push(default.clone());
        }
    }
}

// === Router ===

/// What the validating route reads of a MyApp: its name and spec (the rest is skipped, not
/// parsed).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reviewed {
    /// Only the name is read.
    #[serde(default)]
    pub metadata: NameOnly,
    /// The spec.
    pub spec: ReviewedSpec,
}

/// A [`MyAppSpec`] as the validating route reads it: the env list bounded by its limit, so a
/// request with 200,000 entries costs [`MAX_ENV`] of them (the rest are counted, for the
/// denial). The same fields as `MyAppSpec` (a test keeps them so).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewedSpec {
    /// `spec.replicas`.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// `spec.image`.
    pub image: String,
    /// `spec.port`.
    pub port: i32,
    /// `spec.env`, at most [`MAX_ENV`] entries kept.
    #[serde(default)]
    pub env: Bounded<EnvVar, MAX_ENV>,
}

/// The name of an object (empty on CREATE with `generateName`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct NameOnly {
    /// `metadata.name`.
    #[serde(default)]
    pub name: String,
}

/// What the mutating route edits: `spec.env` alone, so the patch can only touch it, and a body
/// at the size limit costs no more than the list's limit to read. An object whose env list is
/// over the limit (or does not parse) is admitted unchanged; the validating route denies it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Defaulted {
    /// The metadata: its shard label alone. Always written out, as it always exists, so that
    /// a label added to an object without labels is patched in as `/metadata/labels`.
    #[serde(default)]
    pub metadata: DefaultedMeta,
    /// The spec.
    pub spec: DefaultedSpec,
}

/// The part of the metadata the mutating route edits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DefaultedMeta {
    /// The labels, of which only the shard label is read (the others are skipped as they are
    /// read); `None` when the object has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<ShardLabel>,
}

/// A label map as the mutating route sees it: the shard label, or nothing. Written out as a
/// map of that one label, so a patch adds it beside the others without touching them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardLabel(pub Option<String>);

impl Serialize for ShardLabel {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(usize::from(self.0.is_some())))?;
        if let Some(shard) = &self.0 {
            map.serialize_entry(SHARD_LABEL, shard)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ShardLabel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let labels = crate::cache::ShardLabels::<String>::deserialize(deserializer)?;
        Ok(Self(labels.shard))
    }
}

/// The part of the spec the mutating route edits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DefaultedSpec {
    /// `spec.env`, refused past [`MAX_ENV`] entries.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "env_within_limit"
    )]
    pub env: Vec<EnvVar>,
}

fn env_within_limit<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<EnvVar>, D::Error> {
    at_most(deserializer, MAX_ENV)
}

/// What the scale route reads of a `Scale`: `spec.replicas` (metadata, which a sender can fill
/// with megabytes of labels, is skipped).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ScaleReviewed {
    /// The spec.
    #[serde(default)]
    pub spec: Option<ScaleSpec>,
}

/// The validating rule as the route runs it: [`validate`] plus [`validate_name`].
pub fn review(
    new: &Reviewed,
    old: Option<&Reviewed>,
    context: &Context<'_>,
    limits: &Limits,
) -> Verdict {
    let mut verdict = judge(&new.spec, old.and_then(|o| o.spec.replicas), limits);
    // With generateName the name is not known yet; the schema's CEL rule checks the generated
    // one when the object is stored.
    let name = if new.metadata.name.is_empty() {
        context.name
    } else {
        &new.metadata.name
    };
    if !name.is_empty()
        && let Some(violation) = validate_name(name)
    {
        verdict.violations.insert(0, violation);
    }
    verdict
}

/// The rule for a write of the `/scale` subresource (`kubectl scale`, autoscalers), whose
/// review carries `autoscaling/v1` `Scale` objects: the replicas rules of [`validate`],
/// ratcheting included. A `Scale` omits `spec.replicas` when it is 0.
pub fn validate_scale(new: &Scale, old: Option<&Scale>, limits: &Limits) -> Verdict {
    let replicas_of = |scale: &Scale| Some(scale.spec.as_ref()?.replicas.unwrap_or(0));
    let mut verdict = Verdict::default();
    replicas(
        Some(replicas_of(new).unwrap_or(0)),
        old.and_then(replicas_of),
        limits,
        &mut verdict,
    );
    verdict
}

/// The webhook routes: `POST /validate-myapp`, `POST /validate-myapp-scale` and
/// `POST /mutate-myapp`.
pub fn router(config: AdmissionConfig) -> Router {
    let limits = config.limits();
    let defaults = Arc::new(config.default_env);
    let shards = config.shards;
    Router::new()
        .route(
            VALIDATE_PATH,
            webhook::validating(move |new: &Reviewed, old: Option<&Reviewed>, context| {
                review(new, old, context, &limits)
            }),
        )
        .route(
            SCALE_PATH,
            webhook::validating(
                move |new: &ScaleReviewed, old: Option<&ScaleReviewed>, _context| {
                    let scale = |read: &ScaleReviewed| Scale {
                        spec: read.spec.clone(),
                        ..Scale::default()
                    };
                    validate_scale(&scale(new), old.map(scale).as_ref(), &limits)
                },
            ),
        )
        .route(
            MUTATE_PATH,
            webhook::mutating(move |object: &mut Defaulted, context| {
                default_env(&mut object.spec.env, &defaults);
                if let Some(view) = &shards {
                    stamp_shard(object, context, view);
                }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(image: &str) -> MyAppSpec {
        MyAppSpec {
            replicas: Some(2),
            image: image.to_owned(),
            port: 8080,
            env: Vec::new(),
        }
    }

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.to_owned(),
            value: value.to_owned(),
        }
    }

    fn fields(verdict: &Verdict) -> Vec<&str> {
        verdict
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect()
    }

    #[test]
    fn a_typical_spec_is_valid_without_warnings() {
        let verdict = validate(&spec("ghcr.io/example/web:1.4.2"), None, &Limits::default());
        assert_eq!(verdict, Verdict::default());
    }

    #[test]
    fn every_violation_is_reported_at_once_with_its_field() {
        let mut bad = spec("Not An Image");
        bad.replicas = Some(-1);
        bad.port = 0;
        bad.env = vec![env("1X", ""), env("A", ""), env("A", ""), env("..", "")];
        let verdict = validate(&bad, None, &Limits::default());
        assert_eq!(
            fields(&verdict),
            [
                "spec.replicas",
                "spec.port",
                "spec.image",
                "spec.env[0].name",
                "spec.env[2].name",
                "spec.env[3].name"
            ]
        );
        assert_eq!(
            verdict.violations[4].message, "Duplicate value: \"A\"",
            "{verdict:?}"
        );
        assert_eq!(
            verdict.violations[5].message,
            "Invalid value: \"..\": must not be '..'"
        );
    }

    #[test]
    fn limits_on_replicas_env_count_and_value_size_apply() {
        let mut big = spec("app:1");
        big.replicas = Some(11);
        big.env = (0..MAX_ENV).map(|i| env(&format!("E{i}"), "")).collect();
        big.env[3].value = "x".repeat(MAX_ENV_VALUE_LEN + 1);
        let verdict = validate(&big, None, &Limits { max_replicas: 10 });
        assert_eq!(fields(&verdict), ["spec.replicas", "spec.env[3].value"]);
        assert!(verdict.violations[0].message.contains("--max-replicas"));
        // One entry too many: the list is refused as a whole, its entries are not looked at.
        big.env.push(env("E3", ""));
        let verdict = validate(&big, None, &Limits { max_replicas: 10 });
        assert_eq!(fields(&verdict), ["spec.replicas", "spec.env"]);
    }

    #[test]
    fn an_unchanged_replica_count_above_a_lowered_maximum_is_kept_with_a_warning() {
        let mut app = spec("app:1");
        app.replicas = Some(50);
        let limits = Limits { max_replicas: 10 };
        let verdict = validate(&app, Some(&app.clone()), &limits);
        assert!(verdict.violations.is_empty());
        assert_eq!(verdict.warnings.len(), 1);
        let mut grown = app.clone();
        grown.replicas = Some(51);
        assert_eq!(
            fields(&validate(&grown, Some(&app), &limits)),
            ["spec.replicas"]
        );
        // The schema's own bound never ratchets.
        let mut huge = app.clone();
        huge.replicas = Some(MAX_REPLICAS + 1);
        assert_eq!(
            fields(&validate(&huge, Some(&huge), &limits)),
            ["spec.replicas"]
        );
    }

    #[test]
    fn suspicious_but_legal_specs_get_short_warnings() {
        let mut zero = spec("nginx");
        zero.replicas = Some(0);
        let verdict = validate(&zero, None, &Limits::default());
        assert!(verdict.violations.is_empty());
        assert_eq!(verdict.warnings.len(), 2, "{verdict:?}");
        let latest = validate(&spec("nginx:latest"), None, &Limits::default());
        assert_eq!(latest.warnings.len(), 1);
        for warning in verdict.warnings.iter().chain(&latest.warnings) {
            assert!(warning.len() <= 120, "{warning}");
        }
        let pinned = format!("nginx@sha256:{}", "b".repeat(64));
        assert!(
            validate(&spec(&pinned), None, &Limits::default())
                .warnings
                .is_empty()
        );
    }

    #[test]
    fn names_must_be_dns_1035_labels() {
        assert!(validate_name("web-1").is_none());
        for bad in ["1web", "web-", "Web", "w.eb", &"a".repeat(64)] {
            assert!(validate_name(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn an_over_long_name_is_echoed_cut_with_its_length() {
        let violation = validate_name(&"n".repeat(100_000)).unwrap();
        assert!(
            violation
                .message
                .contains("…\" (100000 bytes): must be no more than 63"),
            "{}",
            violation.message
        );
        assert!(violation.message.len() < 400, "{}", violation.message);
    }

    fn env_json(count: usize) -> String {
        let entries: Vec<String> = (0..count)
            .map(|i| format!(r#"{{"name":"E{i}","value":"x"}}"#))
            .collect();
        format!("[{}]", entries.join(","))
    }

    #[test]
    fn the_validating_route_keeps_at_most_the_env_limit_and_denies_with_the_count() {
        let json = format!(
            r#"{{"metadata":{{"name":"web"}},"spec":{{"image":"app:1","port":0,"env":{}}}}}"#,
            env_json(100_000)
        );
        let read: Reviewed = serde_json::from_str(&json).unwrap();
        assert_eq!(read.spec.env.len(), 100_000);
        assert_eq!(read.spec.env.kept().len(), MAX_ENV, "never more held");
        let verdict = judge(&read.spec, None, &Limits::default());
        // Every other violation is still listed.
        assert_eq!(fields(&verdict), ["spec.port", "spec.env"]);
        assert_eq!(
            verdict.violations[1].message,
            "Too many: 100000: must have at most 64 items"
        );
    }

    #[test]
    fn the_mutating_route_stops_reading_an_env_list_past_its_limit() {
        let over = format!(r#"{{"spec":{{"env":{}}}}}"#, env_json(MAX_ENV + 1));
        let error = serde_json::from_str::<Defaulted>(&over).unwrap_err();
        assert!(error.to_string().contains("at most 64"), "{error}");
        let within = format!(r#"{{"spec":{{"env":{}}}}}"#, env_json(MAX_ENV));
        let read: Defaulted = serde_json::from_str(&within).unwrap();
        assert_eq!(read.spec.env.len(), MAX_ENV);
    }

    #[test]
    fn the_validating_route_reads_every_field_of_the_spec() {
        let full = MyAppSpec {
            replicas: Some(3),
            image: "app:1".to_owned(),
            port: 80,
            env: vec![env("A", "1")],
        };
        let read: ReviewedSpec =
            serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        // A struct literal on purpose: a field added to MyAppSpec stops this compiling until
        // ReviewedSpec reads it too (and the rules judge it).
        let back = MyAppSpec {
            replicas: read.replicas,
            image: read.image,
            port: read.port,
            env: read.env.kept().to_vec(),
        };
        assert_eq!(back, full);
    }

    #[test]
    fn defaults_never_override_user_names_and_are_idempotent() {
        let defaults = [
            env("LOG_LEVEL", "info"),
            env("REGION", "eu"),
            env("LOG_LEVEL", "debug"),
        ];
        let mut app = spec("app:1");
        app.env = vec![env("REGION", "us")];
        default(&mut app, &defaults);
        assert_eq!(app.env, [env("REGION", "us"), env("LOG_LEVEL", "info")]);
        let once = app.clone();
        default(&mut app, &defaults);
        assert_eq!(app, once);
    }

    #[test]
    fn defaults_stop_at_the_env_limit() {
        let mut app = spec("app:1");
        app.env = (0..MAX_ENV).map(|i| env(&format!("E{i}"), "")).collect();
        default(&mut app, &[env("EXTRA", "1")]);
        assert_eq!(app.env.len(), MAX_ENV);
    }

    #[test]
    fn default_env_flags_are_checked_at_parse_time() {
        assert_eq!(parse_default_env("A=b=c").unwrap(), env("A", "b=c"));
        assert_eq!(parse_default_env("EMPTY=").unwrap(), env("EMPTY", ""));
        assert!(
            parse_default_env("NOVALUE")
                .unwrap_err()
                .contains("NAME=VALUE")
        );
        assert!(
            parse_default_env("1A=x")
                .unwrap_err()
                .contains("must not start with a digit")
        );
        assert!(parse_default_env("=x").is_err());
    }

    fn scale(replicas: Option<i32>) -> Scale {
        Scale {
            spec: Some(k8s_openapi::api::autoscaling::v1::ScaleSpec { replicas }),
            ..Scale::default()
        }
    }

    #[test]
    fn a_scale_write_gets_the_replicas_rules_ratcheting_included() {
        let limits = Limits { max_replicas: 5 };
        let denied = validate_scale(&scale(Some(7)), Some(&scale(Some(3))), &limits);
        assert_eq!(fields(&denied), ["spec.replicas"]);
        assert!(denied.violations[0].to_string().contains("--max-replicas"));
        let negative = validate_scale(&scale(Some(-1)), Some(&scale(Some(3))), &limits);
        assert_eq!(fields(&negative), ["spec.replicas"]);
        let allowed = validate_scale(&scale(Some(5)), Some(&scale(Some(3))), &limits);
        assert!(allowed.violations.is_empty());
        // Kept above a lowered maximum: a no-op scale must not fail.
        let kept = validate_scale(&scale(Some(7)), Some(&scale(Some(7))), &limits);
        assert!(kept.violations.is_empty());
        assert_eq!(kept.warnings.len(), 1);
        // A Scale omits replicas 0.
        let zero = validate_scale(&scale(None), Some(&scale(Some(3))), &limits);
        assert!(zero.violations.is_empty());
        assert_eq!(zero.warnings, ["spec.replicas is 0: the app runs no pods"]);
    }
}
