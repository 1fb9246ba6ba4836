//! The simulated kube-controller-manager and kubelet: Deployments get ReplicaSets and Pods as in
//! a cluster, kubectl's rollout commands work on them, and deletion propagates (background,
//! foreground, orphan) as the garbage collector does it.

use crate::support::api::deployment;
use crate::support::fixtures::client;
use crate::support::kubectl::served_kubectl;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_sandbox::Sandbox;
use kube_sandbox::testing::{eventually, path_str};
use serde_json::json;

const REVISION: &str = "deployment.kubernetes.io/revision";

fn sandbox() -> Sandbox {
    Sandbox::builder()
        .rollout_delay(Duration::from_millis(20))
        .build()
}

struct Apis {
    deployments: Api<Deployment>,
    replica_sets: Api<ReplicaSet>,
    pods: Api<Pod>,
}

impl Apis {
    fn new(client: &Client) -> Self {
        Apis {
            deployments: Api::default_namespaced(client.clone()),
            replica_sets: Api::default_namespaced(client.clone()),
            pods: Api::default_namespaced(client.clone()),
        }
    }

    async fn create(&self, deployment: Deployment) -> Deployment {
        self.deployments
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap()
    }

    /// Creates the Deployment and waits until it is rolled out.
    async fn deploy(&self, deployment: Deployment) -> Deployment {
        let name = deployment.name_any();
        self.create(deployment).await;
        self.rolled_out(&name).await
    }

    /// Changes the image of the Deployment's container `c`, as `kubectl set image` does.
    async fn set_image(&self, name: &str, image: &str) {
        let patch = json!({"spec": {"template": {"spec": {
            "containers": [{"name": "c", "image": image}]}}}});
        self.deployments
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
    }

    /// Waits until the Deployment is gone.
    async fn gone(&self, name: &str, what: &str) {
        eventually(what, || async {
            let found = self.deployments.get_opt(name).await.ok()?;
            found.is_none().then_some(())
        })
        .await
    }

    /// Waits until no ReplicaSet or Pod is left.
    async fn collected(&self, what: &str) {
        eventually(what, || async {
            (self.replica_sets().await.is_empty() && self.pods().await.is_empty()).then_some(())
        })
        .await
    }

    /// Waits until the Deployment's rollout of its current generation is complete.
    async fn rolled_out(&self, name: &str) -> Deployment {
        eventually("the rollout completes", || async {
            let d = self.deployments.get(name).await.ok()?;
            let status = d.status.clone()?;
            let want = d.spec.as_ref()?.replicas;
            let progressing = status
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Progressing")?
                .reason
                .clone();
            (status.observed_generation == d.metadata.generation
                && status.updated_replicas == want
                && status.available_replicas == want
                && status.replicas == want
                && progressing.as_deref() == Some("NewReplicaSetAvailable"))
            .then_some(d)
        })
        .await
    }

    async fn replica_sets(&self) -> Vec<ReplicaSet> {
        self.replica_sets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    async fn replica_set_names(&self) -> Vec<String> {
        let replica_sets = self.replica_sets().await;
        replica_sets.iter().map(ResourceExt::name_any).collect()
    }

    async fn pods(&self) -> Vec<Pod> {
        self.pods.list(&ListParams::default()).await.unwrap().items
    }
}

fn revision(rs: &ReplicaSet) -> Option<&str> {
    rs.annotations().get(REVISION).map(String::as_str)
}

/// The revisions `kubectl rollout history` lists.
fn revisions(history: &str) -> Vec<&str> {
    history
        .lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

#[tokio::test]
async fn a_deployment_gets_a_replica_set_and_running_pods_named_and_owned_as_in_a_cluster() {
    let sandbox = sandbox();
    let apis = Apis::new(&client(&sandbox));
    let created = apis.create(deployment("web", 2, "nginx:1.25")).await;
    let d = apis.rolled_out("web").await;
    assert_eq!(d.annotations().get(REVISION).map(String::as_str), Some("1"));
    let status = d.status.unwrap();
    assert_eq!(status.ready_replicas, Some(2));
    assert_eq!(status.unavailable_replicas, None, "zero counts are omitted");
    let reasons: Vec<(String, String, Option<String>)> = status
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "Available".into(),
                "True".into(),
                Some("MinimumReplicasAvailable".into())
            ),
            (
                "Progressing".into(),
                "True".into(),
                Some("NewReplicaSetAvailable".into())
            ),
        ]
    );

    let replica_sets = apis.replica_sets().await;
    assert_eq!(replica_sets.len(), 1);
    let rs = &replica_sets[0];
    let hash = rs.labels()["pod-template-hash"].clone();
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    assert!(hash.len() <= 10 && hash.chars().all(|c| c.is_ascii_alphanumeric()));
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        ("Deployment", "web", Some(true), Some(true))
    );
    assert_eq!(Some(owner.uid.clone()), created.metadata.uid);
    assert_eq!(revision(rs), Some("1"));
    assert_eq!(
        rs.annotations()["deployment.kubernetes.io/desired-replicas"],
        "2"
    );
    assert_eq!(
        rs.annotations()["deployment.kubernetes.io/max-replicas"],
        "3"
    );
    let spec = rs.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.selector.match_labels.as_ref().unwrap()["pod-template-hash"],
        hash
    );
    assert_eq!(rs.status.as_ref().unwrap().ready_replicas, Some(2));

    let pods = apis.pods().await;
    assert_eq!(pods.len(), 2);
    for pod in &pods {
        let name = pod.name_any();
        let suffix = name.strip_prefix(&format!("{}-", rs.name_any())).unwrap();
        assert_eq!(suffix.len(), 5, "{name}");
        assert_eq!(pod.labels()["pod-template-hash"], hash);
        assert_eq!(pod.labels()["app"], "web");
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ReplicaSet", Some(true))
        );
        assert_eq!(Some(owner.uid.clone()), rs.metadata.uid);
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let conditions = status.conditions.as_ref().unwrap();
        for type_ in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            let c = conditions.iter().find(|c| c.type_ == type_).unwrap();
            assert_eq!(c.status, "True", "{type_}");
        }
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(container.ready && container.started == Some(true));
        assert!(container.state.as_ref().unwrap().running.is_some());
        assert!(status.pod_ip.is_some());
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some("sandbox-node")
        );
    }
}

#[tokio::test]
async fn a_template_change_makes_a_second_replica_set_and_scales_the_first_to_zero() {
    let sandbox = sandbox();
    let apis = Apis::new(&client(&sandbox));
    apis.deploy(deployment("web", 3, "nginx:1.25")).await;
    let first = apis.replica_sets().await.remove(0);
    apis.set_image("web", "nginx:1.26").await;
    let d = apis.rolled_out("web").await;
    assert_eq!(d.annotations().get(REVISION).map(String::as_str), Some("2"));
    let replica_sets = apis.replica_sets().await;
    assert_eq!(
        replica_sets.len(),
        2,
        "the old ReplicaSet is kept for history"
    );
    let old = replica_sets
        .iter()
        .find(|rs| rs.name_any() == first.name_any())
        .unwrap();
    let new = replica_sets
        .iter()
        .find(|rs| rs.name_any() != first.name_any())
        .unwrap();
    assert_eq!(old.spec.as_ref().unwrap().replicas, Some(0));
    assert_eq!(revision(old), Some("1"));
    assert_eq!(new.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(revision(new), Some("2"));
    let pods = apis.pods().await;
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p.name_any().starts_with(&new.name_any()))
    );
}

#[tokio::test]
async fn old_replica_sets_are_kept_only_up_to_the_revision_history_limit() {
    let sandbox = sandbox();
    let apis = Apis::new(&client(&sandbox));
    let mut d = deployment("web", 1, "nginx:1.0");
    d.spec.as_mut().unwrap().revision_history_limit = Some(1);
    apis.create(d).await;
    for minor in 1..4 {
        apis.rolled_out("web").await;
        apis.set_image("web", &format!("nginx:1.{minor}")).await;
    }
    apis.rolled_out("web").await;
    let revisions = eventually("the oldest ReplicaSets are deleted", || async {
        let mut revisions: Vec<String> = apis
            .replica_sets()
            .await
            .iter()
            .filter_map(|rs| revision(rs).map(String::from))
            .collect();
        revisions.sort();
        (revisions.len() == 2).then_some(revisions)
    })
    .await;
    assert_eq!(revisions, ["3", "4"]);
}

#[tokio::test]
async fn a_failing_rollout_leaves_its_pods_pulling_and_the_deployment_past_its_deadline() {
    let sandbox = sandbox();
    sandbox.rollouts().set_failing(true);
    let apis = Apis::new(&client(&sandbox));
    apis.create(deployment("web", 1, "nginx:nope")).await;
    let message = eventually("the deadline passes", || async {
        let d = apis.deployments.get("web").await.ok()?;
        let c = d
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"))?;
        Some(c.message.unwrap_or_default())
    })
    .await;
    let rs = apis.replica_sets().await.remove(0);
    assert_eq!(
        message,
        format!(
            "ReplicaSet \"{}\" has timed out progressing.",
            rs.name_any()
        )
    );
    let pod = apis.pods().await.remove(0);
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let waiting = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ImagePullBackOff"));
}

#[tokio::test]
async fn without_pod_simulation_only_the_deployment_status_is_written() {
    let sandbox = Sandbox::builder()
        .rollout_delay(Duration::from_millis(10))
        .simulate_pods(false)
        .build();
    let apis = Apis::new(&client(&sandbox));
    apis.deploy(deployment("web", 2, "nginx")).await;
    assert!(apis.replica_sets().await.is_empty());
    assert!(apis.pods().await.is_empty());
}

#[tokio::test]
async fn an_excluded_deployment_gets_no_replica_sets_from_the_simulation() {
    let sandbox = sandbox();
    sandbox.rollouts().exclude("default", "mine");
    let apis = Apis::new(&client(&sandbox));
    apis.create(deployment("mine", 2, "nginx")).await;
    apis.create(deployment("theirs", 1, "nginx")).await;
    apis.rolled_out("theirs").await;
    let names = apis.replica_set_names().await;
    assert!(names.iter().all(|n| n.starts_with("theirs-")), "{names:?}");
    assert!(apis.deployments.get("mine").await.unwrap().status.is_none());
}

#[tokio::test]
async fn deleting_a_deployment_collects_its_replica_sets_and_pods_in_the_background() {
    let sandbox = sandbox();
    let apis = Apis::new(&client(&sandbox));
    apis.deploy(deployment("web", 2, "nginx")).await;
    apis.deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    apis.collected("the ReplicaSet and Pods are collected")
        .await;
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_its_blocking_dependents_are_gone() {
    let sandbox = sandbox();
    let client = client(&sandbox);
    let apis = Apis::new(&client);
    let d = apis.deploy(deployment("web", 2, "nginx")).await;
    // A dependent that holds on: it blocks its owner and has a finalizer of its own.
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let held: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "held", "finalizers": ["example.com/hold"],
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                         "name": "web", "uid": d.metadata.uid, "blockOwnerDeletion": true}]},
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &held)
        .await
        .unwrap();

    let answer = apis
        .deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let marked = answer.left().expect("the owner is answered, still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.finalizers(), ["foregroundDeletion"]);
    assert_eq!(
        marked.metadata.generation,
        d.metadata.generation.map(|g| g + 1)
    );

    apis.collected("the ReplicaSet and Pods go first").await;
    let waiting = apis.deployments.get("web").await.unwrap();
    assert_eq!(
        waiting.finalizers(),
        ["foregroundDeletion"],
        "held blocks it"
    );
    let held = configmaps.get("held").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "the dependent is being deleted"
    );

    configmaps
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    apis.gone("web", "the owner goes after its last dependent")
        .await;
}

#[tokio::test]
async fn orphan_deletion_leaves_the_replica_set_and_pods_without_their_owner() {
    let sandbox = sandbox();
    let apis = Apis::new(&client(&sandbox));
    apis.deploy(deployment("web", 2, "nginx")).await;
    let answer = apis
        .deployments
        .delete("web", &DeleteParams::orphan())
        .await
        .unwrap();
    let marked = answer
        .left()
        .expect("the owner is answered while it orphans");
    assert_eq!(marked.finalizers(), ["orphan"]);
    apis.gone("web", "the Deployment goes").await;
    let replica_sets = apis.replica_sets().await;
    assert_eq!(replica_sets.len(), 1);
    assert!(replica_sets[0].metadata.owner_references.is_none());
    let pods = apis.pods().await;
    assert_eq!(pods.len(), 2);
    assert!(
        pods.iter()
            .all(|p| p.owner_references()[0].kind == "ReplicaSet")
    );
}

#[tokio::test]
async fn setting_a_deletion_timestamp_bumps_the_generation() {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let deployments: Api<Deployment> = Api::default_namespaced(client(&sandbox));
    let mut d = deployment("web", 1, "nginx");
    d.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let deleting = deployments.get("web").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.generation, Some(2));
    // A second DELETE changes nothing more.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        deployments.get("web").await.unwrap().metadata.generation,
        Some(2)
    );
}

#[tokio::test]
async fn delete_options_with_two_policies_or_an_unknown_one_are_invalid() {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let deployments: Api<Deployment> = Api::default_namespaced(client(&sandbox));
    deployments
        .create(&PostParams::default(), &deployment("web", 1, "nginx"))
        .await
        .unwrap();
    // kube's DeleteParams cannot send both; a raw request can.
    let request = axum::http::Request::delete("/apis/apps/v1/namespaces/default/deployments/web")
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(
                &json!({"orphanDependents": true, "propagationPolicy": "Foreground"}),
            )
            .unwrap(),
        )
        .unwrap();
    let err = client(&sandbox).request_text(request).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Foreground\": orphanDependents and deletionPropagation cannot be both set"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_rollout_status_history_and_undo_work_on_the_simulated_replica_sets() {
    let sandbox = sandbox();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let manifest = k.file(
        "web.json",
        &serde_json::to_string(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": serde_json::to_value(deployment("web", 2, "nginx:1.25").spec).unwrap(),
        }))
        .unwrap(),
    );
    k.ok(&["apply", "-f", path_str(&manifest)]).await;
    let status = ["rollout", "status", "deployment/web", "--timeout=60s"];
    let out = k.ok(&status).await;
    assert!(
        out.contains("deployment \"web\" successfully rolled out"),
        "{out}"
    );
    k.ok(&["set", "image", "deployment/web", "c=nginx:1.26"])
        .await;
    let out = k.ok(&status).await;
    assert!(out.contains("successfully rolled out"), "{out}");

    let out = k.ok(&["rollout", "history", "deployment/web"]).await;
    assert_eq!(revisions(&out), ["1", "2"], "{out}");
    let out = k
        .ok(&["rollout", "history", "deployment/web", "--revision=1"])
        .await;
    assert!(out.contains("nginx:1.25"), "{out}");

    let out = k.ok(&["rollout", "undo", "deployment/web"]).await;
    assert!(out.contains("deployment.apps/web rolled back"), "{out}");
    k.ok(&status).await;
    let image = k
        .ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .await;
    assert_eq!(image, "nginx:1.25");
    let out = k.ok(&["rollout", "history", "deployment/web"]).await;
    assert_eq!(
        revisions(&out),
        ["2", "3"],
        "revision 1 came back as 3: {out}"
    );

    let out = k
        .ok(&["get", "pods", "-o", "jsonpath={.items[*].status.phase}"])
        .await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["Running", "Running"],
        "{out}"
    );
    let out = k.ok(&["get", "pods"]).await;
    assert!(out.contains("web-"), "{out}");
    let out = k.ok(&["get", "rs", "-o", "name"]).await;
    assert_eq!(out.lines().count(), 2, "{out}");
    let out = k.ok(&["describe", "deployment", "web"]).await;
    assert!(out.contains("NewReplicaSet:"), "{out}");
    assert!(out.contains("(2/2 replicas created)"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_cascades_in_the_foreground_and_orphans_on_request() {
    let sandbox = sandbox();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let apis = Apis::new(&client(&sandbox));
    for name in ["fg", "orphaned"] {
        apis.deploy(deployment(name, 1, "nginx")).await;
    }
    let out = k
        .ok(&["delete", "deployment", "fg", "--cascade=foreground"])
        .await;
    assert!(out.contains("deployment.apps \"fg\" deleted"), "{out}");
    let out = k
        .ok(&["delete", "deployment", "orphaned", "--cascade=orphan"])
        .await;
    assert!(
        out.contains("deployment.apps \"orphaned\" deleted"),
        "{out}"
    );
    let left = eventually("only the orphans are left", || async {
        let names = apis.replica_set_names().await;
        (apis
            .deployments
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            && names.len() == 1)
            .then_some(names)
    })
    .await;
    assert!(left[0].starts_with("orphaned-"), "{left:?}");
    let pods = apis.pods().await;
    assert_eq!(pods.len(), 1);
    assert!(pods[0].name_any().starts_with("orphaned-"));
}

#[tokio::test]
async fn a_deleted_pod_or_replica_set_is_made_again_by_its_controllers() {
    let sandbox = sandbox();
    let apis = Apis::new(&client(&sandbox));
    apis.deploy(deployment("web", 2, "nginx")).await;
    let gone = apis.pods().await.remove(0).name_any();
    apis.pods
        .delete(&gone, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the ReplicaSet replaces its Pod", || async {
        let names: Vec<String> = apis.pods().await.iter().map(|p| p.name_any()).collect();
        (names.len() == 2 && !names.contains(&gone)).then_some(())
    })
    .await;

    let rs = apis.replica_sets().await.remove(0);
    apis.replica_sets
        .delete(&rs.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let again = eventually("the Deployment makes its ReplicaSet again", || async {
        let made = apis.replica_sets().await.pop()?;
        (made.metadata.uid != rs.metadata.uid).then_some(made)
    })
    .await;
    assert_eq!(again.name_any(), rs.name_any(), "the same template hash");
    apis.rolled_out("web").await;
    assert_eq!(apis.pods().await.len(), 2);
}
