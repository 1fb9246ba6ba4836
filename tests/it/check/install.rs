//! A whole installation on the sandbox, shaped as `deploy/` and cert-manager leave one: the CRD,
//! `deploy/base/rbac.yaml` enforced, the webhook configurations with the CA injected, the Service
//! with its EndpointSlice, the serving certificate in its Secret (and a Ready Certificate
//! beside it), the real `myapp-operator run` serving and leading as the ServiceAccount, and its
//! Pod and Deployment objects as the kubelet and `kubectl apply` would leave them.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc::Receiver,
    time::Duration,
};

use crate::support::install::{apply, client_for, deploy_documents as documents, rbac_documents};
use base64::Engine;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Pod, discovery::v1::EndpointSlice},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use kube_sandbox::{
    admission::ServiceRef,
    testing::{Reap, eventually, log_lines, wait_for_addr},
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use serde_json::{Value, json};

pub const NS: &str = "myapp-system";
pub const SERVICE: &str = "myapp-operator-webhook";
pub const IDENTITY: &str = "myapp-operator-7d9f-abcde";

/// Midnight UTC, `offset` days from today, as rcgen takes it.
macro_rules! day {
    ($offset:expr) => {{
        let date = k8s_openapi::jiff::Timestamp::now()
            .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
            .date()
            .checked_add(k8s_openapi::jiff::Span::new().days($offset))
            .unwrap();
        rcgen::date_time_ymd(i32::from(date.year()), date.month() as u8, date.day() as u8)
    }};
}

/// A CA made for the test, and serving certificates it signs with any validity.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new() -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "check test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        params.not_before = day!(-1);
        params.not_after = day!(3650);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        Self {
            ca: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// (cert, key) PEM for the webhook Service's names, valid from `from` to `until` days
    /// relative to today.
    pub fn serving(&self, from: i64, until: i64) -> (String, String) {
        let mut params = CertificateParams::default();
        params.subject_alt_names = myapp_operator::certs::service_sans(SERVICE, NS)
            .into_iter()
            .chain(["localhost".to_owned()])
            .map(|san| SanType::DnsName(san.try_into().unwrap()))
            .collect();
        params.not_before = day!(from);
        params.not_after = day!(until);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A healthy installation, and the means to break it.
pub struct Install {
    pub sandbox: kube_sandbox::Sandbox,
    pub served: kube_sandbox::Served,
    pub admin: Client,
    pub pki: Pki,
    pub dir: tempfile::TempDir,
    pub replica: Option<Reap>,
    pub webhook: Option<SocketAddr>,
}

/// A stand-in CRD for cert-manager's Certificate (the real one comes with cert-manager).
fn certificate_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "certificates.cert-manager.io"},
        "spec": {"group": "cert-manager.io", "scope": "Namespaced",
                 "names": {"kind": "Certificate", "plural": "certificates", "singular": "certificate"},
                 "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {
                         "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                         "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    }))
    .unwrap()
}

impl Install {
    /// The API server with `deploy/base/rbac.yaml` and the CRD only (enough for the RBAC checks).
    pub async fn bare() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let sandbox = kube_sandbox::Sandbox::builder()
            .namespace(NS)
            .service_account_token("replica-0", NS, "myapp-operator")
            .rollout_delay(Duration::from_millis(50))
            .build();
        let served = sandbox
            .serve_tls("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let admin = client_for(&served.kubeconfig()).await;
        apply(&admin, rbac_documents()).await;
        Api::<CustomResourceDefinition>::all(admin.clone())
            .create(&PostParams::default(), &myapp_operator::crd::stamped_crd())
            .await
            .unwrap();
        Self {
            sandbox,
            served,
            admin,
            pki: Pki::new(),
            dir: tempfile::tempdir().unwrap(),
            replica: None,
            webhook: None,
        }
    }

    /// Everything, healthy, with one MyApp running.
    pub async fn healthy() -> Self {
        let mut install = Self::bare().await;
        let admin = install.admin.clone();
        Api::<CustomResourceDefinition>::all(admin.clone())
            .create(&PostParams::default(), &certificate_crd())
            .await
            .unwrap();
        let ca = base64::engine::general_purpose::STANDARD.encode(install.pki.ca_pem());
        let mut hooks = documents("base/webhooks.yaml");
        for config in &mut hooks {
            // As deploy/kustomization.yaml renders them, and cert-manager's injector fills them.
            config["metadata"]["annotations"] = json!({
                "cert-manager.io/inject-ca-from": "myapp-system/myapp-operator-webhook"
            });
            for hook in config["webhooks"].as_array_mut().unwrap() {
                hook["clientConfig"]["caBundle"] = json!(ca);
            }
        }
        apply(&admin, hooks).await;
        apply(&admin, documents("base/services.yaml")).await;
        let (cert, key) = install.pki.serving(-1, 90);
        install.put_secret(&cert, &key).await;
        apply(
            &admin,
            vec![json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                "metadata": {"name": "myapp-operator-webhook", "namespace": NS},
                "spec": {"secretName": "myapp-operator-webhook-tls"},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                           "message": "Certificate is up to date and has not expired"}]}})],
        )
        .await;
        // The Deployment as `kubectl apply` leaves it: what the check reads its defaults from.
        apply(
            &admin,
            vec![json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "myapp-operator", "namespace": NS},
                "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "myapp-operator"}},
                         "template": {"metadata": {"labels": {"app.kubernetes.io/name": "myapp-operator"}},
                                      "spec": {"containers": [{"name": "operator", "image": "myapp-operator:test",
                                                               "args": ["run", "--default-env=TEAM=shop"]}]}}}})],
        )
        .await;

        let (replica, lines) = install.spawn_replica(&cert, &key);
        install.replica = Some(replica);
        let webhook = wait_for_addr(&lines, "Webhook serving");
        // Keep draining the log so the child never blocks on a full pipe.
        std::thread::spawn(move || while lines.recv().is_ok() {});
        install.webhook = Some(webhook);
        install.publish_endpoint(true).await;

        // The pod the kubelet runs, Ready.
        let pods = Api::<Pod>::namespaced(admin.clone(), NS);
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": IDENTITY, "namespace": NS},
            "spec": {"containers": [{"name": "operator", "image": "myapp-operator:test"}]}}))
            .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        pods.patch_status(
            IDENTITY,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();

        let leases = Api::<Lease>::namespaced(admin.clone(), NS);
        eventually("the replica leads", || async {
            let lease = leases.get_opt("myapp-operator").await.ok()??;
            (lease.spec?.holder_identity.as_deref() == Some(IDENTITY)).then_some(())
        })
        .await;
        let apps = Api::<myapp_operator::crd::MyApp>::namespaced(admin.clone(), "default");
        let app = myapp_operator::crd::MyApp::test("web");
        apps.create(&PostParams::default(), &app).await.unwrap();
        crate::support::converge::converged(&apps, "web", myapp_operator::crd::Phase::Running)
            .await;
        install
    }

    /// Starts `myapp-operator run` as the ServiceAccount (leader election on, JSON logs),
    /// serving `cert`; its log lines arrive on the receiver.
    pub fn spawn_replica(&self, cert: &str, key: &str) -> (Reap, Receiver<String>) {
        self.spawn_replica_with(cert, key, &[])
    }

    /// [`Install::spawn_replica`] with `extra` flags.
    pub fn spawn_replica_with(
        &self,
        cert: &str,
        key: &str,
        extra: &[&str],
    ) -> (Reap, Receiver<String>) {
        let cert_dir = self.dir.path().join("tls");
        std::fs::create_dir_all(&cert_dir).unwrap();
        std::fs::write(cert_dir.join("tls.crt"), cert).unwrap();
        std::fs::write(cert_dir.join("tls.key"), key).unwrap();
        let kubeconfig = self.dir.path().join("kubeconfig-replica");
        std::fs::write(
            &kubeconfig,
            self.served.kubeconfig_for_token("replica-0").unwrap(),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
            .args([
                "run",
                "--webhook-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
            ])
            .args([
                "--log-format",
                "json",
                "--identity",
                IDENTITY,
                "--default-env",
                "TEAM=shop",
            ])
            .arg("--cert-dir")
            .arg(&cert_dir)
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = log_lines(&mut child);
        (Reap(child), lines)
    }

    /// Replaces the webhook's Secret with this certificate and key.
    pub async fn put_secret(&self, cert: &str, key: &str) {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "myapp-operator-webhook-tls", "namespace": NS},
            "stringData": {"tls.crt": cert, "tls.key": key}});
        let data = json!({"tls.crt": base64::engine::general_purpose::STANDARD.encode(cert),
                          "tls.key": base64::engine::general_purpose::STANDARD.encode(key)});
        let mut secret = secret;
        secret["data"] = data;
        secret.as_object_mut().unwrap().remove("stringData");
        let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.admin.clone(), NS);
        let _ = api
            .delete("myapp-operator-webhook-tls", &Default::default())
            .await;
        apply(&self.admin, vec![secret]).await;
    }

    /// Tells both the API server's webhook client and the EndpointSlice whether the one
    /// replica is Ready, as the endpoint controllers would.
    pub async fn publish_endpoint(&self, ready: bool) {
        let address = self.webhook.unwrap();
        self.sandbox
            .admission()
            .set_endpoints(ServiceRef::new(NS, SERVICE, 443), vec![(address, ready)]);
        let slice: EndpointSlice = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "myapp-operator-webhook-x1", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": SERVICE}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address.ip().to_string()], "conditions": {"ready": ready},
                           "targetRef": {"kind": "Pod", "name": IDENTITY, "namespace": NS}}],
            "ports": [{"name": "https", "port": address.port(), "protocol": "TCP"}],
        }))
        .unwrap();
        Api::<EndpointSlice>::namespaced(self.admin.clone(), NS)
            .patch(
                "myapp-operator-webhook-x1",
                &PatchParams::apply("endpointslice-controller").force(),
                &Patch::Apply(&slice),
            )
            .await
            .unwrap();
    }

    /// Runs `myapp-operator check` with `args` and the admin's kubeconfig.
    pub async fn check(&self, args: &[&str]) -> Ran {
        let kubeconfig: PathBuf = self.dir.path().join("kubeconfig-admin");
        std::fs::write(&kubeconfig, self.served.kubeconfig()).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_myapp-operator"));
        command
            .arg("check")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG");
        let output = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        Ran {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    /// `check -o json`, parsed.
    pub async fn report(&self) -> Report {
        let ran = self.check(&["-o", "json"]).await;
        let json: Value = serde_json::from_str(&ran.stdout).unwrap_or_else(|e| {
            panic!(
                "check printed no JSON ({e}): {}\n{}",
                ran.stdout, ran.stderr
            )
        });
        for docs in json["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["checks"].as_array().unwrap())
            .filter_map(|c| c["docs"].as_str())
        {
            let anchor = docs.strip_prefix("deploy/README.md#").unwrap();
            assert!(
                readme_anchors().contains(anchor),
                "{docs} names no heading of deploy/README.md"
            );
        }
        Report { ran, json }
    }
}

#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A parsed `check -o json`.
pub struct Report {
    pub ran: Ran,
    pub json: Value,
}

impl Report {
    /// Every check as (id, status, message, hint).
    pub fn checks(&self) -> Vec<(String, String, String, String)> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        self.json["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["checks"].as_array().unwrap())
            .map(|c| {
                (
                    text(&c["id"]),
                    text(&c["status"]),
                    text(&c["message"]),
                    text(&c["hint"]),
                )
            })
            .collect()
    }

    /// The ids of failed checks.
    pub fn failed(&self) -> Vec<String> {
        self.with_status("fail")
    }

    pub fn with_status(&self, status: &str) -> Vec<String> {
        self.checks()
            .into_iter()
            .filter(|c| c.1 == status)
            .map(|c| c.0)
            .collect()
    }

    /// The check with `id`: (status, message, hint).
    pub fn get(&self, id: &str) -> (String, String, String) {
        let (_, status, message, hint) = self
            .checks()
            .into_iter()
            .find(|c| c.0 == id)
            .unwrap_or_else(|| panic!("no check {id} in {}", self.json));
        (status, message, hint)
    }
}

/// The anchors GitHub makes of deploy/README.md's headings.
fn readme_anchors() -> std::collections::BTreeSet<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/README.md")).unwrap();
    readme
        .lines()
        .filter(|l| l.starts_with("## ") || l.starts_with("### "))
        .map(|l| l.trim_start_matches('#').trim().to_lowercase())
        .map(|l| {
            l.chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}
