//! RBAC: a SubjectAccessReview per permission the operator's code needs, for its
//! ServiceAccount, as the API server would authorize the operator's own requests.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{Api, Client, api::PostParams};

use super::{
    report::{Check, Group},
    target::{Target, api_message, names},
};
use crate::permission::{Permission, Scope};

/// Every permission the operator uses: the controller's and the leader election's.
pub fn operator_permissions() -> impl Iterator<Item = &'static Permission> {
    crate::controller::PERMISSIONS
        .iter()
        .chain(crate::leader::PERMISSIONS)
}

/// The RBAC group.
pub async fn checks(client: &Client, target: &Target) -> Group {
    if target.is_dev() {
        return Group {
            name: "RBAC",
            checks: vec![Check::skip(
                "rbac",
                "dev runs the operator with its kubeconfig's credentials: there is no ServiceAccount to check",
            )],
        };
    }
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let user = format!(
        "system:serviceaccount:{}:{}",
        target.namespace,
        names::SERVICE_ACCOUNT
    );
    let mut checks = Vec::new();
    let sharding = crate::shard::sharder::PERMISSIONS
        .iter()
        .filter(|_| target.sharding.is_some())
        .map(|p| (p, Grant::Sharding));
    let all = operator_permissions()
        .map(|p| (p, Grant::Base))
        .chain(sharding);
    for (permission, grant) in all {
        let review = review(&user, &target.namespace, permission);
        let id = format!(
            "rbac.{}/{}/{}",
            if permission.group.is_empty() {
                "core"
            } else {
                permission.group
            },
            permission.resource,
            permission.verb
        );
        let what = describe(permission, &target.namespace);
        match api.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {
                checks.push(Check::ok(
                    id,
                    format!("{} may {what}", names::SERVICE_ACCOUNT),
                ));
            }
            Ok(answer) => {
                let reason = answer
                    .status
                    .and_then(|s| s.reason)
                    .filter(|r| !r.is_empty())
                    .map_or_else(String::new, |r| format!(" ({r})"));
                checks.push(Check::fail(
                    id,
                    format!("{} may not {what}{reason}", names::SERVICE_ACCOUNT),
                    missing_rule(permission, grant, &target.namespace),
                    "rbac",
                ));
            }
            Err(error) => {
                // One failure says it all: every other review would fail the same way.
                checks.push(Check::fail(
                    "rbac.review",
                    format!(
                        "cannot ask the API server what {user} may do: {}",
                        api_message(&error)
                    ),
                    "run check as a user who may create subjectaccessreviews (authorization.k8s.io)",
                    "rbac",
                ));
                break;
            }
        }
    }
    Group {
        name: "RBAC",
        checks,
    }
}

/// The review the API server would make of the operator's request.
fn review(user: &str, namespace: &str, permission: &Permission) -> SubjectAccessReview {
    let (resource, subresource) = permission.split_resource();
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(permission.group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource: subresource.map(str::to_owned),
                verb: Some(permission.verb.to_owned()),
                // No namespace: all of them, as the controller's cluster-wide watches ask.
                namespace: match permission.scope {
                    Scope::Cluster => None,
                    Scope::OperatorNamespace => Some(namespace.to_owned()),
                },
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// `patch deployments.apps in every namespace`.
fn describe(permission: &Permission, namespace: &str) -> String {
    let resource = if permission.group.is_empty() {
        permission.resource.to_owned()
    } else {
        let (resource, sub) = permission.split_resource();
        match sub {
            Some(sub) => format!("{resource}.{}/{sub}", permission.group),
            None => format!("{resource}.{}", permission.group),
        }
    };
    let scope = match permission.scope {
        Scope::Cluster => "in every namespace".to_owned(),
        Scope::OperatorNamespace => format!("in {namespace}"),
    };
    format!("{} {resource} {scope}", permission.verb)
}

/// Which manifest grants a permission.
#[derive(Clone, Copy)]
enum Grant {
    /// `deploy/base/rbac.yaml`: every install.
    Base,
    /// `deploy/sharding/rbac.yaml`: what sharding adds.
    Sharding,
}

/// The exact rule that grants the permission, and where it goes.
fn missing_rule(permission: &Permission, grant: Grant, namespace: &str) -> String {
    let (cluster_role, role, file) = match grant {
        Grant::Base => (
            names::CLUSTER_ROLE,
            names::LEADER_ROLE,
            "deploy/base/rbac.yaml",
        ),
        Grant::Sharding => (
            names::SHARDING_ROLE,
            names::SHARDING_ROLE,
            "deploy/sharding/rbac.yaml",
        ),
    };
    let role = match permission.scope {
        Scope::Cluster => format!("the ClusterRole {cluster_role}"),
        Scope::OperatorNamespace => format!("the Role {role} in {namespace}"),
    };
    format!(
        "add the rule {} to {role} ({file} has it: kubectl apply -f {file})",
        permission.rule()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_permission_names_the_rule_and_the_role() {
        let lease = Permission::namespaced("coordination.k8s.io", "leases", "update");
        assert_eq!(
            missing_rule(&lease, Grant::Base, "myapp-system"),
            "add the rule {apiGroups: [\"coordination.k8s.io\"], resources: [\"leases\"], verbs: [\"update\"]} to the Role myapp-operator-leader-election in myapp-system (deploy/base/rbac.yaml has it: kubectl apply -f deploy/base/rbac.yaml)"
        );
        let relabel = Permission::cluster("example.com", "myapps", "patch");
        assert_eq!(
            missing_rule(&relabel, Grant::Sharding, "myapp-system"),
            "add the rule {apiGroups: [\"example.com\"], resources: [\"myapps\"], verbs: [\"patch\"]} to the ClusterRole myapp-operator-sharding (deploy/sharding/rbac.yaml has it: kubectl apply -f deploy/sharding/rbac.yaml)"
        );
        let status = Permission::cluster("example.com", "myapps/status", "patch");
        assert_eq!(
            describe(&status, "myapp-system"),
            "patch myapps.example.com/status in every namespace"
        );
        let review = review("u", "myapp-system", &status);
        let attributes = review.spec.resource_attributes.unwrap();
        assert_eq!(attributes.resource.as_deref(), Some("myapps"));
        assert_eq!(attributes.subresource.as_deref(), Some("status"));
        assert_eq!(attributes.namespace, None);
    }
}
