//! Local certificates: a CA and a webhook serving certificate signed by it (ECDSA P-256), for
//! `dev` and for running the webhook outside a cluster. In a cluster, cert-manager does this.

use crate::Error;
use std::{
    fs,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};

/// A CA and a serving certificate it signed, as PEM.
pub struct Bundle {
    /// The CA certificate: what a client (the API server's `caBundle`) trusts.
    pub ca_pem: String,
    /// The serving certificate (`tls.crt`).
    pub cert_pem: String,
    /// The serving certificate's private key (`tls.key`, PKCS#8).
    pub key_pem: String,
}

/// The DNS names a webhook Service is reached by: `<svc>.<ns>.svc` and its `.cluster.local` form.
pub fn service_sans(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Default life of the local CA, in days (10 years, cert-manager's order of magnitude for a CA).
pub const CA_DAYS: u32 = 3650;
/// Default life of the serving certificate, in days (1 year).
pub const CERT_DAYS: u32 = 365;

/// Makes a fresh CA and a serving certificate for `sans` (DNS names or IP addresses), valid
/// from today for [`CA_DAYS`] and [`CERT_DAYS`].
pub fn generate(sans: &[String]) -> Result<Bundle, Error> {
    generate_for(sans, CA_DAYS, CERT_DAYS)
}

/// [`generate`] with the validity of each certificate in days, counted from today (UTC). The
/// serving certificate may not outlive the CA.
pub fn generate_for(sans: &[String], ca_days: u32, cert_days: u32) -> Result<Bundle, Error> {
    if cert_days > ca_days {
        return Err(Error::CertOutlivesCa { cert_days, ca_days });
    }
    use k8s_openapi::jiff::{Span, tz::TimeZone};
    let today = k8s_openapi::jiff::Timestamp::now()
        .to_zoned(TimeZone::UTC)
        .date();
    let day = |offset: u32| -> SystemTime {
        let date = today
            .checked_add(Span::new().days(i64::from(offset)))
            .unwrap_or(today);
        let midnight = date
            .to_zoned(TimeZone::UTC)
            .map_or(0, |z| z.timestamp().as_second());
        UNIX_EPOCH + Duration::from_secs(u64::try_from(midnight).unwrap_or(0))
    };
    generate_between(sans, day(0), day(ca_days), day(cert_days))
}

/// [`generate`] with both certificates valid from `not_before`, the CA until `ca_not_after`
/// and the serving certificate until `cert_not_after` (to the second).
pub fn generate_between(
    sans: &[String],
    not_before: SystemTime,
    ca_not_after: SystemTime,
    cert_not_after: SystemTime,
) -> Result<Bundle, Error> {
    // rcgen's dates, without relying on a feature of its date crate.
    let date = |at: SystemTime| {
        rcgen::date_time_ymd(1970, 1, 1) + at.duration_since(UNIX_EPOCH).unwrap_or_default()
    };
    let mut ca_params = CertificateParams::default();
    ca_params.not_before = date(not_before);
    ca_params.not_after = date(ca_not_after);
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "myapp-operator local CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key =
        KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(Error::GenerateCertificate)?;
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(Error::GenerateCertificate)?;

    let mut params = CertificateParams::default();
    params.not_before = date(not_before);
    params.not_after = date(cert_not_after);
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first().map_or("webhook", String::as_str),
    );
    params.subject_alt_names = sans
        .iter()
        .map(|san| match san.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            // rcgen takes any ASCII string; rustls' parser holds a DNS name to the hostname rules.
            Err(_) => rustls_pki_types::DnsName::try_from(san.as_str())
                .ok()
                .and_then(|_| san.clone().try_into().ok())
                .map(SanType::DnsName)
                .ok_or_else(|| Error::InvalidSan(san.clone())),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(Error::GenerateCertificate)?;
    let cert = params
        .signed_by(&key, &ca)
        .map_err(Error::GenerateCertificate)?;
    Ok(Bundle {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

impl Bundle {
    /// Writes the three files into `dir` as [`Bundle::write_to`] does, but refuses, naming it,
    /// a file that exists already unless `force`: a CA in use is not replaced by accident.
    pub fn write_new(&self, dir: &Path, force: bool) -> Result<(), Error> {
        if !force
            && let Some(path) = ["ca.crt", "tls.crt", "tls.key"]
                .iter()
                .map(|name| dir.join(name))
                .find(|path| path.exists())
        {
            return Err(Error::CertificateExists(path));
        }
        self.write_to(dir)
    }

    /// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, creating it.
    pub fn write_to(&self, dir: &Path) -> Result<(), Error> {
        let write = |name: &str, text: &str, private: bool| {
            let path = dir.join(name);
            write_file(&path, text, private).map_err(|source| Error::WriteFile { path, source })
        };
        fs::create_dir_all(dir).map_err(|source| Error::WriteFile {
            path: dir.to_owned(),
            source,
        })?;
        write("ca.crt", &self.ca_pem, false)?;
        write("tls.key", &self.key_pem, true)?;
        write("tls.crt", &self.cert_pem, false)
    }
}

/// Writes `text` to `path`; a `private` file is readable by its owner only, also when it
/// existed before with wider permissions.
pub(crate) fn write_file(path: &Path, text: &str, private: bool) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        if path.exists() {
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        }
    }
    #[cfg(not(unix))]
    let _ = private;
    std::io::Write::write_all(&mut options.open(path)?, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn serving_certificate_chains_to_the_ca_and_names_the_service() {
        let bundle = generate(&service_sans("myapp-operator-webhook", "myapp-system")).unwrap();
        let ca =
            rustls_pki_types::CertificateDer::from_pem_slice(bundle.ca_pem.as_bytes()).unwrap();
        let leaf =
            rustls_pki_types::CertificateDer::from_pem_slice(bundle.cert_pem.as_bytes()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        let provider = rustls::crypto::ring::default_provider();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.into(),
            provider.into(),
        )
        .build()
        .unwrap();
        let now = rustls_pki_types::UnixTime::now();
        for name in [
            "myapp-operator-webhook.myapp-system.svc",
            "myapp-operator-webhook.myapp-system.svc.cluster.local",
        ] {
            let server_name = rustls_pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&leaf, &[], &server_name, &[], now)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let other = rustls_pki_types::ServerName::try_from("other.myapp-system.svc").unwrap();
        assert!(
            verifier
                .verify_server_cert(&leaf, &[], &other, &[], now)
                .is_err()
        );
    }

    #[test]
    fn files_are_written_with_a_private_key_only_the_owner_reads() {
        let dir = tempfile::tempdir().unwrap();
        generate(&["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .write_to(&dir.path().join("certs"))
            .unwrap();
        for name in ["ca.crt", "tls.crt", "tls.key"] {
            assert!(dir.path().join("certs").join(name).is_file(), "{name}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join("certs/tls.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn an_invalid_name_is_refused() {
        assert!(matches!(
            generate(&["not a name".to_owned()]),
            Err(Error::InvalidSan(_))
        ));
    }
}
