//! Logging: `tracing` with structured fields, JSON for clusters or plain text for people, on
//! stderr (stdout is for what a command prints, such as `dev`'s instructions).

use crate::Error;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    Json,
    /// Human-readable lines.
    Plain,
}

/// Installs the global subscriber. `filter` uses `RUST_LOG` syntax.
pub fn init(format: LogFormat, filter: &str) -> Result<(), Error> {
    let filter = EnvFilter::try_new(filter).map_err(|source| Error::ParseLogFilter {
        filter: filter.to_owned(),
        source,
    })?;
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init(),
        LogFormat::Plain => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_target(false)
                    // Colours only for a person at a terminal, never into a file or a collector.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
    }
    .map_err(Error::InstallLogger)
}
