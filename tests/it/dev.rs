//! `myapp-operator dev` as a new user runs it: the real binary, its printed instructions, and
//! the real kubectl against the sandbox it starts.

use kube_sandbox::testing as kubectl;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running `dev` child process and the lines it printed on starting; killed on drop.
pub(crate) struct Dev {
    pub(crate) child: Child,
    lines: Vec<String>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `dev` on free ports and reads what it prints up to "Ctrl-C stops everything.".
pub(crate) fn start_dev(state_dir: &std::path::Path) -> Dev {
    start_dev_with(state_dir, &[])
}

fn start_dev_with(state_dir: &std::path::Path, extra: &[&str]) -> Dev {
    let mut child = Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
        .args([
            "dev",
            "--api-addr",
            "127.0.0.1:0",
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args([
            "--rollout-delay",
            "100ms",
            "--default-env",
            "TEAM=shop",
            "--log-level",
            "warn",
        ])
        .args(extra)
        .arg("--state-dir")
        .arg(state_dir)
        // Another directory than the repository: dev must not depend on where it runs.
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start myapp-operator dev");
    let mut lines = Vec::new();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.expect("read dev output");
        let done = line.starts_with("Ctrl-C stops everything");
        lines.push(line);
        if done {
            break;
        }
    }
    assert!(
        lines.last().is_some_and(|l| l.starts_with("Ctrl-C")),
        "dev printed: {lines:?}"
    );
    Dev { child, lines }
}

/// The rest of the first line `dev` printed that starts with `prefix`.
pub(crate) fn printed<'a>(dev: &'a Dev, prefix: &str) -> &'a str {
    dev.lines
        .iter()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in {:?}", dev.lines))
}

fn example(name: &str) -> String {
    format!("{}/deploy/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_prints_how_to_connect_and_kubectl_sees_admission_defaults_and_reconciling() {
    let state = tempfile::tempdir().unwrap();
    let dev = start_dev(state.path());

    let kubeconfig_path = printed(&dev, "export KUBECONFIG=");
    assert!(
        std::path::Path::new(kubeconfig_path).is_absolute(),
        "{kubeconfig_path}"
    );
    assert!(
        printed(&dev, "webhook: https://127.0.0.1:")
            .parse::<u16>()
            .is_ok()
    );
    let admin: u16 = printed(&dev, "admin: http://127.0.0.1:").parse().unwrap();
    // Probed like a kubelet: ready within 2 s of printing its instructions (the webhook
    // serves by then), whatever the controller is doing.
    let deadline = Instant::now() + Duration::from_secs(2);
    while http_status(admin, "/readyz") != Some(200) {
        assert!(
            Instant::now() < deadline,
            "dev's /readyz is not 200 within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        dev.lines
            .iter()
            .any(|l| l.contains("kubectl apply -f deploy/examples/myapp.yaml"))
    );
    // Started with --default-env, so the banner may promise the injection.
    assert!(
        dev.lines
            .iter()
            .any(|l| l.contains("# --default-env injected")),
        "{:?}",
        dev.lines
    );

    let Some(kubectl) = kubectl::Kubectl::new(&std::fs::read_to_string(kubeconfig_path).unwrap())
    else {
        return;
    };
    // The oldest supported version, unless --server-minor says otherwise.
    let version = kubectl.ok(&["version", "-o", "json"]).await;
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(version["serverVersion"]["minor"], "33", "{version}");
    let applied = kubectl.ok(&["apply", "-f", &example("myapp.yaml")]).await;
    assert!(
        applied.contains("myapp.example.com/web created"),
        "{applied}"
    );

    // The mutating webhook injected the configured default.
    let yaml = kubectl.ok(&["get", "myapp", "web", "-o", "yaml"]).await;
    assert!(
        yaml.contains("name: TEAM") && yaml.contains("value: shop"),
        "{yaml}"
    );

    // The controller made the children and reports Running.
    kubectl::eventually("web reports Running", || async {
        let phase = kubectl
            .ok(&["get", "myapp", "web", "-o", "jsonpath={.status.phase}"])
            .await;
        (phase == "Running").then_some(())
    })
    .await;
    let children = kubectl
        .ok(&["get", "deployments,services", "-o", "name"])
        .await;
    assert!(
        children.contains("deployment.apps/web") && children.contains("service/web"),
        "{children}"
    );

    // A mistake only the webhook knows about gets the webhook's own words. The denial carries
    // field causes with reason Invalid, so kubectl prints it as "The MyApp "web" is invalid:
    // <causes>" (as it does on a real cluster) rather than the "admission webhook ... denied"
    // line, which it keeps for denials without causes.
    let out = kubectl
        .run(&[
            "apply",
            "-f",
            &example("invalid-image-digest-wrong-length.yaml"),
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("The MyApp \"web\" is invalid: spec.image: Invalid value:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("sha256 needs 64 and sha512 128 lower-case hex digits"),
        "{stderr}"
    );
    // A required field missing: the mutating webhook, which runs before the schema, admits
    // what it cannot read, so the author gets the schema's message, not a parse error.
    let missing_port = kubectl.file(
        "missing-port.yaml",
        "apiVersion: example.com/v1\nkind: MyApp\nmetadata:\n  name: no-port\nspec:\n  image: ghcr.io/example/web:1.4.2\n",
    );
    let out = kubectl
        .run(&[
            "apply",
            "-f",
            kube_sandbox::testing::path_str(&missing_port),
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.port: Required value"), "{stderr}");
    assert!(!stderr.contains("does not parse"), "{stderr}");
    // A mistake the schema knows about is refused before any validating webhook runs.
    let out = kubectl
        .run(&["apply", "-f", &example("invalid-replicas-negative.yaml")])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_beyond_max_replicas_is_refused_by_the_webhook() {
    let state = tempfile::tempdir().unwrap();
    let dev = start_dev_with(state.path(), &["--max-replicas", "5"]);
    let kubeconfig = std::fs::read_to_string(printed(&dev, "export KUBECONFIG=")).unwrap();
    let Some(kubectl) = kubectl::Kubectl::new(&kubeconfig) else {
        return;
    };
    kubectl.ok(&["apply", "-f", &example("myapp.yaml")]).await;
    // An autoscaler writes the same way: through the scale subresource, not the MyApp.
    let out = kubectl
        .run(&["scale", "myapp", "web", "--replicas=7"])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("spec.replicas: Invalid value: 7: must be less than or equal to 5"),
        "{stderr}"
    );
    let replicas = kubectl
        .ok(&["get", "myapp", "web", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(replicas, "3");
    let scaled = kubectl.ok(&["scale", "myapp", "web", "--replicas=5"]).await;
    assert!(scaled.contains("myapp.example.com/web scaled"), "{scaled}");
    let replicas = kubectl
        .ok(&["get", "myapp", "web", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(replicas, "5");
}

/// The status code of a plain HTTP/1.1 GET on loopback.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Runs `dev` with `args` until it exits (it must, within 30 s), returning its exit code and
/// stderr.
fn dev_fails(state_dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
        .arg("dev")
        .args(args)
        .arg("--state-dir")
        .arg(state_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start myapp-operator dev");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dev {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[test]
fn dev_refuses_to_serve_beyond_loopback_and_names_a_busy_address() {
    let state = tempfile::tempdir().unwrap();
    let (code, stderr) = dev_fails(
        state.path(),
        &[
            "--api-addr",
            "0.0.0.0:0",
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--api-addr 0.0.0.0:0 must be a loopback address"),
        "{stderr}"
    );

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let (code, stderr) = dev_fails(
        state.path(),
        &[
            "--api-addr",
            &addr,
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("sandbox API server on {addr}")),
        "{stderr}"
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_keeps_its_state_dir_and_kubeconfig_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let state = parent.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kubeconfig = state.join("kubeconfig");
    std::fs::write(&kubeconfig, "left over").unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _dev = start_dev(&state);
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&kubeconfig), 0o600);
    assert_eq!(mode(&state.join("certs/tls.key")), 0o600);
}

#[test]
fn the_banner_promises_injected_defaults_only_when_some_are_configured() {
    let plain = myapp_operator::dev::next_steps(false).join("\n");
    assert!(!plain.contains("default"), "{plain}");
    let with = myapp_operator::dev::next_steps(true).join("\n");
    assert!(with.contains("--default-env injected"), "{with}");
}

/// `check` against a fresh `dev`: it tells dev by the marker dev writes, passes, and reports
/// what only a cluster install has as skipped, each with the reason.
#[test]
fn check_passes_against_a_fresh_dev_and_says_what_it_skipped() {
    let state = tempfile::tempdir().unwrap();
    let dev = start_dev(state.path());
    let kubeconfig = printed(&dev, "export KUBECONFIG=").to_owned();
    let output = Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
        .args(["check", "-o", "json", "--kubeconfig", &kubeconfig])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(output.status.code(), Some(0), "{report:#}");
    let checks: Vec<&serde_json::Value> = report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["checks"].as_array().unwrap())
        .collect();
    let with = |status: &str| -> Vec<String> {
        checks
            .iter()
            .filter(|c| c["status"] == status)
            .map(|c| {
                format!(
                    "{}: {}",
                    c["id"].as_str().unwrap(),
                    c["message"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert!(
        with("fail").is_empty() && with("warn").is_empty(),
        "{report:#}"
    );
    let skipped = with("skip");
    for (id, reason) in [
        ("rbac", "no ServiceAccount"),
        ("webhook.secret", "not a Secret"),
        ("webhook.endpoints", "no pods"),
        ("cert-manager.served", "its own CA"),
        ("controller.lease", "without leader election"),
    ] {
        assert!(
            skipped
                .iter()
                .any(|s| s.starts_with(&format!("{id}: ")) && s.contains(reason)),
            "{id} is skipped because of {reason:?}: {skipped:#?}"
        );
    }
    assert_eq!(skipped.len(), 5, "{skipped:#?}");
    // What still applies to dev is checked for real: every webhook's caBundle against the
    // certificate dev serves, and the whole admission path.
    let passed = with("ok");
    for id in [
        "api.install",
        "webhook.ca-bundle.default.myapps.example.com",
        "webhook.ca-bundle.validate.myapps.example.com",
        "webhook.ca-bundle.scale.myapps.example.com",
        "webhook.denies-invalid",
        "webhook.admits-valid",
    ] {
        assert!(
            passed.iter().any(|s| s.starts_with(&format!("{id}: "))),
            "{id} passed: {passed:#?}"
        );
    }
}
