//! Serving certificates: load at start (fail fast), then hot-reload by watching and polling.
//!
//! Kubernetes mounts a Secret as a directory whose files are symlinks through `..data`, itself a
//! symlink to a timestamped directory; an update writes a new timestamped directory and renames a
//! new `..data` link over the old one. Watching the certificate *files* misses that swap, so the
//! [`CertStore`] watches the *directory* (inotify via `notify`) and also polls it, comparing
//! bytes, because watches are lost when directories are replaced wholesale. A changed pair is
//! used only when both files parse and the key belongs to the certificate; otherwise the last good
//! pair keeps serving and `webhook_certificate_reload_errors_total` goes up.

use std::{
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use tokio::{sync::Notify, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{error::Error, metrics::Metrics};

/// The file names inside the certificate directory (those of a `kubernetes.io/tls` Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertPaths {
    /// The mounted directory; it is what gets watched.
    pub dir: PathBuf,
    /// PEM certificate chain, leaf first (default `tls.crt`).
    pub cert_file: String,
    /// PEM private key, PKCS#8, SEC1 or PKCS#1 (default `tls.key`).
    pub key_file: String,
}

impl CertPaths {
    /// The usual layout of a `kubernetes.io/tls` Secret mounted at `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cert_file: "tls.crt".to_owned(),
            key_file: "tls.key".to_owned(),
        }
    }

    fn cert(&self) -> PathBuf {
        self.dir.join(&self.cert_file)
    }

    fn key(&self) -> PathBuf {
        self.dir.join(&self.key_file)
    }
}

/// What a reload attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files hold the same bytes as the last attempt: nothing to do.
    Unchanged,
    /// A new pair was loaded and serves new handshakes from now on.
    Replaced,
}

/// The serving certificate and key, swappable while the server runs.
///
/// Clones share the same state. It is the rustls certificate resolver of the server, so a
/// replaced pair is used by the next handshake; established connections keep theirs.
#[derive(Clone)]
pub struct CertStore {
    inner: Arc<Inner>,
}

struct Inner {
    paths: CertPaths,
    provider: Arc<CryptoProvider>,
    current: RwLock<Serving>,
    // The last pair *attempted* (good, bad or unreadable): a bad pair is counted once, not on
    // every poll or watch event while it stays on disk.
    last_seen: Mutex<Seen>,
    metrics: Metrics,
}

/// The pair serving new handshakes, with its leaf's validity.
struct Serving {
    key: Arc<CertifiedKey>,
    validity: Validity,
}

/// A certificate's validity period, in Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// `notBefore`.
    pub not_before: i64,
    /// `notAfter`.
    pub not_after: i64,
}

/// Why the pair being served is not valid now (see [`CertStore::not_valid_now`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotValidNow {
    /// Past its `notAfter` (RFC 3339).
    Expired {
        /// The certificate's `notAfter`.
        not_after: String,
    },
    /// Before its `notBefore` by more than [`CLOCK_SKEW`] (RFC 3339).
    NotYetValid {
        /// The certificate's `notBefore`.
        not_before: String,
    },
}

impl fmt::Display for NotValidNow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired { not_after } => {
                write!(f, "serving certificate expired (notAfter {not_after})")
            }
            Self::NotYetValid { not_before } => {
                write!(
                    f,
                    "serving certificate not valid yet (notBefore {not_before})"
                )
            }
        }
    }
}

/// What the last reload found on disk.
#[derive(PartialEq, Eq)]
enum Seen {
    Pair(Vec<u8>, Vec<u8>),
    // The read error's message: the same failure again is not a new bad pair.
    Unreadable(String),
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("paths", &self.inner.paths)
            .field("not_after", &self.inner.metrics.cert_not_after())
            .finish_non_exhaustive()
    }
}

impl CertStore {
    /// Loads the pair from `paths`, failing with an error that names the file and the problem.
    ///
    /// Uses rustls' ring provider. Sets the `notAfter` gauge of `metrics`.
    pub fn load(paths: CertPaths, metrics: Metrics) -> Result<Self, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert_pem, key_pem) = read_pair(&paths)?;
        let (key, validity) = parse_pair(&paths, &cert_pem, &key_pem, &provider)?;
        metrics.cert_not_after.set(validity.not_after);
        info!(dir = %paths.dir.display(), not_after = %rfc3339(validity.not_after), "Loaded serving certificate");
        let store = Self {
            inner: Arc::new(Inner {
                paths,
                provider,
                current: RwLock::new(Serving {
                    key: Arc::new(key),
                    validity,
                }),
                last_seen: Mutex::new(Seen::Pair(cert_pem, key_pem)),
                metrics,
            }),
        };
        store.warn_if_not_valid_now();
        Ok(store)
    }

    /// Re-reads the pair; replaces the serving one only if it changed, parses and matches.
    ///
    /// An error leaves the serving pair in place and counts one reload error.
    pub fn reload(&self) -> Result<Reload, Error> {
        let result = self.try_reload();
        if let Err(error) = &result {
            self.inner.metrics.cert_reload_errors.inc();
            warn!(%error, "Kept the previous serving certificate");
        }
        result
    }

    fn try_reload(&self) -> Result<Reload, Error> {
        let paths = &self.inner.paths;
        let read = read_pair(paths);
        let seen = match &read {
            Ok((cert_pem, key_pem)) => Seen::Pair(cert_pem.clone(), key_pem.clone()),
            Err(error) => Seen::Unreadable(error.to_string()),
        };
        {
            let mut last = self
                .inner
                .last_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *last == seen {
                return Ok(Reload::Unchanged);
            }
            // Remember before parsing, so a bad pair (or a missing file) is reported once.
            *last = seen;
        }
        let (cert_pem, key_pem) = read?;
        let (key, validity) = parse_pair(paths, &cert_pem, &key_pem, &self.inner.provider)?;
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Serving {
            key: Arc::new(key),
            validity,
        };
        self.inner.metrics.cert_not_after.set(validity.not_after);
        self.inner.metrics.cert_reloads.inc();
        info!(dir = %paths.dir.display(), not_after = %rfc3339(validity.not_after), "Reloaded serving certificate");
        self.warn_if_not_valid_now();
        Ok(Reload::Replaced)
    }

    /// The pair serving new handshakes.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.serving(|serving| serving.key.clone())
    }

    /// The serving certificate's `notAfter`, in Unix seconds.
    pub fn not_after(&self) -> i64 {
        self.validity().not_after
    }

    /// The serving certificate's validity period.
    pub fn validity(&self) -> Validity {
        self.serving(|serving| serving.validity)
    }

    /// Why the pair being served is not valid by this node's clock now, or `None` when it is.
    ///
    /// A pair past its `notAfter` is not valid: the API server refuses it, give or take its
    /// own clock. A pair that turns valid within [`CLOCK_SKEW`] counts as valid, as it does
    /// when loading, so an issuer whose clock runs a little ahead does not take every replica
    /// out of its Service at each renewal. The loader accepts a pair that expired up to
    /// [`CLOCK_SKEW`] ago, so the process stays up to pick up the renewal, but it is not valid.
    pub fn not_valid_now(&self) -> Option<NotValidNow> {
        let Validity {
            not_before,
            not_after,
        } = self.validity();
        let now = unix_now();
        if now > not_after {
            Some(NotValidNow::Expired {
                not_after: rfc3339(not_after),
            })
        } else if now + (CLOCK_SKEW.as_secs() as i64) < not_before {
            Some(NotValidNow::NotYetValid {
                not_before: rfc3339(not_before),
            })
        } else {
            None
        }
    }

    fn warn_if_not_valid_now(&self) {
        if let Some(invalid) = self.not_valid_now() {
            warn!(
                dir = %self.inner.paths.dir.display(),
                %invalid,
                "Serving a certificate within the clock skew allowed; not valid now, so not ready until a valid pair is loaded"
            );
        }
    }

    fn serving<T>(&self, read: impl FnOnce(&Serving) -> T) -> T {
        read(
            &self
                .inner
                .current
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The crypto provider used for the server (rustls' ring provider).
    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.inner.provider
    }

    /// A rustls server configuration that resolves to this store: TLS 1.2 and 1.3 only, ALPN
    /// `http/1.1` only, no client authentication.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, Error> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.inner.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(Error::ConfigureTls)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(self.clone()));
        // HTTP/2 stays off: the API server's webhook client speaks HTTP/1.1, and h2 brings
        // Rapid-Reset-style exposure for nothing.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Starts watching and polling the directory; reloads run until `cancel` fires.
    ///
    /// Filesystem events trigger a reload at once (after a short pause that merges the burst
    /// of events of one update); the poll every `poll_interval` catches what the watcher
    /// misses. Fails if the directory cannot be watched.
    pub fn watch(
        &self,
        poll_interval: Duration,
        cancel: CancellationToken,
    ) -> Result<JoinHandle<()>, Error> {
        use notify::Watcher as _;

        let changed = Arc::new(Notify::new());
        let on_event = changed.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Errors from the watcher are not fatal: the poll still runs.
                if event.is_ok_and(|event| may_change_files(&event.kind)) {
                    on_event.notify_one();
                }
            })
            .map_err(|source| self.watch_error(source))?;
        watcher
            .watch(&self.inner.paths.dir, notify::RecursiveMode::NonRecursive)
            .map_err(|source| self.watch_error(source))?;

        let store = self.clone();
        Ok(tokio::spawn(async move {
            // The watcher stops when dropped: keep it alive as long as this task.
            let _watcher = watcher;
            let mut poll = tokio::time::interval(poll_interval);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = changed.notified() => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    _ = poll.tick() => {}
                }
                // Reading files is blocking I/O, but two small files on a tmpfs; not worth a
                // blocking-pool hop on every poll.
                let _ = store.reload();
            }
        }))
    }

    fn watch_error(&self, source: notify::Error) -> Error {
        Error::WatchDirectory {
            path: self.inner.paths.dir.clone(),
            source,
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Whether a filesystem event in the directory may have changed what it holds. Opening and
/// reading the files does not: a reload reads them, and reacting to its own reads it would
/// reload again and again.
fn may_change_files(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(access) => *access == AccessKind::Close(AccessMode::Write),
        _ => true,
    }
}

fn read_pair(paths: &CertPaths) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let read =
        |path: PathBuf| std::fs::read(&path).map_err(|source| Error::ReadFile { path, source });
    Ok((read(paths.cert())?, read(paths.key())?))
}

/// How far the clocks of this node and of the certificate's issuer may disagree: a pair that
/// turns valid within this long, or expired this long ago, is still loaded. cert-manager renews
/// two thirds into a certificate's life, so a pair this close to its end is already replaced.
pub const CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(5 * 60);

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Unix seconds as an RFC 3339 UTC date, for messages people read.
fn rfc3339(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map_or_else(|_| format!("{unix} (Unix seconds)"), |t| t.to_string())
}

fn parse_pair(
    paths: &CertPaths,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, Validity), Error> {
    let cert_error = |reason: String| Error::ParseCertificate {
        path: paths.cert(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_error(format!("bad pem: {e}")))?;
    let leaf = chain
        .first()
        .ok_or_else(|| cert_error("no CERTIFICATE block found".to_owned()))?;
    let (not_before, not_after) = der::validity(leaf).map_err(|e| cert_error(e.to_owned()))?;
    let (now, skew) = (unix_now(), CLOCK_SKEW.as_secs() as i64);
    if now + skew < not_before || now - skew > not_after {
        return Err(Error::CertificateNotValid {
            path: paths.cert(),
            not_before: rfc3339(not_before),
            not_after: rfc3339(not_after),
            now: rfc3339(now),
        });
    }

    let key_error = |reason: String| Error::ParseKey {
        path: paths.key(),
        reason,
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| key_error(format!("{e}")))?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| key_error(format!("unsupported key: {e}")))?;

    let pair = CertifiedKey::new(chain, signing_key);
    pair.keys_match().map_err(|e| Error::MatchKey {
        cert: paths.cert(),
        key: paths.key(),
        reason: match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                "the key does not belong to the certificate".to_owned()
            }
            other => other.to_string(),
        },
    })?;
    Ok((
        pair,
        Validity {
            not_before,
            not_after,
        },
    ))
}

/// A DER certificate's (`notBefore`, `notAfter`) as Unix seconds, for callers that judge a
/// certificate they do not serve (the operator's `check`).
pub fn certificate_validity(cert: &[u8]) -> Result<(i64, i64), &'static str> {
    der::validity(cert)
}

// === Pinned verifier (warm-up) ===

/// A client-side verifier that trusts exactly the certificate the server is serving.
///
/// Used for the loopback warm-up handshake: the server's own certificate is known, its CA may
/// not be, and the serving name need not resolve. Handshake signatures are still checked.
#[derive(Debug)]
pub(crate) struct PinnedVerifier {
    expected: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl PinnedVerifier {
    pub(crate) fn new(store: &CertStore) -> Self {
        Self {
            expected: store.current().cert[0].clone(),
            provider: store.provider().clone(),
        }
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.expected.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Reads the one field of an X.509 certificate the server needs: `notAfter`.
///
/// A full X.509 parser is a heavy dependency for one timestamp; the path to the validity is
/// fixed by RFC 5280 (`Certificate -> tbsCertificate -> [version] serial signature issuer
/// validity`), and rustls has already parsed the certificate for real when the key was matched.
mod der {
    /// Returns `notAfter` as Unix seconds.
    #[cfg(test)]
    pub(super) fn not_after(cert: &[u8]) -> Result<i64, &'static str> {
        validity(cert).map(|(_, not_after)| not_after)
    }

    /// Returns (`notBefore`, `notAfter`) as Unix seconds.
    pub(super) fn validity(cert: &[u8]) -> Result<(i64, i64), &'static str> {
        let (certificate, _) = element(cert, 0x30)?;
        let (tbs, _) = element(certificate, 0x30)?;
        let mut rest = tbs;
        // Optional explicit [0] version.
        if rest.first() == Some(&0xa0) {
            rest = element(rest, 0xa0)?.1;
        }
        rest = element(rest, 0x02)?.1; // serialNumber
        rest = element(rest, 0x30)?.1; // signature AlgorithmIdentifier
        rest = element(rest, 0x30)?.1; // issuer Name
        let (validity, _) = element(rest, 0x30)?;
        let not_after = skip_any(validity)?;
        Ok((time(validity)?, time(not_after)?))
    }

    /// Splits off one element with the expected tag: returns (content, rest).
    fn element(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), &'static str> {
        match input.first() {
            Some(&t) if t == tag => {}
            Some(_) => return Err("unexpected DER tag in certificate"),
            None => return Err("truncated certificate"),
        }
        let (len, header) = length(&input[1..])?;
        let start = 1 + header;
        let end = start.checked_add(len).ok_or("bad DER length")?;
        if end > input.len() {
            return Err("truncated certificate");
        }
        Ok((&input[start..end], &input[end..]))
    }

    fn skip_any(input: &[u8]) -> Result<&[u8], &'static str> {
        let tag = *input.first().ok_or("truncated certificate")?;
        Ok(element(input, tag)?.1)
    }

    /// Returns (length, bytes used by the length).
    fn length(input: &[u8]) -> Result<(usize, usize), &'static str> {
        let first = *input.first().ok_or("truncated certificate")?;
        if first < 0x80 {
            return Ok((usize::from(first), 1));
        }
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || input.len() < 1 + count {
            return Err("bad DER length");
        }
        let len = input[1..=count]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        Ok((len, 1 + count))
    }

    fn time(input: &[u8]) -> Result<i64, &'static str> {
        let tag = *input.first().ok_or("truncated certificate")?;
        let (text, _) = element(input, tag)?;
        let digits = |s: &[u8]| -> Result<i64, &'static str> {
            s.iter().try_fold(0i64, |acc, b| {
                if b.is_ascii_digit() {
                    Ok(acc * 10 + i64::from(b - b'0'))
                } else {
                    Err("bad time in certificate validity")
                }
            })
        };
        // RFC 5280: UTCTime YYMMDDHHMMSSZ until 2049, GeneralizedTime YYYYMMDDHHMMSSZ after.
        let (year, rest) = match (tag, text.len()) {
            (0x17, 13) => {
                let yy = digits(&text[..2])?;
                (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
            }
            (0x18, 15) => (digits(&text[..4])?, &text[4..]),
            _ => return Err("unsupported time format in certificate validity"),
        };
        if rest[10] != b'Z' {
            return Err("certificate validity time is not in UTC");
        }
        let month = digits(&rest[0..2])?;
        let day = digits(&rest[2..4])?;
        let (hour, minute, second) = (
            digits(&rest[4..6])?,
            digits(&rest[6..8])?,
            digits(&rest[8..10])?,
        );
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
            return Err("bad time in certificate validity");
        }
        Ok(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
    fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (month + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn civil_days_match_known_dates() {
            assert_eq!(days_from_civil(1970, 1, 1), 0);
            assert_eq!(days_from_civil(2000, 3, 1), 11_017);
            assert_eq!(days_from_civil(2038, 1, 19), 24_855);
        }

        #[test]
        fn garbage_is_an_error_not_a_panic() {
            assert!(not_after(&[]).is_err());
            assert!(not_after(&[0x30, 0x82, 0xff]).is_err());
            assert!(not_after(&[0x30, 0x03, 0x30, 0x01, 0x00]).is_err());
            assert!(not_after(&[0x04, 0x00]).is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn write_pair(dir: &Path, cert: &str, key: &str) {
        std::fs::write(dir.join("tls.crt"), cert).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
    }

    /// Valid from rcgen's default start (1975) until `not_after`.
    fn self_signed(not_after: (i32, u8, u8)) -> (String, String) {
        signed_for((1975, 1, 1), not_after)
    }

    #[test]
    fn not_after_is_read_from_the_leaf_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed((2031, 5, 17));
        write_pair(dir.path(), &cert, &key);
        let store = CertStore::load(CertPaths::in_dir(dir.path()), Metrics::new()).unwrap();
        // The notAfter set above, midnight UTC of that day, in Unix seconds.
        assert_eq!(store.not_after(), 1_936_742_400);
    }

    fn signed_for(not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["webhook.test.svc".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn an_expired_or_not_yet_valid_pair_is_refused_at_start_naming_file_and_dates() {
        for ((cert, key), expected) in [
            (
                signed_for((2020, 1, 1), (2021, 3, 4)),
                "valid from 2020-01-01T00:00:00Z to 2021-03-04T00:00:00Z",
            ),
            (
                signed_for((2090, 1, 1), (2091, 1, 1)),
                "valid from 2090-01-01T00:00:00Z to 2091-01-01T00:00:00Z",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            write_pair(dir.path(), &cert, &key);
            let error = CertStore::load(CertPaths::in_dir(dir.path()), Metrics::new()).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, Error::CertificateNotValid { .. }), "{text}");
            assert!(
                text.contains("tls.crt") && text.contains(expected),
                "{text}"
            );
        }
    }

    #[test]
    fn a_pair_that_is_not_valid_now_never_replaces_a_valid_one() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed((2030, 1, 1));
        write_pair(dir.path(), &cert, &key);
        let metrics = Metrics::new();
        let store = CertStore::load(CertPaths::in_dir(dir.path()), metrics.clone()).unwrap();
        let before = store.current();
        for (cert, key) in [
            signed_for((2020, 1, 1), (2021, 1, 1)),
            signed_for((2090, 1, 1), (2091, 1, 1)),
        ] {
            write_pair(dir.path(), &cert, &key);
            let error = store.reload().unwrap_err();
            assert!(
                matches!(error, Error::CertificateNotValid { .. }),
                "{error}"
            );
            assert!(Arc::ptr_eq(&before, &store.current()));
        }
        assert_eq!(metrics.cert_reload_errors(), 2);
        assert_eq!(metrics.cert_reloads(), 0);
    }

    #[test]
    fn a_missing_key_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = self_signed((2030, 1, 1));
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        let error = CertStore::load(CertPaths::in_dir(dir.path()), Metrics::new()).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("tls.key"), "{text}");
        assert!(text.starts_with("failed to read"), "{text}");
    }

    #[test]
    fn a_key_file_gone_missing_counts_one_reload_error_however_often_it_is_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed((2030, 1, 1));
        write_pair(dir.path(), &cert, &key);
        let metrics = Metrics::new();
        let store = CertStore::load(CertPaths::in_dir(dir.path()), metrics.clone()).unwrap();
        std::fs::remove_file(dir.path().join("tls.key")).unwrap();
        // A watch event and a poll (and later polls) all see the same missing file.
        let error = store.reload().unwrap_err();
        assert!(error.to_string().contains("tls.key"), "{error}");
        assert_eq!(store.reload().unwrap(), Reload::Unchanged);
        assert_eq!(store.reload().unwrap(), Reload::Unchanged);
        assert_eq!(metrics.cert_reload_errors(), 1);
        // The pair back in place is a change again.
        write_pair(dir.path(), &cert, &key);
        assert_eq!(store.reload().unwrap(), Reload::Replaced);
    }

    #[test]
    fn a_certificate_file_without_pem_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let (_, key) = self_signed((2030, 1, 1));
        write_pair(dir.path(), "not a certificate\n", &key);
        let error = CertStore::load(CertPaths::in_dir(dir.path()), Metrics::new()).unwrap_err();
        assert!(matches!(error, Error::ParseCertificate { .. }), "{error}");
        assert!(error.to_string().contains("tls.crt"), "{error}");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = self_signed((2030, 1, 1));
        let (_, other_key) = self_signed((2030, 1, 1));
        write_pair(dir.path(), &cert, &other_key);
        let error = CertStore::load(CertPaths::in_dir(dir.path()), Metrics::new()).unwrap_err();
        assert!(matches!(error, Error::MatchKey { .. }), "{error}");
        assert!(error.to_string().contains("does not belong"), "{error}");
    }

    #[test]
    fn reload_keeps_the_last_good_pair_and_counts_one_error_per_bad_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed((2030, 1, 1));
        write_pair(dir.path(), &cert, &key);
        let metrics = Metrics::new();
        let store = CertStore::load(CertPaths::in_dir(dir.path()), metrics.clone()).unwrap();
        let before = store.current();

        assert_eq!(store.reload().unwrap(), Reload::Unchanged);
        write_pair(
            dir.path(),
            &cert,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        );
        assert!(store.reload().is_err());
        assert!(store.reload().is_ok(), "the same bad pair is not retried");
        assert_eq!(metrics.cert_reload_errors(), 1);
        assert!(Arc::ptr_eq(&before, &store.current()));

        let (cert2, key2) = self_signed((2032, 1, 1));
        write_pair(dir.path(), &cert2, &key2);
        assert_eq!(store.reload().unwrap(), Reload::Replaced);
        assert_ne!(store.current().cert[0], before.cert[0]);
        assert_eq!(metrics.cert_reloads(), 1);
        assert_eq!(metrics.cert_not_after(), 1_956_528_000);
    }

    #[tokio::test]
    async fn a_watched_directory_is_read_again_only_when_something_in_it_changes() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        use notify::Watcher as _;
        use notify::event::{AccessKind, EventKind};

        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed((2030, 1, 1));
        write_pair(dir.path(), &cert, &key);
        let store = CertStore::load(CertPaths::in_dir(dir.path()), Metrics::new()).unwrap();
        let before = store.current();
        // Every open of the certificate file, as the kernel reports it.
        let opens = Arc::new(AtomicUsize::new(0));
        let counted = opens.clone();
        let mut spy = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event
                && matches!(event.kind, EventKind::Access(AccessKind::Open(_)))
                && event.paths.iter().any(|p| p.ends_with("tls.crt"))
            {
                counted.fetch_add(1, SeqCst);
            }
        })
        .unwrap();
        spy.watch(dir.path(), notify::RecursiveMode::NonRecursive)
            .unwrap();
        let cancel = CancellationToken::new();
        let watching = store
            .watch(Duration::from_secs(3600), cancel.clone())
            .unwrap();

        // The first poll reads the pair at once; then nothing in the directory changes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let settled = opens.load(SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            opens.load(SeqCst),
            settled,
            "the pair was read again unchanged"
        );

        let (cert, key) = self_signed((2032, 1, 1));
        write_pair(dir.path(), &cert, &key);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.current().cert[0] == before.cert[0] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new pair was not loaded"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
        watching.await.unwrap();
    }
}
