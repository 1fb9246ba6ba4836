//! Built-in kinds as kubectl 1.33 meets them on a real kube-apiserver 1.33: the CRD table, a
//! `kind: List` file, webhook configurations refused and defaulted, and the defaults of
//! admission objects owned by the manager that wrote them.

use crate::support::kubectl::{apply_widget_crd, served_kubectl};

use kube_sandbox::Sandbox;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_crd_prints_name_and_created_at_as_rfc3339() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    apply_widget_crd(&k, &[]).await;
    let created = k
        .ok(&[
            "get",
            "crd",
            "widgets.sandbox.test",
            "-o",
            "jsonpath={.metadata.creationTimestamp}",
        ])
        .await;
    for args in [&["get", "crd"][..], &["get", "crd", "widgets.sandbox.test"]] {
        let out = k.ok(args).await;
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec!["NAME", "CREATED", "AT"],
                vec!["widgets.sandbox.test", created.as_str()]
            ],
            "{out}"
        );
    }
}
