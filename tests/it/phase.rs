//! The phase as a watcher sees it on create and on an image edit, with a rollout that lasts as
//! long as the test wants (it plays the Deployment controller for its app, so no timing is
//! assumed), and what a created MyApp costs in writes, counted from the sandbox's request log.

use crate::support::{converge, operator::Operator};

use converge::eventually;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::http::{HeaderValue, header::USER_AGENT};
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, events::v1::Event};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use kube_sandbox::RequestRecord;
use myapp_operator::{
    crd::{MyApp, Phase},
    dev::Environment,
    run,
};
use serde_json::json;
use tokio_util::task::AbortOnDropHandle;

const NS: &str = "default";

/// (phase, observedGeneration) of the app's status, `None`s while it has none.
type Seen = (Option<Phase>, Option<i64>);

/// A client that sends the operator's User-Agent, as `run` does, so the request log tells its
/// writes from the test's.
async fn operator_client(env: &Environment) -> Client {
    let text = std::fs::read_to_string(&env.kubeconfig_path).unwrap();
    let mut config = kube_sandbox::config_for(&text).await.unwrap();
    config
        .headers
        .push((USER_AGENT, HeaderValue::from_static(run::USER_AGENT)));
    Client::try_from(config).unwrap()
}

/// Records every change of `name`'s (phase, observedGeneration) a watch delivers, from the
/// watch's first list on; resolves once that list is done. The watch stops when the handle is
/// dropped: once the test's API server is gone it would only fail, and a task that never
/// waits holds the test's runtime from shutting down.
async fn record_phases(
    apps: Api<MyApp>,
    name: &'static str,
) -> (Arc<Mutex<Vec<Seen>>>, AbortOnDropHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let (listed, mut is_listed) = tokio::sync::watch::channel(false);
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(apps, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let app = match event {
                Ok(watcher::Event::Apply(app) | watcher::Event::InitApply(app)) => app,
                Ok(watcher::Event::InitDone) => {
                    listed.send_replace(true);
                    continue;
                }
                _ => continue,
            };
            if app.metadata.name.as_deref() != Some(name) {
                continue;
            }
            let status = app.status.as_ref();
            let now = (
                status.and_then(|s| s.phase),
                status.and_then(|s| s.observed_generation),
            );
            let mut seen = record.lock().unwrap();
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
    });
    is_listed.wait_for(|done| *done).await.unwrap();
    (seen, AbortOnDropHandle::new(task))
}

async fn saw(seen: &Mutex<Vec<Seen>>, phase: Phase, generation: i64) {
    eventually(
        &format!("a watcher sees {phase:?} for generation {generation}"),
        || async {
            seen.lock()
                .unwrap()
                .contains(&(Some(phase), Some(generation)))
                .then_some(())
        },
    )
    .await;
}

/// Writes what the Deployment controller writes once the rollout of the Deployment's current
/// generation is complete.
async fn finish_rollout(deployments: &Api<Deployment>, name: &str, replicas: i32) {
    let generation = deployments
        .get(name)
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    let status = json!({"status": {
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }});
    deployments
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// The operator's writes, by what they wrote.
#[derive(Debug, Default, PartialEq)]
struct Writes {
    child_applies: usize,
    status_writes: usize,
    events: usize,
    other: Vec<String>,
}

fn operator_writes(requests: &[RequestRecord]) -> Writes {
    let mut writes = Writes::default();
    let ours = requests.iter().filter(|r| {
        r.user_agent.as_deref() == Some(run::USER_AGENT)
            && !matches!(r.verb.as_str(), "get" | "list" | "watch")
    });
    for r in ours {
        assert!(r.status < 300, "a write failed: {r:?}");
        match (r.resource.as_deref(), r.subresource.as_deref()) {
            (Some("deployments" | "services"), None) => writes.child_applies += 1,
            (Some("myapps"), Some("status")) => writes.status_writes += 1,
            (Some("events"), None) => writes.events += 1,
            _ => writes.other.push(format!("{} {}", r.verb, r.path)),
        }
    }
    writes
}

async fn events_with_reason(events: &Api<Event>, reason: &str, count: usize) {
    eventually(&format!("{count} {reason} Event(s)"), || async {
        let list = events.list(&Default::default()).await.ok()?;
        let n = list
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .count();
        (n == count).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_phase_is_reported_while_a_slow_rollout_runs_on_create_and_on_edit() {
    let (env, _dir) = crate::support::dev_environment().await;
    // The test answers for this app's Deployment itself, only once it has seen what the
    // operator reports while nobody else answers: a rollout as slow as a real one.
    env.sandbox.rollouts().exclude(NS, "web");
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let events = Api::<Event>::namespaced(client.clone(), NS);
    let (seen, _recording) = record_phases(apps.clone(), "web").await;
    let operator = Operator::start(
        operator_client(&env).await,
        "solo",
        false,
        Duration::from_secs(300),
    );

    apps.create(
        &PostParams::default(),
        &MyApp::test("web").replicas(Some(2)),
    )
    .await
    .unwrap();
    saw(&seen, Phase::Pending, 1).await;
    finish_rollout(&deployments, "web", 2).await;
    saw(&seen, Phase::Running, 1).await;
    // The Event is published after the status write the watcher saw: the last of a create.
    events_with_reason(&events, "RolloutComplete", 1).await;
    // Per created MyApp, the budget is 2 child applies, at most 2 status writes and at most 1
    // Event; this create, with a rollout that outlasts the pending grace, spends all of it.
    let create = operator_writes(&env.sandbox.faults().requests());
    assert_eq!(
        create,
        Writes {
            child_applies: 2,
            status_writes: 2,
            events: 1,
            other: vec![],
        }
    );
    eprintln!("writes per created MyApp: {create:?}");

    env.sandbox.faults().clear_requests();
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"image": "ghcr.io/example/web:1.5.0"}})),
    )
    .await
    .unwrap();
    saw(&seen, Phase::Progressing, 2).await;
    finish_rollout(&deployments, "web", 2).await;
    saw(&seen, Phase::Running, 2).await;
    events_with_reason(&events, "RolloutComplete", 2).await;
    let edit = operator_writes(&env.sandbox.faults().requests());
    assert_eq!(
        edit,
        Writes {
            child_applies: 1,
            status_writes: 2,
            events: 2,
            other: vec![],
        },
        "an edit: the Deployment, Progressing and Running, RollingOut and RolloutComplete"
    );
    eprintln!("writes per image edit: {edit:?}");

    // Never blank once reported, and never Pending again: an edit is Progressing while its
    // Deployment's controller has not picked it up.
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (None, None),
            (Some(Phase::Pending), Some(1)),
            (Some(Phase::Running), Some(1)),
            (Some(Phase::Progressing), Some(2)),
            (Some(Phase::Running), Some(2)),
        ]
    );
    operator.stop().await;
    env.shutdown().await;
}
