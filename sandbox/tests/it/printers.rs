//! The columns kubectl prints for built-in kinds come from the server's Tables, as
//! kube-apiserver's printers make them.

use crate::support::kubectl::served_kubectl;

use std::time::Duration;

use kube_sandbox::Sandbox;
use kube_sandbox::testing::{eventually, path_str};

const MANIFESTS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
    matchExpressions:
    - {key: tier, operator: In, values: [front, edge]}
  template:
    metadata:
      labels: {app: web, tier: front}
    spec:
      containers:
      - {name: app, image: "nginx:1.27"}
      - {name: sidecar, image: "busybox:1.36"}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web, tier: front}
  ports:
  - {port: 80, targetPort: 8080}
  - {port: 53, protocol: UDP, name: dns}
---
apiVersion: v1
kind: Service
metadata:
  name: outside
spec:
  type: ExternalName
  externalName: example.com
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
spec:
  nodeName: node-1
  containers:
  - {name: app, image: "nginx:1.27"}
  - {name: sidecar, image: "busybox:1.36"}
"#;

/// What a kubelet reports: the app runs and is ready, the sidecar crash-loops.
const POD_STATUS: &str = r#"{"status": {
  "phase": "Running",
  "podIP": "10.244.0.5",
  "podIPs": [{"ip": "10.244.0.5"}],
  "containerStatuses": [
    {"name": "app", "ready": true, "restartCount": 0, "image": "nginx:1.27", "imageID": "",
     "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}},
    {"name": "sidecar", "ready": false, "restartCount": 3, "image": "busybox:1.36", "imageID": "",
     "state": {"waiting": {"reason": "CrashLoopBackOff"}},
     "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:00:00Z"}}}
  ]
}}"#;

/// The cells of the line for `name` (split on runs of two or more spaces).
fn row(out: &str, name: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in\n{out}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

fn header(out: &str) -> Vec<String> {
    row(out, out.split_whitespace().next().unwrap_or(""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_prints_built_in_kinds_with_kube_apiserver_columns() {
    let sandbox = Sandbox::builder()
        .rollout_delay(Duration::from_millis(20))
        .build();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let manifests = k.file("all.yaml", MANIFESTS);
    k.ok(&["apply", "-f", path_str(&manifests)]).await;

    let out = eventually("the Deployment's rollout is reported", || async {
        let out = k.ok(&["get", "deployments"]).await;
        out.contains("2/2").then_some(out)
    })
    .await;
    assert_eq!(
        header(&out),
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    let cells = row(&out, "web");
    assert_eq!(cells[..4], ["web", "2/2", "2", "2"], "{out}");
    assert!(cells[4].ends_with('s'), "AGE: {out}");

    let out = k.ok(&["get", "deployment", "web", "-o", "wide"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]
    );
    let cells = row(&out, "web");
    assert_eq!(
        cells[5..],
        [
            "app,sidecar",
            "nginx:1.27,busybox:1.36",
            "app=web,tier in (edge,front)"
        ],
        "{out}"
    );

    let out = k.ok(&["get", "services", "-o", "wide"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE",
            "SELECTOR"
        ]
    );
    let web = row(&out, "web");
    assert_eq!(web[1], "ClusterIP", "{out}");
    assert!(web[2].starts_with("10."), "CLUSTER-IP: {out}");
    assert_eq!(web[3..5], ["<none>", "80/TCP,53/UDP"], "{out}");
    assert_eq!(web[6], "app=web,tier=front", "{out}");
    let outside = row(&out, "outside");
    assert_eq!(
        outside[1..5],
        ["ExternalName", "<none>", "example.com", "<none>"],
        "{out}"
    );

    k.ok(&[
        "patch",
        "pod",
        "web-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        POD_STATUS,
    ])
    .await;
    let out = k.ok(&["get", "pods", "-o", "wide"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED NODE",
            "READINESS GATES"
        ]
    );
    let pod = row(&out, "web-0");
    assert_eq!(pod[1..3], ["1/2", "CrashLoopBackOff"], "{out}");
    assert!(
        pod[3].starts_with("3 (") && pod[3].ends_with(" ago)"),
        "RESTARTS says when the last one was: {out}"
    );
    assert_eq!(
        pod[5..],
        ["10.244.0.5", "node-1", "<none>", "<none>"],
        "{out}"
    );
}
