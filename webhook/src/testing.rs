//! Test support (feature `testing`, for dev-dependencies only): a certificate authority made at
//! test time, the serving pairs it issues, and TLS configurations that use them.
//!
//! One test CA for every crate's tests: the webhook's own, the sandbox's test webhooks and the
//! operator's. No key material is ever committed; each test makes its own.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
    PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

/// A certificate authority issuing ECDSA P-256 serving certificates.
pub struct TestCa {
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A serving pair in PEM, and its leaf in DER to compare with what a client sees.
pub struct ServingPair {
    /// `tls.crt`.
    pub cert_pem: String,
    /// `tls.key` (PKCS#8).
    pub key_pem: String,
    /// The leaf certificate.
    pub leaf: CertificateDer<'static>,
}

impl TestCa {
    /// A new CA whose subject's common name is `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("a P-256 key");
        Self {
            ca: CertifiedIssuer::self_signed(params, key).expect("a self-signed CA"),
        }
    }

    /// The CA certificate in PEM: what a `caBundle` holds.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA certificate in DER.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }

    /// A serving certificate for `names` (DNS names or IP addresses) and its key.
    pub fn issue(&self, names: &[&str]) -> ServingPair {
        self.issue_with(names, |_| {})
    }

    /// [`TestCa::issue`], with `tune` changing the certificate's parameters first (its
    /// validity, say).
    pub fn issue_with(
        &self,
        names: &[&str],
        tune: impl FnOnce(&mut CertificateParams),
    ) -> ServingPair {
        let names = names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).expect("valid subject alternative names");
        tune(&mut params);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("a P-256 key");
        let cert = params
            .signed_by(&key, &self.ca)
            .expect("a signed certificate");
        ServingPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            leaf: cert.der().clone(),
        }
    }

    /// A rustls server configuration serving a fresh certificate for `names` (HTTP/1.1 and any
    /// ALPN the client offers).
    pub fn server_config(&self, names: &[&str]) -> rustls::ServerConfig {
        let pair = self.issue(names);
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_single_cert(
            vec![pair.leaf],
            PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).expect("a PEM key"),
        )
        .expect("a matching pair")
    }

    /// A rustls client configuration trusting only this CA, for `versions`, offering `alpn`.
    pub fn client_config(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        alpn: &[&[u8]],
    ) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der()).expect("a CA certificate");
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .expect("supported versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}
