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

/// The API server this process talks to, for the log lines about requests that failed.
static API_SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Remembers the API server's URL (the first one set wins: a process has one).
pub fn set_api_server(url: &str) {
    let _ = API_SERVER.set(url.trim_end_matches('/').to_owned());
}

/// The API server's URL, once known.
pub fn api_server() -> &'static str {
    API_SERVER.get().map_or("(not known yet)", String::as_str)
}

/// What to do about a request that failed below HTTP (no connection, TLS, DNS), if it did:
/// such a failure has an I/O error among its causes.
pub fn unreachable_fix(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<std::io::Error>() {
            return Some(
                "the API server is unreachable from here: check its address (KUBECONFIG, or the pod's in-cluster config) and the network between them",
            );
        }
        cause = e.source();
    }
    None
}

/// Directives added to the filter unless it names the crate itself (the first element).
///
/// kube's client logs every failed request at ERROR with only the transport's words ("client
/// error (Connect)"), no URL and no cause; the operator logs each failure itself, with both.
///
/// kube's controller wraps every reconcile in an INFO span (`reconciling object`, with the
/// object and the reason it was queued) around the operator's own `reconcile` span, which
/// names the same MyApp. Creating, formatting and entering it costs a few percent of the
/// operator's CPU while converging, and it adds only the reason to a log line.
const QUIET: [(&str, &str); 2] = [
    ("kube_client", "kube_client::client::builder=off"),
    ("kube_runtime", "kube_runtime::controller=warn"),
];

/// Installs the global subscriber. `filter` uses `RUST_LOG` syntax.
pub fn init(format: LogFormat, filter: &str) -> Result<(), Error> {
    let with_quiet = with_quiet(filter);
    let filter = EnvFilter::try_new(&with_quiet).map_err(|source| Error::ParseLogFilter {
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

/// `filter` with each [`QUIET`] directive whose crate it does not name.
fn with_quiet(filter: &str) -> String {
    let mut with_quiet = filter.to_owned();
    for (named, directive) in QUIET {
        if !filter.contains(named) {
            with_quiet.push(',');
            with_quiet.push_str(directive);
        }
    }
    with_quiet
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubes_request_errors_and_reconcile_span_are_quiet_unless_the_filter_names_the_crate() {
        assert_eq!(
            with_quiet("info"),
            "info,kube_client::client::builder=off,kube_runtime::controller=warn"
        );
        assert_eq!(
            with_quiet("debug,kube_runtime=debug"),
            "debug,kube_runtime=debug,kube_client::client::builder=off"
        );
        assert_eq!(
            with_quiet("kube_client=debug,kube_runtime::controller=info"),
            "kube_client=debug,kube_runtime::controller=info"
        );
    }

    #[test]
    fn the_quiet_directives_parse() {
        for (_, directive) in QUIET {
            assert!(EnvFilter::try_new(directive).is_ok(), "{directive}");
        }
    }
}
