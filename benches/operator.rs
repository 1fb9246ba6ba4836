//! Load benchmark of the operator binary the image ships, against a kube-sandbox served on
//! loopback.
//!
//! `cargo bench --bench operator -- [APPS] [CONCURRENCY]` (defaults 1000 and 4). Reports: time to
//! the first admitted review after process start, idle RSS, create and convergence times for APPS
//! MyApps, the operator's object writes, Events, reads and reconciles per MyApp and its peak
//! requests in flight, RSS with everything cached, its requests during a resync of every MyApp,
//! time, RSS peak and requests of a forced relist of every watch, edits during rollouts (every
//! MyApp's image edited twice, the second time while the first edit's rollout runs: time to
//! converge, the operator's requests, its writes the sandbox refused, 409 Conflict apart, per 1,000
//! edits, and its CPU), and the rate of a no-op loader making the same creates and writes through
//! the same sandbox, alone (the operator is stopped by then), its writes over HTTPS as the
//! operator's, timed like the operator from the first create; for both runs, the CPU per MyApp of
//! each process and how the machine spent its time (busy, idle, stolen by the hypervisor), since on
//! a shared machine both rates stand as the CPU each run costs. Convergence is read from the
//! sandbox's store in memory, not through its API, so checking it costs the machine little. Numbers
//! are printed, never asserted; a figure the bench cannot attribute to the operator (see
//! `operator/requests.rs`) or a wait that passes its deadline fails the bench with a message
//! instead.
//!
//! Environment: `MYAPP_BENCH_OPERATOR` (the binary to measure; default: built now with
//! `--release --no-default-features` into `<target>/bench-operator`), `MYAPP_BENCH_WRAPPER` (a
//! command prefix, e.g. a profiler: `heaptrack -o /tmp/operator`), `MYAPP_BENCH_USER_AGENT`
//! (the operator's user agent; default `myapp_operator::run::USER_AGENT`), `MYAPP_BENCH_THREADS`
//! (worker threads of the bench's runtime, which serves the sandbox; default CONCURRENCY + 2),
//! `MYAPP_BENCH_ROLLOUT_MS` (how long the sandbox's simulated rollout of a new Deployment
//! template takes; default 1500, longer than a second as in a cluster, so the operator's
//! writes while a rollout runs are counted as a cluster would draw them),
//! `MYAPP_BENCH_OPERATOR_ARGS` (more flags for `run`, split at whitespace, e.g.
//! `--list-page-size 500`), `MYAPP_BENCH_UNTIL=relist` (stop after the relist, whose headline
//! is the last `[bench]` line: the edits and the loader hold more of the sandbox's memory than
//! this machine has at 100,000 MyApps).

#[path = "operator/common.rs"]
mod common;
#[path = "operator/edits.rs"]
mod edits;
#[path = "operator/probe.rs"]
mod probe;
#[path = "operator/requests.rs"]
mod requests;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    process::{Command, ExitCode, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use common::{Outcome, cpu_seconds, progress, serve_with_crd, status_kib, wait_until};
use futures::{StreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::{
    Api, Client, Resource as _,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use kube_sandbox::testing::{Reap, log_lines, wait_for_addr};
use myapp_operator::{crd::MyApp, resources, run::USER_AGENT};
use serde_json::json;

/// A client of the sandbox as served: HTTPS to its address, authenticated as `kubeconfig` says,
/// as an out-of-process client (the operator) reaches it.
async fn served_client(kubeconfig: &str) -> Outcome<Client> {
    kube_sandbox::client_for(kubeconfig)
        .await
        .map_err(|e| format!("a client of the served sandbox: {e}"))
}

/// The machine's clock ticks so far, summed over its cores (the first line of /proc/stat): busy,
/// idle (waiting for I/O included) and stolen by the hypervisor for other guests.
#[derive(Clone, Copy)]
struct Ticks {
    busy: u64,
    idle: u64,
    steal: u64,
}

impl Ticks {
    fn now() -> Outcome<Self> {
        let stat = std::fs::read_to_string("/proc/stat")
            .map_err(|e| format!("reading /proc/stat for the machine's CPU time: {e}"))?;
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("cpu "))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|f| f.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        // user nice system idle iowait irq softirq steal (guest time is counted in user).
        let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields[..] else {
            return Err(format!("/proc/stat has no 8-field cpu line: {stat:.200}"));
        };
        Ok(Self {
            busy: user + nice + system + irq + softirq,
            idle: idle + iowait,
            steal,
        })
    }

    /// How the machine spent the time since `before`, in percent of it.
    fn since(self, before: Self) -> String {
        let (busy, idle, steal) = (
            self.busy - before.busy,
            self.idle - before.idle,
            self.steal - before.steal,
        );
        let total = (busy + idle + steal).max(1) as f64 / 100.0;
        format!(
            "busy {:.0} %, idle {:.0} %, stolen by the hypervisor {:.0} %",
            busy as f64 / total,
            idle as f64 / total,
            steal as f64 / total
        )
    }
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

fn name(i: usize) -> String {
    format!("app-{i}")
}

fn app(i: usize) -> MyApp {
    MyApp::test(&name(i))
}

/// How many of the bench's creates (and edits) are in flight at once.
const AT_ONCE: usize = 32;

/// Creates `apps` MyApps in `namespace`, [`AT_ONCE`] at a time, and hands each to `created`.
///
/// Each create is a task of its own. The bench's client calls the sandbox in process, and a
/// request is served by the task that awaits it: awaited in place, every create (and every
/// loader write) ran on the bench's main thread, and the loader used one core of two while
/// the operator's requests were served on every worker.
async fn create_all<F>(client: &Client, namespace: &'static str, apps: usize, created: F)
where
    F: Fn(MyApp) + Clone + Send + 'static,
{
    let api = Api::<MyApp>::namespaced(client.clone(), namespace);
    stream::iter(0..apps)
        .for_each_concurrent(AT_ONCE, |i| {
            let (api, created) = (api.clone(), created.clone());
            let create = tokio::spawn(async move {
                match api.create(&PostParams::default(), &app(i)).await {
                    Ok(app) => created(app),
                    Err(e) => panic!("creating MyApp {namespace}/app-{i}: {e}"),
                }
            });
            async move { create.await.expect("a create task panicked") }
        })
        .await;
}

/// Waits until the operator has finished `more` reconciles after `from` (by its own counter).
/// Every look is a scrape the operator pays for, counted apart by [`ScrapeCost`]; five a
/// second keep that small beside a resync, whose duration the bench does not report.
async fn reconciled(admin: SocketAddr, from: u64, more: usize, what: &str) -> Outcome<()> {
    wait_until(
        what,
        deadline(more),
        Duration::from_millis(200),
        move || async move {
            match probe::reconciles(admin).await {
                Ok(n) if n >= from + more as u64 => None,
                Ok(n) => Some(format!("{} of {more} reconciles", n - from.min(n))),
                Err(e) => Some(e),
            }
        },
    )
    .await
}

/// The operator's CPU for one scrape of its metrics by the bench, measured at rest: what the
/// bench's own looks cost it, taken out of the CPU a resync or relist is reported with.
#[derive(Clone, Copy)]
struct ScrapeCost {
    seconds: f64,
}

impl ScrapeCost {
    /// Enough scrapes for the cost to stand well above the 10 ms tick of `/proc/<pid>/stat`.
    const SAMPLES: u32 = 200;

    async fn measure(admin: SocketAddr, pid: u32) -> Outcome<Self> {
        let before = cpu_seconds(pid)?;
        for _ in 0..Self::SAMPLES {
            probe::reconciles(admin).await?;
        }
        let spent = cpu_seconds(pid)? - before;
        if spent <= 0.0 {
            return Err(format!(
                "{} scrapes of the operator's metrics cost it no CPU by /proc/{pid}/stat: the \
                 bench cannot take them out of what it reports",
                Self::SAMPLES
            ));
        }
        Ok(Self {
            seconds: spent / f64::from(Self::SAMPLES),
        })
    }

    /// The operator's CPU `cpu` over a step in which the bench scraped `scrapes` times: the
    /// step's own, and the scrapes' share.
    fn split(self, cpu: f64, scrapes: u64) -> (f64, f64) {
        let scraped = self.seconds * scrapes as f64;
        (cpu - scraped, scraped)
    }
}

/// How long a step over `apps` MyApps may take before the bench gives up on it: 2 minutes, or
/// 20 ms per MyApp (far slower than any run measured) for big runs.
fn deadline(apps: usize) -> Duration {
    Duration::from_secs(120).max(Duration::from_millis(apps as u64 * 20))
}

fn main() -> ExitCode {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let apps = args.first().copied().unwrap_or(1000);
    let concurrency = args
        .get(1)
        .copied()
        .unwrap_or(usize::from(myapp_operator::controller::DEFAULT_CONCURRENCY));
    // The sandbox serves a request on one worker of this runtime from start to end without
    // yielding (its store is behind a plain mutex), so it holds at most one request in flight
    // per worker: with one worker per core (2 here) the operator never showed more than 2 in
    // flight at a concurrency of 4. Enough workers for the operator's concurrency and the bench's
    // own polling let the count show the operator's concurrency, not the sandbox's threads.
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let threads = std::env::var("MYAPP_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or((concurrency + 2).max(cores));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    eprintln!("bench runtime (sandbox, poller, loader): {threads} worker threads");
    match runtime.block_on(bench(apps, concurrency)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("operator bench failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(apps: usize, concurrency: usize) -> Outcome<()> {
    let binary = probe::operator_binary()?;
    let agent = std::env::var("MYAPP_BENCH_USER_AGENT").unwrap_or_else(|_| USER_AGENT.into());
    let rollout = Duration::from_millis(
        std::env::var("MYAPP_BENCH_ROLLOUT_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(1500),
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    // The bench reads the sandbox's request counts, never its (truncating) request log.
    let sandbox = kube_sandbox::Sandbox::builder()
        .namespace("load")
        .namespace("baseline")
        .rollout_delay(rollout)
        // Status only: thousands of simulated Pods would slow every list and watch measured.
        .simulate_pods(false)
        // A watch history bounded by count only, as the API server's watch caches are, and
        // long enough for a relist of every MyApp's children while they are written (about 8
        // events per MyApp). Bounded by bytes as well (the sandbox's default), a large run would
        // outgrow it: watches would fall behind (410 "too old resource version") and continue
        // tokens expire in the middle of a relist, which would then never finish.
        .event_log_capacity((apps * 10).max(200_000))
        .event_log_bytes(usize::MAX)
        .request_log_capacity(1_000)
        // As `dev` and a cluster are reached: HTTPS, and a bearer token checked on every
        // request, so the operator's cost includes TLS.
        .authentication()
        .build();
    let (served, client) = serve_with_crd(&sandbox, &dir.path().join("kubeconfig")).await;
    let bundle = myapp_operator::certs::generate(&["localhost".to_owned()]).unwrap();
    bundle.write_to(&dir.path().join("certs")).unwrap();
    let tls = kube_sandbox::testing::tls_client_trusting(&bundle.ca_pem);

    // MYAPP_BENCH_WRAPPER runs the operator under a profiler, e.g. `heaptrack -o /tmp/op`; RSS
    // and CPU are then read from the operator's own process, found under the wrapper.
    let wrapper = std::env::var("MYAPP_BENCH_WRAPPER").unwrap_or_default();
    let extra_args = std::env::var("MYAPP_BENCH_OPERATOR_ARGS").unwrap_or_default();
    // Short, so that the resync below is measured soon, but at least 2 ms per MyApp: with
    // 100,000 MyApps a 10 s resync asked for 10,000 reconciles a second, and the operator spent
    // the run on resyncs (2.7 million reconciles in 13 minutes) instead of converging.
    let resync = Duration::from_secs(10).max(Duration::from_millis(apps as u64 * 2));
    let mut command: Vec<&std::ffi::OsStr> = wrapper
        .split_whitespace()
        .map(std::ffi::OsStr::new)
        .collect();
    command.push(binary.as_os_str());
    let started = Instant::now();
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
            &format!("{}s", resync.as_secs()),
        ])
        .args(["--concurrency", &concurrency.to_string()])
        .args(extra_args.split_whitespace())
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .env("KUBECONFIG", dir.path().join("kubeconfig"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let lines = log_lines(&mut child);
    let child = Reap(child);
    let admin = wait_for_addr(&lines, "Admin server listening");
    let pid = if wrapper.is_empty() {
        child.0.id()
    } else {
        probe::operator_under(child.0.id(), &binary)?
    };
    let webhook = wait_for_addr(&lines, "Webhook serving");
    let serving = started.elapsed();
    std::thread::spawn(move || lines.into_iter().for_each(drop));
    let first_review =
        probe::first_admitted_review(webhook, started, Duration::from_secs(60), Arc::new(tls))
            .await?;
    wait_until(
        "the operator's watch caches synced",
        Duration::from_secs(60),
        Duration::from_millis(20),
        move || async move {
            match probe::caches_synced(admin).await {
                Ok(true) => None,
                Ok(false) => Some("myapp_caches_synced is not 1".into()),
                Err(e) => Some(e),
            }
        },
    )
    .await?;
    // The resources the operator watches: every resource it listed. Not only those with a
    // watch counted yet: the caches report synced once their lists are in, and the watch that
    // follows a list may not have reached the sandbox by then; a resource left out here got no
    // 410 in the relist step below, and the bench failed (2 runs of 6 at 1 and 300 MyApps).
    let watched: BTreeSet<String> = requests::watches_and_lists(&sandbox, &agent)
        .into_iter()
        .filter(|(_, (watches, lists))| *watches > 0 || *lists > 0)
        .map(|(resource, _)| resource)
        .collect();
    if watched.is_empty() {
        return Err(requests::unattributed(
            &sandbox,
            &agent,
            "the watches that fill its caches",
        ));
    }
    let watches = watched.len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = rss(pid);
    let idle_kib = status_kib(pid, "VmRSS");
    let scrape_cost = ScrapeCost::measure(admin, pid).await?;

    sandbox.faults().clear_requests();
    let cpu_idle = cpu_seconds(pid)?;
    let (machine_idle, bench_idle) = (Ticks::now()?, cpu_seconds(std::process::id())?);
    let reconciles_idle = probe::reconciles(admin).await?;
    let mut observed = probe::Observed::start(&sandbox, "load", (0..apps).map(name));
    let create_start = Instant::now();
    create_all(&client, "load", apps, drop).await;
    let created = create_start.elapsed();
    let poll = Duration::from_millis(50);
    wait_until("convergence of every MyApp", deadline(apps), poll, || {
        std::future::ready(observed.unconverged())
    })
    .await
    .map_err(|e| format!("{e} ({} of {apps} not converged)", observed.waiting()))?;
    let converged_after = create_start.elapsed();
    let machine_converging = Ticks::now()?.since(machine_idle);
    let bench_converging = cpu_seconds(std::process::id())? - bench_idle;
    let reconciles_converging = probe::reconciles(admin).await? - reconciles_idle;
    let converging = requests::of(&sandbox, &agent);
    let peak_in_flight = sandbox.faults().peak_in_flight(&agent);
    if converging.object_writes() == 0 {
        let what = format!("the writes that converged {apps} MyApps");
        return Err(requests::unattributed(&sandbox, &agent, &what));
    }
    if peak_in_flight == 0 {
        return Err(requests::unattributed(
            &sandbox,
            &agent,
            "its requests in flight",
        ));
    }
    let others = requests::others_writes(&sandbox, &agent);
    if others > 0 {
        return Err(format!(
            "{others} writes of Deployments, Services, MyApp status or Events came from user \
             agents other than {agent:?}, so the operator's count is incomplete. Requests by \
             user agent: {}. How: {}",
            requests::seen_agents(&sandbox),
            requests::HOW
        ));
    }
    let loaded_rss = rss(pid);
    let loaded_kib = status_kib(pid, "VmRSS");
    let cpu_converging = cpu_seconds(pid)? - cpu_idle;
    progress(&format!(
        "converged {converged_after:?} after the first create ({:?} after the last); operator \
         CPU {:.3} ms per MyApp, the bench's process {:.3}, the machine {machine_converging}; \
         RSS {loaded_rss}; reconcile errors {}",
        converged_after.saturating_sub(created),
        cpu_converging * 1000.0 / apps as f64,
        bench_converging * 1000.0 / apps as f64,
        probe::reconcile_errors(admin).await?
    ));

    // A resync: each MyApp's point of the resync period comes and it is reconciled again.
    sandbox.faults().clear_requests();
    let mark = probe::reconciles(admin).await?;
    let (cpu_before, scrapes_before) = (cpu_seconds(pid)?, probe::scrapes());
    reconciled(admin, mark, apps, "a resync of every MyApp").await?;
    let resync = requests::of(&sandbox, &agent);
    let (cpu_resync, resync_scraped) = scrape_cost.split(
        cpu_seconds(pid)? - cpu_before,
        probe::scrapes() - scrapes_before,
    );
    progress(&format!(
        "resync: operator CPU {:.3} ms per MyApp",
        cpu_resync * 1000.0 / apps as f64
    ));

    // A relist of every watch, as after an API server restart: each resumes, gets 410 Gone and
    // lists again (the reflector holds a second copy of its cache until the list is done), and
    // every MyApp is reconciled once more.
    sandbox.faults().clear_requests();
    let mark = probe::reconciles(admin).await?;
    for _ in 0..watches {
        sandbox.faults().expire_next_watch();
    }
    sandbox.faults().close_watches();
    let relist_start = Instant::now();
    let (cpu_before, scrapes_before) = (cpu_seconds(pid)?, probe::scrapes());
    let peak_kib = std::cell::Cell::new(0);
    wait_until(
        "a relist of every watch",
        deadline(apps),
        Duration::from_millis(20),
        || {
            peak_kib.set(peak_kib.get().max(status_kib(pid, "VmRSS")));
            let seen = requests::watches_and_lists(&sandbox, &agent);
            let done = watched.iter().all(|resource| {
                seen.get(resource)
                    .is_some_and(|&(watches, lists)| watches >= 2 && lists >= 1)
            });
            let missing = format!(
                "watches and lists by {agent:?} per resource: {seen:?}; each of {watched:?} \
                 needs a watch that gets 410, a list and a new watch. How: {}",
                requests::HOW
            );
            std::future::ready((!done).then_some(missing))
        },
    )
    .await?;
    let relisted_after = relist_start.elapsed();
    reconciled(admin, mark, apps, "every MyApp reconciled after the relist").await?;
    let relist = requests::of(&sandbox, &agent);
    let relisted_rss = rss(pid);
    let (cpu_relist, relist_scraped) = scrape_cost.split(
        cpu_seconds(pid)? - cpu_before,
        probe::scrapes() - scrapes_before,
    );
    let errors_by_relist = probe::reconcile_errors(admin).await?;
    progress(&format!(
        "relist: {relisted_after:?}, RSS peak {:.1} MiB, operator CPU {:.3} ms per MyApp; \
         reconcile errors {errors_by_relist}",
        peak_kib.get() as f64 / 1024.0,
        cpu_relist * 1000.0 / apps as f64,
    ));
    if std::env::var("MYAPP_BENCH_UNTIL").as_deref() == Ok("relist") {
        eprintln!(
            "stopped after the relist (MYAPP_BENCH_UNTIL=relist): the lines above are the run"
        );
        drop(child);
        served.shutdown().await.unwrap();
        return Ok(());
    }

    // Edits during rollouts: every MyApp's image edited, then edited again while the rollout of
    // the first edit runs (see `operator/edits.rs`), until every MyApp converged on the last.
    // Refused writes are counted by the sandbox's answers, not the operator's metrics.
    sandbox.faults().clear_requests();
    let cpu_before = cpu_seconds(pid)?;
    let names: Vec<String> = (0..apps).map(name).collect();
    let edits_start = Instant::now();
    let rolling =
        edits::during_rollouts(&client, &sandbox, "load", &names, AT_ONCE, deadline(apps)).await?;
    let mut observed = probe::Observed::start(&sandbox, "load", names);
    let what = format!("convergence of every MyApp on {}", edits::IMAGES[1]);
    wait_until(&what, deadline(apps), poll, || {
        std::future::ready(observed.unconverged())
    })
    .await
    .map_err(|e| format!("{e} ({} of {apps} not converged)", observed.waiting()))?;
    let edited_after = edits_start.elapsed();
    let cpu_edits = cpu_seconds(pid)? - cpu_before;
    progress(&format!(
        "edits: converged {edited_after:?} after the first edit"
    ));
    let edited = requests::of(&sandbox, &agent);
    let conflicts = requests::answered(&sandbox, &agent, |status| status == 409);
    let refused = requests::answered(&sandbox, &agent, |status| status >= 400 && status != 409);
    let refused_statuses = requests::refused_statuses(&sandbox, &agent, 409);
    if edited.object_writes() == 0 {
        let what = format!("the writes that converged {apps} edited MyApps");
        return Err(requests::unattributed(&sandbox, &agent, &what));
    }
    let others = requests::others_writes(&sandbox, &agent);
    if others > 0 {
        return Err(format!(
            "{others} writes of Deployments, Services, MyApp status or Events during the edits \
             came from user agents other than {agent:?}, so the operator's count is incomplete. \
             Requests by user agent: {}. How: {}",
            requests::seen_agents(&sandbox),
            requests::HOW
        ));
    }
    if rolling == 0 {
        return Err(format!(
            "edits during rollouts: none of the {apps} second edits found the first edit's \
             rollout running (the Deployment's status had observed its generation), so the \
             phase measured edits after rollouts; a longer MYAPP_BENCH_ROLLOUT_MS (now \
             {rollout:?}) keeps them running"
        ));
    }

    // The loader runs alone. A running operator would reconcile the baseline MyApps as well,
    // competing with the loader for the sandbox and writing their children before it.
    drop(child);

    // Baseline: a loader that makes the run's writes without deciding anything. Its MyApps are
    // created as the run's were (`create_all`), and each, once created, gets from
    // `concurrency` workers what a created MyApp gets from the operator: the two child applies,
    // a status write and an Event; not the second status write, which waits for the rollout.
    // It is timed as the operator is, from the first create to the last write: creates and
    // writes share the sandbox in both.
    //
    // The writes go the operator's way: over HTTPS to the served address, with the kubeconfig
    // the operator was given. The bench's own client calls the sandbox's router in process,
    // without TCP, TLS or HTTP; a loader on it was spared the transport every operator request
    // pays (both ends of it on this machine's cores), and the ratio compared the operator with
    // a path no client of an API server has. The creates stay in process, as in the run.
    let loader_client = served_client(&served.kubeconfig()).await?;
    let apply = PatchParams::apply("baseline-loader").force();
    let (created_tx, created_rx) = futures::channel::mpsc::unbounded::<MyApp>();
    let creator = client.clone();
    let create = async move {
        // The writers outlive the creates: the channel is open. `created_tx` goes when
        // `create_all` returns, which ends the writers' stream.
        create_all(&creator, "baseline", apps, move |created| {
            let _ = created_tx.unbounded_send(created);
        })
        .await;
    };
    let write = created_rx.for_each_concurrent(concurrency, |a| {
        let (client, apply) = (loader_client.clone(), apply.clone());
        // A task of its own, as each create: see `create_all`.
        let write = tokio::spawn(async move {
            let name = a.metadata.name.clone().unwrap();
            Api::<Deployment>::namespaced(client.clone(), "baseline")
                .patch(&name, &apply, &Patch::Apply(resources::deployment(&a, None)))
                .await
                .unwrap_or_else(|e| panic!("loader: applying Deployment {name}: {e}"));
            Api::<Service>::namespaced(client.clone(), "baseline")
                .patch(&name, &apply, &Patch::Apply(resources::service(&a, None)))
                .await
                .unwrap_or_else(|e| panic!("loader: applying Service {name}: {e}"));
            let status = json!({"apiVersion": "example.com/v1", "kind": "MyApp",
                                "status": myapp_operator::status::status(&a, None, None, k8s_openapi::jiff::Timestamp::now())});
            Api::<MyApp>::namespaced(client.clone(), "baseline")
                .patch_status(&name, &apply, &Patch::Apply(&status))
                .await
                .unwrap_or_else(|e| panic!("loader: applying status {name}: {e}"));
            let reporter = Reporter {
                controller: "baseline-loader".into(),
                instance: None,
            };
            let event = Event {
                type_: EventType::Normal,
                reason: "Loaded".into(),
                note: Some("The loader wrote the children and the status.".into()),
                action: "Load".into(),
                secondary: None,
            };
            Recorder::new(client, reporter)
                .publish(&event, &a.object_ref(&()))
                .await
                .unwrap_or_else(|e| panic!("loader: publishing an Event about {name}: {e}"));
        });
        async move { write.await.expect("a loader task panicked") }
    });
    let (machine_loader, bench_loader) = (Ticks::now()?, cpu_seconds(std::process::id())?);
    let loader_start = Instant::now();
    futures::join!(create, write);
    let loader = loader_start.elapsed();
    let machine_loader = Ticks::now()?.since(machine_loader);
    let bench_loader = cpu_seconds(std::process::id())? - bench_loader;

    let operator_rate = apps as f64 / converged_after.as_secs_f64();
    let loader_rate = apps as f64 / loader.as_secs_f64();
    let size = std::fs::metadata(&binary).map_or(0, |m| m.len());
    let per_app_ms = |cpu: f64| cpu * 1000.0 / apps as f64;
    println!(
        "apps={apps} concurrency={concurrency} simulated rollout={rollout:?} more flags={:?}",
        extra_args.trim()
    );
    println!(
        "binary: {} ({:.1} MB); requests attributed by User-Agent {agent:?}",
        binary.display(),
        size as f64 / 1e6
    );
    println!(
        "webhook serving (log line) after start: {serving:?}; first admitted review after start: {first_review:?}"
    );
    println!("idle RSS: {idle_rss}");
    println!(
        "created {apps} MyApps in {created:?}; all converged {converged_after:?} after the first create ({:?} after the last)",
        converged_after.saturating_sub(created)
    );
    println!(
        "operator requests while converging: {}",
        converging.per_app(apps)
    );
    println!(
        "operator CPU while converging: {cpu_converging:.2} s = {:.3} ms per MyApp; reconciles {reconciles_converging} = {:.2} per MyApp",
        per_app_ms(cpu_converging),
        reconciles_converging as f64 / apps as f64
    );
    println!(
        "CPU per MyApp from the first create until converged: {:.3} ms = the bench's process \
         (creates, the sandbox) {:.3} + the operator {:.3}; the machine meanwhile: {machine_converging}",
        per_app_ms(bench_converging + cpu_converging),
        per_app_ms(bench_converging),
        per_app_ms(cpu_converging)
    );
    println!(
        "RSS with {apps} MyApps + children cached: {loaded_rss}; {:.1} KiB per MyApp over idle",
        loaded_kib.saturating_sub(idle_kib) as f64 / apps as f64
    );
    println!(
        "operator requests in flight at once (watches excepted): at most {peak_in_flight}; watches open: {watches}"
    );
    println!(
        "one scrape of the operator's metrics by the bench costs it {:.3} ms (at rest, over {})",
        scrape_cost.seconds * 1000.0,
        ScrapeCost::SAMPLES
    );
    println!(
        "operator requests during a resync of every MyApp: {}; CPU {cpu_resync:.2} s = {:.3} ms per MyApp, besides {resync_scraped:.2} s for the bench's scrapes",
        resync.per_app(apps),
        per_app_ms(cpu_resync)
    );
    println!(
        "forced relist of every watch: done after {relisted_after:?}, RSS peak (sampled every 20 ms) {:.1} MiB; once every MyApp was reconciled again {relisted_rss}",
        peak_kib.get() as f64 / 1024.0
    );
    println!(
        "operator requests during the relist: {}; CPU until every MyApp was reconciled again {cpu_relist:.2} s = {:.3} ms per MyApp, besides {relist_scraped:.2} s for the bench's scrapes",
        relist.per_app(apps),
        per_app_ms(cpu_relist)
    );
    println!("failed reconciles from the start until the relist was done: {errors_by_relist}");
    let edits_made = 2 * apps;
    let per_edits = |n: u64| n as f64 * 1000.0 / edits_made as f64;
    println!(
        "edits during rollouts: every MyApp's image edited to {}, then to {} while its \
         Deployment's rollout of the first ran ({rolling} of {apps} second edits found it \
         running; {edits_made} edits, {AT_ONCE} at a time, in process); all converged on the \
         last {edited_after:?} after the first edit",
        edits::IMAGES[0],
        edits::IMAGES[1]
    );
    println!(
        "operator requests during the edits: {}",
        edited.per_app(apps)
    );
    let conflicted = conflicts.writes() + conflicts.reads + conflicts.watches;
    println!(
        "answers to the operator during the edits (the sandbox's count): 409 Conflict \
         {conflicted} = {:.1} per 1,000 edits (child writes {}, status writes {}, Events {}, other writes {}); \
         other refused writes (4xx/5xx) {} = {:.1} per 1,000 edits ({refused_statuses}); CPU \
         {cpu_edits:.2} s = {:.3} ms per MyApp",
        per_edits(conflicted),
        conflicts.child_writes,
        conflicts.status_writes,
        conflicts.events,
        conflicts.other_writes,
        refused.writes(),
        per_edits(refused.writes()),
        per_app_ms(cpu_edits)
    );
    println!(
        "no-op loader (same creates; 2 child applies, 1 status write, 1 Event each over HTTPS; same concurrency; from first create to last write): {loader:?} = {loader_rate:.0} apps/s; operator {operator_rate:.0} apps/s = {:.2}x",
        operator_rate / loader_rate
    );
    println!(
        "CPU per MyApp of the loader's run: {:.3} ms, all in the bench's process (creates, the \
         sandbox, the loader's client); the machine meanwhile: {machine_loader}",
        per_app_ms(bench_loader)
    );
    served.shutdown().await.unwrap();
    Ok(())
}
