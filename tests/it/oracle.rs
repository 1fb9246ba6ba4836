//! The end-state oracles of the fault suites (pause, crash, stale views, kill chaos): what the
//! cluster must hold once the operator has converged on the MyApps a test wrote, and the
//! observedGeneration history a watch recorded on the way.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::{
    Api, Resource,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use myapp_operator::crd::{MyApp, MyAppSpec};
use tokio::task::JoinHandle;

/// A seeded sequence of numbers (splitmix64): the same seed, the same faults.
pub(crate) struct Seeded(u64);

impl Seeded {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A number in `0..bound`.
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound.max(1)
    }
}

/// Every way the cluster differs from `want` (MyApp name → the spec the test last wrote), in
/// namespace `default`: each MyApp exists with that spec and reports its current generation; it
/// has exactly one Deployment and one Service of its name, controlled by it (uid), equal to the
/// spec; no Deployment or Service is left without its MyApp.
/// `apps` MyApps as a test wrote them last, `app-0` and on: one replica each, all running
/// `image`.
pub(crate) fn all_running(apps: usize, image: &str) -> BTreeMap<String, MyAppSpec> {
    (0..apps)
        .map(|i| {
            let app = MyApp::test(&format!("app-{i}"))
                .replicas(Some(1))
                .image(image);
            (format!("app-{i}"), app.spec)
        })
        .collect()
}

pub(crate) async fn differences(
    client: &kube::Client,
    want: &BTreeMap<String, MyAppSpec>,
) -> Vec<String> {
    differences_in(client, "default", want).await
}

/// [`differences`] in `namespace`.
pub(crate) async fn differences_in(
    client: &kube::Client,
    namespace: &str,
    want: &BTreeMap<String, MyAppSpec>,
) -> Vec<String> {
    let params = ListParams::default();
    let (apps, deployments, services) = (
        Api::<MyApp>::namespaced(client.clone(), namespace),
        Api::<Deployment>::namespaced(client.clone(), namespace),
        Api::<Service>::namespaced(client.clone(), namespace),
    );
    let (apps, deployments, services) = match futures::try_join!(
        apps.list(&params),
        deployments.list(&params),
        services.list(&params),
    ) {
        Ok(lists) => lists,
        Err(e) => return vec![format!("listing: {e}")],
    };
    let mut out = Vec::new();
    let mut uids = HashMap::new();
    for app in &apps.items {
        let name = app.metadata.name.clone().unwrap_or_default();
        match want.get(&name) {
            None => out.push(format!("MyApp {name} exists but was deleted")),
            Some(spec) if spec != &app.spec => out.push(format!("MyApp {name}: spec lost a write")),
            Some(_) => {}
        }
        let observed = app.status.as_ref().and_then(|s| s.observed_generation);
        if observed != app.metadata.generation {
            out.push(format!(
                "MyApp {name}: observedGeneration {observed:?} of {:?}",
                app.metadata.generation
            ));
        }
        uids.insert(name, app.metadata.uid.clone().unwrap_or_default());
    }
    for name in want.keys().filter(|n| !uids.contains_key(*n)) {
        out.push(format!("MyApp {name} is missing"));
    }
    let owned_by = |kind: &str, meta: &kube::api::ObjectMeta, out: &mut Vec<String>| {
        let name = meta.name.clone().unwrap_or_default();
        let controller: Vec<_> = meta
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.controller == Some(true))
            .collect();
        match (uids.get(&name), controller.as_slice()) {
            (None, _) => out.push(format!("{kind} {name} has no MyApp")),
            (Some(uid), [owner]) if owner.kind == "MyApp" && &owner.uid == uid => {}
            (Some(_), owners) => out.push(format!("{kind} {name}: controller owners {owners:?}")),
        }
        name
    };
    let mut with_deployment = Vec::new();
    for d in &deployments.items {
        let name = owned_by("Deployment", d.meta(), &mut out);
        with_deployment.push(name.clone());
        let Some(spec) = want.get(&name) else {
            continue;
        };
        let pod = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let container = pod.and_then(|p| p.containers.first());
        let image = container.and_then(|c| c.image.as_deref());
        let port = container
            .and_then(|c| c.ports.as_ref()?.first())
            .map(|p| p.container_port);
        let env: Vec<(String, String)> = container
            .and_then(|c| c.env.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect();
        let want_env: Vec<(String, String)> = spec
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        let replicas = d.spec.as_ref().and_then(|s| s.replicas);
        if image != Some(spec.image.as_str())
            || port != Some(spec.port)
            || env != want_env
            || spec.replicas.is_some_and(|r| replicas != Some(r))
        {
            out.push(format!(
                "Deployment {name}: image {image:?} port {port:?} env {env:?} replicas {replicas:?}, the spec says {spec:?}"
            ));
        }
    }
    let mut with_service = Vec::new();
    for s in &services.items {
        let name = owned_by("Service", s.meta(), &mut out);
        with_service.push(name.clone());
        let Some(spec) = want.get(&name) else {
            continue;
        };
        let port = s
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref()?.first())
            .map(|p| p.port);
        if port != Some(spec.port) {
            out.push(format!(
                "Service {name}: port {port:?}, the spec says {}",
                spec.port
            ));
        }
    }
    for name in want.keys() {
        for (kind, has) in [("Deployment", &with_deployment), ("Service", &with_service)] {
            if !has.contains(name) {
                out.push(format!("MyApp {name} has no {kind}"));
            }
        }
    }
    out
}

/// The token of a replica's request that changed something and succeeded (not a read): what
/// the request-log oracles of the sharding suites look at.
pub(crate) fn replica_write(record: &kube_sandbox::RequestRecord) -> Option<&str> {
    let token = record.token_id.as_deref()?;
    let read = matches!(record.verb.as_str(), "get" | "list" | "watch");
    (token.starts_with("replica-") && record.status < 300 && !read).then_some(token)
}

/// Edits the image of MyApps `app-0` to `app-{count - 1}` at once, eight in flight.
pub(crate) async fn set_images(apps: &Api<MyApp>, count: usize, image: &str) {
    futures::stream::iter(0..count)
        .map(|i| {
            let apps = apps.clone();
            let patch = serde_json::json!({"spec": {"image": image}});
            async move {
                let params = kube::api::PatchParams::default();
                let name = format!("app-{i}");
                apps.patch(&name, &params, &kube::api::Patch::Merge(patch))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
}

/// Watches every object of an API and records each time a value that must never decrease
/// (an `observedGeneration`, an image version) went below the highest one seen for that object.
pub(crate) struct NeverBackwards {
    regressions: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl NeverBackwards {
    /// Every MyApp's `status.observedGeneration`, by uid (a MyApp deleted and created again
    /// starts over).
    pub(crate) fn generations(apps: Api<MyApp>) -> Self {
        Self::watch(
            apps,
            |app| app.metadata.uid.clone().unwrap_or_default(),
            |app| app.status.as_ref()?.observed_generation,
        )
    }

    /// `value` of every `K` in `api`, by `key`; objects without a value are skipped.
    pub(crate) fn watch<K>(api: Api<K>, key: fn(&K) -> String, value: fn(&K) -> Option<i64>) -> Self
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
        K::DynamicType: Default,
    {
        let regressions = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let regressions = regressions.clone();
            async move {
                let mut highest = HashMap::<String, i64>::new();
                let mut events = watcher::watcher(api, watcher::Config::default())
                    .applied_objects()
                    .boxed();
                while let Ok(Some(object)) = events.try_next().await {
                    let Some(now) = value(&object) else { continue };
                    let name = object.meta().name.clone().unwrap_or_default();
                    let last = highest.entry(key(&object)).or_insert(now);
                    if now < *last {
                        let line = format!("{name}: {last} -> {now}");
                        regressions.lock().unwrap().push(line);
                    }
                    *last = (*last).max(now);
                }
            }
        });
        Self { regressions, task }
    }

    /// Stops watching; every regression seen.
    pub(crate) fn regressions(self) -> Vec<String> {
        self.task.abort();
        self.regressions.lock().unwrap().clone()
    }
}

/// How every fault suite with replicas of the real binary ends: RBAC refused none of their
/// requests (`refused`, from `Cluster::refused_replica_requests`), and no
/// `observedGeneration` went backwards in `history`.
pub(crate) fn assert_no_refusal_and_no_regression(refused: Vec<String>, history: NeverBackwards) {
    assert_eq!(
        refused,
        Vec::<String>::new(),
        "RBAC refused a replica's request"
    );
    assert_eq!(
        history.regressions(),
        Vec::<String>::new(),
        "observedGeneration went backwards"
    );
}
