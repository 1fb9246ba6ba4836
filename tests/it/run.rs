//! `myapp-operator run` as a child process, the way a cluster runs it: readiness with and
//! without the lease, with and without the CRD, across a lease hand-off, and SIGTERM while
//! webhook requests stream in. Each replica reaches the API server over HTTPS with its own
//! bound token of the operator's ServiceAccount, under `deploy/base/rbac.yaml` enforced: a
//! permission the operator lacks fails these tests as it would fail a cluster.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc::Receiver,
    },
    time::{Duration, Instant},
};

use crate::support::install::{apply, client_for, rbac_documents};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, CustomResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use kube_sandbox::testing::{Reap, eventually, log_lines, wait_for_addr, wait_for_message};
use myapp_operator::crd::MyApp;
use serde_json::json;
use tokio::net::TcpStream;

const DRAIN: Duration = Duration::from_secs(2);

struct Client {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    async fn connect(&self) -> std::io::Result<SendRequest<Full<Bytes>>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let stream = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(connection);
        Ok(sender)
    }
}

fn review(uid: u64) -> Bytes {
    let object = json!({"apiVersion": "example.com/v1", "kind": "MyApp", "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"replicas": 2, "image": "ghcr.io/example/web:1.4.2", "port": 8080}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": format!("uid-{uid}"), "kind": {"group": "example.com", "version": "v1", "kind": "MyApp"},
        "resource": {"group": "example.com", "version": "v1", "resource": "myapps"},
        "name": "web", "namespace": "default", "operation": "CREATE", "userInfo": {"username": "test"},
        "object": object, "oldObject": null, "dryRun": false}});
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drops_no_webhook_request_and_exits_zero_with_admin_connections_held_open() {
    let cluster = Cluster::start(true).await;
    let drain = format!("{}s", DRAIN.as_secs());
    let mut replica = cluster.replica(&["--leader-elect=false", "--drain-delay", &drain]);
    let admin = replica.admin;
    let webhook = replica.webhook;
    let bundle = &cluster.bundle;

    let client = Arc::new(Client {
        addr: webhook,
        tls: Arc::new(kube_sandbox::testing::tls_client_trusting(&bundle.ca_pem)),
    });

    // Four keep-alive connections send reviews back to back, like the API server's pool.
    let sending = Arc::new(AtomicBool::new(true));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut senders = Vec::new();
    for worker in 0..4u64 {
        let (client, sending, answered, failed) = (
            client.clone(),
            sending.clone(),
            answered.clone(),
            failed.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut conn = client.connect().await.expect("connect before shutdown");
            let mut uid = worker * 1_000_000;
            while sending.load(Ordering::SeqCst) {
                if conn.ready().await.is_err() {
                    // The server closed this connection (Connection: close): open another.
                    conn = client
                        .connect()
                        .await
                        .expect("the listener accepts during the drain delay");
                    continue;
                }
                uid += 1;
                let request = hyper::Request::post("/validate-myapp?timeout=5s")
                    .header("host", "localhost")
                    .header("content-type", "application/json")
                    .body(Full::new(review(uid)))
                    .unwrap();
                match conn.send_request(request).await {
                    Ok(response) if response.status() == 200 => {
                        let body = response.into_body().collect().await.unwrap().to_bytes();
                        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        assert_eq!(answer["response"]["uid"], format!("uid-{uid}"));
                        assert_eq!(answer["response"]["allowed"], true);
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    eventually("requests are answered before shutdown", || async {
        (answered.load(Ordering::SeqCst) >= 20).then_some(())
    })
    .await;

    // Held open across the signal: neither may hold the exit.
    let _admin_connections = half_sent_and_idle(admin).await;
    let kill = Command::new("kill")
        .args(["-TERM", &replica.process.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // Readiness drops at once, while the webhook keeps answering.
    let mut unready = false;
    for _ in 0..50 {
        let status = readyz(admin).await;
        if status == Some(503) {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(unready, "/readyz turns 503 after SIGTERM");
    let at_sigterm = answered.load(Ordering::SeqCst);
    // The API server stops picking this pod once it leaves the endpoints: stop sending a bit
    // before the drain delay ends, as it would.
    tokio::time::sleep(DRAIN - Duration::from_millis(500)).await;
    sending.store(false, Ordering::SeqCst);
    for sender in senders {
        sender.await.unwrap();
    }
    assert!(
        answered.load(Ordering::SeqCst) > at_sigterm,
        "requests were answered during the drain delay"
    );
    assert_eq!(failed.load(Ordering::SeqCst), 0, "no request failed");

    // A bound that fails a hang, not a timing assertion (the load driver measures the time).
    let status = exits_within(
        &mut replica.process,
        DRAIN + Duration::from_secs(10),
        "the operator exits after the drain",
    )
    .await;
    assert_eq!(
        status.code(),
        Some(0),
        "the operator exits 0 after a graceful shutdown"
    );
    cluster.served.shutdown().await.unwrap();
}

/// A half-sent admin request, and an idle keep-alive admin connection that had one answer.
async fn half_sent_and_idle(admin: SocketAddr) -> (TcpStream, TcpStream) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut half = TcpStream::connect(admin).await.unwrap();
    half.write_all(b"GET /readyz HTTP/1.1\r\nHost: a")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(admin).await.unwrap();
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let read = idle.read(&mut buf).await.unwrap();
    assert!(buf[..read].starts_with(b"HTTP/1.1 200"), "/livez answers");
    (half, idle)
}

async fn readyz(admin: SocketAddr) -> Option<u16> {
    tokio::time::timeout(PROBE_TIMEOUT, status_of(admin, "/readyz"))
        .await
        .ok()?
}

/// How long a test's probe or scrape waits for its answer before it counts as none (kubelet
/// gives a probe 1 s by default). Without a bound, an answer that never comes hangs a test for
/// good instead of failing it:
/// `idle_admin_connections_are_capped_and_timed_out_so_probes_keep_working` has hung so in its
/// readiness loop, past the cap check, where this request was the only unbounded wait (why
/// that answer never came is not known).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The status code of a plain-HTTP GET of `path`, as a kubelet's httpGet probe sees it.
pub(crate) async fn status_of(addr: SocketAddr, path: &str) -> Option<u16> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .ok()?;
    Some(sender.send_request(request).await.ok()?.status().as_u16())
}

/// The body of a plain-HTTP GET of `path`, whatever its status.
pub(crate) async fn get_text(admin: SocketAddr, path: &str) -> Option<String> {
    tokio::time::timeout(PROBE_TIMEOUT, get_text_unbounded(admin, path))
        .await
        .ok()?
}

async fn get_text_unbounded(admin: SocketAddr, path: &str) -> Option<String> {
    let tcp = TcpStream::connect(admin).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .ok()?;
    let body = sender.send_request(request).await.ok()?.into_body();
    let bytes = body.collect().await.ok()?.to_bytes();
    String::from_utf8(bytes.to_vec()).ok()
}

/// The value of an unlabelled gauge in the replica's `/metrics`.
pub(crate) async fn gauge(admin: SocketAddr, name: &str) -> Option<i64> {
    let text = get_text(admin, "/metrics").await?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The names the webhook's serving certificate is valid for.
const WEBHOOK_SANS: [&str; 3] = [
    "localhost",
    "myapp-operator-webhook.myapp-system.svc",
    "myapp-operator-webhook.myapp-system.svc.cluster.local",
];

/// Lease timings short enough for a test to see several hand-offs: a 2 s lease, renewed
/// every 200 ms, given up 1.5 s after the last renewal began.
pub(crate) const SHORT_LEASE: [&str; 6] = [
    "--lease-duration",
    "2s",
    "--lease-renew-deadline",
    "1500ms",
    "--lease-retry-period",
    "200ms",
];

/// How many replicas a test may start: each has its own token.
const REPLICA_TOKENS: usize = 64;

/// An in-memory API server on loopback over HTTPS, as the replicas' "cluster", with
/// `deploy/base/rbac.yaml` applied and enforced, and the webhook's serving certificate where
/// cert-manager would have put it.
pub(crate) struct Cluster {
    pub(crate) sandbox: kube_sandbox::Sandbox,
    pub(crate) served: kube_sandbox::Served,
    /// The admin's client (system:masters), for what the test itself does.
    admin: kube::Client,
    /// The webhook's serving certificate and key, valid for `localhost` and the webhook
    /// Service's names, as the Secret's volume would hold them.
    pub(crate) certs: PathBuf,
    pub(crate) bundle: myapp_operator::certs::Bundle,
    started: AtomicUsize,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// A kubeconfig with the admin's token, for a process the test starts by hand.
    pub(crate) fn admin_kubeconfig(&self) -> PathBuf {
        let path = self.dir.path().join("kubeconfig-admin");
        std::fs::write(&path, self.served.kubeconfig()).unwrap();
        path
    }

    pub(crate) async fn start(with_crd: bool) -> Self {
        Self::start_under(with_crd, rbac_documents()).await
    }

    /// [`Cluster::start`] with the RBAC `documents` enforced instead of `deploy/base/rbac.yaml`.
    pub(crate) async fn start_under(with_crd: bool, documents: Vec<serde_json::Value>) -> Self {
        Self::start_configured(with_crd, documents, |builder| builder).await
    }

    /// [`Cluster::start_under`] with the sandbox built by `configure` as well.
    pub(crate) async fn start_configured(
        with_crd: bool,
        documents: Vec<serde_json::Value>,
        configure: impl FnOnce(kube_sandbox::SandboxBuilder) -> kube_sandbox::SandboxBuilder,
    ) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        // The Lease's namespace, as `deploy/` creates it; one bound token per replica.
        let mut builder = configure(kube_sandbox::Sandbox::builder().namespace("myapp-system"));
        for i in 0..REPLICA_TOKENS {
            builder = builder.service_account_token(
                &format!("replica-{i}"),
                "myapp-system",
                "myapp-operator",
            );
        }
        let sandbox = builder.build();
        let served = sandbox
            .serve_tls("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let admin = client_for(&served.kubeconfig()).await;
        apply(&admin, documents).await;
        let bundle = myapp_operator::certs::generate(&WEBHOOK_SANS.map(String::from)).unwrap();
        let certs = dir.path().join("certs");
        bundle.write_to(&certs).unwrap();
        let cluster = Self {
            sandbox,
            served,
            admin,
            certs,
            bundle,
            started: AtomicUsize::new(0),
            dir,
        };
        if with_crd {
            cluster.install_crd().await;
        }
        cluster
    }

    /// Writes into `dir` a serving pair for the webhook's names, valid from `from` until
    /// `until` (relative to now): what a Secret holds when cert-manager's renewal failed.
    pub(crate) fn write_pair_valid(&self, dir: &Path, from: i64, until: i64) {
        let at = |offset: i64| {
            let span = Duration::from_secs(offset.unsigned_abs());
            let now = std::time::SystemTime::now();
            if offset < 0 { now - span } else { now + span }
        };
        myapp_operator::certs::generate_between(
            &WEBHOOK_SANS.map(String::from),
            at(from),
            at(3600),
            at(until),
        )
        .unwrap()
        .write_to(dir)
        .unwrap();
    }

    /// The test's private directory, removed with the cluster.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn client(&self) -> kube::Client {
        self.admin.clone()
    }

    /// Every request a replica's token made.
    pub(crate) fn replica_requests(&self) -> Vec<kube_sandbox::RequestRecord> {
        self.sandbox
            .faults()
            .requests()
            .into_iter()
            .filter(|r| {
                r.token_id
                    .as_deref()
                    .is_some_and(|t| t.starts_with("replica-"))
            })
            .collect()
    }

    /// Every request a replica's token made and the API server refused (401 or 403).
    pub(crate) fn refused_replica_requests(&self) -> Vec<String> {
        self.replica_requests()
            .into_iter()
            .filter(|r| matches!(r.status, 401 | 403))
            .map(|r| format!("{} {} -> {} ({:?})", r.verb, r.path, r.status, r.token_id))
            .collect()
    }

    /// Who holds the operator's Lease now, if anyone.
    pub(crate) async fn lease_holder(&self) -> Option<String> {
        Api::<Lease>::namespaced(self.client(), "myapp-system")
            .get_opt("myapp-operator")
            .await
            .ok()
            .flatten()
            .and_then(|lease| lease.spec?.holder_identity)
    }

    pub(crate) async fn install_crd(&self) {
        Api::<CustomResourceDefinition>::all(self.client())
            .patch(
                "myapps.example.com",
                &PatchParams::apply("test"),
                &Patch::Apply(&MyApp::crd()),
            )
            .await
            .unwrap();
    }

    async fn create_apps(&self, count: usize) {
        use futures::StreamExt;
        let api = Api::<MyApp>::namespaced(self.client(), "default");
        futures::stream::iter(0..count)
            .map(|i| {
                let api = api.clone();
                async move {
                    let app = MyApp::test(&format!("app-{i}")).replicas(Some(1));
                    api.create(&PostParams::default(), &app).await.unwrap();
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
    }

    /// A kubeconfig for the next replica: its own bound token of the operator's
    /// ServiceAccount (`replica-N`) and the API server's CA, as a pod's projected volume has.
    pub(crate) fn next_replica_kubeconfig(&self) -> (PathBuf, String) {
        let n = self.started.fetch_add(1, Ordering::SeqCst);
        let kubeconfig = self.dir.path().join(format!("kubeconfig-{n}"));
        let token = format!("replica-{n}");
        let text = self
            .served
            .kubeconfig_for_token(&token)
            .unwrap_or_else(|| panic!("no token {token}: raise REPLICA_TOKENS"));
        std::fs::write(&kubeconfig, text).unwrap();
        (kubeconfig, token)
    }

    /// Starts `myapp-operator run` with `args`, as the next replica with its own token, and
    /// waits until its webhook serves.
    pub(crate) fn replica(&self, args: &[&str]) -> Replica {
        self.replica_serving(args, &self.certs)
    }

    /// [`Cluster::replica`], serving the pair in `cert_dir`.
    fn replica_serving(&self, args: &[&str], cert_dir: &Path) -> Replica {
        let (kubeconfig, _) = self.next_replica_kubeconfig();
        let mut child = operator_run(&kubeconfig)
            .args(["--log-format", "json"])
            .args(args)
            .arg("--cert-dir")
            .arg(cert_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start myapp-operator run");
        let lines = log_lines(&mut child);
        let process = Reap(child);
        let admin = wait_for_addr(&lines, "Admin server listening");
        let webhook = wait_for_addr(&lines, "Webhook serving");
        Replica {
            process,
            lines,
            admin,
            webhook,
            serving_since: Instant::now(),
        }
    }
}

pub(crate) struct Replica {
    pub(crate) process: Reap,
    pub(crate) lines: Receiver<String>,
    pub(crate) admin: SocketAddr,
    webhook: SocketAddr,
    /// When its log said the webhook serves.
    serving_since: Instant,
}

impl Replica {
    /// Probes `/readyz` like a kubelet until it answers 200; how long after the webhook began
    /// serving that was, or `None` past `within`.
    async fn time_to_ready(&self, within: Duration) -> Option<Duration> {
        let deadline = self.serving_since + within;
        while Instant::now() < deadline {
            if readyz(self.admin).await == Some(200) {
                return Some(self.serving_since.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// The lines logged until one satisfies `found` (the last one then) or `within` passes.
    pub(crate) fn lines_until(
        &self,
        within: Duration,
        found: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut lines = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else {
                break;
            };
            let done = found(&line);
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    }

    pub(crate) fn logged(&self, message: &str, within: Duration) -> bool {
        wait_for_message(&self.lines, message, within).is_some()
    }

    fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends the process `signal` (`-STOP`, `-CONT`, `-KILL`...), as `kill` does.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.process.0.id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }
}

/// `myapp-operator run` on free loopback ports, reaching the API server through `kubeconfig`
/// (in a pod: the ServiceAccount's token and CA, translated to a kubeconfig here).
pub(crate) fn operator_run(kubeconfig: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_myapp-operator"));
    command
        .args([
            "run",
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", kubeconfig);
    command
}

/// Waits for the process to exit, failing with `why` after `bound`.
pub(crate) async fn exits_within(
    process: &mut Reap,
    bound: Duration,
    why: &str,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const READY_BOUND: Duration = Duration::from_secs(2);
const SYNC_BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_replica_is_ready_within_two_seconds_of_serving_with_0_1_and_1000_myapps() {
    for apps in [0, 1, 1000] {
        let cluster = Cluster::start(true).await;
        cluster.create_apps(apps).await;
        // Election off: the replica always leads.
        let alone = cluster.replica(&["--leader-elect=false"]);
        // Election on: the first takes the lease, the second started after it follows.
        let leader = cluster.replica(&["--leader-elect=true", "--identity", "leader"]);
        for (name, replica) in [("without election", &alone), ("leader", &leader)] {
            let ready = replica.time_to_ready(READY_BOUND).await;
            assert!(ready.is_some(), "{apps} MyApps: {name} not ready in 2 s");
            println!("{apps} MyApps: {name} ready {ready:?} after its webhook served");
            assert!(
                replica.logged("Caches synced", SYNC_BOUND),
                "{apps} MyApps: the {name} never logged `Caches synced`"
            );
            assert_eq!(gauge(replica.admin, "myapp_caches_synced").await, Some(1));
            assert_eq!(gauge(replica.admin, "myapp_leader").await, Some(1));
        }
        let follower = cluster.replica(&["--leader-elect=true", "--identity", "follower"]);
        let ready = follower.time_to_ready(READY_BOUND).await;
        assert!(ready.is_some(), "{apps} MyApps: follower not ready in 2 s");
        println!("{apps} MyApps: follower ready {ready:?} after its webhook served");
        assert_eq!(gauge(follower.admin, "myapp_leader").await, Some(0));
        assert_eq!(gauge(follower.admin, "myapp_caches_synced").await, Some(0));
        assert_eq!(cluster.refused_replica_requests(), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_without_the_crd_is_ready_and_syncs_once_the_crd_is_installed() {
    let cluster = Cluster::start(false).await;
    let replica = cluster.replica(&["--leader-elect=false"]);
    assert!(
        replica.time_to_ready(READY_BOUND).await.is_some(),
        "not ready in 2 s without the CRD"
    );
    assert_eq!(gauge(replica.admin, "myapp_caches_synced").await, Some(0));
    cluster.install_crd().await;
    assert!(
        replica.logged("Caches synced", SYNC_BOUND),
        "the controller syncs once the CRD exists"
    );
    assert_eq!(readyz(replica.admin).await, Some(200));
    assert_eq!(gauge(replica.admin, "myapp_caches_synced").await, Some(1));
    assert_eq!(cluster.refused_replica_requests(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_stays_up_across_a_lease_hand_off() {
    let cluster = Cluster::start(true).await;
    cluster.create_apps(3).await;
    let first = cluster.replica(&["--identity", "first", "--drain-delay", "1s"]);
    assert!(first.logged("Caches synced", SYNC_BOUND), "first leads");
    let second = cluster.replica(&["--identity", "second", "--drain-delay", "1s"]);
    assert!(second.time_to_ready(READY_BOUND).await.is_some());
    first.terminate();
    // Probe the follower like a kubelet until it has taken over and synced.
    let deadline = Instant::now() + SYNC_BOUND;
    let (mut probes, mut unready) = (0, 0);
    loop {
        probes += 1;
        if readyz(second.admin).await != Some(200) {
            unready += 1;
        }
        if wait_for_message(&second.lines, "Caches synced", Duration::from_millis(50)).is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "second never took over the lease"
        );
    }
    assert_eq!(
        unready, 0,
        "{unready} of {probes} probes failed during the hand-off"
    );
    assert_eq!(gauge(second.admin, "myapp_leader").await, Some(1));
    assert_eq!(cluster.refused_replica_requests(), Vec::<String>::new());
    // The request log tells the replicas apart by their tokens: both renewed the Lease.
    let lease_writers: std::collections::BTreeSet<String> = cluster
        .sandbox
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.resource.as_deref() == Some("leases") && r.verb == "update")
        .filter_map(|r| r.token_id)
        .collect();
    assert_eq!(
        lease_writers,
        ["replica-0", "replica-1"].map(String::from).into()
    );

    // An edit after the hand-off: the new leader writes it. Every write but the Lease's, in
    // the order the API server saw them, comes from one replica and then only the other.
    let apps = Api::<MyApp>::namespaced(cluster.client(), "default");
    apps.patch(
        "app-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "ghcr.io/example/web:1.4.3"}})),
    )
    .await
    .unwrap();
    let is_write = |r: &kube_sandbox::RequestRecord| {
        !matches!(r.verb.as_str(), "get" | "list" | "watch")
            && r.resource.as_deref() != Some("leases")
            && r.token_id
                .as_deref()
                .is_some_and(|t| t.starts_with("replica-"))
    };
    let deadline = Instant::now() + SYNC_BOUND;
    while !cluster
        .sandbox
        .faults()
        .requests()
        .iter()
        .any(|r| is_write(r) && r.token_id.as_deref() == Some("replica-1"))
    {
        assert!(
            Instant::now() < deadline,
            "the new leader never wrote the edit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let writers: Vec<String> = cluster
        .sandbox
        .faults()
        .requests()
        .into_iter()
        .filter(is_write)
        .filter_map(|r| r.token_id)
        .collect();
    let mut runs = writers.clone();
    runs.dedup();
    assert_eq!(
        runs,
        ["replica-0", "replica-1"].map(String::from),
        "one writer at a time: {writers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_serving_certificate_stops_the_start_naming_the_file_and_its_not_after() {
    let cluster = Cluster::start(true).await;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 6, 30);
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(cluster.certs.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(cluster.certs.join("tls.key"), key.serialize_pem()).unwrap();
    let mut child = Reap(
        operator_run(&cluster.admin_kubeconfig())
            .arg("--cert-dir")
            .arg(&cluster.certs)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = exits_within(
        &mut child,
        Duration::from_secs(30),
        "still running 30 s after start: the expired pair was served",
    )
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("tls.crt") && stderr.contains("to 2021-06-30T00:00:00Z"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_serving_an_expired_pair_is_live_but_not_ready_until_the_renewal_lands() {
    let cluster = Cluster::start(true).await;
    // Expired a minute ago: within the clock skew the loader allows, so the process starts
    // and waits for the renewal; but the API server refuses the pair, so no Service may
    // route to it.
    let certs = cluster.dir.path().join("renewal-failed");
    cluster.write_pair_valid(&certs, -3600, -60);
    let replica = cluster.replica_serving(&["--leader-elect=false"], &certs);
    assert_eq!(readyz(replica.admin).await, Some(503));
    let body = get_text(replica.admin, "/readyz").await.unwrap();
    assert!(
        body.starts_with("not ready: serving certificate expired (notAfter 20"),
        "{body}"
    );
    assert_eq!(status_of(replica.admin, "/livez").await, Some(200));

    // The renewed pair lands in the Secret's directory: ready again, with no restart.
    cluster.bundle.write_to(&certs).unwrap();
    eventually("ready once the renewed pair is served", || async {
        (readyz(replica.admin).await == Some(200)).then_some(())
    })
    .await;
    assert!(replica.logged("Reloaded serving certificate", Duration::from_secs(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_cuts_the_drain_short_and_exits_non_zero() {
    let cluster = Cluster::start(true).await;
    let mut replica = cluster.replica(&["--leader-elect=false", "--drain-delay", "60s"]);
    replica.terminate();
    assert!(
        replica.logged("Shutting down: readiness off, draining webhook", SYNC_BOUND),
        "the first signal starts the drain"
    );
    replica.terminate();
    let status = exits_within(
        &mut replica.process,
        Duration::from_secs(10),
        "still draining after the second signal",
    )
    .await;
    assert_eq!(status.code(), Some(1), "a forced exit is not a clean one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_admin_request_does_not_hold_the_exit_after_sigterm() {
    let cluster = Cluster::start(true).await;
    let mut replica = cluster.replica(&["--leader-elect=false", "--drain-delay", "0s"]);
    let mut half = TcpStream::connect(replica.admin).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut half, b"GET /readyz HTTP/1.1\r\nHost: a")
        .await
        .unwrap();
    replica.terminate();
    // Well inside the admin header timeout (5 s): the shutdown grace (1 s) ends it.
    let status = exits_within(
        &mut replica.process,
        Duration::from_secs(4),
        "a half-sent request holds the exit",
    )
    .await;
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_are_capped_and_timed_out_so_probes_keep_working() {
    use myapp_operator::admin::{HEADER_TIMEOUT, MAX_CONNECTIONS};
    let cluster = Cluster::start(true).await;
    let replica = cluster.replica(&["--leader-elect=false"]);
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(TcpStream::connect(replica.admin).await.unwrap());
    }
    // Every slot is held: one more connection is closed without an answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut extra = TcpStream::connect(replica.admin).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::io::AsyncReadExt::read(&mut extra, &mut byte),
        )
        .await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "connections beyond the cap are refused"
        );
    }
    // The header timeout frees the slots; a probe gets its answer again.
    let deadline = Instant::now() + HEADER_TIMEOUT + Duration::from_secs(10);
    while readyz(replica.admin).await != Some(200) {
        assert!(Instant::now() < deadline, "probes never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut closed = 0;
    for mut stream in idle {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::io::AsyncReadExt::read(&mut stream, &mut byte),
        )
        .await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, MAX_CONNECTIONS, "every idle connection was closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_logs_into_a_pipe_carry_no_colour_codes() {
    let cluster = Cluster::start(true).await;
    let output = tokio::task::spawn_blocking({
        let kubeconfig = cluster.admin_kubeconfig();
        move || {
            operator_run(&kubeconfig)
                .args(["--log-format", "plain", "--cert-dir", "/nonexistent-certs"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Admin server listening"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

#[test]
fn certs_writes_a_private_key_with_the_validity_asked_and_never_overwrites_by_accident() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("certs");
    let certs = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
            .args([
                "certs",
                "--cert-days",
                "7",
                "--ca-days",
                "30",
                "--san",
                "localhost",
            ])
            .arg("--out")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let first = certs(&[]);
    assert!(first.status.success(), "{first:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.join("tls.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let store = webhook::tls::CertStore::load(
        webhook::tls::CertPaths::in_dir(&out),
        webhook::Metrics::new(),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let days_left = (store.not_after() - now) as f64 / 86_400.0;
    assert!((6.0..=7.0).contains(&days_left), "{days_left} days left");

    let again = certs(&[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ca.crt exists already; pass --force"),
        "{stderr}"
    );
    assert!(certs(&["--force"]).status.success());
}
