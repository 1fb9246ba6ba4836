//! What the people who run the operator see, read from a running `dev` as a monitoring system
//! and a log collector read a replica: `/metrics` and the JSON log lines.

use std::{
    collections::BTreeMap,
    fmt,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
};

use kube_sandbox::testing::{self, Kubectl, eventually};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

struct Dev {
    child: Child,
    stdout: Vec<String>,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    /// Starts `dev` with JSON logs at the default level, plus the controller's debug lines (to
    /// see a delete's trigger handled), collecting stderr line by line.
    fn start(state_dir: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
            .args([
                "dev",
                "--api-addr",
                "127.0.0.1:0",
                "--webhook-addr",
                "127.0.0.1:0",
            ])
            .args(["--admin-addr", "127.0.0.1:0", "--rollout-delay", "100ms"])
            .args(["--log-format", "json"])
            .args(["--log-level", "info,myapp_operator::controller=debug"])
            .arg("--state-dir")
            .arg(state_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start myapp-operator dev");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let mut stdout = Vec::new();
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.expect("read dev output");
            let done = line.starts_with("Ctrl-C stops everything");
            stdout.push(line);
            if done {
                break;
            }
        }
        Self {
            child,
            stdout,
            logs,
        }
    }

    fn printed(&self, prefix: &str) -> &str {
        self.stdout
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in {:?}", self.stdout))
    }

    fn admin_port(&self) -> u16 {
        self.printed("admin: http://127.0.0.1:").parse().unwrap()
    }

    fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The parsed log lines with `message` (checked for duplicate keys as they parse).
    fn logged(&self, message: &str) -> Vec<BTreeMap<String, Json>> {
        self.logs()
            .iter()
            .map(|line| strict_object(line))
            .filter(|o| o.get("message") == Some(&Json::String(message.into())))
            .collect()
    }
}

/// `GET path` on the admin server: the body of a 200.
fn get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// One scrape: each family's type, each sample's value by its name and labels as written.
struct Scrape {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, f64>,
    text: String,
}

fn scrape(port: u16) -> Scrape {
    let text = get(port, "/metrics");
    let mut types = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap();
            assert!(
                types.insert(family.to_owned(), kind.to_owned()).is_none(),
                "{family} declared twice"
            );
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').unwrap();
            samples.insert(series.to_owned(), value.parse().unwrap());
        }
    }
    Scrape {
        types,
        samples,
        text,
    }
}

impl Scrape {
    fn value(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("{series} missing from\n{}", self.text))
    }
}

const DENIED: &str =
    "myapp_webhook_requests_total{path=\"/validate-myapp\",decision=\"denied\",code=\"422\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exist_from_the_start_and_move_with_errors_and_denials_and_logs_are_strict_json() {
    let state = tempfile::tempdir().unwrap();
    let dev = Dev::start(state.path());
    let admin = dev.admin_port();

    // Every family with its type, before anything happened.
    let first = scrape(admin);
    for (family, kind) in [
        ("myapp_build", "info"),
        ("myapp_reconcile", "counter"),
        ("myapp_reconcile_errors", "counter"),
        ("myapp_reconcile_noop", "counter"),
        ("myapp_reconcile_writes", "counter"),
        ("myapp_reconcile_duration_seconds", "histogram"),
        ("myapp_reconciles_in_flight", "gauge"),
        ("myapp_reconcile_queue_depth", "gauge"),
        ("myapp_leader", "gauge"),
        ("myapp_caches_synced", "gauge"),
        ("myapp_webhook_requests", "counter"),
        ("myapp_webhook_request_duration_seconds", "histogram"),
        ("myapp_webhook_rejections", "counter"),
        ("myapp_webhook_certificate_reloads", "counter"),
        ("myapp_webhook_certificate_reload_errors", "counter"),
        (
            "myapp_webhook_certificate_expiry_timestamp_seconds",
            "gauge",
        ),
        ("process_cpu_seconds", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert_eq!(
            first.types.get(family).map(String::as_str),
            Some(kind),
            "{family}\n{}",
            first.text
        );
    }
    assert!(
        first
            .types
            .keys()
            .all(|f| f.starts_with("myapp_") || f.starts_with("process_")),
        "one prefix for the process: {:?}",
        first.types.keys()
    );
    let build = format!(
        "myapp_build_info{{version=\"{}\",git_commit=\"{}\",rustc=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        myapp_operator::version::GIT_COMMIT,
        myapp_operator::version::RUSTC
    );
    assert_eq!(first.value(&build), 1.0);
    // Labelled series a rate() alert reads are there at 0 before their first increment.
    assert_eq!(first.value("myapp_reconcile_total{result=\"error\"}"), 0.0);
    assert_eq!(first.value(DENIED), 0.0);
    for reason in ["handshake_timeout", "body_too_large"] {
        let series = format!("myapp_webhook_rejections_total{{reason=\"{reason}\"}}");
        assert_eq!(first.value(&series), 0.0);
    }
    assert!(first.value("process_resident_memory_bytes") > 0.0);
    assert!(first.value("process_open_fds") > 0.0);
    assert!(first.value("myapp_webhook_certificate_expiry_timestamp_seconds") > 0.0);

    let kubeconfig = std::fs::read_to_string(dev.printed("export KUBECONFIG=")).unwrap();
    let Some(kubectl) = Kubectl::new(&kubeconfig) else {
        return;
    };

    // A reconcile error: the API server refuses the Deployment of the MyApp `broken`, as a
    // cluster whose policy webhook is down refuses it (failurePolicy Fail, nobody listening).
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let policy = kubectl.file(
        "policy.yaml",
        &format!(
            "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: deployment-policy-down
webhooks:
  - name: policy.example.com
    clientConfig:
      url: https://127.0.0.1:{closed_port}/validate
    rules:
      - apiGroups: [apps]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: [deployments]
    matchConditions:
      - name: only-broken
        expression: object.metadata.name == 'broken'
    failurePolicy: Fail
    sideEffects: None
    admissionReviewVersions: [v1]
"
        ),
    );
    kubectl
        .ok(&["apply", "-f", testing::path_str(&policy)])
        .await;
    let broken = kubectl.file(
        "broken.yaml",
        "apiVersion: example.com/v1\nkind: MyApp\nmetadata:\n  name: broken\nspec:\n  image: ghcr.io/example/web:1.4.2\n  port: 8080\n",
    );
    kubectl
        .ok(&["apply", "-f", testing::path_str(&broken)])
        .await;
    eventually("a reconcile error is counted", || async {
        let s = scrape(admin);
        (s.value("myapp_reconcile_errors_total") >= 1.0
            && s.value("myapp_reconcile_total{result=\"error\"}") >= 1.0)
            .then_some(())
    })
    .await;

    // A denial.
    let example = |name: &str| format!("{}/deploy/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = kubectl
        .run(&[
            "apply",
            "-f",
            &example("invalid-image-digest-wrong-length.yaml"),
        ])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let s = scrape(admin);
    assert_eq!(s.value(DENIED), 1.0, "{}", s.text);
    assert!(
        s.value("myapp_webhook_request_duration_seconds_count{path=\"/validate-myapp\"}") >= 1.0
    );

    // A normal life: created, reconciled, deleted; the delete's child events find it gone.
    kubectl.ok(&["apply", "-f", &example("myapp.yaml")]).await;
    eventually("web is reconciled", || async {
        (!dev.logged("Applied Service").is_empty()
            && scrape(admin).value("myapp_reconcile_total{result=\"success\"}")
                + scrape(admin).value("myapp_reconcile_total{result=\"requeue\"}")
                >= 1.0)
            .then_some(())
    })
    .await;
    kubectl.ok(&["delete", "myapp", "web"]).await;
    eventually("the delete's triggers are handled", || async {
        (!dev.logged("MyApp gone, nothing to reconcile").is_empty()).then_some(())
    })
    .await;

    let logs = dev.logs();
    assert!(!logs.is_empty());
    for line in &logs {
        let object = strict_object(line);
        for key in ["timestamp", "level", "message"] {
            assert!(object.contains_key(key), "no {key}: {line}");
        }
        for (key, value) in flattened(&object) {
            if key.ends_with("namespace") || key.ends_with("name") {
                let Json::String(text) = value else {
                    panic!("{key} is not a string: {line}")
                };
                assert!(!text.starts_with("Some("), "{key}: {line}");
            }
        }
        let level = &object["level"];
        if *level == Json::String("WARN".into()) || *level == Json::String("ERROR".into()) {
            // The only trouble this session had is the refused Deployment of `broken`: the
            // sandbox failing to call the policy webhook, the operator retrying.
            assert!(
                line.contains("broken") || line.contains("policy.example.com"),
                "unexpected {level:?}: {line}"
            );
        }
    }
    // A denial, at info, says who asked what and why it was refused.
    let denied = dev.logged("Denied");
    assert_eq!(denied.len(), 1, "{logs:#?}");
    let denied = &denied[0];
    assert_eq!(denied["level"], Json::String("INFO".into()));
    assert_eq!(denied["operation"], Json::String("CREATE".into()));
    assert_eq!(denied["namespace"], Json::String("default".into()));
    assert_eq!(denied["name"], Json::String("web".into()));
    let Json::String(uid) = &denied["uid"] else {
        panic!("{denied:?}")
    };
    assert!(!uid.is_empty());
    let Json::String(reasons) = &denied["reasons"] else {
        panic!("{denied:?}")
    };
    assert!(
        reasons.starts_with("spec.image: Invalid value:"),
        "{reasons}"
    );
    // What deploy/README.md tells admins to look for is logged at the default level (info).
    for message in [
        "Caches synced",
        "Applied Deployment",
        "Applied Service",
        "Denied",
        "Reconcile failed, retrying",
    ] {
        let lines = dev.logged(message);
        assert!(!lines.is_empty(), "no {message:?} line in {logs:#?}");
        assert!(
            lines
                .iter()
                .all(|l| matches!(&l["level"], Json::String(s) if s == "INFO" || s == "WARN")),
            "{message}: {lines:?}"
        );
    }
}

/// Every key of `object` and of the objects inside it, with its value.
fn flattened(object: &BTreeMap<String, Json>) -> Vec<(String, &Json)> {
    let mut out = Vec::new();
    for (key, value) in object {
        match value {
            Json::Object(inner) => out.extend(flattened(inner)),
            Json::Array(items) => {
                for item in items {
                    if let Json::Object(inner) = item {
                        out.extend(flattened(inner));
                    }
                }
            }
            _ => {}
        }
        out.push((key.clone(), value));
    }
    out
}

/// A log line parsed as a JSON object, failing on a duplicate key at any depth.
fn strict_object(line: &str) -> BTreeMap<String, Json> {
    match serde_json::from_str::<Json>(line) {
        Ok(Json::Object(object)) => object,
        Ok(other) => panic!("not a JSON object: {other:?}: {line}"),
        Err(e) => panic!("{e}: {line}"),
    }
}

/// JSON as `serde_json::Value`, except that an object with a key twice does not parse
/// (`Value` keeps the last one silently).
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v as f64))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v as f64))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Number(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut object = BTreeMap::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            object.insert(key, value);
        }
        Ok(Json::Object(object))
    }
}

#[test]
fn the_strict_parser_refuses_a_duplicate_key_that_value_keeps_silently() {
    let line = r#"{"spans":[{"name":"reconcile","name":"web"}],"message":"x"}"#;
    assert!(serde_json::from_str::<serde_json::Value>(line).is_ok());
    let error = serde_json::from_str::<Json>(line).unwrap_err();
    assert!(
        error.to_string().contains("duplicate key \"name\""),
        "{error}"
    );
}
