//! The request's identity and its authorization: the authentication, impersonation and
//! authorization filters kube-apiserver runs before any handler, and the request attributes
//! they judge (`staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`).

use std::collections::HashMap;

use axum::http::{HeaderMap, Method};

use super::context::{Inner, ResPath};
use crate::authn::{Identity, Impersonation, UserInfo};
use crate::rbac::{self, Attributes, Policy};
use crate::status::ApiError;

const RBAC_KINDS: [(&str, &str); 4] = [
    ("clusterroles", "ClusterRole"),
    ("roles", "Role"),
    ("clusterrolebindings", "ClusterRoleBinding"),
    ("rolebindings", "RoleBinding"),
];

/// The RBAC objects stored now, with the default roles.
pub(super) fn policy(inner: &Inner) -> Policy {
    let state = inner.store.lock();
    let mut policy = Policy::new();
    for (plural, kind) in RBAC_KINDS {
        let res = ("rbac.authorization.k8s.io".to_string(), plural.to_string());
        for obj in state.list(&res, None) {
            policy = policy.object(kind, obj);
        }
    }
    policy
}

/// Authenticates the request, then applies `Impersonate-*` headers if the authenticated user
/// may impersonate what they name (verb `impersonate` on users, groups, serviceaccounts,
/// uids and userextras, as `filters/impersonation.go` checks).
pub(super) fn identify(inner: &Inner, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let identity = inner.tokens.authenticate(headers)?;
    let Some(imp) = Impersonation::from_headers(headers)? else {
        return Ok(identity);
    };
    let actor = identity.user.clone();
    let mut checks = Vec::new();
    let username = imp.user.clone().unwrap_or_default();
    let target = UserInfo::user(username.as_str());
    checks.push(match target.service_account_name() {
        Some((ns, name)) => {
            Attributes::resource(actor.clone(), "impersonate", "", "serviceaccounts")
                .namespace(ns)
                .name(name)
        }
        None => Attributes::resource(actor.clone(), "impersonate", "", "users").name(&username),
    });
    for group in &imp.groups {
        checks.push(Attributes::resource(actor.clone(), "impersonate", "", "groups").name(group));
    }
    if let Some(uid) = &imp.uid {
        checks.push(
            Attributes::resource(
                actor.clone(),
                "impersonate",
                "authentication.k8s.io",
                "uids",
            )
            .name(uid),
        );
    }
    for (key, values) in &imp.extra {
        for value in values {
            checks.push(
                Attributes::resource(
                    actor.clone(),
                    "impersonate",
                    "authentication.k8s.io",
                    "userextras",
                )
                .subresource(key)
                .name(value),
            );
        }
    }
    for check in &checks {
        authorize(inner, check)?;
    }
    Ok(Identity {
        user: imp.user(),
        token_id: identity.token_id,
    })
}

/// Why `attrs` is denied (RBAC's reason, often empty), or None when it is allowed.
/// `system:masters` (and everyone when authentication is off) skips the policy.
fn denial(inner: &Inner, attrs: &Attributes) -> Option<String> {
    if attrs.user.is_privileged() {
        return None;
    }
    let decision = policy(inner).authorize(attrs);
    (!decision.allowed).then_some(decision.reason)
}

/// Whether `attrs` is allowed; the 403 if not.
pub(super) fn authorize(inner: &Inner, attrs: &Attributes) -> Result<(), ApiError> {
    match denial(inner, attrs) {
        None => Ok(()),
        Some(reason) => Err(rbac::forbidden(attrs, &reason)),
    }
}

/// The second check of a server-side apply that creates its object: the PATCH was authorized
/// as `patch`; creating also needs `create`, and a denial reads
/// `<resource> "<name>" is forbidden: <reason>` (`handlers/patch.go` wraps the create
/// validation in `withAuthorization`, `handlers/rest.go`).
pub(super) fn authorize_create_on_apply(inner: &Inner, attrs: &Attributes) -> Result<(), ApiError> {
    let create = attrs.with_verb("create");
    match denial(inner, &create) {
        None => Ok(()),
        Some(reason) => Err(rbac::forbidden_status(&create, reason)),
    }
}

/// The verb kube-apiserver derives: GET on a collection is `list` (or `watch` with
/// `?watch=true`), DELETE on one is `deletecollection`.
pub(super) fn verb(
    method: &Method,
    path: &ResPath,
    query: &HashMap<String, String>,
) -> &'static str {
    match (method.as_str(), path.name.is_some()) {
        ("GET" | "HEAD", false) if watching(query) => "watch",
        ("GET" | "HEAD", false) => "list",
        ("GET" | "HEAD", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        _ => "unknown",
    }
}

/// Whether a GET asks for a watch stream rather than a list.
pub(super) fn watching(query: &HashMap<String, String>) -> bool {
    query.get("watch").is_some_and(|w| w == "true" || w == "1")
}

/// The attributes of a resource request. A list or watch narrowed to one object by
/// `fieldSelector=metadata.name=<name>` is authorized for that name, as `requestinfo.go` does,
/// so `resourceNames` rules allow `kubectl get -w` of one object.
pub(super) fn resource_attributes(
    user: UserInfo,
    method: &Method,
    path: &ResPath,
    query: &HashMap<String, String>,
) -> Attributes {
    let verb = verb(method, path, query);
    let mut attrs = Attributes::resource(user, verb, &path.group, &path.plural)
        .namespace(path.namespace.as_deref().unwrap_or(""))
        .subresource(path.sub.as_deref().unwrap_or(""))
        .name(path.name.as_deref().unwrap_or(""));
    attrs.api_version = path.version.clone();
    if matches!(verb, "list" | "watch")
        && let Some(name) = query.get("fieldSelector").and_then(|s| single_name(s))
    {
        attrs.name = name;
    }
    // `namespaces/<name>` is the namespace itself: its namespace attribute is its name.
    if path.group.is_empty() && path.plural == "namespaces" && path.namespace.is_none() {
        attrs.namespace = path.name.clone().unwrap_or_default();
    }
    attrs
}

fn single_name(selector: &str) -> Option<String> {
    let mut names = selector.split(',').filter_map(|term| {
        let (key, value) = term.split_once("==").or_else(|| term.split_once('='))?;
        (key.trim() == "metadata.name").then(|| value.trim().to_string())
    });
    let name = names.next()?;
    names.next().is_none().then_some(name)
}
