//! What the operator benches share: reading a process's CPU and memory from /proc, the
//! sandbox's router as its admin, waiting for a condition, and reporting a phase.

use std::time::{Duration, Instant};

/// A bench step's result: its failure says what could not be measured.
pub type Outcome<T> = Result<T, String>;

/// A `VmRSS`-style line of /proc/<pid>/status in KiB (`VmRSS`, `RssAnon`, `RssFile`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time, user plus system, that `pid` has used so far: fields 14 and 15 of
/// /proc/<pid>/stat, in clock ticks of 1/100 s (`USER_HZ`, fixed at 100 in Linux's ABI).
pub fn cpu_seconds(pid: u32) -> Outcome<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("reading /proc/{pid}/stat for the operator's CPU time: {e}"))?;
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (tick(11), tick(12)) {
        (Some(user), Some(system)) => Ok((user + system) as f64 / 100.0),
        _ => Err(format!(
            "/proc/{pid}/stat has no utime/stime fields: {stat:?}"
        )),
    }
}

/// The sandbox's router in process, as its admin: with authentication on, every request needs
/// the admin's bearer token.
pub fn admin_router(
    router: axum::Router,
    token: String,
) -> impl tower::Service<
    axum::http::Request<kube::client::Body>,
    Response = axum::http::Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ use<> {
    let bearer = axum::http::HeaderValue::from_str(&format!("Bearer {token}"))
        .expect("a token is a header value");
    tower::ServiceBuilder::new()
        .map_request(
            move |mut request: axum::http::Request<kube::client::Body>| {
                request
                    .headers_mut()
                    .insert(axum::http::header::AUTHORIZATION, bearer.clone());
                request
            },
        )
        .service(router)
}

/// Waits until `done` says so, polling every `poll`, or fails after `deadline` with `what` and
/// the last thing `done` said was missing.
pub async fn wait_until<F, Fut>(
    what: &str,
    deadline: Duration,
    poll: Duration,
    mut done: F,
) -> Outcome<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let start = Instant::now();
    loop {
        let Some(missing) = done().await else {
            return Ok(());
        };
        if start.elapsed() > deadline {
            return Err(format!("{what}: not done within {deadline:?}: {missing}"));
        }
        tokio::time::sleep(poll).await;
    }
}

/// A phase's headline on stderr as soon as it is measured, so that a long run stopped before
/// its report (the full figures come at the end, on stdout) still says what it measured.
pub fn progress(line: &str) {
    eprintln!("[bench] {line}");
}

/// Serves `sandbox` over HTTPS on loopback as the operator reaches it, writes its kubeconfig
/// (the admin's token) to `kubeconfig`, and installs the MyApp CRD. Returns the serving handle,
/// which stops serving when dropped, and a client that calls the sandbox in process as its
/// admin (the bench's own requests, without TLS).
pub async fn serve_with_crd(
    sandbox: &kube_sandbox::Sandbox,
    kubeconfig: &std::path::Path,
) -> (kube_sandbox::Served, kube::Client) {
    use kube::CustomResourceExt as _;
    let served = sandbox
        .serve_tls("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    std::fs::write(kubeconfig, served.kubeconfig()).unwrap();
    let admin_token = sandbox
        .token(kube_sandbox::authn::ADMIN_TOKEN_ID)
        .expect("authentication is on");
    let client = kube::Client::new(admin_router(sandbox.router(), admin_token), "default");
    let crd = myapp_operator::crd::MyApp::crd();
    kube::Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone())
        .patch(
            "myapps.example.com",
            &kube::api::PatchParams::apply("bench"),
            &kube::api::Patch::Apply(&crd),
        )
        .await
        .unwrap();
    (served, client)
}
