//! The crate's one error type.

use std::{net::SocketAddr, path::PathBuf};

/// Everything that can fail while loading certificates or serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A certificate or key file could not be read.
    #[error("failed to read {path}: {source}")]
    ReadFile {
        /// The file that could not be read.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },

    /// The certificate file holds no usable PEM certificate.
    #[error("failed to parse certificate {path}: {reason}")]
    ParseCertificate {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong with its content.
        reason: String,
    },

    /// The certificate is expired or not valid yet (beyond the allowed clock skew).
    #[error(
        "certificate {path} is not valid now ({now}): valid from {not_before} to {not_after}; renew it (cert-manager: check the Certificate's status)"
    )]
    CertificateNotValid {
        /// The certificate file.
        path: PathBuf,
        /// Its `notBefore`, RFC 3339.
        not_before: String,
        /// Its `notAfter`, RFC 3339.
        not_after: String,
        /// This node's clock, RFC 3339.
        now: String,
    },

    /// The key file holds no usable PEM private key.
    #[error("failed to parse private key {path}: {reason}")]
    ParseKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong with its content.
        reason: String,
    },

    /// The private key does not belong to the certificate.
    #[error("failed to pair key {key} with certificate {cert}: {reason}")]
    MatchKey {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why the pair was refused.
        reason: String,
    },

    /// The certificate directory could not be watched for changes.
    #[error("failed to watch certificate directory {path}: {source}")]
    WatchDirectory {
        /// The watched directory.
        path: PathBuf,
        /// The watcher's error.
        #[source]
        source: notify::Error,
    },

    /// The rustls server configuration could not be built.
    #[error("failed to build tls configuration: {0}")]
    ConfigureTls(#[source] rustls::Error),

    /// The listening socket could not be bound.
    #[error("failed to bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },

    /// The warm-up handshake against our own listener failed.
    #[error("failed to warm up tls on {addr}: {source}")]
    WarmUp {
        /// The address dialled.
        addr: SocketAddr,
        /// The connection or handshake error.
        #[source]
        source: std::io::Error,
    },

    /// The server task ended abnormally (it panicked or was aborted).
    #[error("failed to join the server task: {0}")]
    JoinServer(#[source] tokio::task::JoinError),
}
