//! How the server listens, times out, caps connections and drains.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::tls::CertPaths;

/// How the server listens, times out and drains. Build with [`ServerConfig::new`] and adjust.
///
/// Every state a connection can be in before its request is answered has its own bound, so no
/// client holds a connection for longer than that without sending what the state waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address to bind; port 0 picks a free port (see [`crate::ServerHandle::local_addr`]).
    pub addr: SocketAddr,
    /// Where the serving certificate and key live (`tls.crt`, `tls.key`).
    pub certs: CertPaths,
    /// How often the certificate directory is re-read besides watching it (<= 10 s advised).
    pub cert_poll_interval: Duration,
    /// Time allowed from TCP accept to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed from the end of the handshake to the first byte of the first request.
    pub first_request_timeout: Duration,
    /// Time allowed from the first byte of a request to the end of its headers.
    pub header_read_timeout: Duration,
    /// Time allowed from the end of the headers to the last byte of the body.
    pub body_read_timeout: Duration,
    /// Time allowed from the end of the headers to the response (includes reading the body).
    /// Keep it at or below the webhook configuration's `timeoutSeconds`: the API server has
    /// given up by then, so working longer only burns CPU.
    pub request_timeout: Duration,
    /// An idle keep-alive connection is closed after this long. Keep it above the API server's
    /// idle-pool timeout (90 s) so the client, not the server, closes idle connections: a server
    /// closing first races with a request being sent, and POSTs are not retried.
    pub idle_timeout: Duration,
    /// After the shutdown signal, how long to keep accepting and answering (the API server keeps
    /// sending on pooled connections after the pod left the endpoints). Answers given meanwhile
    /// carry `Connection: close`, so each client re-dials, reaching a replica that stays.
    pub drain_delay: Duration,
    /// At most this many connections are open at once. At the cap, a new connection sheds the
    /// one that has waited longest without a request in flight; it waits only while every
    /// connection is answering a request. Each connection costs a file descriptor: keep the
    /// process's `RLIMIT_NOFILE` above this plus the admin server's cap.
    pub max_connections: usize,
    /// After closing a connection whose client may still be sending (a refused body, say), how
    /// long to keep reading and discarding, so the client reads the answer instead of a reset.
    pub linger: Duration,
}

impl ServerConfig {
    /// Defaults: poll 10 s; handshake, first request, headers 5 s each; body 4 s; request 5 s
    /// (the `timeoutSeconds` of `deploy/base/webhooks.yaml`); idle 120 s; drain 10 s; 4096
    /// connections; linger 1 s.
    pub fn new(addr: SocketAddr, cert_dir: impl Into<PathBuf>) -> Self {
        Self {
            addr,
            certs: CertPaths::in_dir(cert_dir),
            cert_poll_interval: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            first_request_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(5),
            body_read_timeout: Duration::from_secs(4),
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            drain_delay: Duration::from_secs(10),
            max_connections: 4096,
            linger: Duration::from_secs(1),
        }
    }
}
