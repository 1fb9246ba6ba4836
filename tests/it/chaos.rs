//! Two replicas of the real `run` binary (their own tokens, enforced RBAC, short leases) while
//! the leader is killed (SIGKILL) at a seeded moment in the middle of a burst of creates, edits
//! and deletes, and a fresh replica takes its place. After each kill the cluster converges on
//! exactly what the test wrote: no lost write, no duplicate or orphaned child, every child
//! owned by its MyApp and equal to its spec, `observedGeneration` never decreasing. A child
//! created for a MyApp deleted a moment before (no precondition can stop that create) is
//! counted, at most one of each kind per deleted MyApp, and collected.
//!
//! `CHAOS_KILLS` asks for more kills (default 4), `CHAOS_SEED` for another sequence.

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_sandbox::testing::eventually;
use myapp_operator::crd::{EnvVar, MyApp, MyAppSpec};
use serde_json::json;

use crate::oracle::{NeverBackwards, Seeded, assert_no_refusal_and_no_regression, differences};
use crate::run::{Cluster, Replica, SHORT_LEASE};

const APPS: usize = 30;
/// User writes per burst; the kill lands somewhere among them.
const BURST: usize = 24;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// One user write of a burst.
enum Op {
    Image(String, String),
    Env(String, String),
    Replicas(String, i32),
    Delete(String),
    Create(String),
}

impl Op {
    /// A seeded write on a distinct MyApp of `model` (or a new one), applied to the model.
    fn pick(
        rng: &mut Seeded,
        model: &mut BTreeMap<String, MyAppSpec>,
        taken: &mut Vec<String>,
        (burst, write): (u64, usize),
    ) -> Op {
        let label = format!("{burst}.{write}.0");
        let free: Vec<String> = model
            .keys()
            .filter(|n| !taken.contains(n))
            .cloned()
            .collect();
        let kind = rng.below(5);
        if kind == 4 || free.is_empty() {
            let name = format!("new-{burst}-{write}");
            model.insert(name.clone(), MyApp::test(&name).replicas(Some(1)).spec);
            taken.push(name.clone());
            return Op::Create(name);
        }
        let name = free[rng.below(free.len() as u64) as usize].clone();
        taken.push(name.clone());
        let spec = model.get_mut(&name).unwrap();
        match kind {
            0 => {
                spec.image = format!("ghcr.io/example/web:{label}");
                Op::Image(name, spec.image.clone())
            }
            1 => {
                spec.env = vec![EnvVar {
                    name: "BUILD".into(),
                    value: label.clone(),
                }];
                Op::Env(name, label)
            }
            2 => {
                let replicas = 1 + rng.below(3) as i32;
                spec.replicas = Some(replicas);
                Op::Replicas(name, replicas)
            }
            _ => {
                model.remove(&name);
                Op::Delete(name)
            }
        }
    }

    async fn send(self, apps: Api<MyApp>) {
        let merge = |name: String, spec: serde_json::Value| {
            let apps = apps.clone();
            async move {
                apps.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": spec})),
                )
                .await
                .map(|_| ())
            }
        };
        let sent = match self {
            Op::Image(name, image) => merge(name, json!({"image": image})).await,
            Op::Env(name, value) => {
                merge(name, json!({"env": [{"name": "BUILD", "value": value}]})).await
            }
            Op::Replicas(name, n) => merge(name, json!({"replicas": n})).await,
            Op::Delete(name) => apps
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
            Op::Create(name) => {
                let app = MyApp::test(&name).replicas(Some(1));
                apps.create(&PostParams::default(), &app).await.map(|_| ())
            }
        };
        sent.expect("a user write");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_killed_mid_burst_loses_no_write_and_leaves_no_stray_child() {
    let kills = setting("CHAOS_KILLS", 4);
    let mut rng = Seeded::new(setting("CHAOS_SEED", 31));
    let cluster = Cluster::start(true).await;
    let apps = Api::<MyApp>::namespaced(cluster.client(), "default");
    let mut model = BTreeMap::new();
    for i in 0..APPS {
        let app = MyApp::test(&format!("app-{i}")).replicas(Some(1));
        apps.create(&PostParams::default(), &app).await.unwrap();
        model.insert(format!("app-{i}"), app.spec);
    }
    let history = NeverBackwards::generations(apps.clone());
    let start = |identity: String| -> (String, Replica) {
        let mut args = vec!["--identity", &identity, "--drain-delay", "0s"];
        args.extend(SHORT_LEASE);
        let replica = cluster.replica(&args);
        (identity, replica)
    };
    let mut replicas = vec![start("r-0".into()), start("r-1".into())];
    let converged = |model: &BTreeMap<String, MyAppSpec>| {
        let (client, model) = (cluster.client(), model.clone());
        async move {
            eventually("the cluster holds exactly what the test wrote", || async {
                differences(&client, &model).await.is_empty().then_some(())
            })
            .await
        }
    };
    converged(&model).await;
    let (mut orphans, mut deletions) = (0, 0);

    for kill in 0..kills {
        let leader = eventually("a replica leads", || async {
            let holder = cluster.lease_holder().await?;
            replicas
                .iter()
                .position(|(identity, _)| *identity == holder)
        })
        .await;
        let mut taken = Vec::new();
        let ops: Vec<Op> = (0..BURST)
            .map(|i| Op::pick(&mut rng, &mut model, &mut taken, (kill, i)))
            .collect();
        let deleted: Vec<String> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Delete(name) => Some(name.clone()),
                _ => None,
            })
            .collect();
        let at = std::time::Duration::from_millis(rng.below(60));
        let burst = futures::stream::iter(ops)
            .map(|op| op.send(apps.clone()))
            .buffer_unordered(6)
            .collect::<Vec<()>>();
        let (_, victim) = &mut replicas[leader];
        let kill_it = async {
            tokio::time::sleep(at).await;
            victim.process.0.kill().unwrap();
        };
        let from = cluster.sandbox.faults().requests().len();
        futures::join!(burst, kill_it);
        let (identity, mut dead) = replicas.swap_remove(leader);
        dead.process.0.wait().unwrap();
        eprintln!("kill {kill}: {identity} killed {at:?} into a burst of {BURST} writes");
        replicas.push(start(format!("r-{}", kill + 2)));
        converged(&model).await;
        // Children created for a MyApp the burst deleted (the controller planned from a cache
        // that still held it): at most one of each kind per deleted MyApp, and the collector
        // removed them (the cluster converged).
        let requests = &cluster.sandbox.faults().requests()[from..];
        deletions += deleted.len();
        for name in &deleted {
            let created: Vec<_> = requests
                .iter()
                .filter(|r| r.name.as_deref() == Some(name.as_str()) && r.status == 201)
                .filter(|r| matches!(r.resource.as_deref(), Some("deployments" | "services")))
                .filter(|r| r.field_manager.is_some())
                .map(|r| r.resource.clone().unwrap_or_default())
                .collect();
            orphans += created.len();
            assert!(
                !created
                    .iter()
                    .enumerate()
                    .any(|(i, r)| created[..i].contains(r)),
                "{name}: a child created twice: {created:?}"
            );
        }
    }
    eprintln!(
        "{orphans} children created for the {deletions} MyApps deleted, after their deletion"
    );
    assert_no_refusal_and_no_regression(cluster.refused_replica_requests(), history);
}
