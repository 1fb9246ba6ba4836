//! The HTTPS client that calls webhooks: service addresses, kept-alive connections, TLS from
//! `caBundle`, timeouts.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tracing::debug;

use super::errors::Error;
use super::hook::Hook;
use super::review::{Verdict, verify_answer};
use super::trust::GoVerifier;

/// The largest answer read from a webhook; more is an invalid answer, not a hang.
const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Idle connections kept per webhook endpoint.
const MAX_IDLE_PER_ENDPOINT: usize = 8;

/// A Service a webhook configuration may reference: `namespace/name:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service port (443 when the reference names none).
    pub port: u16,
}

impl ServiceRef {
    /// A reference from its parts.
    pub fn new(namespace: &str, name: &str, port: u16) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        }
    }

    /// The name its certificate must carry: `<name>.<namespace>.svc`.
    pub fn dns_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

impl FromStr for ServiceRef {
    type Err = String;

    /// Parses `namespace/name:port` (or `namespace/name`, port 443).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespace, rest) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not namespace/name:port"))?;
        let (name, port) = match rest.split_once(':') {
            Some((name, port)) => (
                name,
                port.parse()
                    .map_err(|_| format!("{port:?} in {s:?} is not a port number"))?,
            ),
            None => (rest, 443),
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(format!("{s:?} is not namespace/name:port"));
        }
        Ok(Self::new(namespace, name, port))
    }
}

type Sender = http1::SendRequest<Full<Bytes>>;

/// Where and how to reach one webhook.
struct Endpoint {
    /// What to dial for a new connection: a socket address, or `host:port` to resolve.
    dial: String,
    /// Which kept-alive connections may carry the call: per Service, whichever endpoint they
    /// were dialled to, as the API server's connections to a ClusterIP are (so a replica that
    /// stops being Ready keeps its open connections until it closes them: the drain race).
    pool: String,
    server_name: ServerName<'static>,
    /// The URL the real server would call, for `Host`, the path and messages.
    url: String,
    host_header: String,
    path_and_query: String,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    dial: String,
    server_name: String,
    ca_bundle: Vec<u8>,
}

/// The connections behind a chain: registered service addresses, kept-alive connections, and
/// TLS configurations per caBundle.
#[derive(Default)]
pub(super) struct WebhookClient {
    services: RwLock<HashMap<ServiceRef, Endpoints>>,
    idle: Mutex<HashMap<PoolKey, Vec<Sender>>>,
    tls: Mutex<HashMap<Vec<u8>, Arc<rustls::ClientConfig>>>,
}

/// A Service's endpoints, each Ready or not; new connections go to Ready ones in turn.
#[derive(Default)]
struct Endpoints {
    addresses: Vec<(SocketAddr, bool)>,
    next: std::sync::atomic::AtomicUsize,
}

impl Endpoints {
    fn pick(&self) -> Option<SocketAddr> {
        let ready: Vec<SocketAddr> = self
            .addresses
            .iter()
            .filter(|(_, ready)| *ready)
            .map(|(address, _)| *address)
            .collect();
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ready.get(turn % ready.len().max(1)).copied()
    }
}

impl WebhookClient {
    /// Makes webhooks referencing `service` dial `address`; replaces an earlier registration.
    pub(super) fn register_service(&self, service: ServiceRef, address: SocketAddr) {
        self.set_endpoints(service, vec![(address, true)]);
    }

    /// The endpoints behind `service`, each with whether it is Ready (what an EndpointSlice
    /// says): new connections go only to Ready ones; replaces the earlier set.
    pub(super) fn set_endpoints(&self, service: ServiceRef, addresses: Vec<(SocketAddr, bool)>) {
        let mut services = self
            .services
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        services.insert(
            service,
            Endpoints {
                addresses,
                ..Endpoints::default()
            },
        );
    }

    /// How many service addresses are registered.
    pub(super) fn service_count(&self) -> usize {
        self.services.read().map(|s| s.len()).unwrap_or_default()
    }

    /// POSTs the review and checks the answer, all within the webhook's timeout.
    pub(super) async fn call(
        &self,
        hook: &Hook<'_>,
        uid: &str,
        request: Value,
    ) -> Result<Verdict, Error> {
        if !hook.review_versions.is_empty() && !hook.review_versions.iter().any(|v| v == "v1") {
            return Err(Error::NegotiateReviewVersion {
                versions: hook.review_versions.to_vec(),
            });
        }
        let seconds = hook.timeout_seconds.clamp(1, 30);
        let endpoint = self.endpoint(hook.client_config, seconds)?;
        let ca_bundle = hook
            .client_config
            .ca_bundle
            .as_ref()
            .map(|ByteString(b)| b.clone())
            .unwrap_or_default();
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        });
        let body = Bytes::from(review.to_string());
        let url = endpoint.url.clone();
        let exchange = self.exchange(&endpoint, ca_bundle, body);
        let (code, answer) =
            match tokio::time::timeout(Duration::from_secs(seconds as u64), exchange).await {
                Ok(answered) => answered?,
                Err(_elapsed) => return Err(Error::TimeOut { url, seconds }),
            };
        if !(200..=206).contains(&code) {
            let body = String::from_utf8_lossy(&answer[..answer.len().min(256)]).into_owned();
            return Err(Error::WebhookStatus { code, body });
        }
        verify_answer(&answer, uid, hook.mutating)
    }

    /// Where a client config points, as the real server would call it.
    fn endpoint(&self, config: &WebhookClientConfig, seconds: i32) -> Result<Endpoint, Error> {
        let resolve = |reason: String| Error::ResolveWebhook { reason };
        if let Some(service) = &config.service {
            let port = service.port.unwrap_or(443);
            let port = u16::try_from(port)
                .map_err(|_| resolve(format!("service port {port} is out of range")))?;
            let key = ServiceRef::new(&service.namespace, &service.name, port);
            let services = self
                .services
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let endpoints = services.get(&key).ok_or_else(|| {
                resolve(format!(
                    "service \"{key}\" has no address registered with the sandbox"
                ))
            })?;
            // kube-apiserver's service resolver says the same when no endpoint is Ready.
            let address = endpoints.pick().ok_or_else(|| {
                resolve(format!(
                    "no endpoints available for service \"{}\"",
                    service.name
                ))
            })?;
            let host = key.dns_name();
            let server_name = ServerName::try_from(host.clone())
                .map_err(|e| resolve(format!("{host:?} is not a valid server name: {e}")))?;
            let path = service.path.as_deref().unwrap_or("/");
            let host_header = format!("{host}:{port}");
            let path_and_query = format!("{path}?timeout={seconds}s");
            return Ok(Endpoint {
                dial: address.to_string(),
                pool: key.to_string(),
                server_name,
                url: format!("https://{host_header}{path_and_query}"),
                host_header,
                path_and_query,
            });
        }
        let Some(url) = config.url.as_deref() else {
            return Err(resolve(
                "clientConfig has neither service nor url".to_owned(),
            ));
        };
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| resolve(format!("invalid url {url:?}: {e}")))?;
        if uri.scheme_str() != Some("https") {
            return Err(resolve(format!("url {url:?} is not https")));
        }
        let host = uri
            .host()
            .ok_or_else(|| resolve(format!("url {url:?} has no host")))?;
        // An IPv6 literal comes bracketed; the server name is the bare address.
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let server_name = ServerName::try_from(bare.clone())
            .map_err(|e| resolve(format!("{host:?} is not a valid server name: {e}")))?;
        let port = uri.port_u16().unwrap_or(443);
        let path = match uri.path() {
            "" => "/",
            p => p,
        };
        let path_and_query = match uri.query() {
            Some(q) => format!("{path}?{q}&timeout={seconds}s"),
            None => format!("{path}?timeout={seconds}s"),
        };
        let host_header = format!("{host}:{port}");
        Ok(Endpoint {
            dial: host_header.clone(),
            pool: host_header.clone(),
            server_name,
            url: format!("https://{host_header}{path_and_query}"),
            host_header,
            path_and_query,
        })
    }

    /// Sends the body on a pooled or new connection; returns the status code and body.
    async fn exchange(
        &self,
        endpoint: &Endpoint,
        ca_bundle: Vec<u8>,
        body: Bytes,
    ) -> Result<(u16, Bytes), Error> {
        let key = PoolKey {
            dial: endpoint.pool.clone(),
            server_name: endpoint.server_name.to_str().into_owned(),
            ca_bundle,
        };
        let make = || {
            hyper::Request::post(endpoint.path_and_query.as_str())
                .header(hyper::header::HOST, endpoint.host_header.as_str())
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header(hyper::header::ACCEPT, "application/json")
                .header(
                    hyper::header::USER_AGENT,
                    "kube-sandbox-apiserver-admission",
                )
                .body(Full::new(body.clone()))
        };
        // A kept-alive connection may have been closed by the server meanwhile. Like Go's
        // transport (`shouldRetryRequest`), retry on a fresh connection only when the request
        // was never written: a POST whose bytes went out fails, as it does for kube-apiserver,
        // so a server that closes a keep-alive connection under a request is caught.
        if let Some(mut sender) = self.take_idle(&key).await {
            let request = make().map_err(|e| Error::ResolveWebhook {
                reason: format!("invalid request for {}: {e}", endpoint.url),
            })?;
            match sender.try_send_request(request).await {
                Ok(response) => return self.finish(key, sender, response, endpoint).await,
                Err(error) if error.message().is_some() => {
                    debug!(error = %error.error(), url = %endpoint.url, "Reused connection closed before the request was written");
                }
                Err(error) => {
                    return Err(Error::SendReview {
                        url: endpoint.url.clone(),
                        source: error.into_error(),
                    });
                }
            }
        }
        let mut sender = self.connect(endpoint, &key).await?;
        let request = make().map_err(|e| Error::ResolveWebhook {
            reason: format!("invalid request for {}: {e}", endpoint.url),
        })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| Error::SendReview {
                url: endpoint.url.clone(),
                source,
            })?;
        self.finish(key, sender, response, endpoint).await
    }

    /// Reads the answer, then returns the connection to the pool if it can serve again.
    async fn finish(
        &self,
        key: PoolKey,
        sender: Sender,
        response: hyper::Response<hyper::body::Incoming>,
        endpoint: &Endpoint,
    ) -> Result<(u16, Bytes), Error> {
        let code = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|source| Error::ReadReview {
                url: endpoint.url.clone(),
                source,
            })?
            .to_bytes();
        if !sender.is_closed() {
            let mut idle = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let senders = idle.entry(key).or_default();
            if senders.len() < MAX_IDLE_PER_ENDPOINT {
                senders.push(sender);
            }
        }
        Ok((code, body))
    }

    async fn take_idle(&self, key: &PoolKey) -> Option<Sender> {
        loop {
            let sender = {
                let mut idle = self
                    .idle
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                idle.get_mut(key).and_then(Vec::pop)
            };
            let mut sender = sender?;
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn connect(&self, endpoint: &Endpoint, key: &PoolKey) -> Result<Sender, Error> {
        let config = self.tls_config(&key.ca_bundle)?;
        let url = || endpoint.url.clone();
        let tcp = TcpStream::connect(endpoint.dial.as_str())
            .await
            .map_err(|source| Error::ConnectWebhook {
                url: url(),
                address: endpoint.dial.clone(),
                source,
            })?;
        // Reviews are small request/response pairs: Nagle would only add latency.
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(endpoint.server_name.clone(), tcp)
            .await
            .map_err(|source| Error::TlsHandshake { url: url(), source })?;
        let (sender, connection) = http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| Error::SendReview { url: url(), source })?;
        let url = url();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, %url, "Webhook connection ended");
            }
        });
        Ok(sender)
    }

    /// A client configuration trusting exactly the certificates of `ca_bundle`, as the API
    /// server's Go client does (see [`super::trust`]).
    fn tls_config(&self, ca_bundle: &[u8]) -> Result<Arc<rustls::ClientConfig>, Error> {
        let mut cache = self
            .tls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = cache.get(ca_bundle) {
            return Ok(config.clone());
        }
        let load = |reason: String| Error::LoadCaBundle { reason };
        if ca_bundle.is_empty() {
            return Err(load(
                "empty: the sandbox trusts only clientConfig.caBundle".to_owned(),
            ));
        }
        let roots = CertificateDer::pem_slice_iter(ca_bundle)
            .map(|cert| cert.map_err(|e| load(format!("not PEM: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = GoVerifier::new(roots, provider.clone()).map_err(load)?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| load(format!("no TLS version available: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        // The API server's webhook client pins HTTP/1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        cache.insert(ca_bundle.to_vec(), config.clone());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_refs_parse_and_print() {
        let service: ServiceRef = "ops/webhook:8443".parse().unwrap();
        assert_eq!(service, ServiceRef::new("ops", "webhook", 8443));
        assert_eq!(service.to_string(), "ops/webhook:8443");
        assert_eq!(service.dns_name(), "webhook.ops.svc");
        assert_eq!("ops/webhook".parse::<ServiceRef>().unwrap().port, 443);
        assert!("webhook:443".parse::<ServiceRef>().is_err());
        assert!("ops/webhook:http".parse::<ServiceRef>().is_err());
    }
}
