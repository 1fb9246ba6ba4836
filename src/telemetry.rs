//! Logging: `tracing` with structured fields, JSON for clusters or plain text for people.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    Json,
    /// Human-readable lines.
    Plain,
}

/// Why logging could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `--log-level` filter does not parse.
    #[error(
        "invalid --log-level {filter:?}: {source} (examples: info, debug, myapp_operator=debug,kube=warn)"
    )]
    ParseFilter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("failed to install the log subscriber: {0}")]
    Install(#[source] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber. `filter` uses `RUST_LOG` syntax.
pub fn init(format: LogFormat, filter: &str) -> Result<(), Error> {
    let filter = EnvFilter::try_new(filter).map_err(|source| Error::ParseFilter {
        filter: filter.to_owned(),
        source,
    })?;
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init(),
        LogFormat::Plain => registry.with(fmt::layer().with_target(false)).try_init(),
    }
    .map_err(Error::Install)
}
