//! One webhook of either kind, as the chain sees it (kube-apiserver's webhook accessor).

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, RuleWithOperations,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The webhook timeout when a configuration names none.
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

/// One webhook of either kind, borrowed from its configuration.
pub(super) struct Hook<'a> {
    pub(super) name: &'a str,
    pub(super) client_config: &'a WebhookClientConfig,
    pub(super) rules: &'a [RuleWithOperations],
    pub(super) ignore_failures: bool,
    pub(super) namespace_selector: Option<&'a LabelSelector>,
    pub(super) object_selector: Option<&'a LabelSelector>,
    pub(super) side_effects: &'a str,
    pub(super) timeout_seconds: i32,
    pub(super) match_conditions: &'a [MatchCondition],
    pub(super) review_versions: &'a [String],
    pub(super) reinvoke_if_needed: bool,
    pub(super) mutating: bool,
}

impl<'a> Hook<'a> {
    pub(super) fn mutating(configs: &'a [MutatingWebhookConfiguration]) -> Vec<Hook<'a>> {
        let mut configs: Vec<_> = configs.iter().collect();
        configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        configs
            .into_iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .map(|w| Hook {
                name: &w.name,
                client_config: &w.client_config,
                rules: w.rules.as_deref().unwrap_or_default(),
                ignore_failures: w.failure_policy.as_deref() == Some("Ignore"),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
                match_conditions: w.match_conditions.as_deref().unwrap_or_default(),
                review_versions: &w.admission_review_versions,
                reinvoke_if_needed: w.reinvocation_policy.as_deref() == Some("IfNeeded"),
                mutating: true,
            })
            .collect()
    }

    pub(super) fn validating(configs: &'a [ValidatingWebhookConfiguration]) -> Vec<Hook<'a>> {
        let mut configs: Vec<_> = configs.iter().collect();
        configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        configs
            .into_iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .map(|w| Hook {
                name: &w.name,
                client_config: &w.client_config,
                rules: w.rules.as_deref().unwrap_or_default(),
                ignore_failures: w.failure_policy.as_deref() == Some("Ignore"),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
                match_conditions: w.match_conditions.as_deref().unwrap_or_default(),
                review_versions: &w.admission_review_versions,
                reinvoke_if_needed: false,
                mutating: false,
            })
            .collect()
    }

    pub(super) fn has_no_side_effects(&self) -> bool {
        matches!(self.side_effects, "None" | "NoneOnDryRun")
    }
}
