//! `myapp-operator run` as a child process: SIGTERM while webhook requests stream in.

#[path = "support/process.rs"]
mod process;

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use kube::{
    Api, CustomResourceExt,
    api::{Patch, PatchParams},
};
use myapp_operator::crd::MyApp;
use process::{Reap, log_lines, wait_for_addr};
use serde_json::json;
use tokio::net::TcpStream;

const DRAIN: Duration = Duration::from_secs(2);

struct Client {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    async fn connect(&self) -> std::io::Result<SendRequest<Full<Bytes>>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let stream = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(connection);
        Ok(sender)
    }
}

fn review(uid: u64) -> Bytes {
    let object = json!({"apiVersion": "example.com/v1", "kind": "MyApp", "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"replicas": 2, "image": "ghcr.io/example/web:1.4.2", "port": 8080}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": format!("uid-{uid}"), "kind": {"group": "example.com", "version": "v1", "kind": "MyApp"},
        "resource": {"group": "example.com", "version": "v1", "resource": "myapps"},
        "name": "web", "namespace": "default", "operation": "CREATE", "userInfo": {"username": "test"},
        "object": object, "oldObject": null, "dryRun": false}});
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drops_no_webhook_request_and_exits_zero() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let sandbox = kube_sandbox::Sandbox::new();
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, served.kubeconfig()).unwrap();
    let client = kube::Client::new(sandbox.router(), "default");
    let crd = MyApp::crd();
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client)
        .patch("myapps.example.com", &PatchParams::apply("test"), &Patch::Apply(&crd))
        .await
        .unwrap();
    let bundle = myapp_operator::certs::generate(&["localhost".to_owned()]).unwrap();
    bundle.write_to(&dir.path().join("certs")).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
        .args([
            "run",
            "--webhook-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--leader-elect=false",
        ])
        .args([
            "--drain-delay",
            &format!("{}s", DRAIN.as_secs()),
            "--log-format",
            "json",
        ])
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start myapp-operator run");
    let lines = log_lines(&mut child);
    let child = Reap(child);
    let admin = wait_for_addr(&lines, "Admin server listening");
    let webhook = wait_for_addr(&lines, "Webhook serving");

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::pem::PemObject::from_pem_slice(bundle.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client = Arc::new(Client {
        addr: webhook,
        tls: Arc::new(tls),
    });

    // Four keep-alive connections send reviews back to back, like the API server's pool.
    let sending = Arc::new(AtomicBool::new(true));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut senders = Vec::new();
    for worker in 0..4u64 {
        let (client, sending, answered, failed) = (
            client.clone(),
            sending.clone(),
            answered.clone(),
            failed.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut conn = client.connect().await.expect("connect before shutdown");
            let mut uid = worker * 1_000_000;
            while sending.load(Ordering::SeqCst) {
                if conn.ready().await.is_err() {
                    // The server closed this connection (Connection: close): open another.
                    conn = client
                        .connect()
                        .await
                        .expect("the listener accepts during the drain delay");
                    continue;
                }
                uid += 1;
                let request = hyper::Request::post("/validate-myapp?timeout=5s")
                    .header("host", "localhost")
                    .header("content-type", "application/json")
                    .body(Full::new(review(uid)))
                    .unwrap();
                match conn.send_request(request).await {
                    Ok(response) if response.status() == 200 => {
                        let body = response.into_body().collect().await.unwrap().to_bytes();
                        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        assert_eq!(answer["response"]["uid"], format!("uid-{uid}"));
                        assert_eq!(answer["response"]["allowed"], true);
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = answered.load(Ordering::SeqCst);
    assert!(before > 0, "requests are answered before shutdown");

    let kill = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // Readiness drops at once, while the webhook keeps answering.
    let mut unready = false;
    for _ in 0..50 {
        let status = readyz(admin).await;
        if status == Some(503) {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(unready, "/readyz turns 503 after SIGTERM");
    let at_sigterm = answered.load(Ordering::SeqCst);
    // The API server stops picking this pod once it leaves the endpoints: stop sending a bit
    // before the drain delay ends, as it would.
    tokio::time::sleep(DRAIN - Duration::from_millis(500)).await;
    sending.store(false, Ordering::SeqCst);
    for sender in senders {
        sender.await.unwrap();
    }
    assert!(
        answered.load(Ordering::SeqCst) > at_sigterm,
        "requests were answered during the drain delay"
    );
    assert_eq!(failed.load(Ordering::SeqCst), 0, "no request failed");

    let status = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.0.wait()
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "the operator exits 0 after a graceful shutdown"
    );
    served.shutdown().await.unwrap();
}

async fn readyz(admin: SocketAddr) -> Option<u16> {
    let tcp = TcpStream::connect(admin).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/readyz")
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .ok()?;
    Some(sender.send_request(request).await.ok()?.status().as_u16())
}
