//! Load driver for the webhook server's "Done when" measurements, run against a real binary
//! (see the crate README, "Measuring"). Not a test: it prints numbers.
//!
//! ```text
//! cargo run --release -p webhook --example load -- <scenario> --addr 127.0.0.1:8443 \
//!     --ca ca.crt --review review.json --path /validate-myapp --pid <server pid> [options]
//! ```
//!
//! Scenarios:
//! - `hostile`: holds `--each` slowloris, `--each` no-ClientHello and `--each` idle-after-
//!   handshake connections for `--secs` (re-opening each one the server closes), while sending
//!   `--rate` legitimate reviews per second, each on a fresh connection.
//! - `big`: 6.9 MiB reviews of several shapes one at a time; then small reviews on a keep-alive
//!   connection for `--secs` alone, and `--secs` with four big reviews at once alongside.
//! - `drain`: `--rate` reviews per second over 10 keep-alive connections; after `--secs` / 2 it
//!   sends SIGTERM to `--pid` and new connections go to `--addr2` (the pod left the endpoints).
//!   With `--admin`, a half-sent admin request and an idle keep-alive admin connection are open
//!   when the signal arrives.
//! - `pki`: writes a CA to `--ca` (its key to `<ca>.key`) and a serving pair into `--cert-dir`,
//!   laid out as the kubelet mounts a Secret; `--valid expired` writes an expired pair.
//! - `rotate`: `--rate` reviews per second on fresh connections while `--rotations` pairs are
//!   published into `--cert-dir` the kubelet's way (valid ones mixed with expired, not-yet-valid,
//!   mismatched and half-written ones), checking which certificate each connection was served.
//!
//! Every scenario samples the server's RSS from `/proc/<pid>/status` and prints its `VmHWM`.

#[path = "load/rotate.rs"]
mod rotate;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;

struct Options {
    flags: Flags,
    scenario: String,
    addr: SocketAddr,
    addr2: Option<SocketAddr>,
    tls: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
    review: Value,
    path: String,
    pid: u32,
    secs: u64,
    each: usize,
    rate: u64,
}

type Flags = std::collections::HashMap<String, String>;

fn flags() -> (String, Flags) {
    let mut args = std::env::args().skip(1);
    let scenario = args
        .next()
        .expect("a scenario: hostile, big, drain, pki or rotate");
    let mut flags = Flags::new();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        flags.insert(flag.trim_start_matches("--").to_owned(), value);
    }
    (scenario, flags)
}

fn options(scenario: String, flags: Flags) -> Options {
    let get = |name: &str| {
        flags
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("--{name} is required"))
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(get("ca")).expect("read --ca") {
        roots.add(cert.expect("parse --ca")).expect("add --ca");
    }
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Every fresh connection pays a full handshake, as a new API server connection does.
    tls.resumption = rustls::client::Resumption::disabled();
    let name = flags
        .get("server-name")
        .cloned()
        .unwrap_or_else(|| "myapp-operator-webhook.myapp-system.svc".to_owned());
    let review = std::fs::read(get("review")).expect("read --review");
    Options {
        flags: flags.clone(),
        scenario,
        addr: get("addr").parse().expect("--addr"),
        addr2: flags.get("addr2").map(|a| a.parse().expect("--addr2")),
        tls: Arc::new(tls),
        server_name: ServerName::try_from(name).expect("--server-name"),
        review: serde_json::from_slice(&review).expect("--review is JSON"),
        path: flags
            .get("path")
            .cloned()
            .unwrap_or_else(|| "/validate-myapp".to_owned()),
        pid: get("pid").parse().expect("--pid"),
        secs: flags.get("secs").map_or(60, |s| s.parse().expect("--secs")),
        each: flags
            .get("each")
            .map_or(1000, |s| s.parse().expect("--each")),
        rate: flags.get("rate").map_or(20, |s| s.parse().expect("--rate")),
    }
}

#[tokio::main]
async fn main() {
    let (scenario, flags) = flags();
    if scenario == "pki" {
        rotate::pki(&flags);
        return;
    }
    let options = Arc::new(options(scenario, flags));
    let rss = Rss::sample(options.pid);
    match options.scenario.as_str() {
        "hostile" => hostile(&options).await,
        "big" => big(&options).await,
        "drain" => drain(&options).await,
        "rotate" => rotate::rotate(&options).await,
        other => panic!("unknown scenario {other}"),
    }
    println!(
        "server RSS: max {} MiB sampled, VmHWM {}",
        rss.max_mib(),
        Rss::high_water_mark(options.pid)
    );
}

// === Clients ===

async fn tls(options: &Options, addr: SocketAddr) -> std::io::Result<TlsStream> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(options.tls.clone())
        .connect(options.server_name.clone(), tcp)
        .await
}

type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

async fn http(options: &Options, addr: SocketAddr) -> std::io::Result<SendRequest<Full<Bytes>>> {
    let stream = tls(options, addr).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Posts `body`; Ok(whether the server asked to close) when the answer is a 200 review.
async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    path: &str,
    body: Bytes,
) -> Result<bool, String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let request = hyper::Request::post(path)
        .header("host", "webhook")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let close = response
        .headers()
        .get("connection")
        .is_some_and(|v| v == "close");
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let review: Value = serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())?;
    if status != 200 || review["response"]["uid"].is_null() {
        return Err(format!("{status}: {review}"));
    }
    Ok(close)
}

/// One review on a fresh connection, timed from the TCP connect to the last byte of the answer.
async fn fresh_review(options: &Options, body: Bytes) -> Result<Duration, String> {
    let start = Instant::now();
    let mut sender = http(options, options.addr)
        .await
        .map_err(|e| e.to_string())?;
    post(&mut sender, &options.path, body).await?;
    Ok(start.elapsed())
}

fn body_of(review: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(review).unwrap())
}

// === hostile ===

async fn hostile(options: &Arc<Options>) {
    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicU64::new(0));
    let mut holders = Vec::new();
    for kind in ["no-client-hello", "idle-after-handshake", "slowloris"] {
        for _ in 0..options.each {
            let (options, stop, reopened) = (options.clone(), stop.clone(), reopened.clone());
            holders.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = hold(&options, kind, &stop).await;
                    reopened.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
    }
    // Let the held connections pile up before measuring.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let body = body_of(&options.review);
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let mut interval = tokio::time::interval(Duration::from_secs(1) / options.rate as u32);
    let end = Instant::now() + Duration::from_secs(options.secs);
    let mut requests = Vec::new();
    while Instant::now() < end {
        interval.tick().await;
        let (options, body) = (options.clone(), body.clone());
        let (latencies, errors) = (latencies.clone(), errors.clone());
        requests.push(tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(10), fresh_review(&options, body)).await
            {
                Ok(Ok(latency)) => latencies.lock().unwrap().push(latency),
                _ => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for request in requests {
        let _ = request.await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut latencies = latencies.lock().unwrap().clone();
    let within = latencies
        .iter()
        .filter(|l| **l <= Duration::from_secs(1))
        .count();
    let total = latencies.len() + errors.load(Ordering::Relaxed) as usize;
    println!(
        "hostile: {} x 3 held; legit reviews on fresh connections: {total}, errors {}, within 1 s: {:.2} %",
        options.each,
        errors.load(Ordering::Relaxed),
        100.0 * within as f64 / total.max(1) as f64
    );
    print_percentiles("legit latency", &mut latencies);
    println!(
        "hostile connections re-opened after the server closed them: {}",
        reopened.load(Ordering::Relaxed)
    );
    for holder in holders {
        holder.abort();
    }
}

/// Holds one hostile connection until the server closes it.
async fn hold(options: &Options, kind: &str, stop: &AtomicBool) -> std::io::Result<()> {
    let mut buf = [0u8; 1024];
    match kind {
        "no-client-hello" => {
            let mut tcp = TcpStream::connect(options.addr).await?;
            while tcp.read(&mut buf).await? > 0 {}
        }
        "idle-after-handshake" => {
            let mut stream = tls(options, options.addr).await?;
            while stream.read(&mut buf).await? > 0 {}
        }
        _ => {
            let stream = tls(options, options.addr).await?;
            let (mut read, mut write) = tokio::io::split(stream);
            let closed = async move {
                while read.read(&mut buf).await? > 0 {}
                Ok::<_, std::io::Error>(())
            };
            let trickle = async move {
                write.write_all(b"POST / HTTP/1.1\r\n").await?;
                while !stop.load(Ordering::Relaxed) {
                    write.write_all(b"x").await?;
                    write.flush().await?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok::<_, std::io::Error>(())
            };
            tokio::select! {
                result = closed => result?,
                result = trickle => result?,
            }
        }
    }
    Ok(())
}

// === big ===

async fn big(options: &Arc<Options>) {
    const TARGET: usize = 6_900 * 1024;
    let shapes = big_reviews(&options.review, TARGET);
    for (shape, body) in &shapes {
        let mut latencies = Vec::new();
        for _ in 0..5 {
            match fresh_review(options, body.clone()).await {
                Ok(latency) => latencies.push(latency),
                Err(error) => println!("big {shape}: error {error}"),
            }
        }
        println!(
            "big {shape} ({:.2} MiB): {:?}",
            body.len() as f64 / 1048576.0,
            latencies
        );
    }
    let small = body_of(&options.review);
    let mut alone = small_reviews(options, &small).await;
    print_percentiles("small review latency alone", &mut alone);
    // Four big ones at once, repeatedly, while small reviews run on a keep-alive connection.
    let stop = Arc::new(AtomicBool::new(false));
    let mut heavy = Vec::new();
    // `--shape env` makes all four env lists; by default they are four different shapes.
    let heavy_shapes: Vec<&Bytes> = match options.flags.get("shape") {
        Some(wanted) => shapes
            .iter()
            .filter(|(name, _)| name.contains(wanted.as_str()))
            .map(|(_, body)| body)
            .collect(),
        None => shapes.iter().map(|(_, body)| body).collect(),
    };
    for i in 0..4 {
        let body = heavy_shapes[i % heavy_shapes.len()].clone();
        let (options, stop) = (options.clone(), stop.clone());
        heavy.push(tokio::spawn(async move {
            let mut answered = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if fresh_review(&options, body.clone()).await.is_ok() {
                    answered += 1;
                }
            }
            answered
        }));
    }
    let mut latencies = small_reviews(options, &small).await;
    stop.store(true, Ordering::Relaxed);
    let mut big_answered = 0;
    for task in heavy {
        big_answered += task.await.unwrap_or(0);
    }
    println!("four big reviews in parallel: {big_answered} answered");
    print_percentiles("small review latency alongside", &mut latencies);
}

/// Small reviews on one keep-alive connection for `--secs`, 10 ms apart: their latencies.
async fn small_reviews(options: &Options, small: &Bytes) -> Vec<Duration> {
    let mut latencies = Vec::new();
    let mut sender = http(options, options.addr).await.expect("connect");
    let end = Instant::now() + Duration::from_secs(options.secs);
    while Instant::now() < end {
        let start = Instant::now();
        match post(&mut sender, &options.path, small.clone()).await {
            Ok(_) => latencies.push(start.elapsed()),
            Err(error) => {
                println!("small review failed: {error}");
                sender = http(options, options.addr).await.expect("connect");
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    latencies
}

fn big_reviews(review: &Value, target: usize) -> Vec<(&'static str, Bytes)> {
    let with_spec = |edit: &dyn Fn(&mut Value)| {
        let mut review = review.clone();
        edit(&mut review["request"]["object"]["spec"]);
        body_of(&review)
    };
    let entries = target / 31;
    let env: Vec<Value> = (0..entries)
        .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
        .collect();
    let mut nested = json!("leaf");
    // Below serde_json's recursion limit, so the whole depth is parsed; the rest is breadth.
    for _ in 0..120 {
        nested = json!([nested]);
    }
    let wide: Vec<Value> = (0..target / 260).map(|_| nested.clone()).collect();
    let long = "a".repeat(target - 2048);
    let labels: serde_json::Map<String, Value> = (0..target / 128)
        .map(|i| {
            (
                format!("example.com/label-{i:06}"),
                json!(format!("v{i:031}")),
            )
        })
        .collect();
    let with_metadata = {
        let mut review = review.clone();
        let metadata = &mut review["request"]["object"]["metadata"];
        metadata["labels"] = Value::Object(labels.clone());
        metadata["annotations"] = Value::Object(labels);
        body_of(&review)
    };
    vec![
        ("labels + annotations", with_metadata),
        ("env list", with_spec(&|spec| spec["env"] = json!(env))),
        (
            "deep nesting",
            with_spec(&|spec| spec["extra"] = json!(wide)),
        ),
        ("long image", with_spec(&|spec| spec["image"] = json!(long))),
        (
            "long env value",
            with_spec(&|spec| spec["env"] = json!([{"name": "BIG", "value": long}])),
        ),
    ]
}

// === drain ===

async fn drain(options: &Arc<Options>) {
    let next = options
        .addr2
        .expect("--addr2: where new connections go after SIGTERM");
    let endpoint = Arc::new(Mutex::new(options.addr));
    let stop = Arc::new(AtomicBool::new(false));
    let (errors, sent, closes) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let body = body_of(&options.review);
    let per_connection = Duration::from_secs(10) / options.rate as u32;
    let mut workers = Vec::new();
    for _ in 0..10 {
        let (options, endpoint, stop, body) = (
            options.clone(),
            endpoint.clone(),
            stop.clone(),
            body.clone(),
        );
        let (errors, sent, closes) = (errors.clone(), sent.clone(), closes.clone());
        workers.push(tokio::spawn(async move {
            let mut sender = None;
            let mut interval = tokio::time::interval(per_connection);
            while !stop.load(Ordering::Relaxed) {
                interval.tick().await;
                let addr = *endpoint.lock().unwrap();
                let mut current = match sender.take() {
                    Some(current) => current,
                    None => match http(&options, addr).await {
                        Ok(current) => current,
                        Err(error) => {
                            println!("dial {addr}: {error}");
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    },
                };
                sent.fetch_add(1, Ordering::Relaxed);
                match post(&mut current, &options.path, body.clone()).await {
                    Ok(true) => {
                        closes.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(false) => sender = Some(current),
                    Err(error) => {
                        println!("review: {error}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(options.secs / 2)).await;
    // Held open across the signal: neither may keep the process alive.
    let _admin = match options.flags.get("admin") {
        Some(admin) => Some(admin_connections(admin.parse().expect("--admin")).await),
        None => None,
    };
    let signalled = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &options.pid.to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    *endpoint.lock().unwrap() = next;
    let exit = tokio::task::spawn_blocking({
        let pid = options.pid;
        move || {
            while running(pid) {
                std::thread::sleep(Duration::from_millis(10));
            }
            signalled.elapsed()
        }
    });
    tokio::time::sleep(Duration::from_secs(options.secs / 2)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    println!(
        "drain: {} reviews sent, {} errors, {} answers with Connection: close",
        sent.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        closes.load(Ordering::Relaxed)
    );
    match tokio::time::timeout(Duration::from_secs(60), exit).await {
        Ok(Ok(elapsed)) => println!("server gone {elapsed:?} after SIGTERM"),
        _ => println!("server still running 60 s after SIGTERM"),
    }
}

/// A half-sent admin request and an idle keep-alive admin connection (after one answer).
async fn admin_connections(admin: SocketAddr) -> (TcpStream, TcpStream) {
    let mut half = TcpStream::connect(admin).await.expect("connect to --admin");
    half.write_all(b"GET /readyz HTTP/1.1\r\nHost: a")
        .await
        .expect("half a request");
    let mut idle = TcpStream::connect(admin).await.expect("connect to --admin");
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .expect("an admin request");
    let mut buf = [0u8; 1024];
    let read = idle.read(&mut buf).await.expect("an admin answer");
    assert!(
        buf[..read].starts_with(b"HTTP/1.1 200"),
        "/livez answers 200"
    );
    (half, idle)
}

/// Whether `pid` still runs (a zombie, exited but not yet reaped by its parent, does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.as_bytes()[0]);
        !matches!(state, Some(b'Z' | b'X'))
    })
}

// === Measuring ===

fn print_percentiles(what: &str, latencies: &mut [Duration]) {
    if latencies.is_empty() {
        println!("{what}: no samples");
        return;
    }
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    println!(
        "{what}: n={} p50 {:?} p99 {:?} max {:?}",
        latencies.len(),
        at(0.50),
        at(0.99),
        at(1.0)
    );
}

/// The server's resident set, sampled every 100 ms.
struct Rss {
    max_kib: Arc<AtomicU64>,
}

impl Rss {
    fn sample(pid: u32) -> Self {
        let max_kib = Arc::new(AtomicU64::new(0));
        let max = max_kib.clone();
        std::thread::spawn(move || {
            while let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                let kib = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .unwrap_or(0);
                max.fetch_max(kib, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { max_kib }
    }

    /// The peak resident set since the process started (`VmHWM`), or why not.
    fn high_water_mark(pid: u32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
                let kib: f64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
                Some(format!("{:.1} MiB", kib / 1024.0))
            })
            .unwrap_or_else(|| "unknown (the process has exited)".to_owned())
    }

    fn max_mib(&self) -> String {
        format!(
            "{:.1}",
            self.max_kib.load(Ordering::Relaxed) as f64 / 1024.0
        )
    }
}
