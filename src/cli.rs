//! The command line: flags are the interface, documented by `--help`, each with an env fallback.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{crd::EnvVar, telemetry::LogFormat};

/// Kubernetes operator for `MyApp` (example.com/v1): a controller that keeps each app's
/// Deployment and Service equal to its spec, and the admission webhook that validates and
/// defaults MyApps.
#[derive(Debug, Parser)]
#[command(name = "myapp-operator", version = crate::version::LONG, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the process's arguments as `Cli::parse` does, exiting with clap's message on a
    /// mistake; a bad value that came from an environment variable is named by the variable,
    /// which is where it must be fixed.
    pub fn parse_naming_env() -> Self {
        Self::try_parse().unwrap_or_else(|error| naming_env(error, std::env::args()).exit())
    }
}

/// `error`, told as the environment variable's when the invalid value came from one (the flag
/// it stands for was not on the command line, and the variable is set).
fn naming_env(error: clap::Error, args: impl Iterator<Item = String>) -> clap::Error {
    use clap::{
        CommandFactory,
        error::{ContextKind, ContextValue, ErrorKind},
    };
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return error;
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
        return error;
    };
    let flag = arg.split_whitespace().next().unwrap_or_default().to_owned();
    let on_command_line = args
        .into_iter()
        .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let mut command = Cli::command();
    let env = env_of(&command, &flag);
    let Some((env, value)) = env.and_then(|env| Some((env.clone(), std::env::var(&env).ok()?)))
    else {
        return error;
    };
    if on_command_line {
        return error;
    }
    let said = error.to_string();
    let said = said.lines().next().unwrap_or_default();
    let said = said.strip_prefix("error: ").unwrap_or(said);
    command.error(
        ErrorKind::InvalidValue,
        format!(
            "environment variable {env}={value:?} (read for {flag}): {said}; fix or unset {env}"
        ),
    )
}

/// The environment variable of the flag `--long`, in any subcommand.
fn env_of(command: &clap::Command, flag: &str) -> Option<String> {
    let long = flag.strip_prefix("--")?;
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .or_else(|| command.get_subcommands().find_map(|c| env_of(c, flag)))
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster of the current kube-context (controller, webhook and
    /// admin servers in one process).
    Run(RunArgs),
    /// Run everything locally with no cluster: an in-memory API server on loopback, the webhook
    /// with a fresh certificate, and the controller; prints how to point kubectl at it.
    #[cfg(feature = "dev")]
    Dev(DevArgs),
    /// Diagnose an installation (API, CRD, RBAC, webhook, cert-manager, controller, children):
    /// one line per check with the fix; exits 1 when a check fails.
    Check(CheckArgs),
    /// Print the MyApp CustomResourceDefinition as YAML (the content of deploy/base/crd.yaml).
    Crd,
    /// Write a fresh local CA and webhook serving certificate (ECDSA P-256) for running the
    /// webhook outside a cluster: ca.crt, tls.crt, tls.key.
    Certs(CertsArgs),
}

/// Flags of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The kubeconfig to use; without it, KUBECONFIG, ~/.kube/config or the pod's
    /// ServiceAccount, as kubectl finds them.
    #[arg(long, env = "MYAPP_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of the current one.
    #[arg(long, env = "MYAPP_CONTEXT")]
    pub context: Option<String>,
    /// The operator's namespace (where deploy/ installs it).
    #[arg(
        long,
        short = 'n',
        env = "MYAPP_NAMESPACE",
        default_value = "myapp-system"
    )]
    pub namespace: String,
    /// Where the dry-run MyApps go: a namespace the webhooks apply to (not kube-system, not
    /// the operator's own).
    #[arg(long, env = "MYAPP_CHECK_PROBE_NAMESPACE", default_value = "default")]
    pub probe_namespace: String,
    /// How long a MyApp's status may lag its spec (by its conditions' lastTransitionTime)
    /// before that fails.
    #[arg(long, env = "MYAPP_CHECK_LAG_BOUND", default_value = "5m", value_parser = parse_duration)]
    pub lag_bound: Duration,
    /// `text` for people, `json` for machines.
    #[arg(long, short = 'o', env = "MYAPP_CHECK_OUTPUT", value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Output formats of `check`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line per check, grouped, hints under failures.
    Text,
    /// The same as one JSON document.
    Json,
}

/// Flags of `certs`.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long, env = "MYAPP_CERTS_OUT", default_value = "certs")]
    pub out: PathBuf,
    /// A DNS name or IP address the serving certificate is valid for. Repeatable. Defaults to
    /// the in-cluster Service names and localhost / 127.0.0.1.
    #[arg(long = "san", env = "MYAPP_CERTS_SANS", value_delimiter = ',', default_values_t = default_sans())]
    pub sans: Vec<String>,
    /// Days the CA is valid, from today.
    #[arg(long, env = "MYAPP_CERTS_CA_DAYS", default_value_t = crate::certs::CA_DAYS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ca_days: u32,
    /// Days the serving certificate is valid, from today (at most the CA's).
    #[arg(long, env = "MYAPP_CERTS_CERT_DAYS", default_value_t = crate::certs::CERT_DAYS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub cert_days: u32,
    /// Replace existing files in --out. Deliberately a flag only, with no environment fallback:
    /// overwriting a CA key should never come from a variable left in a shell.
    #[arg(long)]
    pub force: bool,
}

fn default_sans() -> Vec<String> {
    let mut sans = crate::certs::service_sans("myapp-operator-webhook", "myapp-system");
    sans.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
    sans
}

/// Flags of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub webhook: WebhookArgs,
    /// Directory holding the webhook's serving certificate and key (`tls.crt`, `tls.key`), as a
    /// mounted Secret provides it; watched and polled for renewals.
    #[arg(
        long,
        env = "MYAPP_CERT_DIR",
        default_value = "/etc/myapp-operator/tls"
    )]
    pub cert_dir: PathBuf,
    /// Address of the admin server (`/livez`, `/readyz`, `/metrics`, plain HTTP).
    #[arg(long, env = "MYAPP_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Threads that run the controller, the webhook server and the admin server. One is
    /// enough for tens of thousands of MyApps and costs the least CPU per reconcile: a
    /// reconcile's steps, the watch events that trigger it and the writes it sends are handed
    /// between tasks, and between threads each hand-over wakes a sleeping thread.
    #[arg(long, env = "MYAPP_WORKER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: u16,
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub admission: AdmissionArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Flags of `dev`.
#[cfg(feature = "dev")]
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Address of the in-memory API server (loopback; port 0 picks a free one).
    #[arg(long, env = "MYAPP_DEV_API_ADDR", default_value = "127.0.0.1:6443")]
    pub api_addr: SocketAddr,
    /// Address of the webhook server (loopback; port 0 picks a free one).
    #[arg(
        long = "webhook-addr",
        env = "MYAPP_DEV_WEBHOOK_ADDR",
        default_value = "127.0.0.1:8443"
    )]
    pub webhook_addr: SocketAddr,
    /// Address of the admin server (loopback; port 0 picks a free one).
    #[arg(long, env = "MYAPP_DEV_ADMIN_ADDR", default_value = "127.0.0.1:8080")]
    pub admin_addr: SocketAddr,
    /// Where to write the kubeconfig that points at the in-memory API server, and the
    /// generated certificates.
    #[arg(long, env = "MYAPP_DEV_STATE_DIR", default_value_os_t = default_state_dir())]
    pub state_dir: PathBuf,
    /// How long the simulated Deployment controller takes to roll out a change.
    #[arg(long, env = "MYAPP_DEV_ROLLOUT_DELAY", default_value = "3s", value_parser = parse_duration)]
    pub rollout_delay: Duration,
    /// The Kubernetes minor version the in-memory API server reports (1.N); kubectl picks its
    /// build from it. The project supports 1.33 and newer.
    #[arg(long, env = "MYAPP_DEV_SERVER_MINOR", default_value_t = kube_sandbox::DEFAULT_MINOR,
          value_parser = clap::value_parser!(u32).range(33..))]
    pub server_minor: u32,
    /// How long the in-memory API server keeps an Event after its last write, as
    /// kube-apiserver's --event-ttl (a long session would otherwise pile them up).
    #[arg(long, env = "MYAPP_DEV_EVENT_TTL", default_value = "1h", value_parser = parse_duration)]
    pub event_ttl: Duration,
    /// How much watch history (MiB of memory) the in-memory API server keeps
    /// for watches that resume; older resumes get 410 Expired and relist, as on a real server.
    #[arg(long, env = "MYAPP_DEV_WATCH_HISTORY_MIB", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub watch_history_mib: u32,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub admission: AdmissionArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Default for `--state-dir`: a folder in the system's temporary directory.
#[cfg(feature = "dev")]
pub fn default_state_dir() -> PathBuf {
    std::env::temp_dir().join("myapp-operator-dev")
}

/// Webhook server flags.
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Address of the HTTPS admission webhook server.
    #[arg(long, env = "MYAPP_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub webhook_addr: SocketAddr,
    /// After SIGTERM, keep answering webhook calls this long before closing (the API server keeps
    /// sending on pooled connections after the pod left the Service's endpoints).
    #[arg(long, env = "MYAPP_DRAIN_DELAY", default_value = "10s", value_parser = parse_duration)]
    pub drain_delay: Duration,
}

/// Leader election flags.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// Reconcile only while holding a Lease, so that several replicas can run (all serve the
    /// webhook). Turn off only when exactly one replica runs.
    /// `--leader-elect` alone means true; `--leader-elect=false` turns it off.
    #[arg(long, env = "MYAPP_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, env = "MYAPP_LEASE_NAME", default_value = "myapp-operator")]
    pub lease_name: String,
    /// Namespace of the Lease: the operator's own (from the downward API in a cluster).
    #[arg(long, env = "MYAPP_LEASE_NAMESPACE", default_value = "myapp-system")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease and in Events (the pod name in a cluster).
    /// Defaults to the host name and process id.
    #[arg(long, env = "MYAPP_IDENTITY")]
    pub identity: Option<String>,
    /// How long the Lease stays valid after its last renewal: another replica takes over this
    /// long after it last saw the Lease change. Whole seconds (the Lease records seconds).
    #[arg(long, env = "MYAPP_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The leader stops writing this long after it began its last successful renewal, however
    /// long it was paused. Shorter than --lease-duration.
    #[arg(long, env = "MYAPP_LEASE_RENEW_DEADLINE", default_value = "12s", value_parser = parse_duration)]
    pub lease_renew_deadline: Duration,
    /// How often the leader renews the Lease and the others try to take it. Shorter than
    /// --lease-renew-deadline.
    #[arg(long, env = "MYAPP_LEASE_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub lease_retry_period: Duration,
    /// Spread the MyApps over every replica instead of reconciling them all on the Lease
    /// holder: each replica reconciles its own shard under a shard Lease of its own
    /// (`<lease-name>-shard-<identity>`), and the Lease holder assigns MyApps to the live
    /// shards. Needs --leader-elect and the permissions of `deploy/sharding/`.
    /// `--sharding` alone means true.
    #[arg(long, env = "MYAPP_SHARDING", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub sharding: bool,
    /// With --sharding, how each replica's MyApps are told apart: `label` (the default, any
    /// cluster) or `namespace` (ranges of the namespace's hash filtered by the API server,
    /// which must offer KEP-5866's sharded list and watch: `run` checks and refuses to start
    /// otherwise). See docs/architecture.md, "Sharding".
    #[arg(long, env = "MYAPP_SHARD_BY", value_enum, default_value_t = crate::shard::sharder::By::Label)]
    pub shard_by: crate::shard::sharder::By,
}

impl LeaderArgs {
    /// The election's settings for `identity`, the timings checked (see
    /// [`crate::leader::Config::with_timing`]).
    pub fn lease(&self, identity: String) -> Result<crate::leader::Config, crate::Error> {
        crate::leader::Config::new(&self.lease_name, &self.lease_namespace, identity).with_timing(
            self.lease_duration,
            self.lease_renew_deadline,
            self.lease_retry_period,
        )
    }

    /// Where the shard Leases are, with sharding on (`None` with it off).
    pub fn sharder(&self) -> Result<Option<crate::shard::sharder::Config>, crate::Error> {
        if !self.sharding {
            if self.shard_by == crate::shard::sharder::By::Namespace {
                return Err(crate::Error::ShardByWithoutSharding);
            }
            return Ok(None);
        }
        if !self.leader_elect {
            return Err(crate::Error::ShardingWithoutElection);
        }
        Ok(Some(crate::shard::sharder::Config {
            namespace: self.lease_namespace.clone(),
            lease_prefix: format!("{}-shard-", self.lease_name),
            by: self.shard_by,
            record: format!("{}-ranges", self.lease_name),
            settle: self.lease_duration,
        }))
    }
}

/// Controller flags.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// How many MyApps are reconciled at once. A reconcile mostly waits for the API server;
    /// more in flight let one wake-up of the operator's thread serve several, which lowers the
    /// CPU per MyApp as well as the time to converge.
    #[arg(long, env = "MYAPP_CONCURRENCY", default_value_t = crate::controller::DEFAULT_CONCURRENCY,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Safety-net resync period: every MyApp is reconciled once per period (each at its own
    /// point of it, spread by name) besides what watch events trigger.
    #[arg(long, env = "MYAPP_RESYNC", default_value = "5m", value_parser = parse_duration)]
    pub resync: Duration,
    /// Deadline of one reconcile.
    #[arg(long, env = "MYAPP_RECONCILE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub reconcile_timeout: Duration,
    /// Objects per page when a watch lists (at start, and again after the API server expires
    /// it). Bigger pages list faster in fewer requests; each page is held in memory while it
    /// is read.
    #[arg(long, env = "MYAPP_LIST_PAGE_SIZE", default_value_t = crate::controller::Config::default().page_size,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub list_page_size: u32,
}

/// Admission (webhook rule) flags.
#[derive(Debug, Args)]
pub struct AdmissionArgs {
    /// Maximum `spec.replicas` the webhook admits (the CRD schema allows up to 1000).
    #[arg(long, env = "MYAPP_MAX_REPLICAS", default_value_t = crate::crd::MAX_REPLICAS,
          value_parser = clap::value_parser!(i32).range(0..=i64::from(crate::crd::MAX_REPLICAS)))]
    pub max_replicas: i32,
    /// An env variable every MyApp gets unless it sets that name itself, as NAME=VALUE.
    /// Repeatable; the environment variable takes one entry per line (values may hold commas).
    #[arg(long = "default-env", env = "MYAPP_DEFAULT_ENV", value_delimiter = '\n', value_parser = crate::admission::parse_default_env)]
    pub default_env: Vec<EnvVar>,
}

/// Logging flags.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log format: `plain` for people, `json` for log collectors.
    #[arg(long, env = "MYAPP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `myapp_operator=debug,kube=warn`. kube's
    /// own error line per failed request (the operator logs those with the URL and the cause)
    /// and kube's span around each reconcile (the operator's own names the MyApp) are left out
    /// unless the filter names `kube_client` or `kube_runtime`.
    #[arg(long, env = "MYAPP_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// Parses durations such as `500ms`, `10s`, `5m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 10s, 5m or 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{text:?} has no unit: write 500ms, 10s, 5m or 1h")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The README promises an environment fallback for every flag but `certs --force`.
    #[test]
    fn every_flag_but_force_has_an_environment_fallback() {
        let cli = Cli::command();
        let mut checked = 0;
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || (sub.get_name(), id) == ("certs", "force") {
                    continue;
                }
                let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
                assert!(
                    env.starts_with("MYAPP_"),
                    "{} --{id} has no MYAPP_ environment fallback",
                    sub.get_name()
                );
                checked += 1;
            }
        }
        assert!(checked > 20, "{checked}");
    }

    #[test]
    fn leader_elect_is_a_switch_that_also_takes_false() {
        let elect = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(run) => run.leader.leader_elect,
            _ => unreachable!(),
        };
        assert!(elect(&["myapp-operator", "run"]));
        assert!(elect(&["myapp-operator", "run", "--leader-elect"]));
        assert!(elect(&["myapp-operator", "run", "--leader-elect=true"]));
        assert!(!elect(&["myapp-operator", "run", "--leader-elect=false"]));
    }

    #[test]
    fn sharding_is_off_by_default_and_needs_the_election() {
        let sharder = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(run) => run.leader.sharder(),
            _ => unreachable!(),
        };
        assert!(sharder(&["myapp-operator", "run"]).unwrap().is_none());
        let on = sharder(&["myapp-operator", "run", "--sharding", "--lease-name=ops"])
            .unwrap()
            .expect("sharding on");
        assert_eq!(on.lease_name("pod-0"), "ops-shard-pod-0");
        assert_eq!(on.namespace, "myapp-system");
        let refused = sharder(&[
            "myapp-operator",
            "run",
            "--sharding",
            "--leader-elect=false",
        ]);
        assert!(
            matches!(refused, Err(crate::Error::ShardingWithoutElection)),
            "{refused:?}"
        );
        let by_namespace = sharder(&[
            "myapp-operator",
            "run",
            "--sharding",
            "--shard-by",
            "namespace",
        ])
        .unwrap()
        .expect("sharding on");
        assert_eq!(by_namespace.by, crate::shard::sharder::By::Namespace);
        assert_eq!(by_namespace.record, "myapp-operator-ranges");
        let alone = sharder(&["myapp-operator", "run", "--shard-by=namespace"]);
        assert!(
            matches!(alone, Err(crate::Error::ShardByWithoutSharding)),
            "{alone:?}"
        );
    }

    #[test]
    fn default_env_is_repeatable_and_checked() {
        let cli = Cli::try_parse_from([
            "myapp-operator",
            "run",
            "--default-env",
            "A=1",
            "--default-env",
            "B=x=y,z",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("run")
        };
        let pairs: Vec<(String, String)> = args
            .admission
            .default_env
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect();
        assert_eq!(
            pairs,
            [("A".into(), "1".into()), ("B".into(), "x=y,z".into())]
        );
        let err =
            Cli::try_parse_from(["myapp-operator", "run", "--default-env", "1A=x"]).unwrap_err();
        assert!(
            err.to_string().contains("must not start with a digit"),
            "{err}"
        );
        let err =
            Cli::try_parse_from(["myapp-operator", "run", "--default-env", "NOVALUE"]).unwrap_err();
        assert!(err.to_string().contains("is not NAME=VALUE"), "{err}");
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("ten s").is_err());
    }

    #[test]
    fn max_replicas_cannot_exceed_the_schema_bound() {
        let err =
            Cli::try_parse_from(["myapp-operator", "run", "--max-replicas", "1001"]).unwrap_err();
        assert!(err.to_string().contains("1001"), "{err}");
    }
}
