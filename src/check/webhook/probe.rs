//! The whole admission path, proven without port-forwarding: a server-side dry-run
//! (`dryRun=All`) create of a MyApp only the webhook denies, and of a good one it admits and
//! defaults. Nothing is stored.

use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, PostParams},
};
use serde_json::Value;

use crate::check::report::Check;
use crate::check::target::{Target, api_message, names};
use crate::{
    admission::{Limits, validate},
    crd::{EnvVar, MyApp, MyAppSpec},
};

/// Name of both dry-run MyApps.
pub const PROBE_NAME: &str = "myapp-operator-check";

/// A spec the CRD schema admits but the webhook denies: a sha256 digest of the wrong length
/// (the schema only bounds its length from below).
pub fn known_bad() -> MyAppSpec {
    MyAppSpec {
        image: format!("ghcr.io/example/web@sha256:{}", "0".repeat(40)),
        port: 8080,
        ..MyAppSpec::default()
    }
}

/// A spec everyone admits.
pub fn known_good() -> MyAppSpec {
    MyAppSpec {
        image: "ghcr.io/example/web:1.4.2".into(),
        port: 8080,
        replicas: Some(1),
        ..MyAppSpec::default()
    }
}

/// The denial and the admission checks.
pub async fn checks(client: &Client, target: &Target) -> Vec<Check> {
    let api = Api::<MyApp>::namespaced(client.clone(), &target.probe_namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let path_hint = format!(
        "the API server calls the webhook through the Service {}/{}: look at the endpoints and caBundle checks above, and at NetworkPolicies that could block the API server",
        target.namespace,
        names::WEBHOOK_SERVICE
    );
    let mut checks = Vec::new();

    let bad = known_bad();
    let expected = validate(&bad, None, &Limits::default())
        .violations
        .into_iter()
        .next()
        .map(|v| v.message)
        .unwrap_or_default();
    let created = api.create(&dry_run, &MyApp::new(PROBE_NAME, bad)).await;
    checks.push(match created {
        Err(error) if !expected.is_empty() && api_message(&error).contains(&expected) => Check::ok(
            "webhook.denies-invalid",
            format!("the webhook denies an invalid MyApp (dry run in {})", target.probe_namespace),
        ),
        Err(error) => Check::fail(
            "webhook.denies-invalid",
            format!(
                "a dry-run create of an invalid MyApp failed, but not with the webhook's denial: {}",
                api_message(&error)
            ),
            path_hint.clone(),
            "webhook",
        ),
        Ok(_) => Check::fail(
            "webhook.denies-invalid",
            format!(
                "the API server admitted a MyApp the webhook denies (dry run in {}): the validating webhook was not called",
                target.probe_namespace
            ),
            "kubectl apply -f deploy/base/webhooks.yaml; its namespaceSelector leaves out kube-system and the operator's namespace (pass --probe-namespace to try another)",
            "webhook",
        ),
    });

    let defaults = configured_defaults(client, &target.namespace).await;
    let admitted = api
        .create(&dry_run, &MyApp::new(PROBE_NAME, known_good()))
        .await;
    checks.push(match admitted {
        Ok(app) => {
            let missing: Vec<&str> = defaults
                .iter()
                .filter(|d| !app.spec.env.contains(d))
                .map(|d| d.name.as_str())
                .collect();
            if !missing.is_empty() {
                Check::fail(
                    "webhook.admits-valid",
                    format!(
                        "a valid MyApp was admitted without the env defaults the operator's Deployment configures: {}",
                        missing.join(", ")
                    ),
                    "kubectl apply -f deploy/base/webhooks.yaml: the MutatingWebhookConfiguration must call /mutate-myapp",
                    "webhook",
                )
            } else if defaults.is_empty() {
                Check::ok(
                    "webhook.admits-valid",
                    "the webhook admits a valid MyApp (no env defaults configured to fill in)",
                )
            } else {
                let names: Vec<&str> = defaults.iter().map(|d| d.name.as_str()).collect();
                Check::ok(
                    "webhook.admits-valid",
                    format!("the webhook admits a valid MyApp and defaults it (env {})", names.join(", ")),
                )
            }
        }
        Err(error) => Check::fail(
            "webhook.admits-valid",
            format!("a dry-run create of a valid MyApp failed: {}", api_message(&error)),
            path_hint,
            "webhook",
        ),
    });
    checks
}

/// The `--default-env` entries of the operator's Deployment (`deploy/base/deployment.yaml`), from
/// its container args and `MYAPP_DEFAULT_ENV`. None when there is no such Deployment.
async fn configured_defaults(client: &Client, namespace: &str) -> Vec<EnvVar> {
    // As JSON: a few strings of its containers are all that is read, and a typed Deployment
    // would bring a reader for every field of a pod spec into the binary.
    let deployments = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<Deployment>(&()),
    );
    let Ok(Some(deployment)) = deployments.get_opt(names::DEPLOYMENT).await else {
        return Vec::new();
    };
    let containers = deployment
        .data
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let mut entries = Vec::new();
    for container in containers {
        let mut args = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        while let Some(arg) = args.next() {
            if let Some(value) = arg.strip_prefix("--default-env=") {
                entries.push(value.to_owned());
            } else if arg == "--default-env" {
                entries.extend(args.next().map(str::to_owned));
            }
        }
        for env in container["env"].as_array().into_iter().flatten() {
            if env["name"] == "MYAPP_DEFAULT_ENV" {
                let value = env["value"].as_str().unwrap_or_default();
                entries.extend(value.lines().map(str::to_owned));
            }
        }
    }
    entries
        .iter()
        .filter_map(|e| crate::admission::parse_default_env(e).ok())
        .collect()
}
