//! What the bench observes of the operator and the sandbox: convergence of every MyApp, the
//! first admitted review, the operator's reconcile count, and the binary under test.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::PathBuf,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use kube_sandbox::Sandbox;
use myapp_operator::crd::{MyApp, Phase};
use serde_json::{Value, json};

/// Convergence of the MyApps the bench created, read from the sandbox's store.
///
/// Read in memory ([`Sandbox::stored`]), not through the API, so that observing costs the
/// machine next to nothing the loader's run does not pay too. Listing the three kinds at every
/// check costs the sandbox a list of every object each time, and watch caches of them six more
/// watch events per MyApp for the sandbox to send and the bench to parse, managedFields and
/// all: either would land on the same two cores as the operator and lower its rate against the
/// loader. A MyApp is read once those created before it converged, and once more each check
/// while it is the first that has not.
pub struct Observed {
    sandbox: Sandbox,
    namespace: String,
    /// The MyApps not seen converged yet, in the order they were created.
    waiting: VecDeque<String>,
}

/// The MyApp, Deployment and Service stored under one name, parsed (the children as far as the
/// checks read them: their managedFields and the rest of the pod template would cost more to
/// parse than everything else the check does); None where absent.
struct Stored {
    app: Option<MyApp>,
    deployment: Option<Deployment>,
    service: Option<Service>,
}

impl Observed {
    /// Observes the MyApps `names` in `namespace`.
    pub fn start(
        sandbox: &Sandbox,
        namespace: &str,
        names: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            sandbox: sandbox.clone(),
            namespace: namespace.to_owned(),
            waiting: names.into_iter().collect(),
        }
    }

    /// Why one MyApp is not converged yet, or None once all are: the status reports the
    /// current generation, phase `Running` and every replica available; the Deployment runs
    /// the spec's image, replicas, env and port with every replica available; the Service
    /// exposes the spec's port.
    ///
    /// It stops at the first MyApp not converged, and forgets those found converged (a
    /// converged MyApp stays so: nothing else writes them). [`Observed::waiting`] counts the
    /// rest, for a failure.
    pub fn unconverged(&mut self) -> Option<String> {
        while let Some(name) = self.waiting.front() {
            if let Some(why) = self.why_unconverged(name) {
                return Some(format!("{}/{name}: {why}", self.namespace));
            }
            self.waiting.pop_front();
        }
        None
    }

    /// How many MyApps are not converged.
    pub fn waiting(&self) -> usize {
        self.waiting
            .iter()
            .filter(|name| self.why_unconverged(name).is_some())
            .count()
    }

    fn why_unconverged(&self, name: &str) -> Option<&'static str> {
        let stored = match self.read(name) {
            Ok(stored) => stored,
            Err(why) => return Some(why),
        };
        let Some(app) = stored.app else {
            return Some("no MyApp");
        };
        app_unconverged(&app, stored.deployment.as_ref(), stored.service.as_ref())
    }

    /// The three objects of `name`, parsed after the store's lock is released.
    fn read(&self, name: &str) -> Result<Stored, &'static str> {
        let ns = self.namespace.as_str();
        let [app, deployment, service] = <[_; 3]>::try_from(self.sandbox.stored(&[
            ("example.com", "myapps", ns, name),
            ("apps", "deployments", ns, name),
            ("", "services", ns, name),
        ]))
        .expect("one answer per key");
        fn parse<T: serde::de::DeserializeOwned>(
            v: Option<std::sync::Arc<Value>>,
            what: &'static str,
        ) -> Result<Option<T>, &'static str> {
            v.map(|v| T::deserialize(&*v).map_err(|_| what)).transpose()
        }
        Ok(Stored {
            app: parse(app, "stored MyApp does not parse")?,
            deployment: parse(deployment, "stored Deployment does not parse")?,
            service: parse(service, "stored Service does not parse")?,
        })
    }
}

/// What the check reads of a Deployment, under the API's field names. Not the operator's own
/// cached types (`myapp_operator::cache`): the check must not share the reading it checks.
#[derive(serde::Deserialize)]
struct Deployment {
    spec: Option<DeploymentSpec>,
    status: Option<DeploymentStatus>,
}

#[derive(serde::Deserialize)]
struct DeploymentSpec {
    replicas: Option<i32>,
    template: PodTemplateSpec,
}

#[derive(serde::Deserialize)]
struct PodTemplateSpec {
    spec: Option<PodSpec>,
}

#[derive(serde::Deserialize)]
struct PodSpec {
    containers: Vec<Container>,
}

#[derive(serde::Deserialize)]
struct Container {
    image: Option<String>,
    env: Option<Vec<EnvVar>>,
    ports: Option<Vec<ContainerPort>>,
}

#[derive(serde::Deserialize)]
struct EnvVar {
    name: String,
    value: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerPort {
    container_port: i32,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeploymentStatus {
    available_replicas: Option<i32>,
}

/// What the check reads of a Service.
#[derive(serde::Deserialize)]
struct Service {
    spec: Option<ServiceSpec>,
}

#[derive(serde::Deserialize)]
struct ServiceSpec {
    ports: Option<Vec<ServicePort>>,
}

#[derive(serde::Deserialize)]
struct ServicePort {
    port: i32,
}

fn app_unconverged(
    app: &MyApp,
    deployment: Option<&Deployment>,
    service: Option<&Service>,
) -> Option<&'static str> {
    let spec = &app.spec;
    let Some(status) = app.status.as_ref() else {
        return Some("no status");
    };
    if status.observed_generation != app.metadata.generation {
        return Some("status does not report the current generation");
    }
    if status.phase != Some(Phase::Running) {
        return Some("phase is not Running");
    }
    if status.available_replicas != spec.replicas {
        return Some("status.availableReplicas differs from spec.replicas");
    }
    let Some(deployment) = deployment else {
        return Some("no Deployment");
    };
    let Some(dspec) = deployment.spec.as_ref() else {
        return Some("Deployment without spec");
    };
    if dspec.replicas != spec.replicas {
        return Some("Deployment replicas differ from the spec");
    }
    let available = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas);
    if available != spec.replicas {
        return Some("Deployment's available replicas differ from the spec");
    }
    let containers = dspec.template.spec.as_ref().map(|p| &p.containers);
    let Some([container]) = containers.map(Vec::as_slice) else {
        return Some("Deployment does not run exactly one container");
    };
    if container.image.as_deref() != Some(spec.image.as_str()) {
        return Some("Deployment image differs from the spec");
    }
    let env = container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()));
    let want = spec
        .env
        .iter()
        .map(|e| (e.name.as_str(), Some(e.value.as_str())));
    if !env.eq(want) {
        return Some("Deployment env differs from the spec");
    }
    let ports = container.ports.iter().flatten();
    if !ports.map(|p| p.container_port).eq([spec.port]) {
        return Some("Deployment container port differs from the spec");
    }
    let service_ports = service
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.ports.as_ref());
    let Some(service_ports) = service_ports else {
        return Some("no Service, or one without ports");
    };
    if !service_ports.iter().map(|p| p.port).eq([spec.port]) {
        return Some("Service port differs from the spec");
    }
    None
}

/// Time from `started` to the first AdmissionReview of a valid MyApp that the validating
/// webhook at `addr` answers with `allowed: true`. Refused connections are retried until
/// `deadline`; any other answer fails.
pub async fn first_admitted_review(
    addr: SocketAddr,
    started: Instant,
    deadline: Duration,
    tls: Arc<rustls::ClientConfig>,
) -> Result<Duration, String> {
    let uid = "b7a1c0de-0000-4000-8000-000000000001";
    let object = serde_json::to_value(MyApp::test("first-review").in_namespace("load"))
        .map_err(|e| e.to_string())?;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "example.com", "version": "v1", "kind": "MyApp"},
            "resource": {"group": "example.com", "version": "v1", "resource": "myapps"},
            "name": "first-review",
            "namespace": "load",
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": object,
            "dryRun": false,
        }
    });
    let tcp = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if started.elapsed() > deadline => {
                return Err(format!("the webhook at {addr} refused connections: {e}"));
            }
            // Not a wait for a condition the bench can observe otherwise: the port is bound
            // (it was logged), a refusal is a race with the listener's start.
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    };
    let name = rustls_pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with the webhook: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = hyper::Request::post(myapp_operator::admission::VALIDATE_PATH)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(review.to_string())))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the validating webhook did not answer: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let answered = started.elapsed();
    let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
    let admitted = status == 200
        && answer["response"]["uid"] == uid
        && answer["response"]["allowed"] == Value::Bool(true);
    if !admitted {
        return Err(format!(
            "the validating webhook did not admit a valid MyApp: {status} {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(answered)
}

/// How many times the bench has scraped the operator's metrics: each scrape costs the
/// operator CPU, which the bench takes out of what it reports for a resync or relist.
static SCRAPES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The number of scrapes so far.
pub fn scrapes() -> u64 {
    SCRAPES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The operator's metrics, scraped from its admin server at `admin`.
async fn scrape(admin: SocketAddr) -> Result<String, String> {
    SCRAPES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tcp = tokio::net::TcpStream::connect(admin)
        .await
        .map_err(|e| format!("admin server {admin}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = hyper::Request::get("/metrics")
        .header("host", admin.to_string())
        .body(Full::new(bytes::Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("admin server {admin}: {e}"))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum of the samples of metric `name` (every label set), None if there is none.
fn sum(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Reconciles the operator has finished, by its `myapp_reconcile_total` counter (every result:
/// success, requeue, error).
pub async fn reconciles(admin: SocketAddr) -> Result<u64, String> {
    let metrics = scrape(admin).await?;
    sum(&metrics, "myapp_reconcile_total")
        .map(|n| n as u64)
        .ok_or_else(|| {
            format!(
                "the admin server at {admin} reports no myapp_reconcile_total: the bench counts \
             reconciles by it to know a resync or relist has reconciled every MyApp"
            )
        })
}

/// Reconciles that have failed so far (`myapp_reconcile_errors_total`).
pub async fn reconcile_errors(admin: SocketAddr) -> Result<u64, String> {
    let metrics = scrape(admin).await?;
    sum(&metrics, "myapp_reconcile_errors_total")
        .map(|n| n as u64)
        .ok_or_else(|| {
            format!("the admin server at {admin} reports no myapp_reconcile_errors_total")
        })
}

/// The MyApps the operator's controller holds (`myapp_shard_objects`): the shards bench's.
#[allow(dead_code)]
pub async fn shard_objects(admin: SocketAddr) -> Result<u64, String> {
    let metrics = scrape(admin).await?;
    sum(&metrics, "myapp_shard_objects")
        .map(|n| n as u64)
        .ok_or_else(|| format!("the admin server at {admin} reports no myapp_shard_objects"))
}

/// Whether the operator's watch caches hold a complete list (`myapp_caches_synced`).
pub async fn caches_synced(admin: SocketAddr) -> Result<bool, String> {
    let metrics = scrape(admin).await?;
    Ok(sum(&metrics, "myapp_caches_synced") == Some(1.0))
}

/// The operator binary to measure: `MYAPP_BENCH_OPERATOR` if set, else the build the image
/// ships (`--release --no-default-features`, no dev-dependency features unified), built now
/// into its own target dir, `<target>/bench-operator`.
pub fn operator_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("MYAPP_BENCH_OPERATOR") {
        return Ok(PathBuf::from(path));
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("bench-operator");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "building the shipped operator binary into {}",
        target.display()
    );
    let status = Command::new(cargo)
        .current_dir(&workspace)
        .args(["build", "--release", "--locked", "--no-default-features"])
        .args(["--bin", "myapp-operator", "--target-dir"])
        .arg(&target)
        .status()
        .map_err(|e| format!("running cargo to build the operator: {e}"))?;
    if !status.success() {
        return Err(format!("building the operator binary failed: {status}"));
    }
    Ok(target.join("release").join("myapp-operator"))
}

/// The process running `binary` among the descendants of `wrapper` (a profiler that runs the
/// operator as its child), so that RSS and CPU are the operator's and not the wrapper's. Fails
/// when there is none, rather than measure the wrapper.
pub fn operator_under(wrapper: u32, binary: &std::path::Path) -> Result<u32, String> {
    let binary = std::fs::canonicalize(binary).map_err(|e| format!("{}: {e}", binary.display()))?;
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let descends = |mut pid: u32| {
        while pid > 1 {
            if pid == wrapper {
                return true;
            }
            let Some(next) = parent(pid) else {
                return false;
            };
            pid = next;
        }
        false
    };
    let processes = std::fs::read_dir("/proc").map_err(|e| format!("reading /proc: {e}"))?;
    processes
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == binary)
                && descends(pid)
        })
        .ok_or_else(|| {
            format!(
                "no process runs {} under the wrapper (pid {wrapper}): its RSS and CPU would \
                 be the wrapper's, so the bench stops",
                binary.display()
            )
        })
}
