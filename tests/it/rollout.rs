//! The operator's own Deployment, as `deploy/base/deployment.yaml` writes it, installed and rolled
//! the way a cluster does it: two replicas of the real `myapp-operator run` binary, probed
//! like a kubelet probes them, rolled within `maxSurge`/`maxUnavailable`, stopped with SIGTERM
//! and the manifest's grace period, the webhook reached through a Service whose endpoints are
//! the Ready pods, over TLS verified against the Service's DNS name, with keep-alive
//! connections as the API server keeps them. `node.rs` plays the Deployment controller, the
//! kubelet and the endpoints controller, and says how the pod spec is translated to loopback.
//! One value of the manifest is changed, the drain delay ([`DRAIN_DELAY`] says why).
//!
//! Two bad rollouts must hold `kubectl rollout status` back: a pod that crashes at start (a
//! mistyped certificate directory) and a pod that runs but answers `/readyz` 503 (its Secret
//! holds a certificate that expired a minute ago, which the loader's clock skew still starts).
//!
//! While the Deployment rolls, a client keeps writing valid and invalid MyApps: no valid write
//! may be refused, every invalid one must be refused with the webhook's message.

mod node;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    apps::v1::Deployment,
    coordination::v1::Lease,
};
use k8s_openapi::{ByteString, apimachinery::pkg::util::intstr::IntOrString};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use kube_sandbox::{
    admission::ServiceRef,
    testing::{Kubectl, eventually},
};
use myapp_operator::crd::MyApp;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::run::Cluster;
use crate::support::install::deploy_documents as documents;
use node::Node;

/// Every pod of a good template is Ready (as its kubelet sees it) this soon after its
/// container started: start-up, the webhook's first certificate, one readiness period.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// How many MyApps the writer edits in turn.
const APPS: usize = 5;
/// The one value of the manifest this test changes. A terminating pod keeps answering for its
/// drain delay, so that the webhook's endpoints drop it before it stops accepting; the
/// manifest's 10 s covers endpoint propagation in a cluster, the node here updates the
/// endpoints every [`node::TICK`] (100 ms). 2 s keeps twenty ticks of margin, and saves 8 s on
/// each of the three times the leader drains (the Lease moves only when it exits).
const DRAIN_DELAY: &str = "2s";
/// How long a rollout that must not succeed is watched: two readiness periods of the manifest
/// (2 s each) after the new pod starts, more than a pod that wrongly turned Ready would need.
const MUST_NOT_FINISH_WITHIN: &str = "4s";

/// `deployment` with its container's `MYAPP_DRAIN_DELAY` set to `delay`.
fn with_drain_delay(mut deployment: Deployment, delay: &str) -> Deployment {
    let containers = &mut deployment
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers;
    let var = containers
        .iter_mut()
        .flat_map(|c| c.env.iter_mut().flatten())
        .find(|var| var.name == "MYAPP_DRAIN_DELAY")
        .expect("deploy/base/deployment.yaml sets MYAPP_DRAIN_DELAY");
    var.value = Some(delay.to_owned());
    deployment
}

fn document(file: &str, kind: &str) -> Value {
    documents(file)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("deploy/{file} has no {kind}"))
}

/// The Service the webhook configurations call and the pod port it targets, from
/// `deploy/base/webhooks.yaml` and `deploy/base/services.yaml`.
fn webhook_service() -> (ServiceRef, IntOrString) {
    let hooks = document("base/webhooks.yaml", "ValidatingWebhookConfiguration");
    let service = &hooks["webhooks"][0]["clientConfig"]["service"];
    let (namespace, name) = (
        service["namespace"].as_str().unwrap(),
        service["name"].as_str().unwrap(),
    );
    let port = service["port"].as_u64().unwrap_or(443) as u16;
    let spec = documents("base/services.yaml")
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .expect("deploy/base/services.yaml has the webhook Service");
    let target = spec["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"].as_u64() == Some(u64::from(port)))
        .expect("the Service has the port the webhooks call")["targetPort"]
        .clone();
    let target_port = serde_json::from_value(target).unwrap();
    (ServiceRef::new(namespace, name, port), target_port)
}

/// The webhook configurations of `deploy/base/webhooks.yaml`, with the CA cert-manager's
/// injector would have put in.
async fn install_webhooks(client: &Client, ca_pem: &str) {
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    let mut mutating: MutatingWebhookConfiguration = serde_json::from_value(document(
        "base/webhooks.yaml",
        "MutatingWebhookConfiguration",
    ))
    .unwrap();
    for hook in mutating.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(bundle.clone());
    }
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .unwrap();
    let mut validating: ValidatingWebhookConfiguration = serde_json::from_value(document(
        "base/webhooks.yaml",
        "ValidatingWebhookConfiguration",
    ))
    .unwrap();
    for hook in validating.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(bundle.clone());
    }
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .unwrap();
}

/// What the writer saw in one phase of the test.
#[derive(Default, Debug)]
struct Writes {
    valid_admitted: usize,
    valid_refused: Vec<String>,
    invalid_refused: usize,
    invalid_admitted: Vec<String>,
}

/// Edits the MyApps in turn until `stop`, alternating a valid image and one only the webhook
/// refuses (a sha256 digest of 40 hex digits), counting the answers under the current phase.
async fn write_continuously(
    client: Client,
    stop: CancellationToken,
    phase: Arc<AtomicUsize>,
    writes: Arc<Mutex<BTreeMap<usize, Writes>>>,
) {
    let apps = Api::<MyApp>::namespaced(client, "default");
    let mut n = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(40));
    while !stop.is_cancelled() {
        tick.tick().await;
        n += 1;
        let valid = n.is_multiple_of(2);
        let image = if valid {
            format!("ghcr.io/example/web:1.4.{n}")
        } else {
            "ghcr.io/example/web@sha256:0123456789abcdef0123456789abcdef01234567".to_owned()
        };
        let name = format!("web-{}", n % APPS);
        let patch = Patch::Merge(json!({"spec": {"image": image}}));
        let result = apps.patch(&name, &PatchParams::default(), &patch).await;
        let mut writes = writes.lock().unwrap();
        let counts = writes.entry(phase.load(Ordering::SeqCst)).or_default();
        match (valid, result) {
            (true, Ok(_)) => counts.valid_admitted += 1,
            (true, Err(error)) => counts.valid_refused.push(error.to_string()),
            (false, Err(kube::Error::Api(status)))
                if status.message.contains(
                    "admission webhook \"validate.myapps.example.com\" denied the request",
                ) && status.message.contains("spec.image") =>
            {
                counts.invalid_refused += 1
            }
            (false, Err(error)) => counts
                .invalid_admitted
                .push(format!("wrong refusal: {error}")),
            (false, Ok(_)) => counts.invalid_admitted.push(format!("{name} admitted")),
        }
    }
}

/// `kubectl rollout status`, as deploy/README.md runs it: its exit, output and when it ended.
async fn rollout_status(kubectl: &Kubectl, name: &str, timeout: &str) -> (bool, String, Instant) {
    let deployment = format!("deployment/{name}");
    let timeout = format!("--timeout={timeout}");
    let out = kubectl
        .run(&[
            "-n",
            "myapp-system",
            "rollout",
            "status",
            &deployment,
            &timeout,
        ])
        .await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, Instant::now())
}

async fn lease_holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "myapp-system")
        .get_opt("myapp-operator")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

/// The pods of the template currently in the Deployment.
fn current_pods(node: &Node, deployment: &Deployment) -> Vec<String> {
    let hash = node::template_hash(&deployment.spec.as_ref().unwrap().template);
    node.pods
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.hash == hash)
        .map(|p| p.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operators_deployment_rolls_twice_with_no_valid_write_refused_and_one_writer_at_a_time()
{
    let cluster = Arc::new(Cluster::start(true).await);
    let Some(kubectl) = Kubectl::new(&cluster.served.kubeconfig()) else {
        return;
    };
    let admin = cluster.client();
    install_webhooks(&admin, &cluster.bundle.ca_pem).await;
    let manifest = with_drain_delay(
        serde_json::from_value(document("base/deployment.yaml", "Deployment")).unwrap(),
        DRAIN_DELAY,
    );
    let name = manifest.metadata.name.clone().unwrap();
    let namespace = manifest.metadata.namespace.clone().unwrap();
    cluster.sandbox.rollouts().exclude(&namespace, &name);
    let deployments = Api::<Deployment>::namespaced(admin.clone(), &namespace);
    deployments
        .patch(
            &name,
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&manifest),
        )
        .await
        .unwrap();
    let (service, target_port) = webhook_service();
    let node = Node::new(cluster.clone(), &manifest, service, target_port);
    let stop_node = CancellationToken::new();
    let node_running = tokio::spawn(node.clone().run(stop_node.clone()));

    // The install, as deploy/README.md has it: rollout status returns once both pods are Ready.
    let (ok, text, _) = rollout_status(&kubectl, &name, "180s").await;
    assert!(ok, "the first rollout never finished: {text}");
    assert!(text.contains("successfully rolled out"), "{text}");
    let apps = Api::<MyApp>::namespaced(admin.clone(), "default");
    for i in 0..APPS {
        apps.create(&PostParams::default(), &MyApp::test(&format!("web-{i}")))
            .await
            .unwrap();
    }
    let installed = deployments.get(&name).await.unwrap();
    let first_leader = eventually("a pod of the install leads", || async {
        let holder = lease_holder(&admin).await?;
        current_pods(&node, &installed)
            .contains(&holder)
            .then_some(holder)
    })
    .await;

    let phase = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(Mutex::new(BTreeMap::new()));
    let stop_writer = CancellationToken::new();
    let writer = tokio::spawn(write_continuously(
        admin.clone(),
        stop_writer.clone(),
        phase.clone(),
        writes.clone(),
    ));

    // Two rollouts, as `kubectl rollout restart` starts them. Each finishes only when every
    // new pod is Ready; then the old pods drain and exit, and the Lease moves to a new pod.
    let mut leaders = vec![first_leader];
    for rollout in 1..=2 {
        phase.store(rollout, Ordering::SeqCst);
        kubectl
            .ok(&[
                "-n",
                &namespace,
                "rollout",
                "restart",
                &format!("deployment/{name}"),
            ])
            .await;
        let (ok, text, finished) = rollout_status(&kubectl, &name, "180s").await;
        assert!(ok, "rollout {rollout} never finished: {text}");
        let rolled = deployments.get(&name).await.unwrap();
        let generation = rolled.metadata.generation.unwrap();
        let completed = node.completed.lock().unwrap().get(&generation).copied();
        assert!(
            completed.is_some_and(|at| at <= finished),
            "rollout status returned before the rollout was complete: {text}"
        );
        let new_pods = current_pods(&node, &rolled);
        let leader = eventually("the Lease moves to a pod of the new template", || async {
            let holder = lease_holder(&admin).await?;
            new_pods.contains(&holder).then_some(holder)
        })
        .await;
        assert!(!leaders.contains(&leader), "{leader} led before");
        leaders.push(leader);
    }

    // A bad rollout: the new pod's certificate directory is mistyped, so it never gets Ready.
    // maxUnavailable 0 keeps both old pods serving; rollout status does not report success.
    phase.store(3, Ordering::SeqCst);
    let set_cert_dir = |dir: &str| {
        [
            "-n".to_owned(),
            namespace.clone(),
            "set".into(),
            "env".into(),
            format!("deployment/{name}"),
            "-c".into(),
            "operator".into(),
            format!("MYAPP_CERT_DIR={dir}"),
        ]
    };
    let typo = set_cert_dir("/etc/myapp-operator/tsl");
    kubectl
        .ok(&typo.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let (ok, text, _) = rollout_status(&kubectl, &name, MUST_NOT_FINISH_WITHIN).await;
    assert!(
        !ok,
        "rollout status reported an unready pod's rollout done: {text}"
    );
    assert!(
        text.contains("new replicas have been updated")
            || text.contains("updated replicas are available"),
        "{text}"
    );
    let bad = deployments.get(&name).await.unwrap();
    let bad_hash = node::template_hash(&bad.spec.as_ref().unwrap().template);
    phase.store(4, Ordering::SeqCst);
    let fix = set_cert_dir("/etc/myapp-operator/tls");
    kubectl
        .ok(&fix.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let (ok, text, _) = rollout_status(&kubectl, &name, "180s").await;
    assert!(ok, "the fixed rollout never finished: {text}");

    // A bad rollout that runs: the new template mounts a Secret whose certificate expired a
    // minute ago (a renewal that never came). The process starts, as the loader's clock skew
    // allows, and stays live, but its /readyz answers 503, which holds rollout status back.
    phase.store(5, Ordering::SeqCst);
    let expired_secret = "myapp-operator-webhook-tls-renewal-failed";
    let expired_dir = cluster.dir().join(expired_secret);
    cluster.write_pair_valid(&expired_dir, -3600, -60);
    node.add_secret(expired_secret, expired_dir);
    let set_secret = |secret: &str| {
        let patch = json!([{
            "op": "replace",
            "path": "/spec/template/spec/volumes/0/secret/secretName",
            "value": secret,
        }]);
        [
            "-n".to_owned(),
            namespace.clone(),
            "patch".into(),
            format!("deployment/{name}"),
            "--type=json".into(),
            "-p".into(),
            patch.to_string(),
        ]
    };
    let installed_secret = installed
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .as_ref()
        .unwrap()[0]
        .secret
        .as_ref()
        .unwrap()
        .secret_name
        .clone()
        .unwrap();
    let expire = set_secret(expired_secret);
    kubectl
        .ok(&expire.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let (ok, text, _) = rollout_status(&kubectl, &name, MUST_NOT_FINISH_WITHIN).await;
    assert!(
        !ok,
        "rollout status reported a 503 pod's rollout done: {text}"
    );
    let expired = deployments.get(&name).await.unwrap();
    let expired_hash = node::template_hash(&expired.spec.as_ref().unwrap().template);
    let probe = node
        .pods
        .lock()
        .unwrap()
        .iter()
        .find(|pod| pod.hash == expired_hash && !pod.gone())
        .map(node::Pod::readiness_probe)
        .expect("a pod of the expired template runs");
    let body = crate::run::get_text(probe.0, &probe.1).await;
    assert!(
        body.as_deref()
            .is_some_and(|b| b.starts_with("not ready: serving certificate expired")),
        "{body:?}"
    );
    phase.store(6, Ordering::SeqCst);
    let renew = set_secret(&installed_secret);
    kubectl
        .ok(&renew.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let (ok, text, _) = rollout_status(&kubectl, &name, "180s").await;
    assert!(ok, "the renewed rollout never finished: {text}");

    stop_writer.cancel();
    writer.await.unwrap();
    stop_node.cancel();
    node_running.await.unwrap();

    let writes = writes.lock().unwrap();
    for (phase, counts) in writes.iter() {
        println!("phase {phase}: {counts:?}");
    }
    for (phase, counts) in writes.iter() {
        assert_eq!(counts.valid_refused, Vec::<String>::new(), "phase {phase}");
        assert_eq!(
            counts.invalid_admitted,
            Vec::<String>::new(),
            "phase {phase}"
        );
        assert!(
            counts.valid_admitted > 0 && counts.invalid_refused > 0,
            "phase {phase}"
        );
    }
    assert_eq!(
        writes.keys().copied().collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6],
        "every phase wrote"
    );

    let pods = node.pods.lock().unwrap();
    for pod in pods.iter() {
        println!(
            "{} ({}): ready after {:?}, restarts {}, exit {:?}, killed {}",
            pod.name, pod.token, pod.ready_after, pod.restarts, pod.exit, pod.killed
        );
        assert!(!pod.killed, "{} outlived its grace period", pod.name);
        if pod.hash == bad_hash {
            assert!(
                pod.ready_after.is_none(),
                "the mistyped pod was never Ready"
            );
            continue;
        }
        if pod.hash == expired_hash {
            // Live all along, never Ready, and it exits cleanly when the fix replaces it.
            assert!(pod.ready_after.is_none(), "{} was Ready", pod.name);
            assert_eq!((pod.restarts, pod.liveness_kills), (0, 0), "{}", pod.name);
            assert_eq!(pod.exit.and_then(|e| e.code()), Some(0), "{}", pod.name);
            continue;
        }
        assert!(
            pod.ready_after.is_some_and(|t| t <= READY_WITHIN),
            "{} was not Ready within {READY_WITHIN:?} ({} restarts); its log ends:\n{}",
            pod.name,
            pod.restarts,
            pod.log_tail(20)
        );
        assert_eq!(
            pod.restarts,
            0,
            "{} was restarted; its log ends:\n{}",
            pod.name,
            pod.log_tail(20)
        );
        assert_eq!(
            pod.liveness_kills, 0,
            "{} failed its liveness probe",
            pod.name
        );
        assert_eq!(pod.exit.and_then(|e| e.code()), Some(0), "{}", pod.name);
    }
    assert_eq!(cluster.refused_replica_requests(), Vec::<String>::new());

    // One writer at a time: in the order the API server saw them, every write but the Lease's
    // comes from one pod's token, then only from the next leader's.
    let writers: Vec<String> = cluster
        .sandbox
        .faults()
        .requests()
        .into_iter()
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .filter(|r| r.resource.as_deref() != Some("leases"))
        .filter_map(|r| r.token_id.filter(|t| t.starts_with("replica-")))
        .collect();
    let mut runs = writers.clone();
    runs.dedup();
    let mut seen = std::collections::BTreeSet::new();
    for token in &runs {
        assert!(
            seen.insert(token),
            "{token} wrote again after another leader: {runs:?}"
        );
    }
    assert!(runs.len() >= 3, "three leaders wrote: {runs:?}");
}
