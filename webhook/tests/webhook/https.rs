//! Real HTTPS on 127.0.0.1:0 with certificates generated at test time.

use std::time::Duration;

use axum::{Router, routing::post};
use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::timeout,
};
use webhook::metrics::Rejection;

use super::support::{Pki, SecretDir, client, fixture, router, start, tls_connect};

/// Upper bound on waiting for something that must happen; a hang fails instead of blocking.
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_client_trusting_the_ca_gets_http_1_1_and_an_answer() {
    let pki = Pki::new();
    let pair = pki.pair();
    let dir = SecretDir::new(&pair);
    let server = start(&dir, router(&webhook::Metrics::new()), |_| {}).await;

    let tls = tls_connect(server.addr(), pki.client_config(&[b"h2", b"http/1.1"]))
        .await
        .unwrap();
    let (_, session) = tls.get_ref();
    assert_eq!(session.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(session.peer_certificates().unwrap()[0], pair.leaf);
    drop(tls);

    let mut client = client(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    for _ in 0..3 {
        // Several requests on one keep-alive connection.
        let answer = client
            .post("/validate?timeout=10s", fixture("create.json"))
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.response()["allowed"], true);
    }
    assert_eq!(
        server
            .metrics
            .requests("/validate", webhook::Decision::Allowed, 200),
        3
    );
    assert!(server.handle.certs().not_after() > 0);
}

#[tokio::test]
async fn a_client_offering_only_h2_is_refused() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, Router::new(), |_| {}).await;
    let result = tls_connect(server.addr(), pki.client_config(&[b"h2"])).await;
    assert!(
        result.is_err(),
        "no shared ALPN protocol must fail the handshake"
    );
}

#[tokio::test]
async fn a_client_not_trusting_the_ca_fails_the_handshake() {
    let dir = SecretDir::new(&Pki::new().pair());
    let server = start(&dir, Router::new(), |_| {}).await;
    let stranger = Pki::new();
    let result = tls_connect(server.addr(), stranger.client_config(&[b"http/1.1"])).await;
    assert!(result.is_err());
}

/// A TLS 1.0 ClientHello offering only TLS 1.0/1.1 cipher suites and no supported_versions.
fn legacy_client_hello(version: u8) -> Vec<u8> {
    let mut hello = vec![0x03, version];
    hello.extend([0x42; 32]); // random
    hello.push(0); // session id
    hello.extend([0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]); // ECDHE-RSA-AES128-SHA, AES128-SHA
    hello.extend([0x01, 0x00]); // null compression
    let mut handshake = vec![0x01, 0x00];
    handshake.extend(u16::try_from(hello.len()).unwrap().to_be_bytes());
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend(u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend(handshake);
    record
}

#[tokio::test]
async fn tls_below_1_2_is_refused() {
    let dir = SecretDir::new(&Pki::new().pair());
    let server = start(&dir, Router::new(), |_| {}).await;
    for version in [0x01, 0x02] {
        let mut tcp = TcpStream::connect(server.addr()).await.unwrap();
        tcp.write_all(&legacy_client_hello(version)).await.unwrap();
        let mut reply = Vec::new();
        let _ = timeout(PATIENCE, tcp.read_to_end(&mut reply))
            .await
            .unwrap();
        // Either an alert record or a plain close; never a ServerHello (handshake record 0x16).
        assert!(
            reply.is_empty() || reply[0] == 0x15,
            "TLS 1.{} got {:02x?}",
            version - 1,
            &reply[..reply.len().min(8)]
        );
    }
    assert_eq!(server.metrics.rejections(Rejection::HandshakeFailed), 2);
}

#[tokio::test]
async fn an_8_mib_body_gets_413_without_the_server_reading_it() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |_| {}).await;
    let tls = tls_connect(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);

    // Declares 8 MiB, sends 64 KiB, then stalls: an answer proves the rest was never awaited.
    let (feed, frames) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    feed.send(Ok(Frame::data(Bytes::from(vec![b' '; 64 * 1024]))))
        .await
        .unwrap();
    let body = StreamBody::new(tokio_stream_from(frames));
    let request = axum::http::Request::post("/validate")
        .header("host", "webhook.test.svc")
        .header("content-type", "application/json")
        .header("content-length", 8 * 1024 * 1024)
        .body(body)
        .unwrap();
    let response = timeout(PATIENCE, sender.send_request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(response.headers()["connection"], "close");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["response"]["status"]["code"], 413);
    assert_eq!(server.metrics.rejections(Rejection::BodyTooLarge), 1);
    drop(feed);
}

fn tokio_stream_from<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

#[tokio::test]
async fn warm_up_does_a_handshake_with_the_serving_certificate() {
    let dir = SecretDir::new(&Pki::new().pair());
    let server = start(&dir, Router::new(), |_| {}).await;
    server.handle.warm_up().await.unwrap();
    assert_eq!(server.metrics.rejections(Rejection::HandshakeFailed), 0);
}

#[tokio::test]
async fn a_stalled_request_head_is_cut_off_by_the_header_timeout() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |config| {
        config.header_read_timeout = Duration::from_millis(200);
    })
    .await;
    let mut tls = tls_connect(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    tls.write_all(b"POST /validate HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let mut rest = Vec::new();
    let _ = timeout(PATIENCE, tls.read_to_end(&mut rest)).await.unwrap();
    assert_eq!(server.metrics.rejections(Rejection::HeaderTimeout), 1);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_not_while_busy() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let slow = Router::new().route(
        "/slow",
        post(|| async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            "done"
        }),
    );
    let server = start(&dir, slow, |config| {
        config.idle_timeout = Duration::from_millis(300);
        config.header_read_timeout = Duration::from_millis(300);
    })
    .await;
    let mut client = client(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    // The request outlives the idle timeout; being busy, the connection must not be closed.
    let answer = client.post("/slow", b"{}".to_vec()).await.unwrap();
    assert_eq!(answer.status, 200);
    // Now idle: the server closes it.
    let _ = timeout(PATIENCE, client.connection).await.unwrap();
    assert_eq!(server.metrics.rejections(Rejection::HeaderTimeout), 0);
}

#[tokio::test]
async fn shutdown_drains_then_finishes_in_flight_requests_with_connection_close() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let (entered, mut inside) = tokio::sync::mpsc::channel::<()>(1);
    let slow = Router::new()
        .route(
            "/slow",
            post(move || {
                let entered = entered.clone();
                async move {
                    let _ = entered.send(()).await;
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    "done"
                }
            }),
        )
        .merge(router(&webhook::Metrics::new()));
    let server = start(&dir, slow, |config| {
        config.drain_delay = Duration::from_millis(300);
    })
    .await;
    let addr = server.addr();
    let config = pki.client_config(&[b"http/1.1"]);
    let mut pooled = client(addr, config.clone()).await.unwrap();
    let mut busy = client(addr, config.clone()).await.unwrap();

    let in_flight = tokio::spawn(async move { busy.post("/slow", b"{}".to_vec()).await });
    inside.recv().await.unwrap();
    server.shutdown.send(()).unwrap();

    // During the drain delay: pooled connections and new ones are still served, each answer
    // with `Connection: close` so the client re-dials (reaching a replica that stays).
    let answer = pooled
        .post("/validate", fixture("create.json"))
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers["connection"], "close");
    let mut fresh = client(addr, config.clone()).await.unwrap();
    assert_eq!(
        fresh
            .post("/validate", fixture("create.json"))
            .await
            .unwrap()
            .status,
        200
    );

    let answer = timeout(PATIENCE, in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers["connection"], "close");

    timeout(PATIENCE, server.handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        pooled.sender.is_closed()
            || pooled
                .post("/validate", fixture("create.json"))
                .await
                .is_err()
    );
    assert!(
        tls_connect(addr, config).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn a_request_not_answered_in_time_gets_408_and_the_connection_closes() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let slow = Router::new().route(
        "/slow",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "too late"
        }),
    );
    let server = start(&dir, slow, |config| {
        config.request_timeout = Duration::from_millis(200);
    })
    .await;
    let mut client = client(server.addr(), pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    let answer = timeout(PATIENCE, client.post("/slow", b"{}".to_vec()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 408);
    assert_eq!(answer.headers["connection"], "close");
    let _ = timeout(PATIENCE, client.connection).await.unwrap();
    assert_eq!(server.metrics.rejections(Rejection::RequestTimeout), 1);
}

#[tokio::test]
async fn a_silent_client_is_dropped_by_the_handshake_timeout() {
    let dir = SecretDir::new(&Pki::new().pair());
    let server = start(&dir, Router::new(), |config| {
        config.handshake_timeout = Duration::from_millis(200);
    })
    .await;
    let mut tcp = TcpStream::connect(server.addr()).await.unwrap();
    let mut rest = Vec::new();
    let _ = timeout(PATIENCE, tcp.read_to_end(&mut rest)).await.unwrap();
    assert!(rest.is_empty());
    assert_eq!(server.metrics.rejections(Rejection::HandshakeTimeout), 1);
}

#[tokio::test]
async fn a_tls_1_2_only_client_is_served() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.pair());
    let server = start(&dir, router(&webhook::Metrics::new()), |_| {}).await;
    let config = pki.client_config_for(&[&rustls::version::TLS12], &[b"http/1.1"]);
    let tls = tls_connect(server.addr(), config).await.unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
}
