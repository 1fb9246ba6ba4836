//! The RBAC authorizer: whether a user may do a verb on a resource or a non-resource URL, from
//! Roles, ClusterRoles and their bindings, as kube-apiserver's RBAC authorizer decides it.
//!
//! Real sources: `plugin/pkg/auth/authorizer/rbac/rbac.go` (the decision and its reasons),
//! `pkg/registry/rbac/validation/rule.go` (which bindings apply in which namespace, subject
//! matching, the "allowed by" descriptions), `pkg/apis/rbac/v1/evaluation_helpers.go` (rule
//! matching) and `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go` (the default roles
//! every user has). The `system:masters` bypass is kube-apiserver's privileged-group authorizer
//! (`pkg/kubeapiserver/authorizer/config.go`), placed before RBAC.

use std::collections::HashMap;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use serde_json::Value;

use crate::authn::{AUTHENTICATED, UserInfo};
use crate::status::ApiError;

/// What is being asked, as `authorizer.Attributes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Who asks.
    pub user: UserInfo,
    /// get, list, watch, create, update, patch, delete, deletecollection (or an HTTP verb in
    /// lower case for a non-resource URL).
    pub verb: String,
    /// Whether this is a resource request (false: `path` is a non-resource URL).
    pub resource_request: bool,
    /// Namespace, empty for cluster-scoped resources and requests across all namespaces.
    pub namespace: String,
    /// API group, empty for the core group.
    pub api_group: String,
    /// API version (not used by RBAC, part of the messages' context).
    pub api_version: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource (`status`, `scale`), if any.
    pub subresource: String,
    /// Object name, empty for collections.
    pub name: String,
    /// The request path (for non-resource URLs).
    pub path: String,
}

impl Attributes {
    /// A resource request: `verb` on `resource` in `api_group` (chain `.namespace()`, ...).
    pub fn resource(user: UserInfo, verb: &str, api_group: &str, resource: &str) -> Self {
        Attributes {
            user,
            verb: verb.into(),
            resource_request: true,
            api_group: api_group.into(),
            resource: resource.into(),
            ..Attributes::default()
        }
    }

    /// A non-resource request: `verb` on `path`.
    pub fn non_resource(user: UserInfo, verb: &str, path: &str) -> Self {
        Attributes {
            user,
            verb: verb.into(),
            path: path.into(),
            ..Attributes::default()
        }
    }

    /// In `namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// On `subresource`.
    pub fn subresource(mut self, subresource: &str) -> Self {
        self.subresource = subresource.into();
        self
    }

    /// On the object `name`.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// The same request with another verb (the create check of an apply that creates).
    pub fn with_verb(&self, verb: &str) -> Self {
        Attributes {
            verb: verb.into(),
            ..self.clone()
        }
    }
}

/// The authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is allowed.
    pub allowed: bool,
    /// Why: the binding that allowed it, or the evaluation errors that may explain a denial
    /// (empty for a plain "no rule matched").
    pub reason: String,
}

/// The RBAC objects the authorizer evaluates. [`Policy::new`] starts from the default roles;
/// `Policy::default()` is empty (not even discovery is allowed).
#[derive(Clone, Debug, Default)]
pub struct Policy {
    cluster_roles: HashMap<String, ClusterRole>,
    roles: HashMap<(String, String), Role>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    role_bindings: Vec<RoleBinding>,
}

/// A source of rules, described as kube-apiserver describes it in an "allowed by" reason.
enum Source<'a> {
    ClusterRoleBinding(&'a ClusterRoleBinding, &'a Subject),
    RoleBinding(&'a RoleBinding, &'a Subject),
}

impl std::fmt::Display for Source<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::ClusterRoleBinding(b, s) => write!(
                f,
                "ClusterRoleBinding {:?} of {} {:?} to {}",
                name_of(&b.metadata),
                b.role_ref.kind,
                b.role_ref.name,
                describe_subject(s, "")
            ),
            Source::RoleBinding(b, s) => {
                let ns = b.metadata.namespace.as_deref().unwrap_or("");
                write!(
                    f,
                    "RoleBinding {:?} of {} {:?} to {}",
                    format!("{}/{ns}", name_of(&b.metadata)),
                    b.role_ref.kind,
                    b.role_ref.name,
                    describe_subject(s, ns)
                )
            }
        }
    }
}

fn describe_subject(s: &Subject, binding_namespace: &str) -> String {
    if s.kind == "ServiceAccount" {
        let ns = s.namespace.as_deref().filter(|n| !n.is_empty());
        format!(
            "{} {:?}",
            s.kind,
            format!("{}/{}", s.name, ns.unwrap_or(binding_namespace))
        )
    } else {
        format!("{} {:?}", s.kind, s.name)
    }
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or("")
}

impl Policy {
    /// The default roles only (see [`Policy::default_roles`]).
    pub fn new() -> Self {
        let mut policy = Policy::default();
        for (role, binding) in default_roles() {
            policy = policy.cluster_role(role).cluster_role_binding(binding);
        }
        policy
    }

    /// Adds (or replaces, by name) a ClusterRole.
    pub fn cluster_role(mut self, role: ClusterRole) -> Self {
        self.cluster_roles
            .insert(name_of(&role.metadata).to_string(), role);
        self
    }

    /// Adds (or replaces, by namespace and name) a Role.
    pub fn role(mut self, role: Role) -> Self {
        let key = (
            role.metadata.namespace.clone().unwrap_or_default(),
            name_of(&role.metadata).to_string(),
        );
        self.roles.insert(key, role);
        self
    }

    /// Adds (or replaces, by name) a ClusterRoleBinding.
    pub fn cluster_role_binding(mut self, binding: ClusterRoleBinding) -> Self {
        let name = name_of(&binding.metadata).to_string();
        self.cluster_role_bindings
            .retain(|b| name_of(&b.metadata) != name);
        self.cluster_role_bindings.push(binding);
        self
    }

    /// Adds (or replaces, by namespace and name) a RoleBinding.
    pub fn role_binding(mut self, binding: RoleBinding) -> Self {
        let key = |b: &RoleBinding| (b.metadata.namespace.clone(), b.metadata.name.clone());
        let new = key(&binding);
        self.role_bindings.retain(|b| key(b) != new);
        self.role_bindings.push(binding);
        self
    }

    /// Adds a stored RBAC object of kind `kind` (JSON as the store keeps it); objects that do
    /// not decode are skipped, as the real server would never have stored them.
    pub fn object(self, kind: &str, object: &Value) -> Self {
        fn decode<T: serde::de::DeserializeOwned>(v: &Value) -> Option<T> {
            serde_json::from_value(v.clone()).ok()
        }
        match kind {
            "ClusterRole" => match decode(object) {
                Some(r) => self.cluster_role(r),
                None => self,
            },
            "Role" => match decode(object) {
                Some(r) => self.role(r),
                None => self,
            },
            "ClusterRoleBinding" => match decode(object) {
                Some(b) => self.cluster_role_binding(b),
                None => self,
            },
            "RoleBinding" => match decode(object) {
                Some(b) => self.role_binding(b),
                None => self,
            },
            _ => self,
        }
    }

    /// Decides: `system:masters` first (always allowed), then RBAC.
    pub fn authorize(&self, attrs: &Attributes) -> Decision {
        if attrs.user.is_privileged() {
            return Decision {
                allowed: true,
                reason: String::new(),
            };
        }
        let mut errors = Vec::new();
        let mut allowed_by = None;
        self.visit_rules(&attrs.user, &attrs.namespace, |source, rules| {
            match rules {
                Err(e) => errors.push(e),
                Ok(rules) => {
                    if rules.iter().any(|r| rule_allows(attrs, r)) {
                        allowed_by = Some(format!("RBAC: allowed by {source}"));
                        return false;
                    }
                }
            }
            true
        });
        match allowed_by {
            Some(reason) => Decision {
                allowed: true,
                reason,
            },
            None => Decision {
                allowed: false,
                reason: match errors.as_slice() {
                    [] => String::new(),
                    [one] => format!("RBAC: {one}"),
                    many => format!("RBAC: [{}]", many.join(", ")),
                },
            },
        }
    }

    /// Calls `visit` with every binding that applies to `user` in `namespace` and its role's
    /// rules (or why they could not be read), ClusterRoleBindings first; stops when `visit`
    /// returns false. RoleBindings only count in their own namespace.
    fn visit_rules<'a>(
        &'a self,
        user: &UserInfo,
        namespace: &str,
        mut visit: impl FnMut(Source<'a>, Result<&'a [PolicyRule], String>) -> bool,
    ) {
        for binding in &self.cluster_role_bindings {
            let Some(subject) = applies_to(user, binding.subjects.as_deref(), "") else {
                continue;
            };
            let rules = self.role_ref_rules(&binding.role_ref, "");
            if !visit(Source::ClusterRoleBinding(binding, subject), rules) {
                return;
            }
        }
        if namespace.is_empty() {
            return;
        }
        for binding in &self.role_bindings {
            if binding.metadata.namespace.as_deref() != Some(namespace) {
                continue;
            }
            let Some(subject) = applies_to(user, binding.subjects.as_deref(), namespace) else {
                continue;
            };
            let rules = self.role_ref_rules(&binding.role_ref, namespace);
            if !visit(Source::RoleBinding(binding, subject), rules) {
                return;
            }
        }
    }

    fn role_ref_rules(&self, role_ref: &RoleRef, namespace: &str) -> Result<&[PolicyRule], String> {
        let rules = match role_ref.kind.as_str() {
            "ClusterRole" => self
                .cluster_roles
                .get(&role_ref.name)
                .ok_or_else(|| {
                    format!(
                        "clusterrole.rbac.authorization.k8s.io {:?} not found",
                        role_ref.name
                    )
                })?
                .rules
                .as_deref(),
            "Role" => self
                .roles
                .get(&(namespace.to_string(), role_ref.name.clone()))
                .ok_or_else(|| {
                    format!(
                        "role.rbac.authorization.k8s.io {:?} not found",
                        role_ref.name
                    )
                })?
                .rules
                .as_deref(),
            other => return Err(format!("unsupported role reference kind: {other:?}")),
        };
        Ok(rules.unwrap_or_default())
    }
}

/// The first subject of a binding that names `user` (directly, by group, or as a
/// ServiceAccount, whose namespace defaults to the binding's).
fn applies_to<'a>(
    user: &UserInfo,
    subjects: Option<&'a [Subject]>,
    namespace: &str,
) -> Option<&'a Subject> {
    subjects?.iter().find(|s| match s.kind.as_str() {
        "User" => s.name == user.username,
        "Group" => user.groups.contains(&s.name),
        "ServiceAccount" => {
            let ns = s
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(namespace);
            !ns.is_empty() && user.username == format!("system:serviceaccount:{ns}:{}", s.name)
        }
        _ => false,
    })
}

fn has(list: Option<&[String]>, wanted: &str) -> bool {
    list.unwrap_or_default()
        .iter()
        .any(|v| v == "*" || v == wanted)
}

/// Whether one rule allows the request (`RuleAllows` in kube-apiserver).
pub fn rule_allows(attrs: &Attributes, rule: &PolicyRule) -> bool {
    if !has(Some(&rule.verbs), &attrs.verb) {
        return false;
    }
    if !attrs.resource_request {
        return rule
            .non_resource_urls
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|url| {
                url == "*"
                    || *url == attrs.path
                    || url
                        .strip_suffix('*')
                        .is_some_and(|prefix| attrs.path.starts_with(prefix))
            });
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resources = rule.resources.as_deref().unwrap_or_default();
    let resource_matches = resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    let names = rule.resource_names.as_deref().unwrap_or_default();
    has(rule.api_groups.as_deref(), &attrs.api_group)
        && resource_matches
        && (names.is_empty() || names.contains(&attrs.name))
}

/// The 403 a denied request gets (`responsewriters.Forbidden` with `forbiddenMessage`, and
/// `errors.NewForbidden` for the `<resource>.<group> "<name>" is forbidden:` prefix).
pub fn forbidden(attrs: &Attributes, reason: &str) -> ApiError {
    let message = if attrs.resource_request {
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        let scope = if attrs.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", attrs.namespace)
        };
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
            attrs.user.username, attrs.verb, resource, attrs.api_group
        )
    } else {
        format!(
            "User {:?} cannot {} path {:?}",
            attrs.user.username, attrs.verb, attrs.path
        )
    };
    let message = if reason.is_empty() {
        message
    } else {
        format!("{message}: {reason}")
    };
    forbidden_status(attrs, message)
}

/// `errors.NewForbidden(groupResource, name, err)`: the prefix names the resource (without
/// subresource) and the object, or just `forbidden:` for a non-resource URL.
pub fn forbidden_status(attrs: &Attributes, err: String) -> ApiError {
    let qualified = if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    };
    let message = if !attrs.resource_request || attrs.resource.is_empty() {
        format!("forbidden: {err}")
    } else if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {err}")
    } else {
        format!("{qualified} {:?} is forbidden: {err}", attrs.name)
    };
    let mut e = ApiError::forbidden(message);
    let mut details = serde_json::json!({"group": attrs.api_group, "kind": attrs.resource});
    if !attrs.name.is_empty() {
        details["name"] = serde_json::json!(attrs.name);
    }
    e.details = Some(Box::new(details));
    e
}

/// The default roles every authenticated user holds, as kube-apiserver bootstraps them (and
/// binds them to `system:authenticated`): `system:discovery` (discovery and OpenAPI),
/// `system:public-info-viewer` (version and health) and `system:basic-user` (the self reviews
/// `kubectl auth can-i` and `kubectl auth whoami` send). A stored object of the same name
/// replaces one, as an edited bootstrap role would.
pub fn default_roles() -> Vec<(ClusterRole, ClusterRoleBinding)> {
    let non_resource = |urls: &[&str]| PolicyRule {
        verbs: vec!["get".into()],
        non_resource_urls: Some(urls.iter().map(|u| u.to_string()).collect()),
        ..PolicyRule::default()
    };
    let create = |group: &str, resources: &[&str]| PolicyRule {
        verbs: vec!["create".into()],
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        ..PolicyRule::default()
    };
    let roles = [
        (
            "system:discovery",
            vec![non_resource(&[
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
                "/healthz",
                "/livez",
                "/openapi",
                "/openapi/*",
                "/readyz",
                "/version",
                "/version/",
            ])],
        ),
        (
            "system:public-info-viewer",
            vec![non_resource(&[
                "/healthz",
                "/livez",
                "/readyz",
                "/version",
                "/version/",
            ])],
        ),
        (
            "system:basic-user",
            vec![
                create(
                    "authorization.k8s.io",
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                create("authentication.k8s.io", &["selfsubjectreviews"]),
            ],
        ),
    ];
    roles
        .into_iter()
        .map(|(name, rules)| {
            let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            };
            let role = ClusterRole {
                metadata: meta.clone(),
                rules: Some(rules),
                ..ClusterRole::default()
            };
            let binding = ClusterRoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: name.into(),
                },
                subjects: Some(vec![Subject {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Group".into(),
                    name: AUTHENTICATED.into(),
                    namespace: None,
                }]),
            };
            (role, binding)
        })
        .collect()
}
