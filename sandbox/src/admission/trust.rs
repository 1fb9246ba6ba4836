//! How the API server trusts a webhook's certificate: as Go's `crypto/x509` does with the
//! `caBundle` as its only roots, not as webpki does.
//!
//! The two differ where a webhook author can trip: a self-signed certificate with `CA:TRUE`
//! (what `openssl req -x509` makes by default) served directly and put in its own `caBundle`.
//! Go's `Certificate.Verify` returns the one-certificate chain when the leaf is itself one of
//! the roots, and never asks a leaf whether it is a CA; webpki refuses any `CA:TRUE` leaf
//! (`CaUsedAsEndEntity`). kube-apiserver accepts such a webhook, so the sandbox must too, or a
//! test would fail where the cluster works. Everything else (a chain to a bundle CA, validity,
//! the Service's DNS name) is webpki's verification, which agrees with Go there.
//!
//! Not modelled: Go also accepts a `CA:TRUE` leaf that chains to a bundle CA, and refuses a
//! bundle-member leaf whose extended key usage lacks `serverAuth`; `sandbox/README.md` says so.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// A server certificate verifier with Go's rule for a leaf that is one of the roots.
#[derive(Debug)]
pub(super) struct GoVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// The `caBundle`'s certificates, to recognise a leaf that is one of them.
    roots: Vec<CertificateDer<'static>>,
}

impl GoVerifier {
    /// Trusts exactly `roots` (the `caBundle`), verifying with `provider`'s algorithms.
    pub(super) fn new(
        roots: Vec<CertificateDer<'static>>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, String> {
        let mut store = RootCertStore::empty();
        for cert in &roots {
            store
                .add(cert.clone())
                .map_err(|e| format!("bad certificate: {e}"))?;
        }
        if store.is_empty() {
            return Err("no certificate in it".to_owned());
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(|e| format!("no usable root: {e}"))?;
        Ok(Self { webpki, roots })
    }
}

/// webpki's refusal of a `CA:TRUE` leaf. It checks the validity period before basic
/// constraints, so this error also says the leaf is within its validity.
fn ca_used_as_end_entity(error: &Error) -> bool {
    matches!(
        error,
        Error::InvalidCertificate(CertificateError::Other(other))
            if other.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity)
    )
}

impl ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(error)
                if ca_used_as_end_entity(&error)
                    && self.roots.iter().any(|root| root == end_entity) =>
            {
                // The leaf is a root: Go's one-certificate chain. Still its name must match.
                rustls::client::verify_server_name(
                    &ParsedCertificate::try_from(end_entity)?,
                    server_name,
                )?;
                Ok(ServerCertVerified::assertion())
            }
            result => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
