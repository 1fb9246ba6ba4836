//! Certificate rotation the way the kubelet does it, under load.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use rustls_pki_types::CertificateDer;
use webhook::Metrics;

use super::support::{Pki, SecretDir, client, fixture, router, start, tls_connect};

const PATIENCE: Duration = Duration::from_secs(30);

async fn served_leaf(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> CertificateDer<'static> {
    let tls = tls_connect(addr, config).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// Waits until new connections are served `expected` (bounded, so a bug fails, not hangs).
async fn until_served(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    expected: &CertificateDer<'_>,
) {
    let wait = async {
        while served_leaf(addr, config.clone()).await != *expected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the new certificate was never served");
}

async fn until_reload_errors(metrics: &Metrics, count: u64) {
    let wait = async {
        while metrics.cert_reload_errors() < count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the bad pair was never noticed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotations_reach_new_connections_bad_pairs_keep_the_old_one_and_no_request_fails() {
    let pki = Pki::new();
    let first = pki.pair();
    let dir = SecretDir::new(&first);
    let server = start(&dir, router(&Metrics::new()), |config| {
        config.cert_poll_interval = Duration::from_secs(1);
    })
    .await;
    let addr = server.addr();
    let config = pki.client_config(&[b"http/1.1"]);
    assert_eq!(served_leaf(addr, config.clone()).await, first.leaf);

    // Load during every rotation: one pooled connection plus a fresh connection per round.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, config) = (stop.clone(), config.clone());
        tokio::spawn(async move {
            let mut pooled = client(addr, config.clone()).await.unwrap();
            let (mut answered, mut failures) = (0u32, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match pooled.post("/validate", fixture("create.json")).await {
                    Ok(answer) if answer.status == 200 => answered += 1,
                    other => failures.push(format!("pooled: {:?}", other.map(|a| a.status))),
                }
                match client(addr, config.clone()).await {
                    Ok(mut fresh) => match fresh.post("/mutate", fixture("create.json")).await {
                        Ok(answer) if answer.status == 200 => answered += 1,
                        other => failures.push(format!("fresh: {:?}", other.map(|a| a.status))),
                    },
                    Err(error) => failures.push(format!("connect: {error}")),
                }
            }
            (answered, failures)
        })
    };

    let second = pki.pair();
    dir.publish(&second);
    until_served(addr, &config, &second.leaf).await;
    assert_eq!(server.metrics.cert_reloads(), 1);

    // A key that belongs to another certificate: refused, the second pair keeps serving.
    let third = pki.pair();
    dir.publish_files(&third.cert_pem, &second.key_pem);
    until_reload_errors(&server.metrics, 1).await;
    assert_eq!(served_leaf(addr, config.clone()).await, second.leaf);

    // A half-written certificate: refused too.
    dir.publish_files("-----BEGIN CERTIFICATE-----\nMIIB", &third.key_pem);
    until_reload_errors(&server.metrics, 2).await;
    assert_eq!(served_leaf(addr, config.clone()).await, second.leaf);

    // Well-formed pairs that are not valid now: an expired one, then a not-yet-valid one.
    dir.publish(&pki.pair_valid(2020, 2021));
    until_reload_errors(&server.metrics, 3).await;
    assert_eq!(served_leaf(addr, config.clone()).await, second.leaf);
    dir.publish(&pki.pair_valid(2090, 2091));
    until_reload_errors(&server.metrics, 4).await;
    assert_eq!(served_leaf(addr, config.clone()).await, second.leaf);

    let fourth = pki.pair();
    dir.publish(&fourth);
    until_served(addr, &config, &fourth.leaf).await;

    stop.store(true, Ordering::Relaxed);
    let (answered, failures) = load.await.unwrap();
    assert!(
        failures.is_empty(),
        "requests failed during rotation: {failures:?}"
    );
    assert!(answered > 0);
    assert_eq!(server.metrics.cert_reload_errors(), 4);
    assert_eq!(
        server.metrics.cert_reloads(),
        2,
        "only the valid pairs were loaded"
    );
}

#[tokio::test]
async fn a_replaced_directory_is_picked_up_by_the_poll() {
    // Renaming the watched directory away loses the inotify watch: only the poll can notice.
    let pki = Pki::new();
    let first = pki.pair();
    let root = tempfile::tempdir().unwrap();
    let certs = root.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(certs.join("tls.crt"), &first.cert_pem).unwrap();
    std::fs::write(certs.join("tls.key"), &first.key_pem).unwrap();

    super::support::install_crypto_provider();
    let mut server_config = webhook::ServerConfig::new("127.0.0.1:0".parse().unwrap(), &certs);
    server_config.cert_poll_interval = Duration::from_millis(300);
    let (_shutdown, signal) = tokio::sync::oneshot::channel::<()>();
    let handle = webhook::serve(
        server_config,
        axum::Router::new(),
        Metrics::new(),
        async move {
            let _ = signal.await;
        },
    )
    .await
    .unwrap();

    let second = pki.pair();
    let staged = root.path().join("staged");
    std::fs::create_dir(&staged).unwrap();
    std::fs::write(staged.join("tls.crt"), &second.cert_pem).unwrap();
    std::fs::write(staged.join("tls.key"), &second.key_pem).unwrap();
    std::fs::rename(&certs, root.path().join("old")).unwrap();
    std::fs::rename(&staged, &certs).unwrap();

    until_served(
        handle.local_addr(),
        &pki.client_config(&[b"http/1.1"]),
        &second.leaf,
    )
    .await;
}
