//! A crash at every intermediate state. For each operation a user makes (create, image edit,
//! env edit, replicas handed to an autoscaler, delete, the CRD deleted and restored), the real
//! `run` binary is killed (SIGKILL) right after its k-th accepted write, for every k the
//! operation takes: the API server holds its next write, so exactly k landed. A fresh process
//! then starts and the cluster must converge on what the user wrote, with every oracle of
//! [`crate::oracle::differences`], and `observedGeneration` never going backwards.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_sandbox::{RequestRecord, testing::eventually};
use myapp_operator::{
    crd::{EnvVar, MyApp, MyAppSpec, Phase},
    run::USER_AGENT,
};
use serde_json::json;

use crate::oracle::{NeverBackwards, differences};
use crate::run::{Cluster, Replica};

/// What a user does; each kind runs once per crash point, on its own MyApp where it needs one.
#[derive(Clone, Copy, Debug)]
enum Operation {
    Create,
    ImageEdit,
    EnvEdit,
    ReplicasToAutoscaler,
    Delete,
    CrdDeletedAndRestored,
}

const OPERATIONS: [Operation; 6] = [
    Operation::Create,
    Operation::ImageEdit,
    Operation::EnvEdit,
    Operation::ReplicasToAutoscaler,
    Operation::Delete,
    Operation::CrdDeletedAndRestored,
];

/// The cluster, the MyApps as the user last wrote them, and the one operator process.
struct World {
    cluster: Cluster,
    model: BTreeMap<String, MyAppSpec>,
    operator: Option<Replica>,
    /// Distinguishes the objects and values of each run of an operation.
    runs: usize,
}

impl World {
    fn apps(&self) -> Api<MyApp> {
        Api::namespaced(self.cluster.client(), "default")
    }

    /// Each Event in the namespace: what it regards, its reason and note, when it was made.
    async fn events(&self) -> Vec<String> {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.cluster.client(),
            "default",
        );
        let Ok(list) = events.list(&Default::default()).await else {
            return vec!["(the Events could not be listed)".into()];
        };
        list.items
            .into_iter()
            .map(|e| {
                let regarding = e.regarding.and_then(|r| r.name).unwrap_or_default();
                let made = e.event_time.map(|t| t.0.to_string()).unwrap_or_default();
                format!("{regarding} {:?} {:?} {made}", e.reason, e.note)
            })
            .collect()
    }

    fn start_operator(&mut self) {
        let replica = self
            .cluster
            .replica(&["--leader-elect=false", "--drain-delay", "0s"]);
        self.operator = Some(replica);
    }

    async fn converged(&self) {
        let client = self.cluster.client();
        let mut last = Vec::new();
        let found = tokio::time::timeout(kube_sandbox::testing::PATIENCE, async {
            loop {
                last = differences(&client, &self.model).await;
                if last.is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
        .await;
        assert!(found.is_ok(), "the cluster did not converge: {last:#?}");
    }

    /// Converged, and every MyApp's rollout done (its last status written): the operator has
    /// nothing left to write.
    async fn idle(&self) -> bool {
        let Ok(apps) = self.apps().list(&Default::default()).await else {
            return false;
        };
        let reported = |app: &MyApp| app.status.as_ref().and_then(|s| s.phase);
        differences(&self.cluster.client(), &self.model)
            .await
            .is_empty()
            && apps
                .items
                .iter()
                .all(|app| reported(app) == Some(Phase::Running))
    }

    async fn settled(&self) {
        self.converged().await;
        eventually("every MyApp reports Running", || async {
            self.idle().await.then_some(())
        })
        .await;
    }

    async fn create(&mut self, name: &str) {
        let app = MyApp::test(name).replicas(Some(1));
        self.apps()
            .create(&PostParams::default(), &app)
            .await
            .unwrap();
        self.model.insert(name.to_owned(), app.spec);
    }

    /// What `operation` needs to exist before it runs, converged.
    async fn prepare(&mut self, operation: Operation) -> String {
        self.runs += 1;
        let name = match operation {
            Operation::Create | Operation::CrdDeletedAndRestored => format!("c-{}", self.runs),
            Operation::Delete => {
                let name = format!("d-{}", self.runs);
                self.create(&name).await;
                name
            }
            _ => "edited".to_owned(),
        };
        if !self.model.contains_key("edited") {
            self.create("edited").await;
        }
        if matches!(operation, Operation::ReplicasToAutoscaler) {
            self.merge("edited", json!({"replicas": 2})).await;
        }
        self.settled().await;
        self.events_published().await;
        name
    }

    /// Waits until the operator has published no Event for a while. It publishes an Event
    /// after the status write that reached a phase, without the reconcile waiting for it, so
    /// one of the preparation's can land after `settled` and be counted as the operation's.
    async fn events_published(&self) {
        let faults = self.cluster.sandbox.faults();
        let published = || {
            faults
                .requests()
                .iter()
                .filter(|r| is_operator_write(r) && r.resource.as_deref() == Some("events"))
                .count()
        };
        loop {
            let before = published();
            tokio::time::sleep(Duration::from_millis(200)).await;
            if published() == before {
                return;
            }
        }
    }

    async fn merge(&mut self, name: &str, spec: serde_json::Value) {
        let app = self
            .apps()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap();
        self.model.insert(name.to_owned(), app.spec);
    }

    /// The user's writes of `operation` on `name`.
    async fn run(&mut self, operation: Operation, name: &str) {
        let run = self.runs;
        match operation {
            Operation::Create => self.create(name).await,
            Operation::ImageEdit => {
                let image = format!("ghcr.io/example/web:{run}.0.0");
                self.merge(name, json!({ "image": image })).await;
            }
            Operation::EnvEdit => {
                let env = [EnvVar {
                    name: "BUILD".into(),
                    value: run.to_string(),
                }];
                self.merge(name, json!({ "env": env })).await;
            }
            Operation::ReplicasToAutoscaler => {
                let remove = json!([{"op": "remove", "path": "/spec/replicas"}]);
                let app = self
                    .apps()
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Json::<()>(serde_json::from_value(remove).unwrap()),
                    )
                    .await
                    .unwrap();
                self.model.insert(name.to_owned(), app.spec);
            }
            Operation::Delete => {
                self.apps()
                    .delete(name, &DeleteParams::default())
                    .await
                    .unwrap();
                self.model.remove(name);
            }
            Operation::CrdDeletedAndRestored => {
                let crds = Api::<CustomResourceDefinition>::all(self.cluster.client());
                crds.delete("myapps.example.com", &DeleteParams::default())
                    .await
                    .unwrap();
                eventually("the CRD and its MyApps are gone", || async {
                    crds.get_opt("myapps.example.com")
                        .await
                        .ok()?
                        .is_none()
                        .then_some(())
                })
                .await;
                self.model.clear();
                self.cluster.install_crd().await;
                let apps = self.apps();
                eventually("the MyApp API serves again", || async {
                    apps.list(&Default::default()).await.ok()
                })
                .await;
                self.create(name).await;
            }
        }
    }

    /// Kills the operator at once (SIGKILL), as the OOM killer or a node failure does.
    fn kill(&mut self) {
        if let Some(mut replica) = self.operator.take() {
            replica.process.0.kill().unwrap();
            replica.process.0.wait().unwrap();
        }
    }
}

fn is_operator_write(record: &RequestRecord) -> bool {
    record.user_agent.as_deref() == Some(USER_AGENT)
        && !matches!(record.verb.as_str(), "get" | "list" | "watch")
        && record.status < 300
}

/// Accepted operator writes of `records` for the MyApp `name` (its children, its status, and
/// the Events, which a create names no object in its path), by resource and subresource.
/// Writes for other MyApps are left out: children created for MyApps deleted a moment before,
/// when the CRD goes, are counted by the kill chaos test.
fn writes_by_target(records: &[RequestRecord], name: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let about = |r: &RequestRecord| r.name.as_deref().is_none_or(|n| n == name);
    for r in records.iter().filter(|r| is_operator_write(r) && about(r)) {
        let target = match &r.subresource {
            Some(sub) => format!("{}/{sub}", r.resource.as_deref().unwrap_or("?")),
            None => r.resource.clone().unwrap_or_else(|| r.path.clone()),
        };
        *out.entry(target).or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_after_any_write_of_any_operation_converges_on_what_the_user_wrote() {
    let cluster = Cluster::start(true).await;
    let faults = cluster.sandbox.faults();
    let mut world = World {
        cluster,
        model: BTreeMap::new(),
        operator: None,
        runs: 0,
    };
    let history = NeverBackwards::generations(world.apps());
    world.start_operator();
    // Kills, and those with the next write held (the rest came after the operation's last).
    let (mut crashes, mut interrupted) = (0, 0);

    for operation in OPERATIONS {
        // Uninterrupted: how many writes the operation takes, within the budget.
        let name = world.prepare(operation).await;
        let from = faults.requests().len();
        world.run(operation, &name).await;
        world.settled().await;
        let writes = writes_by_target(&faults.requests()[from..], &name);
        let total: usize = writes.values().sum();
        eprintln!("{operation:?}: {total} writes {writes:?}");
        // The budget: one apply per child (two for the Deployment when replicas pass to an
        // autoscaler: the hand-off of the field, then the apply without it), at most two statuses (the rollout starting and
        // done), one Event per create and never more Events than statuses (each Event reports
        // a phase a status write changed).
        let count = |target: &str| writes.get(target).copied().unwrap_or(0);
        let events_most = match operation {
            Operation::Create | Operation::CrdDeletedAndRestored => 1,
            _ => count("myapps/status"),
        };
        let deployments_most = match operation {
            Operation::ReplicasToAutoscaler => 2,
            _ => 1,
        };
        let within = count("deployments") <= deployments_most
            && count("services") <= 1
            && count("myapps/status") <= 2
            && count("events") <= events_most;
        if !within {
            panic!(
                "{operation:?} went over the budget: {writes:?}; the Events in the namespace: {:#?}",
                world.events().await
            );
        }

        // Then killed after each of those writes in turn, and after none.
        for k in 0..total {
            let name = world.prepare(operation).await;
            faults.stall_writes_after(USER_AGENT, k);
            world.run(operation, &name).await;
            // The next write held, or none coming: an operation can take fewer writes than
            // its uninterrupted run did (a rollout reported in one status write, not two).
            eventually(
                &format!(
                    "{operation:?}: write {} is held, or the operator idle",
                    k + 1
                ),
                || async { (faults.writes_held() > 0 || world.idle().await).then_some(()) },
            )
            .await;
            interrupted += usize::from(faults.writes_held() > 0);
            crashes += 1;
            world.kill();
            assert!(
                faults.stalled_writes_accepted() <= k,
                "{operation:?}: more than {k} writes landed"
            );
            faults.release_stalled();
            world.start_operator();
            world.converged().await;
        }
    }
    world.kill();
    eprintln!("{crashes} kills, {interrupted} with the next write held");
    assert!(interrupted > 0, "no kill interrupted an operation");
    assert_eq!(
        history.regressions(),
        Vec::<String>::new(),
        "observedGeneration went backwards"
    );
}
