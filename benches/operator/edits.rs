//! Edits during rollouts: every MyApp's image is edited to a new tag, and edited again to a third
//! while the Deployment's rollout of the first edit still runs, so the operator's writes meet
//! Deployments whose status the rollout is about to write (where a resourceVersion precondition
//! draws 409 Conflict).
//!
//! The edits are made as the bench's creates are: in process, each a task of its own, as many
//! at once. A MyApp's second edit waits until its Deployment runs the first edit's image (the
//! operator applied it), found in the sandbox's store in memory every 20 ms, then checks whether
//! that rollout is still running (the Deployment's status has not observed its generation) and
//! edits: the count of those that found it running says whether the phase measured what it
//! claims.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt, channel::mpsc, stream};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use kube_sandbox::Sandbox;
use myapp_operator::crd::MyApp;
use serde_json::{Value, json};

/// The images of the two edits: a new tag, then a third.
pub const IMAGES: [&str; 2] = ["ghcr.io/example/web:1.5.0", "ghcr.io/example/web:1.6.0"];

/// How often the bench looks for Deployments that run the first edit's image: far shorter than
/// a rollout (`MYAPP_BENCH_ROLLOUT_MS`, 1.5 s by default).
const POLL: Duration = Duration::from_millis(20);

/// Edits every MyApp of `names` in `namespace` twice, `at_once` edits in flight, as the module
/// says. Returns how many second edits found the first edit's rollout still running; fails when
/// the operator has not applied the first edit's image to every Deployment within `deadline`.
pub async fn during_rollouts(
    client: &Client,
    sandbox: &Sandbox,
    namespace: &'static str,
    names: &[String],
    at_once: usize,
    deadline: Duration,
) -> Result<usize, String> {
    let api = Api::<MyApp>::namespaced(client.clone(), namespace);
    let (ready_tx, ready_rx) = mpsc::unbounded::<String>();
    let rolling = Arc::new(AtomicUsize::new(0));
    let first = edit_all(
        api.clone(),
        stream::iter(names.to_vec()),
        at_once,
        IMAGES[0],
        None,
    );
    let found = (sandbox.clone(), namespace, rolling.clone());
    let second = edit_all(api, ready_rx, at_once, IMAGES[1], Some(found));
    // `ready_tx` goes when the dispatch returns, done or failed, which ends the second edits.
    let dispatch = dispatch(sandbox, namespace, names, deadline, ready_tx);
    let ((), (), dispatched) = futures::join!(first, second, dispatch);
    dispatched?;
    Ok(rolling.load(Ordering::Relaxed))
}

/// Sets the image of every MyApp `names` yields to `image`, `at_once` at a time, each edit a
/// task of its own (see `create_all`). With `rolling`, each edit first counts into it whether
/// the MyApp's Deployment is still rolling out the first edit's image.
async fn edit_all(
    api: Api<MyApp>,
    names: impl Stream<Item = String>,
    at_once: usize,
    image: &'static str,
    rolling: Option<(Sandbox, &'static str, Arc<AtomicUsize>)>,
) {
    names
        .for_each_concurrent(at_once, |name| {
            let (api, rolling) = (api.clone(), rolling.clone());
            let edit = tokio::spawn(async move {
                if let Some((sandbox, namespace, count)) = &rolling
                    && rolling_out(sandbox, namespace, &name)
                {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                let patch = json!({"spec": {"image": image}});
                let params = PatchParams::default();
                if let Err(e) = api.patch(&name, &params, &Patch::Merge(&patch)).await {
                    panic!("editing MyApp {name}'s image to {image}: {e}");
                }
            });
            async move { edit.await.expect("an edit task panicked") }
        })
        .await;
}

/// Hands each MyApp of `names` to `ready` once its Deployment runs the first edit's image,
/// looking every [`POLL`]; fails after `deadline`.
async fn dispatch(
    sandbox: &Sandbox,
    namespace: &str,
    names: &[String],
    deadline: Duration,
    ready: mpsc::UnboundedSender<String>,
) -> Result<(), String> {
    let start = Instant::now();
    let mut pending: Vec<&str> = names.iter().map(String::as_str).collect();
    loop {
        let keys: Vec<_> = pending
            .iter()
            .map(|name| ("apps", "deployments", namespace, *name))
            .collect();
        let stored = sandbox.stored(&keys);
        let mut waiting = Vec::with_capacity(pending.len());
        for (name, deployment) in pending.iter().zip(stored) {
            if deployment.is_some_and(|d| image(&d) == Some(IMAGES[0])) {
                // The receiver lives until this returns.
                let _ = ready.unbounded_send((*name).to_owned());
            } else {
                waiting.push(*name);
            }
        }
        pending = waiting;
        let Some(first) = pending.first() else {
            return Ok(());
        };
        if start.elapsed() > deadline {
            return Err(format!(
                "edits during rollouts: {} of {} Deployments do not run the first edit's image \
                 {} within {deadline:?} (first: {namespace}/{first}), and the second edit waits \
                 for it",
                pending.len(),
                names.len(),
                IMAGES[0]
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The image of a stored Deployment's first container.
fn image(deployment: &Value) -> Option<&str> {
    deployment
        .pointer("/spec/template/spec/containers/0/image")
        .and_then(Value::as_str)
}

/// Whether `name`'s Deployment runs the first edit's image and its rollout is still running:
/// its status has not observed its generation yet (the sandbox writes the status of a finished
/// rollout once, `MYAPP_BENCH_ROLLOUT_MS` after the template changed).
fn rolling_out(sandbox: &Sandbox, namespace: &str, name: &str) -> bool {
    let stored = sandbox.stored(&[("apps", "deployments", namespace, name)]);
    let Some(deployment) = stored.into_iter().next().flatten() else {
        return false;
    };
    let int = |pointer| deployment.pointer(pointer).and_then(Value::as_i64);
    let observed = int("/status/observedGeneration");
    image(&deployment) == Some(IMAGES[0])
        && int("/metadata/generation").is_some_and(|g| observed.is_none_or(|o| o < g))
}
