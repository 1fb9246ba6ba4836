//! What tests of an API server client need, shared by every crate's tests (feature
//! `testing`, never in a shipped build): the real kubectl against a served sandbox, a child
//! process whose JSON log is read as it comes, polling for a condition with a deadline, and a
//! TLS client that trusts one test CA.

use rustls::pki_types::pem::PemObject as _;
use std::{
    future::Future,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    sync::mpsc::Receiver,
    time::Duration,
};

/// Upper bound of [`eventually`]: generous, since CI machines are slow; never a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `check` until it returns `Some`, or panics with `what` after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not happen within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A TLS client configuration that trusts only the CA in `ca_pem` and speaks HTTP/1.1, as
/// the API server's webhook client does.
pub fn tls_client_trusting(ca_pem: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.expect("a PEM certificate"))
            .expect("a CA certificate");
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

// === kubectl ===

/// Says on the process's stderr that the running test is skipped for want of kubectl. A
/// skipped test passes, so the line must not be captured with a passing test's output: libtest
/// captures what `eprintln!` prints, not a write to the stderr handle, which therefore shows in
/// `cargo test`'s output whatever the result. libtest names each test's thread after the test.
fn report_kubectl_skip() {
    use std::io::Write as _;
    let thread = std::thread::current();
    let test = thread
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("a kubectl test");
    // With stderr gone there is nowhere left to say it.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (kubectl not found on PATH): {test}; install kubectl, or set \
         SANDBOX_REQUIRE_KUBECTL=1 to fail instead"
    );
}

/// A kubectl environment: temp HOME, kubeconfig, cache dir.
pub struct Kubectl {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// A kubectl environment for `kubeconfig`, or None when kubectl is missing: the calling test
    /// then returns early, and the run's output names it as skipped. With
    /// `SANDBOX_REQUIRE_KUBECTL=1` (as CI runs) a missing kubectl fails the test instead.
    pub fn new(kubeconfig: &str) -> Option<Kubectl> {
        let found = Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            if std::env::var("SANDBOX_REQUIRE_KUBECTL").as_deref() == Ok("1") {
                panic!("kubectl is not on PATH and SANDBOX_REQUIRE_KUBECTL=1: install kubectl");
            }
            report_kubectl_skip();
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig).expect("write kubeconfig");
        Some(Kubectl {
            dir,
            kubeconfig: path,
        })
    }

    /// Writes `content` to a file in its directory (a manifest to apply).
    pub fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("write manifest");
        path
    }

    /// Runs kubectl with `args`, whatever its exit code.
    pub async fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .arg("--request-timeout=20s")
            .args(args);
        tokio::task::spawn_blocking(move || cmd.output().expect("run kubectl"))
            .await
            .expect("join kubectl")
    }

    /// Runs kubectl and returns stdout, failing the test (with stderr) on a non-zero exit.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed\nstdout: {stdout}\nstderr: {stderr}"
        );
        stdout
    }
}

/// A temp path as the `&str` kubectl arguments are.
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

// === child processes ===

/// Kills and waits for the child when dropped, so a failing test leaves no process behind.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines the child writes to its (piped) stderr. A thread keeps draining the pipe, so the
/// child never blocks on it, whether or not anyone reads the lines.
pub fn log_lines(child: &mut Child) -> Receiver<String> {
    let output = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        output
            .lines()
            .map_while(Result::ok)
            .for_each(|l| drop(tx.send(l)))
    });
    lines
}

/// Waits for the JSON log line whose `message` is `message`, returning its `addr` field.
pub fn wait_for_addr(lines: &Receiver<String>, message: &str) -> SocketAddr {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the operator never logged {message:?}"));
        if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
            && entry["message"] == message
        {
            return entry["addr"].as_str().unwrap().parse().unwrap();
        }
    }
}

/// Waits up to `within` for the JSON log line whose `message` is `message`, skipping others.
pub fn wait_for_message(
    lines: &Receiver<String>,
    message: &str,
    within: Duration,
) -> Option<serde_json::Value> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines.recv_timeout(left).ok()?;
        if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
            && entry["message"] == message
        {
            return Some(entry);
        }
    }
}
