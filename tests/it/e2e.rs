//! The operator end to end on the sandbox: the real kube `Controller`, the real HTTPS webhook,
//! and the sandbox's admission chain calling it — the same `Environment` `dev` runs.

use crate::support::converge;
use crate::support::operator;

use converge::{converged, eventually};
use operator::Operator;

use std::time::Duration;

use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease, core::v1::Service};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_sandbox::WriteFault;
use myapp_operator::{
    admission::AdmissionConfig,
    crd::{EnvVar, MyApp, Phase},
    dev::{Environment, Options},
    leader,
    resources::FIELD_MANAGER,
};
use serde_json::json;

const NS: &str = "default";

async fn environment(default_env: &[(&str, &str)]) -> (Environment, tempfile::TempDir) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::ephemeral(dir.path().to_owned());
    options.admission = AdmissionConfig {
        default_env: default_env
            .iter()
            .map(|(n, v)| EnvVar {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect(),
        ..AdmissionConfig::default()
    };
    (
        Environment::start(options)
            .await
            .expect("environment starts"),
        dir,
    )
}

async fn start_operator(
    env: &Environment,
    identity: &str,
    elect: bool,
    resync: Duration,
) -> Operator {
    Operator::start(env.client().await.unwrap(), identity, elect, resync)
}

fn app(name: &str, replicas: Option<i32>) -> MyApp {
    MyApp::test(name)
        .replicas(replicas)
        .env("LOG_LEVEL", "info")
}

fn container_env(d: &Deployment) -> Vec<(String, String)> {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn image(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

fn writes(env: &Environment) -> Vec<kube_sandbox::RequestRecord> {
    env.sandbox
        .faults()
        .requests()
        .into_iter()
        .filter(|r| {
            matches!(
                r.verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_myapp_gets_owned_children_with_injected_defaults_and_a_running_status() {
    let (env, _dir) = environment(&[("TEAM", "shop"), ("LOG_LEVEL", "debug")]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let created = apps
        .create(&PostParams::default(), &app("web", Some(3)))
        .await
        .unwrap();
    // The mutating webhook added TEAM and left the user's LOG_LEVEL alone.
    let env_names: Vec<(&str, &str)> = created
        .spec
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(env_names, [("LOG_LEVEL", "info"), ("TEAM", "shop")]);

    let running = converged(&apps, "web", Phase::Running).await;
    let status = running.status.clone().unwrap();
    assert_eq!(
        (status.replicas, status.available_replicas),
        (Some(3), Some(3))
    );
    assert_eq!(
        status.selector.as_deref(),
        Some("app.kubernetes.io/instance=web,app.kubernetes.io/name=myapp")
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.observed_generation),
        ("True", running.metadata.generation)
    );

    let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
        .get("web")
        .await
        .unwrap();
    let owner = &deployment.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("MyApp", "web", Some(true))
    );
    assert_eq!(owner.uid, running.uid().unwrap());
    assert_eq!(
        container_env(&deployment),
        [
            ("LOG_LEVEL".into(), "info".into()),
            ("TEAM".into(), "shop".into())
        ]
    );
    let service = Api::<Service>::namespaced(client, NS)
        .get("web")
        .await
        .unwrap();
    assert_eq!(service.owner_references()[0].uid, running.uid().unwrap());
    assert_eq!(service.spec.unwrap().ports.unwrap()[0].port, 8080);
    // A create costs the two child applies and a status write per phase the operator sees:
    // the Deployment controller answers at once that the rollout progresses (as
    // kube-controller-manager does), so the operator may report Progressing before Running.
    // (The environment's install writes come first.)
    let operator_writes: Vec<(String, Option<String>)> = writes(&env)
        .into_iter()
        .filter(|r| r.field_manager.as_deref() == Some(FIELD_MANAGER))
        .map(|r| (r.resource.unwrap_or_default(), r.subresource))
        .filter(|(resource, _)| ["deployments", "services", "myapps"].contains(&resource.as_str()))
        .collect();
    // The two children's applies are in flight at once, so either may land first.
    let (children, statuses) = operator_writes.split_at(2);
    let mut children = children.to_vec();
    children.sort();
    assert_eq!(
        children,
        [("deployments".into(), None), ("services".into(), None)]
    );
    assert!(
        (1..=2).contains(&statuses.len())
            && statuses
                .iter()
                .all(|w| w == &("myapps".to_string(), Some("status".to_string()))),
        "{operator_writes:?}"
    );
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_follow_every_spec_change_and_keep_replicas_when_the_spec_drops_them() {
    let (env, _dir) = environment(&[]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let services = Api::<Service>::namespaced(client.clone(), NS);
    apps.create(&PostParams::default(), &app("web", Some(2)))
        .await
        .unwrap();
    converged(&apps, "web", Phase::Running).await;

    let change = json!({"spec": {"image": "ghcr.io/example/web:2.0.0", "port": 9090, "replicas": 5,
                                 "env": [{"name": "MODE", "value": "fast"}]}});
    apps.patch("web", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let d = eventually("the Deployment follows image, env and replicas", || async {
        let d = deployments.get("web").await.ok()?;
        (image(&d) == "ghcr.io/example/web:2.0.0" && d.spec.as_ref()?.replicas == Some(5))
            .then_some(d)
    })
    .await;
    assert_eq!(
        container_env(&d),
        [("MODE".to_owned(), "fast".to_owned())],
        "LOG_LEVEL was removed from the spec"
    );
    let port = d.spec.unwrap().template.spec.unwrap().containers[0]
        .ports
        .clone()
        .unwrap()[0]
        .container_port;
    assert_eq!(port, 9090);
    eventually("the Service follows the port", || async {
        (services.get("web").await.ok()?.spec?.ports?[0].port == 9090).then_some(())
    })
    .await;
    converged(&apps, "web", Phase::Running).await;

    // The MyApp stops setting replicas: the count stays where it was, for an autoscaler to own.
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([
                {"op": "remove", "path": "/spec/replicas"}
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    converged(&apps, "web", Phase::Running).await;
    let d = deployments.get("web").await.unwrap();
    assert_eq!(
        d.spec.unwrap().replicas,
        Some(5),
        "replicas left alone when the spec drops them"
    );
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_child_comes_back_and_deleting_the_myapp_collects_both() {
    let (env, _dir) = environment(&[]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let services = Api::<Service>::namespaced(client.clone(), NS);
    apps.create(&PostParams::default(), &app("web", Some(1)))
        .await
        .unwrap();
    converged(&apps, "web", Phase::Running).await;
    let first_uid = deployments.get("web").await.unwrap().uid();

    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Deployment is recreated", || async {
        let d = deployments.get("web").await.ok()?;
        (d.uid() != first_uid).then_some(())
    })
    .await;

    apps.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("both children are garbage-collected", || async {
        (deployments.get_opt("web").await.ok()?.is_none()
            && services.get_opt("web").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_changed_by_someone_else_after_it_held_is_put_back() {
    // Once found holding, a Service is remembered by its version and not read again while
    // that version stays: any change of it, by anyone, is a new version and is compared.
    let (env, _dir) = environment(&[]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let services = Api::<Service>::namespaced(client.clone(), NS);
    apps.create(&PostParams::default(), &app("web", Some(1)))
        .await
        .unwrap();
    converged(&apps, "web", Phase::Running).await;
    let ports = |s: &Service| -> Vec<i32> {
        let ports = s.spec.as_ref().unwrap().ports.as_ref().unwrap();
        ports.iter().map(|p| p.port).collect()
    };
    assert_eq!(ports(&services.get("web").await.unwrap()), [8080]);

    // Another writer replaces the ports with one of its own, named apart from ours (a
    // Service's port names must differ), twice.
    for round in 0..2 {
        let edited = services
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"ports": [
                    {"name": "other", "port": 9090 + round, "targetPort": 9090}
                ]}})),
            )
            .await
            .unwrap();
        assert_eq!(ports(&edited), [9090 + round]);
        // The operator applies its own port again; the other writer's stays theirs.
        eventually("the Service's port is put back", || async {
            let service = services.get("web").await.ok()?;
            (ports(&service) == [9090 + round, 8080]).then_some(())
        })
        .await;
    }
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rollout_turns_the_app_degraded() {
    let (env, _dir) = environment(&[]).await;
    env.sandbox.rollouts().set_failing(true);
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let apps = Api::<MyApp>::namespaced(env.client().await.unwrap(), NS);
    apps.create(&PostParams::default(), &app("web", Some(2)))
        .await
        .unwrap();
    let app = converged(&apps, "web", Phase::Degraded).await;
    let degraded = app
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "ProgressDeadlineExceeded")
    );
    // People learn about it from an Event on the MyApp, not only from its status.
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client().await.unwrap(), NS);
    let warning = eventually("a Warning Event says the rollout failed", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("RolloutFailed"))
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let regarding = warning.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("MyApp"), Some("web"))
    );

    env.sandbox.rollouts().set_failing(false);
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"image": "ghcr.io/example/web:1.4.3"}})),
    )
    .await
    .unwrap();
    converged(&apps, "web", Phase::Running).await;
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_steady_state_forced_reconciles_make_no_writes() {
    let (env, _dir) = environment(&[("TEAM", "shop")]).await;
    // A short resync forces reconciles of an unchanged world.
    let operator = start_operator(&env, "solo", false, Duration::from_millis(200)).await;
    let apps = Api::<MyApp>::namespaced(env.client().await.unwrap(), NS);
    for name in ["a", "b", "c"] {
        let mut app = app(name, Some(2));
        if name == "c" {
            // Stored by the API server without its `value`, as Go's encoder omits an empty one.
            app = app.env("EMPTY", "");
        }
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    for name in ["a", "b", "c"] {
        converged(&apps, name, Phase::Running).await;
    }
    // The Running Event is published after the status write converged() saw: the last write
    // of a create. Once all three exist, nothing of the creates is in flight.
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client().await.unwrap(), NS);
    eventually(
        "every MyApp's RolloutComplete Event is published",
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|e| e.reason.as_deref() == Some("RolloutComplete"));
            (running.count() >= 3).then_some(())
        },
    )
    .await;
    env.sandbox.faults().clear_requests();
    let noops_before = operator.parts.metrics.reconcile_noops.get();
    eventually("at least 10 more reconciles ran", || async {
        (operator.parts.metrics.reconcile_noops.get() >= noops_before + 10).then_some(())
    })
    .await;
    assert_eq!(writes(&env), [], "an unchanged world needs no writes");
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_converges_through_dropped_watches_expired_versions_and_failing_writes() {
    let (env, _dir) = environment(&[]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let apps = Api::<MyApp>::namespaced(env.client().await.unwrap(), NS);
    let faults = env.sandbox.faults();

    // The faults are aimed at the operator's writes (its field manager), so the test's own
    // creates never draw them.
    faults.fail_next_writes_by(FIELD_MANAGER, 3, WriteFault::Conflict);
    create_through_faults(&apps, "one").await;
    converged(&apps, "one", Phase::Running).await;

    faults.close_watches();
    faults.expire_next_watch();
    faults.fail_next_writes_by(FIELD_MANAGER, 2, WriteFault::Internal);
    faults.fail_next_writes_by(
        FIELD_MANAGER,
        1,
        WriteFault::TooManyRequests { retry_after: 1 },
    );
    create_through_faults(&apps, "two").await;
    faults.set_delay(Duration::from_millis(100));
    converged(&apps, "two", Phase::Running).await;

    // The request log proves the operator met each fault and retried what failed.
    let requests = faults.requests();
    let ours: Vec<_> = requests
        .iter()
        .filter(|r| r.field_manager.as_deref() == Some(FIELD_MANAGER))
        .collect();
    let failed: Vec<u16> = ours
        .iter()
        .map(|r| r.status)
        .filter(|s| *s >= 400)
        .collect();
    assert_eq!(failed, [409, 409, 409, 500, 500, 429], "{ours:#?}");
    for failure in ours.iter().filter(|r| r.status >= 400) {
        assert!(
            ours.iter().any(|r| r.path == failure.path
                && r.subresource == failure.subresource
                && r.status < 300),
            "{} {} was never retried to success",
            failure.verb,
            failure.path
        );
    }
    faults.set_delay(Duration::ZERO);
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_changed_while_every_watch_was_down_is_reconciled_after_the_relist() {
    let (env, _dir) = environment(&[]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let services = Api::<Service>::namespaced(client, NS);
    let names: Vec<String> = (0..10).map(|i| format!("b-{i}")).collect();
    for name in &names {
        apps.create(&PostParams::default(), &app(name, Some(1)))
            .await
            .unwrap();
    }
    for name in &names {
        converged(&apps, name, Phase::Running).await;
    }

    // Every watch ends and its resume gets 410, so each lists again, in pages of 4.
    let faults = env.sandbox.faults();
    for _ in 0..3 {
        faults.expire_next_watch();
    }
    faults.close_watches();
    // Meanwhile: a new MyApp (first in the MyApp list's first page), a spec edit, and a child
    // deleted with no watch to see it go.
    apps.create(&PostParams::default(), &app("a-new", Some(1)))
        .await
        .unwrap();
    apps.patch(
        "b-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "ghcr.io/example/web:2.0.0"}})),
    )
    .await
    .unwrap();
    services
        .delete("b-5", &DeleteParams::default())
        .await
        .unwrap();

    converged(&apps, "a-new", Phase::Running).await;
    eventually("b-0's Deployment runs the new image", || async {
        let d = deployments.get("b-0").await.ok()?;
        (image(&d) == "ghcr.io/example/web:2.0.0").then_some(())
    })
    .await;
    eventually("b-5's Service is recreated", || async {
        services.get_opt("b-5").await.ok()?.map(|_| ())
    })
    .await;
    operator.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_writes_and_the_other_takes_over_when_it_stops() {
    let (env, _dir) = environment(&[]).await;
    let client = env.client().await.unwrap();
    let first = start_operator(&env, "first", true, Duration::from_secs(300)).await;
    let leases = Api::<Lease>::namespaced(client.clone(), "myapp-system");
    eventually("first holds the lease", || async {
        let holder = leases
            .get("myapp-operator")
            .await
            .ok()?
            .spec?
            .holder_identity?;
        (holder == "first").then_some(())
    })
    .await;
    let second = start_operator(&env, "second", true, Duration::from_secs(300)).await;

    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    apps.create(&PostParams::default(), &app("web", Some(1)))
        .await
        .unwrap();
    converged(&apps, "web", Phase::Running).await;
    assert!(
        first
            .parts
            .metrics
            .writes
            .get_or_create(&deployment_writes())
            .get()
            >= 1
    );
    assert_eq!(
        second
            .parts
            .metrics
            .writes
            .get_or_create(&deployment_writes())
            .get(),
        0,
        "the follower never writes"
    );
    assert!(!second.parts.gate.is_open(), "the follower may not write");

    first.stop().await;
    eventually("second holds the lease", || async {
        let holder = leases
            .get("myapp-operator")
            .await
            .ok()?
            .spec?
            .holder_identity?;
        (holder == "second").then_some(())
    })
    .await;
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 2}})),
    )
    .await
    .unwrap();
    let deployments = Api::<Deployment>::namespaced(client, NS);
    eventually("the new leader reconciles the change", || async {
        (deployments.get("web").await.ok()?.spec?.replicas == Some(2)).then_some(())
    })
    .await;
    // The server holds the write before the client's call returns and counts it.
    eventually("the new leader counted its Deployment write", || async {
        (second
            .parts
            .metrics
            .writes
            .get_or_create(&deployment_writes())
            .get()
            >= 1)
            .then_some(())
    })
    .await;
    second.stop().await;
    env.shutdown().await;
}

/// Creates a MyApp while injected faults may refuse the create: retries until it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_myapp_created_again_after_a_deletion_mid_failure_streak_starts_a_fresh_streak() {
    let (env, _dir) = environment(&[]).await;
    let operator = start_operator(&env, "solo", false, Duration::from_secs(300)).await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client, NS);
    let faults = env.sandbox.faults();
    let failed_writes = || {
        faults
            .requests()
            .iter()
            .filter(|r| r.field_manager.as_deref() == Some(FIELD_MANAGER) && r.status == 500)
            .count()
    };
    // Three failed reconciles in a row (each sends both child applies, and both fail), then
    // the MyApp is deleted before its next retry, with nothing of it written.
    faults.fail_next_writes_by(FIELD_MANAGER, 6, WriteFault::Internal);
    apps.create(&PostParams::default(), &app("flaky", Some(1)))
        .await
        .unwrap();
    eventually("three reconciles of flaky failed", || async {
        (failed_writes() >= 6).then_some(())
    })
    .await;
    apps.delete("flaky", &DeleteParams::default())
        .await
        .unwrap();
    // The MyApp watch delivers in order: once a MyApp created after the delete has converged,
    // the operator has seen the delete.
    apps.create(&PostParams::default(), &app("marker", Some(1)))
        .await
        .unwrap();
    converged(&apps, "marker", Phase::Running).await;

    // Created again, it fails once more: the first failure of a new streak, so it is told in
    // a Warning Event and retried after the shortest backoff.
    faults.fail_next_writes_by(FIELD_MANAGER, 1, WriteFault::Internal);
    let again = apps
        .create(&PostParams::default(), &app("flaky", Some(1)))
        .await
        .unwrap();
    let uid = again.metadata.uid.clone();
    eventually(
        "the new flaky's failure is told in a ReconcileFailed Event",
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("ReconcileFailed")
                        && e.regarding.as_ref().and_then(|r| r.uid.clone()) == uid
                })
                .then_some(())
        },
    )
    .await;
    converged(&apps, "flaky", Phase::Running).await;
    operator.stop().await;
    env.shutdown().await;
}

async fn create_through_faults(apps: &Api<MyApp>, name: &str) {
    eventually(&format!("MyApp {name} exists"), || async {
        if apps.get_opt(name).await.ok()?.is_some() {
            return Some(());
        }
        apps.create(&PostParams::default(), &app(name, Some(1)))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

fn deployment_writes() -> myapp_operator::metrics::WriteLabels {
    myapp_operator::metrics::WriteLabels {
        target: "deployment",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_environment_stops_its_servers() {
    let (env, _dir) = environment(&[]).await;
    let (api, webhook) = (env.api_addr(), env.webhook_addr());
    assert!(tokio::net::TcpStream::connect(api).await.is_ok());
    assert!(tokio::net::TcpStream::connect(webhook).await.is_ok());
    drop(env);
    eventually("the API server and the webhook stop listening", || async {
        let api = tokio::net::TcpStream::connect(api).await;
        let webhook = tokio::net::TcpStream::connect(webhook).await;
        (api.is_err() && webhook.is_err()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_controller_task_ends_stops_renewing_and_another_takes_over() {
    let (env, _dir) = environment(&[]).await;
    let client = env.client().await.unwrap();
    let quick = |identity: &str| {
        leader::Config::new("myapp-operator", "myapp-system", identity)
            .with_timing(
                Duration::from_secs(2),
                Duration::from_millis(1_500),
                Duration::from_millis(200),
            )
            .unwrap()
    };
    let leases = Api::<Lease>::namespaced(client.clone(), "myapp-system");
    let holder = || async {
        leases
            .get("myapp-operator")
            .await
            .ok()?
            .spec?
            .holder_identity
    };
    let first = Operator::start_elected(client.clone(), quick("first"));
    eventually("first holds the lease", || async {
        (holder().await? == "first").then_some(())
    })
    .await;
    let second = Operator::start_elected(client.clone(), quick("second"));
    // As a panic anywhere in its controller would end it: the renewals must end with it.
    first.task.abort();
    eventually("second holds the lease", || async {
        (holder().await? == "second").then_some(())
    })
    .await;
    second.stop().await;
    env.shutdown().await;
}
