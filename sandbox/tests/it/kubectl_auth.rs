//! The real kubectl over HTTPS with tokens: it verifies the sandbox's generated CA, `kubectl
//! auth can-i` (SelfSubjectAccessReview, also impersonating with `--as`) and `kubectl auth
//! whoami` (SelfSubjectReview) are answered by the authorizer requests meet, and a forbidden
//! command prints the server's 403 and exits 1, as against a real cluster.
//!
//! Skipped (with a printed reason) when kubectl is not on PATH, unless
//! `SANDBOX_REQUIRE_KUBECTL=1`.

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

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

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
    let out = admin
        .run(&[
            "auth",
            "can-i",
            "create",
            "deployments",
            "-n",
            "default",
            "--as",
            SA,
        ])
        .await;
    assert_eq!(
        (out.status.code(), stdout(&out).trim()),
        (Some(0), "yes"),
        "{}",
        stderr(&out)
    );
    let out = admin
        .run(&[
            "auth",
            "can-i",
            "delete",
            "deployments",
            "-n",
            "default",
            "--as",
            SA,
        ])
        .await;
    assert_eq!(
        (out.status.code(), stdout(&out).trim()),
        (Some(1), "no"),
        "{}",
        stderr(&out)
    );
    let out = operator
        .run(&[
            "auth",
            "can-i",
            "patch",
            "deployments.apps",
            "-n",
            "default",
        ])
        .await;
    assert_eq!(
        (out.status.code(), stdout(&out).trim()),
        (Some(0), "yes"),
        "{}",
        stderr(&out)
    );
    let out = operator
        .run(&["auth", "can-i", "get", "secrets", "-A"])
        .await;
    assert_eq!(
        (out.status.code(), stdout(&out).trim()),
        (Some(1), "no"),
        "{}",
        stderr(&out)
    );

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
    let out = operator.run(&["get", "secrets", "-A"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("Error from server (Forbidden): secrets is forbidden: User \"{SA}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope")),
        "{}",
        stderr(&out)
    );
    let out = operator
        .run(&["delete", "deployment", "web", "-n", "default"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("Error from server (Forbidden): deployments.apps \"web\" is forbidden: User \"{SA}\" cannot delete resource \"deployments\" in API group \"apps\" in the namespace \"default\"")),
        "{}",
        stderr(&out)
    );
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
    let out = k.run(&["get", "namespaces"]).await;
    assert_eq!(out.status.code(), Some(1));
    // client-go's discovery reads the 401 as "the server has asked for the client to provide
    // credentials"; other paths print the Status message "Unauthorized".
    assert!(
        stderr(&out).contains("error: You must be logged in to the server ("),
        "{}",
        stderr(&out)
    );
    let out = k.run(&["get", "--raw", "/api/v1/namespaces"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("Unauthorized"), "{}", stderr(&out));
}
