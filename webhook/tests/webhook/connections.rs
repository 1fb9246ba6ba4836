//! The connection model over real sockets: every wait before a request is bounded, the cap sheds
//! waiting connections instead of refusing clients, a drain loses no request, and a refused
//! body's answer reaches a client that sent it all.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, routing::post};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    sync::{Notify, mpsc},
    time::timeout,
};
use webhook::metrics::Rejection;

use super::support::{Pki, SecretDir, client, fixture, router, start, tls_connect};

/// Upper bound on waiting for something that must happen; a hang fails instead of blocking.
const PATIENCE: Duration = Duration::from_secs(20);

/// Reads until the server closes; panics if it does not within `PATIENCE`.
async fn closed_by_server(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Vec<u8> {
    let mut rest = Vec::new();
    let _ = timeout(PATIENCE, stream.read_to_end(&mut rest))
        .await
        .expect("the server must close the connection");
    rest
}

#[tokio::test]
async fn a_connection_that_handshakes_and_sends_nothing_is_closed_after_the_first_request_timeout()
{
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |config| {
        config.first_request_timeout = Duration::from_millis(200);
    })
    .await;
    let mut tls = tls_connect(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    closed_by_server(&mut tls).await;
    assert_eq!(server.metrics.rejections(Rejection::FirstRequestTimeout), 1);
    assert_eq!(server.metrics.rejections(Rejection::HeaderTimeout), 0);
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408_after_the_body_read_timeout() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |config| {
        config.body_read_timeout = Duration::from_millis(200);
    })
    .await;
    let mut tls = tls_connect(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    tls.write_all(
        b"POST /validate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"apiVersion\":",
    )
    .await
    .unwrap();
    let answer = String::from_utf8_lossy(&closed_by_server(&mut tls).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert_eq!(server.metrics.rejections(Rejection::BodyTimeout), 1);
}

#[tokio::test]
async fn a_client_is_served_while_the_cap_is_full_of_waiting_connections() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |config| {
        config.max_connections = 6;
    })
    .await;
    let addr = server.addr();
    let config = pki.client_config(&[b"http/1.1"]);
    // Fill the cap: two that never send a ClientHello, two silent after the handshake, two
    // slow heads. Each waits until the server holds it (the next one's accept proves nothing).
    let mut silent_tcp = Vec::new();
    for _ in 0..2 {
        silent_tcp.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tls_connect(addr, config.clone()).await.unwrap());
    }
    for _ in 0..2 {
        let mut slow = tls_connect(addr, config.clone()).await.unwrap();
        slow.write_all(b"POST /validate HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        held.push(slow);
    }

    // Each newcomer stays connected, so each one needs a slot shed.
    let mut served = Vec::new();
    for round in 0..3 {
        let mut legit = timeout(PATIENCE, client(addr, config.clone()))
            .await
            .unwrap()
            .unwrap();
        let answer = timeout(PATIENCE, legit.post("/validate", fixture("create.json")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.status, 200, "round {round}");
        served.push(legit);
    }
    // The longest-waiting went first: both silent TCP connections, then the first silent TLS
    // one; the served clients, idle keep-alive connections now, were not shed.
    for tcp in &mut silent_tcp {
        assert!(closed_by_server(tcp).await.is_empty());
    }
    closed_by_server(&mut held[0]).await;
    assert_eq!(server.metrics.rejections(Rejection::Shed), 3);
    for legit in &mut served {
        let answer = legit.post("/validate", fixture("create.json")).await;
        assert_eq!(answer.unwrap().status, 200);
    }
}

#[tokio::test]
async fn at_the_cap_a_connection_waiting_for_its_request_goes_before_an_idle_keep_alive_one() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |config| {
        config.max_connections = 2;
    })
    .await;
    let addr = server.addr();
    let config = pki.client_config(&[b"http/1.1"]);
    let mut pooled = client(addr, config.clone()).await.unwrap();
    let answer = pooled.post("/validate", fixture("create.json")).await;
    assert_eq!(answer.unwrap().status, 200);
    // Newer than the pooled one, but it has not sent a request.
    let mut silent = tls_connect(addr, config.clone()).await.unwrap();

    let mut fresh = client(addr, config.clone()).await.unwrap();
    let answer = fresh.post("/validate", fixture("create.json")).await;
    assert_eq!(answer.unwrap().status, 200);
    closed_by_server(&mut silent).await;
    let answer = pooled.post("/validate", fixture("create.json")).await;
    assert_eq!(answer.unwrap().status, 200, "the keep-alive one stays");
    assert_eq!(server.metrics.rejections(Rejection::Shed), 1);
}

#[tokio::test]
async fn at_the_cap_a_new_connection_waits_while_every_connection_answers_a_request() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let (entered, mut inside) = mpsc::channel::<()>(1);
    let release = Arc::new(Notify::new());
    let hold = {
        let release = release.clone();
        Router::new()
            .route(
                "/hold",
                post(move || {
                    let (entered, release) = (entered.clone(), release.clone());
                    async move {
                        let _ = entered.send(()).await;
                        release.notified().await;
                        "done"
                    }
                }),
            )
            .merge(router(&webhook::Metrics::new()))
    };
    let server = start(&dir, hold, |config| config.max_connections = 1).await;
    let addr = server.addr();
    let config = pki.client_config(&[b"http/1.1"]);
    let mut busy = client(addr, config.clone()).await.unwrap();
    let in_flight = tokio::spawn(async move { busy.post("/hold", b"{}".to_vec()).await });
    inside.recv().await.unwrap();

    let second = tokio::spawn(tls_connect(addr, config.clone()));
    // An observation window, not a synchronisation: nothing may happen in it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "a busy connection is never shed");
    release.notify_one();
    assert_eq!(in_flight.await.unwrap().unwrap().status, 200);
    timeout(PATIENCE, second).await.unwrap().unwrap().unwrap();
    assert_eq!(server.metrics.rejections(Rejection::Shed), 0);
}

#[tokio::test]
async fn clients_sending_continuously_through_a_shutdown_see_no_error() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let draining = start(&dir, router(&webhook::Metrics::new()), |config| {
        config.drain_delay = Duration::from_millis(500);
    })
    .await;
    let staying = start(&dir, router(&webhook::Metrics::new()), |_| {}).await;
    // The Service: new connections go to the draining replica until it leaves the endpoints.
    let endpoint = Arc::new(Mutex::new(draining.addr()));
    let config = pki.client_config(&[b"http/1.1"]);
    let stop = Arc::new(AtomicBool::new(false));
    let (errors, told_to_close) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (sent_before, mut started) = mpsc::channel::<()>(10);
    let mut workers = Vec::new();
    for _ in 0..10 {
        let (endpoint, config, stop) = (endpoint.clone(), config.clone(), stop.clone());
        let (errors, told_to_close) = (errors.clone(), told_to_close.clone());
        let sent_before = sent_before.clone();
        workers.push(tokio::spawn(async move {
            let mut connection = None;
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                let addr: SocketAddr = *endpoint.lock().unwrap();
                let mut client = match connection.take() {
                    Some(client) => client,
                    None => client(addr, config.clone()).await.unwrap(),
                };
                match client.post("/validate", fixture("create.json")).await {
                    Ok(answer) if answer.status == 200 => {
                        if answer
                            .headers
                            .get("connection")
                            .is_some_and(|v| v == "close")
                        {
                            told_to_close.fetch_add(1, Ordering::Relaxed);
                        } else {
                            connection = Some(client);
                        }
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                sent += 1;
                if sent == 5 {
                    let _ = sent_before.send(()).await;
                }
            }
        }));
    }
    for _ in 0..10 {
        started.recv().await.unwrap();
    }
    draining.shutdown.send(()).unwrap();
    *endpoint.lock().unwrap() = staying.addr();
    timeout(PATIENCE, draining.handle.wait())
        .await
        .unwrap()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    // Every worker's pooled connection to the draining replica was told to close.
    assert!(told_to_close.load(Ordering::Relaxed) >= 10);
    assert!(
        staying
            .metrics
            .requests("/validate", webhook::Decision::Allowed, 200)
            > 0
    );
}

#[tokio::test]
async fn a_client_that_sends_its_whole_over_limit_body_reads_the_413() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |config| {
        // Encrypting 8 MiB in a debug build takes a while; the default bound is for release.
        config.linger = PATIENCE;
    })
    .await;
    let mut tls = tls_connect(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    let size = 8 * 1024 * 1024;
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {size}\r\n\r\n"
    );
    // Like a client that writes the whole request before it reads.
    tls.write_all(head.as_bytes()).await.unwrap();
    timeout(PATIENCE, tls.write_all(&vec![b' '; size]))
        .await
        .unwrap()
        .expect("the server keeps reading until the client had its say");
    tls.flush().await.unwrap();
    let answer = String::from_utf8_lossy(&closed_by_server(&mut tls).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"code\":413"), "{answer}");
    assert_eq!(server.metrics.rejections(Rejection::BodyTooLarge), 1);
}
