//! HTTPS for the served sandbox: a CA generated at start, a serving certificate it signs for
//! loopback and the bound address (as kube-apiserver generates a self-signed pair when given
//! none, `staging/src/k8s.io/apiserver/pkg/server/options/serving.go`), and the accept loop.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::PrivateKeyDer;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// A serving certificate and the CA that signed it.
pub(crate) struct ServingCert {
    /// The CA certificate (PEM): what kubeconfigs carry as `certificate-authority-data`.
    pub(crate) ca_pem: String,
    cert_der: rustls::pki_types::CertificateDer<'static>,
    key_der: Vec<u8>,
}

/// Makes a fresh CA and a certificate for `localhost`, 127.0.0.1, ::1 and `addr`'s IP.
pub(crate) fn generate(addr: SocketAddr) -> Result<ServingCert, rcgen::Error> {
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-sandbox CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut ips = vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
    ];
    // An unspecified address (0.0.0.0) is not one a client dials, so it names nothing.
    if !addr.ip().is_unspecified() && !ips.contains(&addr.ip()) {
        ips.push(addr.ip());
    }
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.subject_alt_names = std::iter::once(SanType::DnsName("localhost".try_into()?))
        .chain(ips.into_iter().map(SanType::IpAddress))
        .collect();
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(ServingCert {
        ca_pem: ca.pem(),
        cert_der: cert.der().clone(),
        key_der: key.serialize_der(),
    })
}

impl ServingCert {
    /// A TLS acceptor with the ring provider (the only one in the workspace).
    pub(crate) fn acceptor(&self) -> Result<TlsAcceptor, rustls::Error> {
        let key = PrivateKeyDer::try_from(self.key_der.clone())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![self.cert_der.clone()], key)?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// Serves `app` over TLS until `stop` fires, then lets connections finish their requests.
pub(crate) async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    mut stop: oneshot::Receiver<()>,
) {
    let (closing_tx, closing) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: back off rather than spin.
                        tracing::debug!(%error, "Accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(app.clone());
                let mut closing = closing.clone();
                connections.spawn(async move {
                    let tls = match acceptor.accept(tcp).await {
                        Ok(tls) => tls,
                        Err(error) => {
                            tracing::debug!(%peer, %error, "TLS handshake failed");
                            return;
                        }
                    };
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service);
                    tokio::pin!(connection);
                    tokio::select! {
                        _ = connection.as_mut() => {}
                        _ = closing.changed() => {
                            connection.as_mut().graceful_shutdown();
                            let _ = connection.await;
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    while connections.join_next().await.is_some() {}
}
