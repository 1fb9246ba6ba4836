//! The command line: flags are the interface, documented by `--help`, each with an env fallback.

use clap::{Parser, Subcommand};

/// Kubernetes operator for `MyApp` (example.com/v1): a controller that keeps each app's
/// Deployment and Service equal to its spec, and the admission webhook that validates and
/// defaults MyApps.
#[derive(Debug, Parser)]
#[command(name = "myapp-operator", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster of the current kube-context (controller, webhook and
    /// admin servers in one process).
    Run(RunArgs),
    /// Print the MyApp CustomResourceDefinition as YAML (the content of deploy/crd.yaml).
    Crd,
}

/// Flags of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Maximum `spec.replicas` the webhook admits (the CRD schema allows up to 1000).
    #[arg(long, env = "MYAPP_MAX_REPLICAS", default_value_t = crate::crd::MAX_REPLICAS,
          value_parser = clap::value_parser!(i32).range(0..=i64::from(crate::crd::MAX_REPLICAS)))]
    pub max_replicas: i32,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
