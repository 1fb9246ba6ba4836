//! Sharding's bench: how long the same MyApps take to converge with 1, 3 and 5 replicas of the
//! operator binary, each replica held to the same CPU quota, and what each replica holds.
//!
//! `cargo bench --bench shards -- [APPS] [RUN...]` (defaults 10000 and `1 3 5`). A run `1` is
//! one replica as the operator runs today (sharding off, leader election on); a run `N` (or
//! `sN`, for one) is N replicas with `--sharding`; `nN` is N replicas with `--sharding
//! --shard-by namespace`, against a sandbox with KEP-5866's sharded list and watch on. Each run gets a fresh sandbox (HTTPS, bearer
//! tokens) on loopback, served by the bench's process; the replicas start, each in a cgroup v1
//! `cpu` group of its own capped at `MYAPP_BENCH_CPU` cores (default 0.1: so that the
//! operators, not the sandbox sharing the machine, are what limits the pace; at 0.2, five
//! replicas and the sandbox used both cores of the bench's machine), and once every
//! replica's caches synced and, sharded, every shard Lease is held, the bench creates APPS
//! MyApps spread over `MYAPP_BENCH_NAMESPACES` namespaces (default 10). A sharded run creates
//! them labelled for their shard as the webhook would label them (the operator's own ring over
//! the replicas' identities); the bench has no webhook in the API server's path.
//!
//! Reported per run: time from the first create until every MyApp converged (status, children,
//! as `benches/operator.rs` judges it, read from the sandbox's store), and after the last
//! create; per replica, the MyApps its shard holds, its CPU while converging and its RSS idle
//! and converged (the difference: what it caches); child and status writes per MyApp, and the
//! label writes the sharder made. Then each run's speed against the first.
//!
//! `MYAPP_BENCH_EXISTING=1`: the MyApps are created before the replicas start, and times count
//! from their start (a restart of the operator over existing MyApps). No idle RSS then, so
//! "holds" is the converged RSS. Sharding by namespace cuts its ranges by the MyApps per
//! namespace it counts; with none yet it cuts the hash space evenly, and recuts 5 minutes later,
//! so its figures mean something in this mode only. Needs root (the
//! cgroups); fails, rather than report unthrottled figures, when it cannot cap a replica.
//! `MYAPP_BENCH_OPERATOR` names the binary to measure (default: built now, as the image's).

// Shared with the operator bench, which uses all of them.
#[path = "operator/common.rs"]
mod common;
#[allow(dead_code)]
#[path = "operator/probe.rs"]
mod probe;
#[allow(dead_code)]
#[path = "operator/requests.rs"]
mod requests;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::PostParams};
use kube_sandbox::testing::{Reap, log_lines, wait_for_addr};
use myapp_operator::{
    crd::MyApp,
    run::USER_AGENT,
    shard::{Ring, SHARD_LABEL},
};

use common::{Outcome, cpu_seconds, progress, serve_with_crd, status_kib, wait_until};

/// How many creates are in flight at once.
const AT_ONCE: usize = 32;

/// One run: how many replicas, and whether they shard.
#[derive(Clone, Copy, Debug)]
struct Run {
    replicas: usize,
    sharded: bool,
    by_namespace: bool,
}

impl Run {
    fn parse(text: &str) -> Option<Self> {
        let (sharded, by_namespace, count) = match (text.strip_prefix('s'), text.strip_prefix('n'))
        {
            (Some(count), _) => (true, false, count),
            (_, Some(count)) => (true, true, count),
            _ => (false, false, text),
        };
        let replicas: usize = count.parse().ok().filter(|&n| n > 0)?;
        Some(Self {
            replicas,
            sharded: sharded || replicas > 1,
            by_namespace,
        })
    }

    /// Whether the replicas place MyApps by label (which the bench sets as the webhook would).
    fn by_label(self) -> bool {
        self.sharded && !self.by_namespace
    }

    fn label(self) -> String {
        let on = if self.by_namespace {
            "sharding by namespace"
        } else {
            "sharding on"
        };
        match (self.replicas, self.sharded) {
            (1, false) => "1 replica, sharding off".into(),
            (1, true) => format!("1 replica, {on}"),
            (n, _) => format!("{n} replicas, {on}"),
        }
    }
}

/// What one run measured.
struct Measured {
    run: Run,
    converged: Duration,
    after_last_create: Duration,
    replicas: Vec<ReplicaFigures>,
    child_and_status_writes: f64,
    label_writes: u64,
}

struct ReplicaFigures {
    identity: String,
    myapps: usize,
    cpu: f64,
    idle_kib: u64,
    converged_kib: u64,
}

/// A cgroup v1 `cpu` group capped at `cores`, removed when dropped (its processes gone).
struct CpuCap(PathBuf);

impl CpuCap {
    fn new(name: &str, cores: f64) -> Outcome<Self> {
        let path = Path::new("/sys/fs/cgroup/cpu").join(name);
        // A group left by a bench that was killed: its counters would add to this run's.
        let _ = std::fs::remove_dir(&path);
        let why = |e: std::io::Error| {
            format!(
                "capping a replica's CPU needs the cgroup v1 cpu controller, writable (as root) \
                 at {}: {e}",
                path.display()
            )
        };
        std::fs::create_dir_all(&path).map_err(why)?;
        let period = 100_000u64;
        std::fs::write(path.join("cpu.cfs_period_us"), period.to_string()).map_err(why)?;
        let quota = (cores * period as f64).round() as u64;
        std::fs::write(path.join("cpu.cfs_quota_us"), quota.to_string()).map_err(why)?;
        Ok(Self(path))
    }

    fn add(&self, pid: u32) -> Outcome<()> {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("moving {pid} into {}: {e}", self.0.display()))
    }

    /// How often the group was held back, and for how long in all.
    fn throttled(&self) -> String {
        let stat = std::fs::read_to_string(self.0.join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        format!(
            "throttled {} of {} periods ({:.1} s)",
            field("nr_throttled"),
            field("nr_periods"),
            field("throttled_time") as f64 / 1e9
        )
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // The group can go only once empty; the replica was killed just before.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A replica under its cap. The process is killed before its group is removed (fields drop
/// in this order).
struct Replica {
    _process: Reap,
    cap: CpuCap,
    identity: String,
    pid: u32,
    admin: SocketAddr,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let apps = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let runs: Vec<Run> = if args.len() > 1 {
        match args[1..].iter().map(|a| Run::parse(a)).collect() {
            Some(runs) => runs,
            None => {
                eprintln!(
                    "runs are replica counts, `sN` for N sharded replicas, `nN` for N sharded by namespace: {args:?}"
                );
                return ExitCode::FAILURE;
            }
        }
    } else {
        ["1", "3", "5"]
            .iter()
            .filter_map(|r| Run::parse(r))
            .collect()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, usize::from) + 2)
        .enable_all()
        .build()
        .unwrap();
    match runtime.block_on(bench(apps, &runs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shards bench failed: {error}");
            ExitCode::FAILURE
        }
    }
}

fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn bench(apps: usize, runs: &[Run]) -> Outcome<()> {
    let binary = probe::operator_binary()?;
    let cores: f64 = setting("MYAPP_BENCH_CPU", 0.1);
    let namespaces: usize = setting("MYAPP_BENCH_NAMESPACES", 10);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut measured = Vec::new();
    for &run in runs {
        progress(&format!(
            "{}: {apps} MyApps in {namespaces} namespaces, {cores} cores per replica",
            run.label()
        ));
        measured.push(one_run(&binary, run, apps, namespaces, cores).await?);
    }
    println!("shards bench: {apps} MyApps in {namespaces} namespaces, {cores} cores per replica");
    let first = measured[0].converged.as_secs_f64();
    for m in &measured {
        println!(
            "{}: converged {:.1} s after the first create ({:.1} s after the last), {:.2}x the \
             first run's speed; child and status writes {:.2} per MyApp; label writes {}",
            m.run.label(),
            m.converged.as_secs_f64(),
            m.after_last_create.as_secs_f64(),
            first / m.converged.as_secs_f64(),
            m.child_and_status_writes,
            m.label_writes,
        );
        for r in &m.replicas {
            println!(
                "  {}: {} MyApps, CPU {:.2} s converging, RSS idle {:.1} MiB, converged {:.1} MiB (holds {:.1} MiB)",
                r.identity,
                r.myapps,
                r.cpu,
                r.idle_kib as f64 / 1024.0,
                r.converged_kib as f64 / 1024.0,
                r.converged_kib.saturating_sub(r.idle_kib) as f64 / 1024.0,
            );
        }
    }
    Ok(())
}

async fn one_run(
    binary: &Path,
    run: Run,
    apps: usize,
    namespaces: usize,
    cores: f64,
) -> Outcome<Measured> {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..namespaces).map(|i| format!("team-{i}")).collect();
    let mut builder = kube_sandbox::Sandbox::builder()
        .namespace("myapp-system")
        .simulate_pods(false)
        .event_log_capacity((apps * 10).max(200_000))
        .event_log_bytes(usize::MAX)
        .request_log_capacity(1_000)
        .authentication();
    for namespace in &names {
        builder = builder.namespace(namespace);
    }
    let sandbox = builder.sharded_list_watch(run.by_namespace).build();
    let (_served, client) = serve_with_crd(&sandbox, &dir.path().join("kubeconfig")).await;
    let bundle = myapp_operator::certs::generate(&["localhost".to_owned()]).unwrap();
    bundle.write_to(&dir.path().join("certs")).unwrap();

    let existing = setting("MYAPP_BENCH_EXISTING", 0) == 1;
    let identities: Vec<String> = (0..run.replicas).map(|i| format!("pod-{i}")).collect();
    // The MyApps, spread over the namespaces, each labelled for its shard as the webhook would.
    let ring = run.by_label().then(|| Ring::new(&identities));
    let placed: Vec<(String, String, Option<String>)> = (0..apps)
        .map(|i| {
            let namespace = names[i % namespaces].clone();
            let name = format!("app-{i}");
            let shard = ring
                .as_ref()
                .and_then(|ring| ring.shard_for(&namespace, &name).map(str::to_owned));
            (namespace, name, shard)
        })
        .collect();
    let mut observed: Vec<probe::Observed> = names
        .iter()
        .map(|namespace| {
            let mine = placed
                .iter()
                .filter(|(ns, _, _)| ns == namespace)
                .map(|(_, name, _)| name.clone());
            probe::Observed::start(&sandbox, namespace, mine)
        })
        .collect();
    let create = || async {
        stream::iter(placed.clone())
            .for_each_concurrent(AT_ONCE, |(namespace, name, shard)| {
                let api = Api::<MyApp>::namespaced(client.clone(), &namespace);
                let create = tokio::spawn(async move {
                    let mut app = MyApp::test(&name);
                    if let Some(shard) = shard {
                        app.metadata
                            .labels
                            .get_or_insert_default()
                            .insert(SHARD_LABEL.to_owned(), shard);
                    }
                    if let Err(e) = api.create(&PostParams::default(), &app).await {
                        panic!("creating MyApp {namespace}/{name}: {e}");
                    }
                });
                async move { create.await.expect("a create task panicked") }
            })
            .await;
    };
    if existing {
        create().await;
        sandbox.faults().clear_requests();
    }
    let started = Instant::now();
    let mut replicas = Vec::new();
    for identity in &identities {
        replicas.push(start(binary, dir.path(), identity, run, cores)?);
    }
    let (first_create, idle, cpu_idle) = if existing {
        (started, vec![0; replicas.len()], vec![0.0; replicas.len()])
    } else {
        let (idle, cpu_idle) = settle(&replicas, run, &client, &identities).await?;
        sandbox.faults().clear_requests();
        let first_create = Instant::now();
        create().await;
        (first_create, idle, cpu_idle)
    };
    let created = first_create.elapsed();
    let deadline = Duration::from_secs(60) + Duration::from_millis(apps as u64 * 20);
    wait_until(
        "convergence of every MyApp",
        deadline,
        Duration::from_millis(100),
        || {
            let why = observed.iter_mut().find_map(probe::Observed::unconverged);
            std::future::ready(why)
        },
    )
    .await?;
    let converged = first_create.elapsed();

    let agent = USER_AGENT;
    let writes = requests::of(&sandbox, agent);
    if writes.object_writes() == 0 {
        return Err(requests::unattributed(
            &sandbox,
            agent,
            "the writes that converged the MyApps",
        ));
    }
    let label_writes = sandbox
        .faults()
        .request_counts()
        .into_iter()
        .filter(|(key, _)| {
            key.user_agent.as_deref() == Some(agent)
                && key.verb == "patch"
                && key.resource.as_deref() == Some("myapps")
                && key.subresource.is_none()
        })
        .map(|(_, count)| count)
        .sum();
    let mut figures = Vec::new();
    for (i, replica) in replicas.iter().enumerate() {
        let myapps = if run.by_namespace {
            probe::shard_objects(replica.admin).await? as usize
        } else {
            placed
                .iter()
                .filter(|(_, _, shard)| {
                    !run.by_label() || shard.as_deref() == Some(&replica.identity)
                })
                .count()
        };
        progress(&format!(
            "{}: {}",
            replica.identity,
            replica.cap.throttled()
        ));
        figures.push(ReplicaFigures {
            identity: replica.identity.clone(),
            myapps,
            cpu: cpu_seconds(replica.pid)? - cpu_idle[i],
            idle_kib: idle[i],
            converged_kib: status_kib(replica.pid, "VmRSS"),
        });
    }
    let measured = Measured {
        run,
        converged,
        after_last_create: converged.saturating_sub(created),
        replicas: figures,
        child_and_status_writes: (writes.child_writes + writes.status_writes) as f64 / apps as f64,
        label_writes,
    };
    progress(&format!(
        "{}: converged {:.1} s after the first create ({:.1} s after the last)",
        run.label(),
        measured.converged.as_secs_f64(),
        measured.after_last_create.as_secs_f64()
    ));
    drop(replicas);
    Ok(measured)
}

/// Waits until every replica's caches synced and, sharded, every shard Lease is held, then a
/// second more: each replica's idle RSS and CPU so far.
async fn settle(
    replicas: &[Replica],
    run: Run,
    client: &kube::Client,
    identities: &[String],
) -> Outcome<(Vec<u64>, Vec<f64>)> {
    wait_until(
        "every replica's caches synced",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async {
            for replica in replicas {
                match probe::caches_synced(replica.admin).await {
                    Ok(true) => {}
                    Ok(false) => return Some(format!("{} has not synced", replica.identity)),
                    Err(e) => return Some(e),
                }
            }
            None
        },
    )
    .await?;
    if run.sharded {
        let leases = Api::<Lease>::namespaced(client.clone(), "myapp-system");
        wait_until(
            "every shard Lease held",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async {
                let held: Vec<String> = leases
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|l| {
                        l.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.contains("-shard-"))
                    })
                    .filter_map(|l| l.spec?.holder_identity)
                    .collect();
                let missing: Vec<&String> =
                    identities.iter().filter(|i| !held.contains(i)).collect();
                (!missing.is_empty()).then(|| format!("no shard Lease held by {missing:?}"))
            },
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle: Vec<u64> = replicas
        .iter()
        .map(|r| status_kib(r.pid, "VmRSS"))
        .collect();
    let cpu_idle: Vec<f64> = replicas
        .iter()
        .map(|r| cpu_seconds(r.pid))
        .collect::<Outcome<_>>()?;
    Ok((idle, cpu_idle))
}

/// Starts a replica as `identity` under its CPU cap.
fn start(binary: &Path, dir: &Path, identity: &str, run: Run, cores: f64) -> Outcome<Replica> {
    let cap = CpuCap::new(&format!("myapp-bench-{identity}"), cores)?;
    let mut command = Command::new(binary);
    command
        .args([
            "run",
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args(["--identity", identity, "--log-format", "json"])
        .args(["--log-level", "info,myapp_operator::controller=warn"])
        .args(["--drain-delay", "0s"])
        .arg("--cert-dir")
        .arg(dir.join("certs"))
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if run.sharded {
        command.arg("--sharding");
    }
    if run.by_namespace {
        command.args(["--shard-by", "namespace"]);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let pid = child.id();
    cap.add(pid)?;
    let lines = log_lines(&mut child);
    let process = Reap(child);
    let admin = wait_for_addr(&lines, "Admin server listening");
    std::thread::spawn(move || lines.into_iter().for_each(drop));
    Ok(Replica {
        _process: process,
        cap,
        identity: identity.to_owned(),
        pid,
        admin,
    })
}
