//! The running operator says what `check` says: a missing CRD once, in words, with a metric
//! and quiet retries, readiness untouched; a status write refused for permission as such, in
//! an Event.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use super::install::Install;
use k8s_openapi::{
    api::events::v1::Event,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use kube_sandbox::testing::{eventually, wait_for_addr, wait_for_message};
use myapp_operator::crd::MyApp;

/// GET `path` from the admin server: (status code, body).
fn get(admin: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(admin).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let code = answer[9..12].parse().unwrap();
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, body.to_owned())
}

fn gauge(admin: SocketAddr, name: &str) -> Option<i64> {
    let (_, text) = get(admin, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_is_said_once_with_the_fix_and_a_metric_and_retried_quietly() {
    let install = Install::bare().await;
    let crds = Api::<CustomResourceDefinition>::all(install.admin.clone());
    crds.delete("myapps.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let (cert, key) = install.pki.serving(-1, 90);
    let (_replica, lines) = install.spawn_replica(&cert, &key);
    let admin = wait_for_addr(&lines, "Admin server listening");
    let said = wait_for_message(
        &lines,
        "MyApp CRD is not installed: nothing is reconciled until it is; the webhook keeps serving",
        Duration::from_secs(30),
    )
    .expect("the operator says the CRD is missing");
    assert_eq!(said["level"], "ERROR", "{said}");
    assert_eq!(said["crd"], "myapps.example.com", "{said}");
    assert!(
        said["fix"]
            .as_str()
            .unwrap()
            .starts_with("kubectl apply -f deploy/base/crd.yaml"),
        "{said}"
    );
    assert_eq!(gauge(admin, "myapp_crd_installed"), Some(0));
    assert_eq!(get(admin, "/readyz").0, 200, "readiness is not the CRD's");

    // It keeps trying (two more refused lists of MyApps) without saying it again.
    let myapp_lists = || {
        install
            .sandbox
            .faults()
            .requests()
            .into_iter()
            .filter(|r| r.token_id.as_deref() == Some("replica-0"))
            .filter(|r| r.resource.as_deref() == Some("myapps") && r.status == 404)
            .count()
    };
    let first = myapp_lists();
    eventually("the operator retries the MyApp list twice more", || async {
        (myapp_lists() >= first + 2).then_some(())
    })
    .await;
    let repeated: Vec<String> = lines
        .try_iter()
        .filter(|l| l.contains("MyApp CRD is not installed") || l.contains("Controller event"))
        .collect();
    assert!(repeated.is_empty(), "said again: {repeated:?}");

    // Installed: said once more, the gauge turns 1.
    crds.create(&PostParams::default(), &myapp_operator::crd::stamped_crd())
        .await
        .unwrap();
    assert!(
        wait_for_message(&lines, "MyApp CRD installed", Duration::from_secs(60)).is_some(),
        "the operator says the CRD is installed"
    );
    assert_eq!(gauge(admin, "myapp_crd_installed"), Some(1));
    install.served.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_status_write_says_forbidden_in_an_event() {
    let install = Install::bare().await;
    let without = crate::rbac::rbac_documents_without(&(
        "example.com".into(),
        "myapps/status".into(),
        "patch".into(),
    ));
    let role = without
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .unwrap()
        .clone();
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(install.admin.clone())
        .patch(
            "myapp-operator",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"rules": role["rules"]})),
        )
        .await
        .unwrap();
    let operator_client = crate::support::install::client_for(
        &install.served.kubeconfig_for_token("replica-0").unwrap(),
    )
    .await;
    let operator = crate::support::operator::Operator::start(
        operator_client,
        "status-test",
        true,
        Duration::from_secs(300),
    );
    let apps = Api::<MyApp>::namespaced(install.admin.clone(), "default");
    apps.create(&PostParams::default(), &MyApp::test("web"))
        .await
        .unwrap();
    let events = Api::<Event>::namespaced(install.admin.clone(), "default");
    let event = eventually("a StatusWriteForbidden Event on the MyApp", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("StatusWriteForbidden"))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("web")
    );
    let note = event.note.unwrap_or_default();
    assert!(
        note.starts_with("status not written, forbidden (403)"),
        "{note}"
    );
    assert!(
        note.contains("kubectl apply -f deploy/base/rbac.yaml"),
        "{note}"
    );
    operator.stop().await;
    install.served.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writer_fighting_over_the_image_is_detected_held_off_and_told_in_an_event() {
    use k8s_openapi::api::apps::v1::Deployment;
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    let install = Install::bare().await;
    let operator_client = crate::support::install::client_for(
        &install.served.kubeconfig_for_token("replica-0").unwrap(),
    )
    .await;
    let operator = crate::support::operator::Operator::start(
        operator_client,
        "fight-test",
        true,
        Duration::from_secs(300),
    );
    let apps = Api::<MyApp>::namespaced(install.admin.clone(), "default");
    apps.create(&PostParams::default(), &MyApp::test("web"))
        .await
        .unwrap();
    crate::support::converge::converged(&apps, "web", myapp_operator::crd::Phase::Running).await;

    // Another writer that sets its own image whenever the operator has put its own back.
    const OTHER: &str = "ghcr.io/example/web:other";
    let polls = Arc::new(AtomicUsize::new(0));
    let deployments = Api::<Deployment>::namespaced(install.admin.clone(), "default");
    let writer = tokio::spawn({
        let (deployments, polls) = (deployments.clone(), polls.clone());
        async move {
            let params = kube::api::PatchParams {
                field_manager: Some("other-controller".into()),
                ..Default::default()
            };
            let patch =
                kube::api::Patch::Strategic(serde_json::json!({"spec": {"template": {"spec": {
                "containers": [{"name": "web", "image": OTHER}]}}}}));
            loop {
                let image = deployments
                    .get("web")
                    .await
                    .ok()
                    .and_then(|d| d.spec?.template.spec?.containers.first()?.image.clone());
                if image.as_deref() != Some(OTHER) {
                    let _ = deployments.patch("web", &params, &patch).await;
                }
                polls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    let events = Api::<Event>::namespaced(install.admin.clone(), "default");
    let event = eventually("a FightDetected Event on the MyApp", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FightDetected"))
    })
    .await;
    let note = event.note.unwrap_or_default();
    // The other writer is named from the Deployment's managedFields, with the field it owns.
    assert!(
        note.contains(
            "field manager \"other-controller\" (Update) keeps changing spec.template.spec.containers[0].image"
        ),
        "{note}"
    );
    assert!(!note.contains("myapp-operator\""), "{note}");
    assert!(note.contains("holding off 30 s"), "{note}");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(operator.parts.metrics.fights.get(), 1);

    // Held off: while the other writer keeps polling, the operator writes the Deployment no more.
    let operator_writes = || {
        install
            .sandbox
            .faults()
            .requests()
            .into_iter()
            .filter(|r| r.token_id.as_deref() == Some("replica-0"))
            .filter(|r| r.resource.as_deref() == Some("deployments") && r.verb == "patch")
            .count()
    };
    let at_event = operator_writes();
    let polled = polls.load(Ordering::SeqCst);
    eventually("the other writer polls 25 more times", || async {
        (polls.load(Ordering::SeqCst) >= polled + 25).then_some(())
    })
    .await;
    assert!(
        operator_writes() <= at_event + 1,
        "the operator kept writing during its hold-off: {at_event} -> {}",
        operator_writes()
    );
    let image = deployments
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .image
        .clone();
    assert_eq!(
        image.as_deref(),
        Some(OTHER),
        "the other writer's image stands while held off"
    );
    writer.abort();
    operator.stop().await;
    install.served.shutdown().await.unwrap();
}
