//! kube's client over HTTPS with bearer tokens: the served certificate verifies against the
//! kubeconfig's CA, a ServiceAccount token is authorized by the RBAC objects stored in the
//! sandbox, denials are kube-apiserver's 403s, a missing token is a 401, and the request log
//! says which token made each request.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::support::api::api_error;
use kube_sandbox::{Sandbox, Served};
use serde_json::json;

const NS: &str = "myapp-system";
const SA: &str = "system:serviceaccount:myapp-system:myapp-operator";

async fn client(kubeconfig: &str) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    kube_sandbox::client_for(kubeconfig)
        .await
        .expect("a client of the kubeconfig")
}

/// A sandbox served over HTTPS with two tokens of the operator's ServiceAccount (two
/// replicas), one for a user who may only patch, and the operator's RBAC applied by the admin.
async fn served() -> (Sandbox, Served, Client) {
    let sandbox = Sandbox::builder()
        .namespace(NS)
        .service_account_token("replica-0", NS, "myapp-operator")
        .service_account_token("replica-1", NS, "myapp-operator")
        .token("patcher", kube_sandbox::UserInfo::user("dave"))
        .build();
    let served = sandbox
        .serve_tls("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let admin = client(&served.kubeconfig()).await;
    // (role, its rules, the subject bound to it)
    let grants = [
        (
            "myapp-operator",
            json!([
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create", "patch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["get"]},
            ]),
            json!({"kind": "ServiceAccount", "name": "myapp-operator", "namespace": NS}),
        ),
        (
            "patcher",
            json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]),
            json!({"kind": "User", "name": "dave"}),
        ),
    ];
    let pp = PostParams::default();
    for (name, rules, subject) in grants {
        let role: ClusterRole =
            serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [subject],
        }))
        .unwrap();
        Api::<ClusterRole>::all(admin.clone())
            .create(&pp, &role)
            .await
            .unwrap();
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&pp, &binding)
            .await
            .unwrap();
    }
    (sandbox, served, admin)
}

fn deployment(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    })
}

fn status_of(err: kube::Error) -> (u16, String, String) {
    let status = api_error(err);
    (status.code, status.reason.clone(), status.message.clone())
}

/// The message of a refusal that must be a 403.
fn forbidden(err: kube::Error) -> String {
    let (code, _, message) = status_of(err);
    assert_eq!(code, 403, "{message}");
    message
}

/// A client of `kubeconfig`'s user that impersonates `user`.
async fn impersonating(kubeconfig: &str, user: &str) -> Client {
    let mut kubeconfig = Kubeconfig::from_yaml(kubeconfig).unwrap();
    kubeconfig.auth_infos[0]
        .auth_info
        .as_mut()
        .unwrap()
        .impersonate = Some(user.into());
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_token_is_allowed_what_its_roles_grant_and_nothing_else() {
    let (sandbox, served, _admin) = served().await;
    let op = client(&served.kubeconfig_for_token("replica-0").unwrap()).await;
    let deployments = Api::<Deployment>::namespaced(op.clone(), "default");

    // Apply creates: patch and create are both granted.
    let ssa = PatchParams::apply("myapp-operator");
    deployments
        .patch("web", &ssa, &Patch::Apply(deployment("web")))
        .await
        .expect("the operator may apply a deployment");
    assert_eq!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    let (code, reason, message) = status_of(
        deployments
            .delete("web", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        format!(
            "deployments.apps \"web\" is forbidden: User \"{SA}\" cannot delete resource \"deployments\" in API group \"apps\" in the namespace \"default\""
        )
    );

    let secrets = Api::<Secret>::all(op.clone());
    let listed = secrets.list(&ListParams::default()).await;
    assert_eq!(
        forbidden(listed.unwrap_err()),
        format!(
            "secrets is forbidden: User \"{SA}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
        )
    );

    // resourceNames: the named ConfigMap only (absent, so 404 after authorization).
    let cms = Api::<ConfigMap>::namespaced(op.clone(), "default");
    assert_eq!(status_of(cms.get("settings").await.unwrap_err()).0, 404);
    assert_eq!(status_of(cms.get("other").await.unwrap_err()).0, 403);

    // The scale subresource is not granted by `deployments`.
    let message = forbidden(deployments.get_scale("web").await.unwrap_err());
    assert!(
        message.contains("cannot get resource \"deployments/scale\""),
        "{message}"
    );
    drop(sandbox);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_would_create_needs_create_as_well_as_patch() {
    let (_sandbox, served, admin) = served().await;
    let dave = client(&served.kubeconfig_for_token("patcher").unwrap()).await;
    let ssa = PatchParams::apply("dave");
    let (code, reason, message) = status_of(
        Api::<Deployment>::namespaced(dave.clone(), "default")
            .patch("web", &ssa, &Patch::Apply(deployment("web")))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    // The create check's denial carries the authorizer's reason only (empty from RBAC).
    assert_eq!(message, "deployments.apps \"web\" is forbidden: ");

    // Once the object exists, the same apply is a patch and allowed.
    Api::<Deployment>::namespaced(admin, "default")
        .patch(
            "web",
            &PatchParams::apply("admin"),
            &Patch::Apply(deployment("web")),
        )
        .await
        .unwrap();
    Api::<Deployment>::namespaced(dave, "default")
        .patch("web", &ssa.force(), &Patch::Apply(deployment("web")))
        .await
        .expect("patching an existing object needs patch only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_valid_token_is_unauthorized() {
    let (sandbox, served, _admin) = served().await;
    let anonymous = served.kubeconfig().replace(
        &format!("token: {}", sandbox.token("admin").unwrap()),
        "token: not-a-token",
    );
    let (code, reason, message) = status_of(
        Api::<Deployment>::all(client(&anonymous).await)
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (401, "Unauthorized", "Unauthorized")
    );
    let last = sandbox.faults().requests().pop().unwrap();
    assert_eq!((last.status, last.user, last.token_id), (401, None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_attributes_each_request_to_its_token() {
    let (sandbox, served, _admin) = served().await;
    sandbox.faults().clear_requests();
    for replica in ["replica-0", "replica-1"] {
        let c = client(&served.kubeconfig_for_token(replica).unwrap()).await;
        Api::<Deployment>::namespaced(c, "default")
            .list(&ListParams::default())
            .await
            .unwrap();
    }
    let seen: Vec<(Option<String>, Option<String>, String)> = sandbox
        .faults()
        .requests()
        .into_iter()
        .map(|r| (r.user, r.token_id, r.verb))
        .collect();
    let sa = Some(SA.to_string());
    assert_eq!(
        seen,
        [
            (sa.clone(), Some("replica-0".into()), "list".into()),
            (sa, Some("replica-1".into()), "list".into()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_authentication_everyone_is_the_admin_as_before() {
    let sandbox = Sandbox::new();
    let c = Client::new(sandbox.router(), "default");
    Api::<Secret>::all(c)
        .list(&ListParams::default())
        .await
        .unwrap();
    let last = sandbox.faults().requests().pop().unwrap();
    assert_eq!((last.status, last.user, last.token_id), (200, None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_reviews_another_users_access_and_others_may_not() {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let (_sandbox, served, admin) = served().await;
    let review = |verb: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({
            "spec": {
                "user": SA,
                "groups": ["system:serviceaccounts", "system:serviceaccounts:myapp-system"],
                "resourceAttributes": {"verb": verb, "group": "apps", "resource": "deployments", "namespace": "default"},
            },
        }))
        .unwrap()
    };
    let reviews = Api::<SubjectAccessReview>::all(admin);
    let answered = reviews
        .create(&PostParams::default(), &review("create"))
        .await
        .unwrap();
    let status = answered.status.unwrap();
    assert!(status.allowed);
    assert_eq!(
        status.reason.as_deref(),
        Some(
            "RBAC: allowed by ClusterRoleBinding \"myapp-operator\" of ClusterRole \"myapp-operator\" to ServiceAccount \"myapp-operator/myapp-system\""
        )
    );
    let answered = reviews
        .create(&PostParams::default(), &review("delete"))
        .await
        .unwrap();
    assert!(!answered.status.unwrap().allowed);

    // The ServiceAccount may review itself (system:basic-user) but not others.
    let op = client(&served.kubeconfig_for_token("replica-0").unwrap()).await;
    let reviewed = Api::<SubjectAccessReview>::all(op)
        .create(&PostParams::default(), &review("create"))
        .await;
    assert_eq!(
        forbidden(reviewed.unwrap_err()),
        format!(
            "subjectaccessreviews.authorization.k8s.io is forbidden: User \"{SA}\" cannot create resource \"subjectaccessreviews\" in API group \"authorization.k8s.io\" at the cluster scope"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_users_allowed_to_impersonate_may_act_as_another() {
    let (sandbox, served, _admin) = served().await;
    let as_dave = impersonating(&served.kubeconfig_for_token("replica-0").unwrap(), "dave").await;
    let listed = Api::<Deployment>::all(as_dave)
        .list(&ListParams::default())
        .await;
    assert_eq!(
        forbidden(listed.unwrap_err()),
        format!(
            "users \"dave\" is forbidden: User \"{SA}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        )
    );
    // The admin may, and the request is then the impersonated user's.
    let err = Api::<Deployment>::all(impersonating(&served.kubeconfig(), "dave").await)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(status_of(err).0, 403);
    let last = sandbox.faults().requests().pop().unwrap();
    assert_eq!(
        (last.user.as_deref(), last.token_id.as_deref()),
        (Some("dave"), Some("admin"))
    );
}
