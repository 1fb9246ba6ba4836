//! `deploy/base/user-roles.yaml`: the MyApp rules that Kubernetes' `admin`, `edit` and `view`
//! ClusterRoles aggregate, judged by the sandbox's RBAC authorizer.
//!
//! The sandbox does not run the ClusterRole aggregation controller, so this test does its job:
//! each default role gets the rules of every ClusterRole labelled for it, as kube-controller-
//! manager fills `rules` from `aggregationRule.clusterRoleSelectors` (and, as there, `view`'s
//! own rules flow into `edit` and `edit`'s into `admin` through the default roles' labels).

use std::path::Path;

use kube_sandbox::UserInfo;
use kube_sandbox::rbac::{Attributes, Policy};
use serde_json::{Value, json};

const NS: &str = "team-a";

fn user_roles() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/user-roles.yaml");
    serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn labelled_for(role: &Value, aggregate: &str) -> bool {
    role["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{aggregate}")]
        == "true"
}

/// `admin`, `edit` and `view` as the aggregation controller fills them from `roles`.
fn aggregated(roles: &[Value]) -> Vec<Value> {
    // Which labels each default role selects: its own, and the roles below it (the default
    // `view` is labelled aggregate-to-edit, the default `edit` aggregate-to-admin).
    let selects: [(&str, &[&str]); 3] = [
        ("admin", &["admin", "edit", "view"]),
        ("edit", &["edit", "view"]),
        ("view", &["view"]),
    ];
    selects
        .iter()
        .map(|(name, labels)| {
            let rules: Vec<Value> = roles
                .iter()
                .filter(|r| labels.iter().any(|l| labelled_for(r, l)))
                .flat_map(|r| r["rules"].as_array().unwrap().clone())
                .collect();
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name}, "rules": rules})
        })
        .collect()
}

fn bound(role: &str, user: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": format!("{user}-{role}"), "namespace": NS},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
}

#[test]
fn edit_and_admin_manage_myapps_view_only_reads_them_through_aggregation() {
    let roles = user_roles();
    let names: Vec<&str> = roles
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["myapp-edit", "myapp-view"]);
    assert!(labelled_for(&roles[0], "edit") && labelled_for(&roles[0], "admin"));
    assert!(!labelled_for(&roles[0], "view"));
    assert!(labelled_for(&roles[1], "view") && !labelled_for(&roles[1], "edit"));

    let policy = aggregated(&roles)
        .iter()
        .fold(Policy::new(), |p, role| p.object("ClusterRole", role))
        .object("RoleBinding", &bound("admin", "ada"))
        .object("RoleBinding", &bound("edit", "ed"))
        .object("RoleBinding", &bound("view", "vi"));
    let may = |user: &str, verb: &str, subresource: Option<&str>, ns: &str| {
        let mut attrs = Attributes::resource(
            UserInfo::user(user).group("system:authenticated"),
            verb,
            "example.com",
            "myapps",
        )
        .namespace(ns);
        if let Some(sub) = subresource {
            attrs = attrs.subresource(sub);
        }
        policy.authorize(&attrs).allowed
    };
    for user in ["ada", "ed"] {
        for verb in [
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
            "get",
            "list",
            "watch",
        ] {
            assert!(may(user, verb, None, NS), "{user} may {verb} MyApps");
        }
        assert!(may(user, "patch", Some("scale"), NS), "{user} may scale");
        assert!(
            may(user, "get", Some("status"), NS),
            "{user} may read the status"
        );
        assert!(
            !may(user, "patch", Some("status"), NS),
            "the status is the operator's"
        );
        assert!(
            !may(user, "create", None, "team-b"),
            "only where {user} is bound"
        );
    }
    for verb in ["get", "list", "watch"] {
        assert!(may("vi", verb, None, NS), "vi may {verb} MyApps");
    }
    assert!(may("vi", "get", Some("status"), NS));
    for verb in ["create", "update", "patch", "delete", "deletecollection"] {
        assert!(!may("vi", verb, None, NS), "vi may not {verb} MyApps");
    }
    assert!(!may("vi", "patch", Some("scale"), NS), "vi may not scale");
    assert!(!may("nobody", "get", None, NS));
}
