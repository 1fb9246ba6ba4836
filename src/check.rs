//! `check`: walks an installation the way `linkerd check` does and prints one line per check,
//! grouped, with a hint and a pointer into `deploy/README.md` for each failure.
//!
//! Every check reads the cluster as the user running `check` (an admin, usually); the RBAC
//! group asks the API server what the operator's ServiceAccount may do. A group whose
//! precondition failed (no API server, no CRD) says so once instead of failing check by check.

mod api;
mod cert_manager;
mod children;
mod controller;
mod rbac;
pub mod report;
mod shards;
pub mod target;
mod webhook;

use std::path::Path;

use kube::{Client, config::KubeConfigOptions};

pub use rbac::operator_permissions;
pub use report::{Check, Group, Report, Status};
pub use target::Target;
pub use webhook::verifies;

use crate::{Error, cli::CheckArgs, kubeconfig};

/// Runs every check against the cluster `args` name.
pub async fn run(args: &CheckArgs) -> Result<Report, Error> {
    let client = client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let target = Target {
        namespace: args.namespace.clone(),
        probe_namespace: args.probe_namespace.clone(),
        lag_bound: args.lag_bound,
        install: target::Install::Cluster,
        sharding: None,
    };
    Ok(check(&client, &target).await)
}

/// Runs every check with `client`; what kind of installation it is comes from the cluster
/// (`target.install` is replaced).
pub async fn check(client: &Client, target: &Target) -> Report {
    let (mut api, reachable, crd_installed) = api::checks(client).await;
    if !reachable {
        return Report::new(vec![api]);
    }
    let install = target::install(client, &target.namespace).await;
    let sharding = if matches!(install, target::Install::Dev { .. }) {
        None
    } else {
        shards::mode(client, &target.namespace).await
    };
    let target = &Target {
        install,
        sharding,
        ..target.clone()
    };
    if target.is_dev() {
        api.checks.push(Check::ok(
            "api.install",
            format!(
                "this is `myapp-operator dev` (the ConfigMap {}/{} says so): what only a cluster install has is skipped",
                target.namespace,
                target::names::DEV_MARKER
            ),
        ));
    }
    let mut groups = vec![api];
    groups.push(rbac::checks(client, target).await);
    let (webhook, configurations) = webhook::checks(client, target, crd_installed).await;
    groups.push(webhook);
    groups.push(cert_manager::checks(client, target, &configurations).await);
    groups.push(controller::checks(client, target).await);
    if target.sharding.is_some() {
        groups.push(shards::checks(client, target, crd_installed).await);
    }
    groups.push(children::checks(client, target, crd_installed).await);
    Report::new(groups)
}

async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => kubeconfig::from_file(path, &options)
            .await
            .map_err(|source| Error::LoadKubeconfig {
                path: path.to_owned(),
                source: Box::new(source),
            })?,
        None if context.is_some() => {
            kubeconfig::from_found(&options)
                .await
                .map_err(|source| Error::LoadKubeconfig {
                    path: std::env::var_os("KUBECONFIG")
                        .map_or_else(|| "~/.kube/config".into(), Into::into),
                    source: Box::new(source),
                })?
        }
        None => kubeconfig::infer()
            .await
            .map_err(|source| Error::InferConfig {
                kubeconfig: std::env::var("KUBECONFIG").unwrap_or_else(|_| "unset".into()),
                source: Box::new(source),
            })?,
    };
    crate::telemetry::set_api_server(&config.cluster_url.to_string());
    Client::try_from(config).map_err(Error::ConnectCluster)
}
