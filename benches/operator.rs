//! Load benchmark of the real operator binary against a kube-sandbox served on loopback.
//!
//! `cargo bench --bench operator -- [APPS] [CONCURRENCY]` (defaults 1000 and 4). Reports: time to
//! a webhook answer after process start, idle RSS, create and convergence times for APPS
//! MyApps, the operator's writes per MyApp and its peak requests in flight, RSS with everything
//! cached, writes during a forced resync, time, RSS and writes of a forced relist of every
//! watch, and the rate of a no-op loader issuing the same writes through the same sandbox.
//! Numbers are printed, never asserted. Set `MYAPP_BENCH_WRAPPER` to run the operator under a
//! profiler (`heaptrack -o /tmp/operator`).

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::{
    Api, Client, CustomResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use kube_sandbox::testing::{Reap, log_lines, wait_for_addr};
use myapp_operator::{crd::MyApp, resources};
use serde_json::json;

/// A `VmRSS`-style line of /proc/<pid>/status in KiB (`VmRSS`, `RssAnon`, `RssFile`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resident memory in MiB, with its anonymous (heap, stacks) and file-backed (the binary's
/// pages) parts.
fn rss(pid: u32) -> String {
    let mib = |field| status_kib(pid, field) as f64 / 1024.0;
    format!(
        "{:.1} MiB ({:.1} MiB anonymous, {:.1} MiB file-backed)",
        mib("VmRSS"),
        mib("RssAnon"),
        mib("RssFile")
    )
}

fn app(i: usize) -> MyApp {
    MyApp::test(&format!("app-{i}"))
}

async fn converged(client: &Client, namespace: &str, apps: usize) -> bool {
    let lp = ListParams::default();
    let Ok(list) = Api::<MyApp>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
    else {
        return false;
    };
    let done = list
        .items
        .iter()
        .filter(|a| {
            a.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == a.metadata.generation)
        })
        .count();
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace)
        .list_metadata(&lp)
        .await
        .map_or(0, |l| l.items.len());
    let services = Api::<Service>::namespaced(client.clone(), namespace)
        .list_metadata(&lp)
        .await
        .map_or(0, |l| l.items.len());
    done == apps && deployments == apps && services == apps
}

fn operator_writes(sandbox: &kube_sandbox::Sandbox) -> usize {
    sandbox
        .faults()
        .requests()
        .iter()
        .filter(|r| r.field_manager.as_deref() == Some(resources::FIELD_MANAGER) && r.verb != "get")
        .count()
}

/// Whether each of the `watched` resources has been restarted by a list since the requests
/// were cleared: its first watch gets 410, it lists, and its second watch resumes the stream.
fn relisted(
    sandbox: &kube_sandbox::Sandbox,
    agent: &str,
    watched: &std::collections::BTreeSet<String>,
) -> bool {
    let mut watches = std::collections::HashMap::<String, usize>::new();
    for r in sandbox.faults().requests() {
        if r.user_agent.as_deref() == Some(agent) && r.verb == "watch" {
            *watches.entry(r.resource.unwrap_or_default()).or_default() += 1;
        }
    }
    watched
        .iter()
        .all(|resource| watches.get(resource).is_some_and(|&n| n >= 2))
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let apps = args.first().copied().unwrap_or(1000);
    let concurrency = args.get(1).copied().unwrap_or(4);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(apps, concurrency));
}

async fn bench(apps: usize, concurrency: usize) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let sandbox = kube_sandbox::Sandbox::builder()
        .namespace("load")
        .namespace("baseline")
        .rollout_delay(Duration::from_millis(10))
        .event_log_capacity(200_000)
        .build();
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    std::fs::write(dir.path().join("kubeconfig"), served.kubeconfig()).unwrap();
    let client = Client::new(sandbox.router(), "default");
    let crd = MyApp::crd();
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone())
        .patch("myapps.example.com", &PatchParams::apply("bench"), &Patch::Apply(&crd))
        .await
        .unwrap();
    let bundle = myapp_operator::certs::generate(&["localhost".to_owned()]).unwrap();
    bundle.write_to(&dir.path().join("certs")).unwrap();
    let tls = kube_sandbox::testing::tls_client_trusting(&bundle.ca_pem);

    let started = Instant::now();
    // MYAPP_BENCH_WRAPPER runs the operator under a profiler, e.g. `heaptrack -o /tmp/op`
    // (the RSS figures then measure the wrapper, not the operator).
    let wrapper = std::env::var("MYAPP_BENCH_WRAPPER").unwrap_or_default();
    let mut command: Vec<&str> = wrapper.split_whitespace().collect();
    command.push(env!("CARGO_BIN_EXE_myapp-operator"));
    let mut child = Command::new(command[0])
        .args(&command[1..])
        .args([
            "run",
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--leader-elect=false",
        ])
        .args([
            "--log-format",
            "json",
            "--log-level",
            "info,myapp_operator::controller=warn",
            "--resync",
            "10s",
        ])
        .args(["--concurrency", &concurrency.to_string()])
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .env("KUBECONFIG", dir.path().join("kubeconfig"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = log_lines(&mut child);
    let child = Reap(child);
    let pid = child.0.id();
    let webhook = wait_for_addr(&lines, "Webhook serving");
    let serving = started.elapsed();
    std::thread::spawn(move || lines.into_iter().for_each(drop));
    let first_answer = first_webhook_answer(webhook, started, Arc::new(tls)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = rss(pid);

    let agent = myapp_operator::run::USER_AGENT;
    // The resources the operator watches (one watch each, unless one restarted already).
    let watched: std::collections::BTreeSet<String> = sandbox
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.user_agent.as_deref() == Some(agent) && r.verb == "watch")
        .filter_map(|r| r.resource)
        .collect();
    let watches = watched.len();
    sandbox.faults().clear_requests();
    let load = Api::<MyApp>::namespaced(client.clone(), "load");
    let create_start = Instant::now();
    stream::iter(0..apps)
        .for_each_concurrent(32, |i| {
            let load = load.clone();
            async move {
                let created = load.create(&PostParams::default(), &app(i)).await;
                created.unwrap_or_else(|e| panic!("creating MyApp load/app-{i}: {e}"));
            }
        })
        .await;
    let created = create_start.elapsed();
    // Each check lists every object; poll less often for big runs so the poller does not
    // starve the operator of the two cores.
    let poll = Duration::from_millis((apps as u64 / 10).max(50));
    while !converged(&client, "load", apps).await {
        tokio::time::sleep(poll).await;
    }
    let converged_after = create_start.elapsed();
    let writes = operator_writes(&sandbox);
    let peak_in_flight = sandbox.faults().peak_in_flight(agent);
    let loaded_rss = rss(pid);

    sandbox.faults().clear_requests();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let resync_writes = operator_writes(&sandbox);

    // A relist of every watch, as after an API server restart: each resumes, gets 410 Gone and
    // lists again (the reflector holds a second copy of its cache until the list is done), and
    // every MyApp is reconciled once more.
    sandbox.faults().clear_requests();
    for _ in 0..watches {
        sandbox.faults().expire_next_watch();
    }
    sandbox.faults().close_watches();
    let relist_start = Instant::now();
    while !relisted(&sandbox, agent, &watched) {
        assert!(
            relist_start.elapsed() < Duration::from_secs(120),
            "the operator did not list and watch {watched:?} again within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let relisted_after = relist_start.elapsed();
    let rss_when_relisted = rss(pid);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let relist_writes = operator_writes(&sandbox);
    let relisted_rss = rss(pid);

    // Baseline: the same three writes per MyApp, issued directly with the same concurrency.
    let baseline = Api::<MyApp>::namespaced(client.clone(), "baseline");
    stream::iter(0..apps)
        .for_each_concurrent(32, |i| {
            let baseline = baseline.clone();
            async move {
                let created = baseline.create(&PostParams::default(), &app(i)).await;
                created.unwrap_or_else(|e| panic!("creating MyApp baseline/app-{i}: {e}"));
            }
        })
        .await;
    let baseline_apps: Vec<Arc<MyApp>> = baseline
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let apply = PatchParams::apply("baseline-loader").force();
    let loader_start = Instant::now();
    stream::iter(baseline_apps)
        .for_each_concurrent(concurrency, |a| {
            let (client, apply) = (client.clone(), apply.clone());
            async move {
                let name = a.metadata.name.clone().unwrap();
                Api::<Deployment>::namespaced(client.clone(), "baseline")
                    .patch(&name, &apply, &Patch::Apply(resources::deployment(&a)))
                    .await
                    .unwrap_or_else(|e| panic!("loader: applying Deployment {name}: {e}"));
                Api::<Service>::namespaced(client.clone(), "baseline")
                    .patch(&name, &apply, &Patch::Apply(resources::service(&a)))
                    .await
                    .unwrap_or_else(|e| panic!("loader: applying Service {name}: {e}"));
                let status = json!({"apiVersion": "example.com/v1", "kind": "MyApp",
                                    "status": myapp_operator::status::status(&a, None, k8s_openapi::jiff::Timestamp::now())});
                Api::<MyApp>::namespaced(client, "baseline")
                    .patch_status(&name, &apply, &Patch::Apply(&status))
                    .await
                    .unwrap_or_else(|e| panic!("loader: applying status {name}: {e}"));
            }
        })
        .await;
    let loader = loader_start.elapsed();

    let operator_rate = apps as f64 / converged_after.as_secs_f64();
    let loader_rate = apps as f64 / loader.as_secs_f64();
    println!("apps={apps} concurrency={concurrency}");
    println!(
        "webhook serving (log line) after start: {serving:?}; first webhook answer after start: {first_answer:?}"
    );
    println!("idle RSS: {idle_rss}");
    println!(
        "created {apps} MyApps in {created:?}; all converged {converged_after:?} after the first create ({:?} after the last)",
        converged_after.saturating_sub(created)
    );
    println!(
        "operator writes: {writes} ({:.2} per MyApp)",
        writes as f64 / apps as f64
    );
    println!("RSS with {apps} MyApps + children cached: {loaded_rss}");
    println!(
        "operator requests in flight at once (watches excepted): at most {peak_in_flight}; watches open: {watches}"
    );
    println!("writes during a forced resync of every object: {resync_writes}");
    println!(
        "forced relist of every watch: done after {relisted_after:?}, RSS then {rss_when_relisted}; 5 s later {relisted_rss}; writes {relist_writes}"
    );
    println!(
        "no-op loader (same writes, same concurrency): {loader:?} = {loader_rate:.0} apps/s; operator {operator_rate:.0} apps/s = {:.2}x",
        operator_rate / loader_rate
    );
    drop(child);
    served.shutdown().await.unwrap();
}

/// Time from process start to the first answered webhook request.
async fn first_webhook_answer(
    addr: SocketAddr,
    started: Instant,
    tls: Arc<rustls::ClientConfig>,
) -> Duration {
    let stream = loop {
        if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
            break s;
        }
    };
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, stream)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::post("/validate-myapp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let _ = sender.send_request(request).await.unwrap();
    started.elapsed()
}
