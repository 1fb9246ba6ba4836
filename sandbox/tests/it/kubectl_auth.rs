//! The real kubectl over HTTPS with tokens: it verifies the sandbox's generated CA, `kubectl
//! auth can-i` (SelfSubjectAccessReview, also impersonating with `--as`) and `kubectl auth
//! whoami` (SelfSubjectReview) are answered by the authorizer requests meet, and a forbidden
//! command prints the server's 403 and exits 1, as against a real cluster.
//!
//! Skipped (with a printed reason) when kubectl is not on PATH, unless
//! `SANDBOX_REQUIRE_KUBECTL=1`.

use crate::support::kubectl::{stderr, stdout};

use kube_sandbox::Sandbox;
use kube_sandbox::testing::{Kubectl, path_str};

const NS: &str = "myapp-system";
const SA: &str = "system:serviceaccount:myapp-system:myapp-operator";

const RBAC: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: myapp-operator
rules:
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: myapp-operator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: myapp-operator
subjects:
- kind: ServiceAccount
  name: myapp-operator
  namespace: myapp-system
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_checks_access_and_identity_and_prints_the_servers_denials() {
    let sandbox = Sandbox::builder()
        .server_minor_version(33)
        .namespace(NS)
        .service_account_token("replica-0", NS, "myapp-operator")
        .build();
    let served = sandbox
        .serve_tls("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let Some(admin) = Kubectl::new(&served.kubeconfig()) else {
        return;
    };
    let operator = Kubectl::new(&served.kubeconfig_for_token("replica-0").unwrap()).unwrap();

    // The admin (system:masters) over HTTPS, the CA from the kubeconfig.
    let out = admin.ok(&["get", "namespaces"]).await;
    assert!(out.contains(NS), "{out}");
    let rbac = admin.file("rbac.yaml", RBAC);
    let out = admin.ok(&["apply", "-f", path_str(&rbac)]).await;
    assert!(
        out.contains("clusterrole.rbac.authorization.k8s.io/myapp-operator created"),
        "{out}"
    );
    assert!(
        out.contains("clusterrolebinding.rbac.authorization.k8s.io/myapp-operator created"),
        "{out}"
    );
    let out = admin.ok(&["get", "clusterrolebindings"]).await;
    assert!(out.contains("myapp-operator"), "{out}");

    // can-i as the admin impersonating the ServiceAccount, and as the ServiceAccount itself.
    // (who asks, the question, the exit code, the answer)
    let questions: Vec<(&str, &Kubectl, &[&str], i32, &str)> = vec![
        (
            "the admin as the ServiceAccount",
            &admin,
            &["create", "deployments", "-n", "default", "--as", SA],
            0,
            "yes",
        ),
        (
            "the admin as the ServiceAccount",
            &admin,
            &["delete", "deployments", "-n", "default", "--as", SA],
            1,
            "no",
        ),
        (
            "the ServiceAccount",
            &operator,
            &["patch", "deployments.apps", "-n", "default"],
            0,
            "yes",
        ),
        (
            "the ServiceAccount",
            &operator,
            &["get", "secrets", "-A"],
            1,
            "no",
        ),
    ];
    for (who, kubectl, question, code, answer) in questions {
        let out = kubectl.run(&[&["auth", "can-i"], question].concat()).await;
        assert_eq!(
            (out.status.code(), stdout(&out).trim()),
            (Some(code), answer),
            "{who}: can-i {question:?}: {}",
            stderr(&out)
        );
    }

    // whoami: the ServiceAccount's name, groups and its token's credential id.
    let out = operator.ok(&["auth", "whoami", "-o", "json"]).await;
    let review: serde_json::Value = serde_json::from_str(&out).expect("whoami prints JSON");
    assert_eq!(review["kind"], "SelfSubjectReview", "{out}");
    let user = &review["status"]["userInfo"];
    assert_eq!(user["username"], SA, "{out}");
    assert_eq!(
        user["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:myapp-system",
            "system:authenticated"
        ])
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/credential-id"][0],
        "JTI=replica-0"
    );

    // Allowed and forbidden commands as the ServiceAccount.
    operator.ok(&["get", "deployments", "-n", "default"]).await;
    // (command, what kubectl prints)
    let forbidden: Vec<(&[&str], String)> = vec![
        (
            &["get", "secrets", "-A"],
            format!(
                "Error from server (Forbidden): secrets is forbidden: User \"{SA}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
            ),
        ),
        (
            &["delete", "deployment", "web", "-n", "default"],
            format!(
                "Error from server (Forbidden): deployments.apps \"web\" is forbidden: User \"{SA}\" cannot delete resource \"deployments\" in API group \"apps\" in the namespace \"default\""
            ),
        ),
    ];
    for (command, printed) in forbidden {
        let out = operator.run(command).await;
        assert_eq!(out.status.code(), Some(1), "{command:?}");
        assert!(
            stderr(&out).contains(&printed),
            "{command:?}: {}",
            stderr(&out)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_with_a_wrong_token_must_log_in() {
    let sandbox = Sandbox::builder().authentication().build();
    let served = sandbox
        .serve_tls("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let kubeconfig = served
        .kubeconfig()
        .replace(&sandbox.token("admin").unwrap(), "wrong");
    let Some(k) = Kubectl::new(&kubeconfig) else {
        return;
    };
    // client-go's discovery reads the 401 as "the server has asked for the client to provide
    // credentials"; other paths print the Status message "Unauthorized".
    // (command, what kubectl prints)
    let cases: Vec<(&[&str], &str)> = vec![
        (
            &["get", "namespaces"],
            "error: You must be logged in to the server (",
        ),
        (&["get", "--raw", "/api/v1/namespaces"], "Unauthorized"),
    ];
    for (command, printed) in cases {
        let out = k.run(command).await;
        assert_eq!(out.status.code(), Some(1), "{command:?}");
        assert!(
            stderr(&out).contains(printed),
            "{command:?}: {}",
            stderr(&out)
        );
    }
}
