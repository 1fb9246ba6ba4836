//! What the binary says when something is wrong: what, where (the URL, file, flag or
//! variable), and the fix. Each case runs the real binary and reads what it prints.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

fn operator() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_myapp-operator"));
    // Nothing from the test's own environment: each case sets what it needs.
    command.env_remove("KUBECONFIG").env_remove("RUST_LOG");
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A kubeconfig whose API server refuses connections: a loopback port just freed.
fn unreachable_kubeconfig(dir: &Path) -> (PathBuf, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: t}}\n"
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    (path, url)
}

/// A serving pair written by `certs` into `dir/certs`.
fn certs(dir: &Path) -> PathBuf {
    let out = dir.join("certs");
    let written = operator()
        .args(["certs", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    out
}

/// `run` with `args` for at most `within`, then killed; everything it wrote to stderr.
fn run_for(kubeconfig: &Path, args: &[&str], within: Duration) -> (Option<i32>, String) {
    let mut child = operator()
        .arg("run")
        .args(["--admin-addr", "127.0.0.1:0", "--log-format", "plain"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + within;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut text).unwrap();
    (code, text)
}

#[test]
fn run_without_certificates_names_the_cert_dir_flag_and_the_certs_command() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = unreachable_kubeconfig(dir.path());
    let missing = dir.path().join("no-certs");
    let missing = missing.to_str().unwrap();
    let args = ["--cert-dir", missing, "--webhook-addr", "127.0.0.1:0"];
    let (code, said) = run_for(&kubeconfig, &args, Duration::from_secs(20));
    assert_eq!(code, Some(1), "{said}");
    for part in [
        &format!("{missing}/tls.crt"),
        "--cert-dir (MYAPP_CERT_DIR)",
        "myapp-operator certs --out",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
}

#[test]
fn run_with_sharding_but_no_election_names_both_flags_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = unreachable_kubeconfig(dir.path());
    let args = ["--sharding", "--leader-elect=false"];
    let (code, said) = run_for(&kubeconfig, &args, Duration::from_secs(20));
    assert_eq!(code, Some(1), "{said}");
    for part in ["--sharding needs --leader-elect", "shard Lease"] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
}

#[test]
fn run_with_a_kubeconfig_that_is_not_one_names_the_file_the_field_and_the_other_way() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "clusters:\n- name: 2024\n  cluster: {server: https://127.0.0.1:1}\n",
    )
    .unwrap();
    let cert_dir = certs(dir.path());
    let args = ["--cert-dir", cert_dir.to_str().unwrap()];
    let (code, said) = run_for(&kubeconfig, &args, Duration::from_secs(20));
    assert_eq!(code, Some(1), "{said}");
    for part in [
        &format!("KUBECONFIG={}", kubeconfig.display()),
        &format!("{} is not a kubeconfig", kubeconfig.display()),
        "clusters[0].name: invalid type: integer `2024`, expected a string",
        "in-cluster: ",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
}

#[test]
fn run_on_a_webhook_port_in_use_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, _) = unreachable_kubeconfig(dir.path());
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let cert_dir = certs(dir.path());
    let cert_dir = cert_dir.to_str().unwrap();
    let args = ["--cert-dir", cert_dir, "--webhook-addr", &addr];
    let (code, said) = run_for(&kubeconfig, &args, Duration::from_secs(20));
    assert_eq!(code, Some(1), "{said}");
    for part in [
        addr.as_str(),
        "in use",
        "--webhook-addr (MYAPP_WEBHOOK_ADDR)",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
}

#[test]
fn run_against_an_unreachable_api_server_names_its_url_the_cause_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, url) = unreachable_kubeconfig(dir.path());
    let cert_dir = certs(dir.path());
    let cert_dir = cert_dir.to_str().unwrap();
    for elect in ["--leader-elect=true", "--leader-elect=false"] {
        let args = [
            "--cert-dir",
            cert_dir,
            "--webhook-addr",
            "127.0.0.1:0",
            elect,
        ];
        let (_, said) = run_for(&kubeconfig, &args, Duration::from_secs(4));
        let failures: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("Lease renewal failed") || l.contains("Controller event"))
            .collect();
        assert!(!failures.is_empty(), "{elect}: no failure logged: {said}");
        for line in failures {
            for part in [url.as_str(), "Connection refused", "unreachable from here"] {
                assert!(
                    line.contains(part),
                    "{elect}: {part:?} missing from: {line}"
                );
            }
        }
        assert!(
            !said.contains("failed with error client error"),
            "{elect}: kube's own line without URL or cause is still logged: {said}"
        );
    }
}

#[test]
fn check_against_an_unreachable_api_server_names_its_url_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, url) = unreachable_kubeconfig(dir.path());
    let output = operator()
        .arg("check")
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let said = String::from_utf8_lossy(&output.stdout);
    for part in [
        url.as_str(),
        "does not answer",
        "Connection refused",
        "kube-context",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
}

#[test]
fn an_invalid_value_from_the_environment_is_named_by_its_variable() {
    let output = operator()
        .arg("run")
        .env("MYAPP_LEASE_DURATION", "fifteen")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let said = stderr(&output);
    for part in [
        "MYAPP_LEASE_DURATION=\"fifteen\"",
        "--lease-duration",
        "not a duration",
        "fix or unset MYAPP_LEASE_DURATION",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
    // On the command line, the flag is what the user typed: named as such.
    let output = operator()
        .args(["run", "--lease-duration", "fifteen"])
        .env("MYAPP_LEASE_DURATION", "10s")
        .output()
        .unwrap();
    let said = stderr(&output);
    assert!(
        said.contains("'--lease-duration <LEASE_DURATION>'") && !said.contains("MYAPP_"),
        "{said}"
    );
}

#[test]
fn certs_refuses_a_certificate_that_would_outlive_its_ca_naming_both_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("certs");
    let output = operator()
        .args(["certs", "--ca-days", "10", "--cert-days", "100", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let said = stderr(&output);
    for part in [
        "--cert-days 100",
        "--ca-days 10",
        "outlive",
        "MYAPP_CERTS_CERT_DAYS",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
    assert!(
        !out.join("tls.crt").exists(),
        "a certificate was written anyway"
    );
}
