//! The RBAC authorizer alone, no HTTP: one policy, a table of requests and what kube-apiserver's
//! RBAC authorizer answers for each.

use kube_sandbox::UserInfo;
use kube_sandbox::rbac::{Attributes, Policy, forbidden};
use serde_json::{Value, json};

const OPERATOR_NS: &str = "myapp-system";

fn operator() -> UserInfo {
    UserInfo::service_account(OPERATOR_NS, "myapp-operator").group("system:authenticated")
}

fn user(name: &str) -> UserInfo {
    UserInfo::user(name).group("system:authenticated")
}

fn role(kind: &str, namespace: Option<&str>, name: &str, rules: Value) -> (String, Value) {
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    (
        kind.to_string(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, "rules": rules}),
    )
}

fn binding(
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    role_kind: &str,
    role: &str,
    subjects: Value,
) -> (String, Value) {
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    (
        kind.to_string(),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": subjects,
        }),
    )
}

/// The operator's permissions, shaped like deploy/base/rbac.yaml, plus a few users for the corners.
fn policy() -> Policy {
    let objects = [
        role(
            "ClusterRole",
            None,
            "myapp-operator",
            json!([
                {"apiGroups": ["example.com"], "resources": ["myapps"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["example.com"], "resources": ["myapps/status"], "verbs": ["patch"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create", "patch"]},
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "patch"]},
            ]),
        ),
        binding(
            "ClusterRoleBinding",
            None,
            "myapp-operator",
            "ClusterRole",
            "myapp-operator",
            json!([{"kind": "ServiceAccount", "name": "myapp-operator", "namespace": OPERATOR_NS}]),
        ),
        // Leader election: a Role, only in the operator's namespace; its ServiceAccount subject
        // leaves the namespace out, which means the binding's.
        role(
            "Role",
            Some(OPERATOR_NS),
            "leader",
            json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
                   {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["myapp-lock"], "verbs": ["*"]}]),
        ),
        binding(
            "RoleBinding",
            Some(OPERATOR_NS),
            "leader",
            "Role",
            "leader",
            json!([{"kind": "ServiceAccount", "name": "myapp-operator"}]),
        ),
        // A ClusterRole bound by a RoleBinding: it grants only in the binding's namespace.
        role(
            "ClusterRole",
            None,
            "configmap-reader",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
                   {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["app-config"], "verbs": ["get"]}]),
        ),
        binding(
            "RoleBinding",
            Some("team-a"),
            "read-config",
            "ClusterRole",
            "configmap-reader",
            json!([{"kind": "User", "name": "alice"}]),
        ),
        // Groups, wildcards and subresources.
        role(
            "ClusterRole",
            None,
            "scaler",
            json!([{"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "update", "patch"]},
                   {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]}]),
        ),
        binding(
            "ClusterRoleBinding",
            None,
            "scalers",
            "ClusterRole",
            "scaler",
            json!([{"kind": "Group", "name": "autoscalers"}]),
        ),
        role(
            "ClusterRole",
            None,
            "everything",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        ),
        binding(
            "RoleBinding",
            Some("sandbox"),
            "owner",
            "ClusterRole",
            "everything",
            json!([{"kind": "User", "name": "bob"}]),
        ),
        role(
            "ClusterRole",
            None,
            "metrics",
            json!([{"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]}]),
        ),
        binding(
            "ClusterRoleBinding",
            None,
            "metrics",
            "ClusterRole",
            "metrics",
            json!([{"kind": "User", "name": "prometheus"}]),
        ),
        binding(
            "RoleBinding",
            Some("team-b"),
            "dangling",
            "Role",
            "gone",
            json!([{"kind": "User", "name": "carol"}]),
        ),
    ];
    objects
        .iter()
        .fold(Policy::new(), |p, (kind, obj)| p.object(kind, obj))
}

fn res(user: UserInfo, verb: &str, group: &str, resource: &str, ns: &str) -> Attributes {
    Attributes::resource(user, verb, group, resource).namespace(ns)
}

#[test]
fn the_authorizer_answers_like_kube_apiservers_rbac_authorizer() {
    let policy = policy();
    let sa = operator;
    #[rustfmt::skip]
    let table: Vec<(&str, Attributes, bool)> = vec![
        ("a ClusterRoleBinding grants in every namespace", res(sa(), "patch", "apps", "deployments", "default").name("web"), true),
        ("and across all namespaces", res(sa(), "list", "apps", "deployments", ""), true),
        ("an ungranted verb is denied", res(sa(), "delete", "apps", "deployments", "default").name("web"), false),
        ("the API group must match", res(sa(), "get", "extensions", "deployments", "default"), false),
        ("the core group is \"\"", res(sa(), "create", "", "services", "default"), true),
        ("a resource grant is not a subresource grant", res(sa(), "patch", "example.com", "myapps", "default").subresource("status").name("a"), true),
        ("a subresource grant is not a resource grant", res(sa(), "patch", "example.com", "myapps", "default").name("a"), false),
        ("nor one for another subresource", res(sa(), "update", "example.com", "myapps", "default").subresource("status").name("a"), false),
        ("a Role grants in its namespace", res(sa(), "update", "coordination.k8s.io", "leases", OPERATOR_NS).name("other"), true),
        ("and only there", res(sa(), "get", "coordination.k8s.io", "leases", "default").name("myapp-lock"), false),
        ("nor at the cluster scope", res(sa(), "list", "coordination.k8s.io", "leases", ""), false),
        ("a ClusterRole bound by a RoleBinding grants in the binding's namespace", res(user("alice"), "list", "", "configmaps", "team-a"), true),
        ("and nowhere else", res(user("alice"), "list", "", "configmaps", "team-b"), false),
        ("nor across all namespaces", res(user("alice"), "list", "", "configmaps", ""), false),
        ("resourceNames allow the named object", res(user("alice"), "get", "", "secrets", "team-a").name("app-config"), true),
        ("and no other", res(user("alice"), "get", "", "secrets", "team-a").name("db-password"), false),
        ("nor the collection", res(user("alice"), "list", "", "secrets", "team-a"), false),
        ("a Group subject grants its members", res(user("hpa").group("autoscalers"), "update", "apps", "deployments", "web").subresource("scale").name("web"), true),
        ("and not others", res(user("hpa"), "update", "apps", "deployments", "web").subresource("scale").name("web"), false),
        ("*/status matches any resource's status", res(user("hpa").group("autoscalers"), "get", "example.com", "myapps", "x").subresource("status").name("a"), true),
        ("but not the resource", res(user("hpa").group("autoscalers"), "get", "example.com", "myapps", "x").name("a"), false),
        ("* verbs, resources and groups grant everything in the namespace", res(user("bob"), "deletecollection", "example.com", "myapps", "sandbox"), true),
        ("including subresources", res(user("bob"), "patch", "apps", "deployments", "sandbox").subresource("scale").name("w"), true),
        ("but not outside it", res(user("bob"), "get", "", "pods", "default").name("p"), false),
        ("a ServiceAccount subject is that account only", res(UserInfo::service_account("default", "myapp-operator").group("system:authenticated"), "get", "apps", "deployments", "default").name("web"), false),
        ("a user named like the ServiceAccount is not it", res(user("myapp-operator"), "get", "apps", "deployments", "default").name("web"), false),
        ("system:masters bypasses RBAC", res(UserInfo::admin(), "delete", "", "namespaces", "kube-system").name("kube-system"), true),
        ("non-resource URLs match exactly", Attributes::non_resource(user("prometheus"), "get", "/metrics"), true),
        ("or by a trailing *", Attributes::non_resource(user("prometheus"), "get", "/logs/kubelet.log"), true),
        ("with the verb", Attributes::non_resource(user("prometheus"), "post", "/metrics"), false),
        ("discovery is every authenticated user's", Attributes::non_resource(user("nobody"), "get", "/apis/apps/v1"), true),
        ("as are /version and /openapi/v3", Attributes::non_resource(user("nobody"), "get", "/openapi/v3/apis/apps/v1"), true),
        ("and the self reviews", res(user("nobody"), "create", "authorization.k8s.io", "selfsubjectaccessreviews", ""), true),
        ("but not other users' reviews", res(user("nobody"), "create", "authorization.k8s.io", "subjectaccessreviews", ""), false),
        ("and not /metrics", Attributes::non_resource(user("nobody"), "get", "/metrics"), false),
        ("a user without system:authenticated gets no defaults", Attributes::non_resource(UserInfo::user("raw"), "get", "/version"), false),
    ];
    let mut wrong = Vec::new();
    for (case, attrs, allowed) in &table {
        let decision = policy.authorize(attrs);
        if decision.allowed != *allowed {
            wrong.push(format!(
                "{case}: expected allowed={allowed}, got {decision:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_server_side_apply_that_creates_needs_patch_and_create() {
    // The PATCH is authorized as `patch`; creating the object also needs `create`
    // (handlers/patch.go). A user with patch only can apply to an existing object but not
    // create one by applying.
    let patch_only = role(
        "ClusterRole",
        None,
        "patcher",
        json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]),
    );
    let bound = binding(
        "ClusterRoleBinding",
        None,
        "patcher",
        "ClusterRole",
        "patcher",
        json!([{"kind": "User", "name": "dave"}]),
    );
    let patcher = Policy::new()
        .object(&patch_only.0, &patch_only.1)
        .object(&bound.0, &bound.1);
    let apply = res(user("dave"), "patch", "apps", "deployments", "default").name("web");
    assert!(patcher.authorize(&apply).allowed);
    assert!(!patcher.authorize(&apply.with_verb("create")).allowed);
    // The operator's role has both, so its applies may create children.
    let op = res(operator(), "patch", "apps", "deployments", "default").name("web");
    assert!(policy().authorize(&op).allowed);
    assert!(policy().authorize(&op.with_verb("create")).allowed);
}

#[test]
fn an_allowed_request_names_the_binding_that_allowed_it() {
    let decision = policy().authorize(
        &res(
            operator(),
            "get",
            "coordination.k8s.io",
            "leases",
            OPERATOR_NS,
        )
        .name("x"),
    );
    assert_eq!(
        decision.reason,
        "RBAC: allowed by RoleBinding \"leader/myapp-system\" of Role \"leader\" to ServiceAccount \"myapp-operator/myapp-system\""
    );
    let decision =
        policy().authorize(&res(operator(), "get", "apps", "deployments", "default").name("x"));
    assert_eq!(
        decision.reason,
        "RBAC: allowed by ClusterRoleBinding \"myapp-operator\" of ClusterRole \"myapp-operator\" to ServiceAccount \"myapp-operator/myapp-system\""
    );
}

#[test]
fn a_binding_to_a_missing_role_explains_the_denial() {
    let attrs = res(user("carol"), "get", "", "pods", "team-b").name("p");
    let decision = policy().authorize(&attrs);
    assert!(!decision.allowed);
    assert_eq!(
        decision.reason,
        "RBAC: role.rbac.authorization.k8s.io \"gone\" not found"
    );
    assert_eq!(
        forbidden(&attrs, &decision.reason).message,
        "pods \"p\" is forbidden: User \"carol\" cannot get resource \"pods\" in API group \"\" in the namespace \"team-b\": RBAC: role.rbac.authorization.k8s.io \"gone\" not found"
    );
}

#[test]
fn denials_read_like_kube_apiservers() {
    let sa = "system:serviceaccount:myapp-system:myapp-operator";
    let cases = [
        (
            res(operator(), "patch", "apps", "deployments", "default").name("web"),
            format!(
                "deployments.apps \"web\" is forbidden: User \"{sa}\" cannot patch resource \"deployments\" in API group \"apps\" in the namespace \"default\""
            ),
        ),
        (
            res(operator(), "list", "", "secrets", ""),
            format!(
                "secrets is forbidden: User \"{sa}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
            ),
        ),
        (
            res(operator(), "update", "apps", "deployments", "default")
                .subresource("scale")
                .name("web"),
            format!(
                "deployments.apps \"web\" is forbidden: User \"{sa}\" cannot update resource \"deployments/scale\" in API group \"apps\" in the namespace \"default\""
            ),
        ),
        (
            Attributes::non_resource(operator(), "get", "/metrics"),
            format!("forbidden: User \"{sa}\" cannot get path \"/metrics\""),
        ),
    ];
    for (attrs, message) in cases {
        let err = forbidden(&attrs, "");
        assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
        assert_eq!(err.message, message);
    }
}
