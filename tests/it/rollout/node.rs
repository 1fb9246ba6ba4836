//! A one-node cluster's worth of controllers for the operator's own Deployment: the
//! Deployment controller (a RollingUpdate within `maxSurge`/`maxUnavailable`), the kubelet
//! (starts each pod's container as a real `myapp-operator` process, probes it as the
//! manifest's probes say, restarts it when it dies, SIGTERM then SIGKILL after the grace
//! period) and the endpoints controller (the webhook Service's endpoints are the Ready pods,
//! handed to the sandbox's admission client).
//!
//! Everything a pod does comes from the live Deployment's pod template, which the test applied
//! from `deploy/base/deployment.yaml`. The pod spec is translated to loopback, nothing else:
//! - each pod gets its own address 127.0.1.N, so the ports stay as the manifest writes them,
//!   and a `0.0.0.0:PORT` in the container's env becomes `127.0.1.N:PORT`;
//! - the downward API's `metadata.name`/`metadata.namespace` become the pod's name/namespace;
//! - a Secret volume's mount path becomes the directory holding that Secret's data: the
//!   installed template's Secret is the test's serving pair, as cert-manager would issue it;
//!   the test may add others ([`Node::add_secret`]);
//! - the ServiceAccount's projected token and the API server's CA reach the process as a
//!   kubeconfig (`KUBECONFIG`), each pod with its own token; in-cluster discovery from
//!   `/var/run/secrets` is on deploy/README.md's real-cluster checklist.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Container, PodTemplateSpec, Probe},
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use kube_sandbox::{admission::ServiceRef, testing::Reap};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::run::{Cluster, status_of};

/// How often the simulated controllers look at the world (the kubelet probes on its own
/// schedule, from the manifest; this is only the resolution of that schedule).
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// The kubelet's first restart delay after a crash (then doubled), as in CrashLoopBackOff.
const CRASH_BACKOFF: Duration = Duration::from_secs(10);

/// A probe as the kubelet reads it from the container spec, with the API's defaults.
#[derive(Clone, Debug)]
struct ProbeSpec {
    path: String,
    port: u16,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

impl ProbeSpec {
    fn from(probe: &Probe, container: &Container) -> Self {
        let get = probe
            .http_get
            .as_ref()
            .expect("the manifest's probes are httpGet");
        ProbeSpec {
            path: get.path.clone().unwrap_or_else(|| "/".into()),
            port: container_port(container, &get.port),
            period: seconds(probe.period_seconds.unwrap_or(10)),
            timeout: seconds(probe.timeout_seconds.unwrap_or(1)),
            success_threshold: probe.success_threshold.unwrap_or(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3) as u32,
        }
    }
}

fn seconds(s: i32) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap())
}

/// A port of the container, by number or by name.
pub(crate) fn container_port(container: &Container, port: &IntOrString) -> u16 {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).unwrap(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| u16::try_from(p.container_port).unwrap())
            .unwrap_or_else(|| panic!("the container has no port named {name}")),
    }
}

/// What a probe saw over time: the kubelet's counters.
#[derive(Default)]
struct ProbeState {
    next: Option<Instant>,
    successes: u32,
    failures: u32,
}

/// One pod: its container is a process, restarted when it dies.
pub(crate) struct Pod {
    pub(crate) name: String,
    /// The template hash, as `pod-template-hash`: which "ReplicaSet" the pod belongs to.
    pub(crate) hash: String,
    ip: Ipv4Addr,
    /// Its own bound token of the ServiceAccount (`replica-N`), inside a kubeconfig.
    pub(crate) token: String,
    kubeconfig: PathBuf,
    /// Its containers' stderr, every restart appended, for a failure to quote.
    log: PathBuf,
    template: PodTemplateSpec,
    process: Option<Reap>,
    pub(crate) started: Instant,
    /// When the kubelet first saw it Ready, counted from `started`.
    pub(crate) ready_after: Option<Duration>,
    pub(crate) ready: bool,
    /// When it was deleted (SIGTERM sent).
    terminating: Option<Instant>,
    /// How its last container exited, and whether the kubelet had to SIGKILL it.
    pub(crate) exit: Option<ExitStatus>,
    pub(crate) killed: bool,
    pub(crate) restarts: u32,
    restart_at: Option<Instant>,
    readiness: ProbeState,
    liveness: ProbeState,
    pub(crate) liveness_kills: u32,
}

impl Pod {
    /// The address its webhook listens on: the Service's target port on the pod's IP.
    pub(crate) fn webhook(&self, target_port: &IntOrString) -> SocketAddr {
        let port = container_port(&self.template_container(), target_port);
        SocketAddr::new(IpAddr::V4(self.ip), port)
    }

    fn template_container(&self) -> Container {
        self.template
            .spec
            .as_ref()
            .unwrap()
            .containers
            .first()
            .cloned()
            .expect("one container")
    }

    /// Where the kubelet sends the readiness probe: its address and path.
    pub(crate) fn readiness_probe(&self) -> (SocketAddr, String) {
        let container = self.template_container();
        let probe = ProbeSpec::from(
            container
                .readiness_probe
                .as_ref()
                .expect("a readiness probe"),
            &container,
        );
        (SocketAddr::new(IpAddr::V4(self.ip), probe.port), probe.path)
    }

    /// The last `lines` lines its containers wrote to stderr.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub(crate) fn gone(&self) -> bool {
        self.terminating.is_some() && self.process.is_none()
    }
}

/// The node and its controllers. `run` drives them until the token is cancelled.
pub(crate) struct Node {
    cluster: Arc<Cluster>,
    namespace: String,
    deployment: String,
    service: ServiceRef,
    target_port: IntOrString,
    /// The directory each Secret's volume stands for, by Secret name.
    secrets: Mutex<BTreeMap<String, PathBuf>>,
    pub(crate) pods: Mutex<Vec<Pod>>,
    /// When the Deployment's status last said its rollout was complete, per generation.
    pub(crate) completed: Mutex<BTreeMap<i64, Instant>>,
    next_ip: Mutex<u8>,
}

impl Node {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        deployment: &Deployment,
        service: ServiceRef,
        target_port: IntOrString,
    ) -> Arc<Self> {
        // The installed template's Secrets hold the serving pair cert-manager would issue.
        let secrets = deployment
            .spec
            .iter()
            .filter_map(|spec| spec.template.spec.as_ref())
            .flat_map(|pod| pod.volumes.iter().flatten())
            .filter_map(|volume| volume.secret.as_ref()?.secret_name.clone())
            .map(|name| (name, cluster.certs.clone()))
            .collect();
        Arc::new(Node {
            cluster,
            namespace: deployment.metadata.namespace.clone().unwrap(),
            deployment: deployment.metadata.name.clone().unwrap(),
            service,
            target_port,
            secrets: Mutex::new(secrets),
            pods: Mutex::new(Vec::new()),
            completed: Mutex::new(BTreeMap::new()),
            next_ip: Mutex::new(0),
        })
    }

    /// Makes the Secret `name` exist on the node, its data the files in `dir`.
    pub(crate) fn add_secret(&self, name: &str, dir: PathBuf) {
        self.secrets.lock().unwrap().insert(name.to_owned(), dir);
    }

    /// Runs the controllers until `stop`, then deletes every pod (SIGTERM, grace period) and
    /// returns once every container has exited.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let api = Api::<Deployment>::namespaced(self.cluster.client(), &self.namespace);
        let mut last_endpoints = None;
        let mut last_status = None;
        while !stop.is_cancelled() {
            let deployment = api
                .get(&self.deployment)
                .await
                .expect("read the Deployment");
            self.kubelet().await;
            self.roll(&deployment);
            let endpoints = self.endpoints();
            if last_endpoints.as_ref() != Some(&endpoints) {
                self.cluster
                    .sandbox
                    .admission()
                    .set_endpoints(self.service.clone(), endpoints.clone());
                last_endpoints = Some(endpoints);
            }
            let status = self.status(&deployment);
            if last_status.as_ref() != Some(&status) {
                api.patch_status(
                    &self.deployment,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .expect("write the Deployment's status");
                last_status = Some(status);
            }
            tokio::time::sleep(TICK).await;
        }
        for pod in self.pods.lock().unwrap().iter_mut() {
            terminate(pod);
        }
        while !self.pods.lock().unwrap().iter().all(Pod::gone) {
            self.kubelet().await;
            tokio::time::sleep(TICK).await;
        }
    }

    /// The kubelet's pass: reap exits, restart crashed containers, enforce grace periods,
    /// run the probes that are due.
    async fn kubelet(&self) {
        let now = Instant::now();
        // Probing happens without the lock: take what each due probe needs first.
        let mut due = Vec::new();
        {
            let mut pods = self.pods.lock().unwrap();
            for (i, pod) in pods.iter_mut().enumerate() {
                let container = pod.template_container();
                if let Some(process) = pod.process.as_mut()
                    && let Some(status) = process.0.try_wait().unwrap()
                {
                    pod.exit = Some(status);
                    pod.process = None;
                    pod.ready = false;
                    if pod.terminating.is_none() {
                        let backoff = CRASH_BACKOFF * 2u32.pow(pod.restarts.min(5));
                        pod.restart_at = Some(now + backoff);
                    }
                }
                if let Some(since) = pod.terminating {
                    let grace = pod_grace(&pod.template);
                    if let Some(process) = pod.process.as_mut()
                        && now.duration_since(since) > grace
                    {
                        let _ = process.0.kill();
                        pod.killed = true;
                    }
                    continue;
                }
                if pod.process.is_none() && pod.restart_at.is_some_and(|at| now >= at) {
                    pod.restarts += 1;
                    pod.restart_at = None;
                    pod.readiness = ProbeState::default();
                    pod.liveness = ProbeState::default();
                    pod.process = Some(self.container(pod));
                }
                if pod.process.is_none() {
                    continue;
                }
                for (kind, probe) in [
                    (Kind::Readiness, &container.readiness_probe),
                    (Kind::Liveness, &container.liveness_probe),
                ] {
                    let Some(probe) = probe else { continue };
                    let spec = ProbeSpec::from(probe, &container);
                    let state = match kind {
                        Kind::Readiness => &mut pod.readiness,
                        Kind::Liveness => &mut pod.liveness,
                    };
                    if state.next.is_none_or(|next| now >= next) {
                        state.next = Some(now + spec.period);
                        due.push((i, kind, spec, pod.ip));
                    }
                }
            }
        }
        for (i, kind, spec, ip) in due {
            let addr = SocketAddr::new(IpAddr::V4(ip), spec.port);
            let answer = tokio::time::timeout(spec.timeout, status_of(addr, &spec.path)).await;
            let ok = matches!(answer, Ok(Some(200..=399)));
            let mut pods = self.pods.lock().unwrap();
            let pod = &mut pods[i];
            if pod.process.is_none() || pod.terminating.is_some() {
                continue;
            }
            let state = match kind {
                Kind::Readiness => &mut pod.readiness,
                Kind::Liveness => &mut pod.liveness,
            };
            if ok {
                state.successes += 1;
                state.failures = 0;
            } else {
                state.failures += 1;
                state.successes = 0;
            }
            let (successes, failures) = (state.successes, state.failures);
            match kind {
                Kind::Readiness if successes >= spec.success_threshold => {
                    if !pod.ready && pod.ready_after.is_none() {
                        pod.ready_after = Some(pod.started.elapsed());
                    }
                    pod.ready = true;
                }
                Kind::Readiness if failures >= spec.failure_threshold => pod.ready = false,
                Kind::Liveness if failures >= spec.failure_threshold => {
                    // The kubelet kills the container; the restart follows the crash path.
                    pod.liveness_kills += 1;
                    if let Some(process) = pod.process.as_mut() {
                        let _ = process.0.kill();
                    }
                }
                _ => {}
            }
        }
    }

    /// The Deployment controller's pass for a RollingUpdate: surge new pods while the total
    /// stays within `replicas + maxSurge`, delete old ones (unready first) while the Ready
    /// count stays at or above `replicas - maxUnavailable`.
    fn roll(&self, deployment: &Deployment) {
        let spec = deployment.spec.as_ref().unwrap();
        let desired = spec.replicas.unwrap_or(1);
        let (surge, unavailable) = budget(deployment);
        let template = spec.template.clone();
        let hash = template_hash(&template);
        let mut pods = self.pods.lock().unwrap();
        let active = |pods: &Vec<Pod>| pods.iter().filter(|p| p.terminating.is_none()).count();
        let new = pods
            .iter()
            .filter(|p| p.terminating.is_none() && p.hash == hash)
            .count() as i32;
        if new < desired && (active(&pods) as i32) < desired + surge {
            let pod = self.pod(template, hash.clone());
            pods.push(pod);
        }
        let ready = pods
            .iter()
            .filter(|p| p.terminating.is_none() && p.ready)
            .count() as i32;
        let min_ready = desired - unavailable;
        let new = pods
            .iter()
            .filter(|p| p.terminating.is_none() && p.hash == hash)
            .count() as i32;
        // Old pods go first, unready before ready; then new pods beyond `replicas`.
        let mut order: Vec<usize> = (0..pods.len())
            .filter(|&i| pods[i].terminating.is_none() && pods[i].hash != hash)
            .collect();
        order.sort_by_key(|&i| pods[i].ready);
        let mut ready_left = ready;
        for i in order {
            let costs = i32::from(pods[i].ready);
            if ready_left - costs >= min_ready {
                ready_left -= costs;
                terminate(&mut pods[i]);
            }
        }
        let mut extra = new - desired;
        for pod in pods.iter_mut().rev() {
            if extra > 0 && pod.terminating.is_none() && pod.hash == hash {
                terminate(pod);
                extra -= 1;
            }
        }
    }

    /// The status the Deployment controller reports for what the pods are now.
    fn status(&self, deployment: &Deployment) -> serde_json::Value {
        let spec = deployment.spec.as_ref().unwrap();
        let generation = deployment.metadata.generation.unwrap();
        let desired = spec.replicas.unwrap_or(1);
        let (_, unavailable) = budget(deployment);
        let hash = template_hash(&spec.template);
        let pods = self.pods.lock().unwrap();
        let active: Vec<&Pod> = pods.iter().filter(|p| p.terminating.is_none()).collect();
        let updated = active.iter().filter(|p| p.hash == hash).count() as i32;
        let ready = active.iter().filter(|p| p.ready).count() as i32;
        let updated_ready = active.iter().filter(|p| p.ready && p.hash == hash).count() as i32;
        let complete =
            updated == desired && active.len() as i32 == desired && updated_ready == desired;
        if complete {
            self.completed
                .lock()
                .unwrap()
                .entry(generation)
                .or_insert_with(Instant::now);
        }
        let condition = |type_: &str, ok: bool, reason: &str, message: String| {
            json!({"type": type_, "status": if ok { "True" } else { "False" },
                   "reason": reason, "message": message})
        };
        let rs = format!("{}-{hash}", self.deployment);
        json!({
            "observedGeneration": generation,
            "replicas": active.len(),
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": (desired - ready).max(0),
            "conditions": [
                if ready >= desired - unavailable {
                    condition("Available", true, "MinimumReplicasAvailable",
                              "Deployment has minimum availability.".into())
                } else {
                    condition("Available", false, "MinimumReplicasUnavailable",
                              "Deployment does not have minimum availability.".into())
                },
                if complete {
                    condition("Progressing", true, "NewReplicaSetAvailable",
                              format!("ReplicaSet \"{rs}\" has successfully progressed."))
                } else {
                    condition("Progressing", true, "ReplicaSetUpdated",
                              format!("ReplicaSet \"{rs}\" is progressing."))
                },
            ],
        })
    }

    /// The endpoints controller: every pod with a webhook address, Ready unless it is not or
    /// it is being deleted.
    fn endpoints(&self) -> Vec<(SocketAddr, bool)> {
        self.pods
            .lock()
            .unwrap()
            .iter()
            .filter(|p| !p.gone())
            .map(|p| {
                (
                    p.webhook(&self.target_port),
                    p.ready && p.terminating.is_none(),
                )
            })
            .collect()
    }

    /// A new pod of `template`, its container started.
    fn pod(&self, template: PodTemplateSpec, hash: String) -> Pod {
        let n = {
            let mut next = self.next_ip.lock().unwrap();
            *next += 1;
            *next
        };
        let (kubeconfig, token) = self.cluster.next_replica_kubeconfig();
        let name = format!("{}-{hash}-{n}", self.deployment);
        let mut pod = Pod {
            log: self.cluster.dir().join(format!("{name}.log")),
            name,
            hash,
            ip: Ipv4Addr::new(127, 0, 1, n),
            token,
            kubeconfig,
            template,
            process: None,
            started: Instant::now(),
            ready_after: None,
            ready: false,
            terminating: None,
            exit: None,
            killed: false,
            restarts: 0,
            restart_at: None,
            readiness: ProbeState::default(),
            liveness: ProbeState::default(),
            liveness_kills: 0,
        };
        pod.process = Some(self.container(&pod));
        pod
    }

    /// Starts the pod's container: the binary with the container's args and env, translated
    /// to loopback as the module doc says, and nothing else from the test's environment.
    fn container(&self, pod: &Pod) -> Reap {
        let container = pod.template_container();
        let pod_spec = pod.template.spec.as_ref().unwrap();
        let mounts: BTreeMap<String, PathBuf> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|mount| {
                let volume = pod_spec
                    .volumes
                    .iter()
                    .flatten()
                    .find(|v| v.name == mount.name)
                    .expect("every mount names a volume");
                let secret = volume
                    .secret
                    .as_ref()
                    .and_then(|secret| secret.secret_name.clone())
                    .unwrap_or_else(|| {
                        panic!("only Secret volumes are modelled, not {}", volume.name)
                    });
                let dir = self.secrets.lock().unwrap().get(&secret).cloned();
                let dir = dir.unwrap_or_else(|| panic!("no Secret {secret}: add_secret first"));
                (mount.mount_path.clone(), dir)
            })
            .collect();
        let mut command = Command::new(env!("CARGO_BIN_EXE_myapp-operator"));
        command
            .env_clear()
            .env("KUBECONFIG", &pod.kubeconfig)
            .args(container.args.iter().flatten())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&pod.log)
                    .expect("open the pod's log"),
            );
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => {
                    let field = &from
                        .field_ref
                        .as_ref()
                        .expect("downward API only")
                        .field_path;
                    match field.as_str() {
                        "metadata.name" => pod.name.clone(),
                        "metadata.namespace" => self.namespace.clone(),
                        other => panic!("downward API field {other} is not modelled"),
                    }
                }
                (None, None) => String::new(),
            };
            command.env(&var.name, translate(&value, pod.ip, &mounts));
        }
        Reap(command.spawn().expect("start the container's process"))
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Readiness,
    Liveness,
}

/// `0.0.0.0:PORT` on the pod's IP; a mount path as the host directory behind it.
fn translate(value: &str, ip: Ipv4Addr, mounts: &BTreeMap<String, PathBuf>) -> String {
    if let Ok(addr) = value.parse::<SocketAddr>()
        && addr.ip().is_unspecified()
    {
        return SocketAddr::new(IpAddr::V4(ip), addr.port()).to_string();
    }
    match mounts.get(value) {
        Some(dir) => dir.display().to_string(),
        None => value.to_owned(),
    }
}

/// Deletes the pod: out of the endpoints at once, SIGTERM to its container.
fn terminate(pod: &mut Pod) {
    if pod.terminating.is_some() {
        return;
    }
    pod.terminating = Some(Instant::now());
    pod.ready = false;
    pod.restart_at = None;
    if let Some(process) = &pod.process {
        let kill = Command::new("kill")
            .args(["-TERM", &process.0.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
    }
}

fn pod_grace(template: &PodTemplateSpec) -> Duration {
    let seconds = template
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(seconds).unwrap())
}

/// `maxSurge` and `maxUnavailable` as pod counts (percentages round up and down, as the
/// Deployment controller rounds them).
fn budget(deployment: &Deployment) -> (i32, i32) {
    let spec = deployment.spec.as_ref().unwrap();
    let replicas = spec.replicas.unwrap_or(1);
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    let count = |value: Option<IntOrString>, default: &str, up: bool| match value
        .unwrap_or(IntOrString::String(default.into()))
    {
        IntOrString::Int(n) => n,
        IntOrString::String(percent) => {
            let p: i32 = percent.trim_end_matches('%').parse().unwrap();
            if up {
                (replicas * p + 99) / 100
            } else {
                replicas * p / 100
            }
        }
    };
    (
        count(rolling.max_surge, "25%", true),
        count(rolling.max_unavailable, "25%", false),
    )
}

/// A stable short hash of the pod template, standing for `pod-template-hash`.
pub(crate) fn template_hash(template: &PodTemplateSpec) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(template).unwrap().hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}
