//! `myapp-operator check`, the real binary, against a whole installation on the sandbox: a
//! healthy install passes every check; broken in each way an installation breaks, exactly the
//! check that names it fails, with its fix.

mod install;
mod operator;

use std::collections::BTreeSet;

use install::{Install, NS};
use k8s_openapi::{
    api::{
        admissionregistration::v1::ValidatingWebhookConfiguration, apps::v1::Deployment,
        rbac::v1::ClusterRole,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use myapp_operator::{
    check::operator_permissions,
    crd::{SCHEMA_SERIAL, SCHEMA_SERIAL_ANNOTATION},
    permission::Scope,
};
use serde_json::json;

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn failed(report: &install::Report) -> BTreeSet<String> {
    report.failed().into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_install_passes_and_each_breakage_fails_exactly_its_check_with_the_fix() {
    let mut install = Install::healthy().await;

    // Healthy: every check passes, nothing is skipped, exit 0.
    let healthy = install.report().await;
    assert_eq!(healthy.ran.code, Some(0), "{:?}", healthy.ran);
    assert!(healthy.failed().is_empty(), "{}", healthy.json);
    assert!(healthy.with_status("warn").is_empty(), "{}", healthy.json);
    assert!(healthy.with_status("skip").is_empty(), "{}", healthy.json);
    assert_eq!(healthy.json["passed"], true);
    let (_, admitted, _) = healthy.get("webhook.admits-valid");
    assert!(admitted.contains("defaults it (env TEAM)"), "{admitted}");
    let text = install.check(&[]).await;
    assert_eq!(text.code, Some(0));
    assert!(
        text.stdout
            .contains("✓ the webhook denies an invalid MyApp"),
        "{}",
        text.stdout
    );
    readme_shows(&text.stdout);

    // A leaked child: our labels, no live MyApp owning it.
    let deployments = Api::<Deployment>::namespaced(install.admin.clone(), "default");
    let leaked: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "leaked", "labels": {"app.kubernetes.io/managed-by": "myapp-operator"}},
        "spec": {"selector": {"matchLabels": {"app": "leaked"}},
                 "template": {"metadata": {"labels": {"app": "leaked"}},
                              "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}))
    .unwrap();
    deployments
        .create(&PostParams::default(), &leaked)
        .await
        .unwrap();
    let report = install.report().await;
    assert_eq!(failed(&report), set(&["children.leaks"]), "{}", report.json);
    assert_eq!(report.ran.code, Some(1));
    let (_, message, hint) = report.get("children.leaks");
    assert!(message.contains("deployment default/leaked"), "{message}");
    assert!(
        hint.contains("kubectl -n default delete deployment leaked"),
        "{hint}"
    );
    deployments
        .delete("leaked", &DeleteParams::default())
        .await
        .unwrap();

    // An older CRD: its serial is below this binary's.
    let crds = Api::<CustomResourceDefinition>::all(install.admin.clone());
    let stamp = |serial: u32| {
        Patch::Merge(
            json!({"metadata": {"annotations": {SCHEMA_SERIAL_ANNOTATION: serial.to_string()}}}),
        )
    };
    crds.patch(
        "myapps.example.com",
        &PatchParams::default(),
        &stamp(SCHEMA_SERIAL - 1),
    )
    .await
    .unwrap();
    let report = install.report().await;
    assert_eq!(failed(&report), set(&["api.crd.schema"]), "{}", report.json);
    let (_, message, hint) = report.get("api.crd.schema");
    assert!(message.contains("older than this binary's"), "{message}");
    assert!(
        hint.contains("kubectl apply -f deploy/base/crd.yaml"),
        "{hint}"
    );
    assert!(
        hint.contains("myapp-operator crd | kubectl apply -f -"),
        "{hint}"
    );
    crds.patch(
        "myapps.example.com",
        &PatchParams::default(),
        &stamp(SCHEMA_SERIAL),
    )
    .await
    .unwrap();

    // A wrong caBundle on the validating configuration: the API server cannot call it either.
    let validating = Api::<ValidatingWebhookConfiguration>::all(install.admin.clone());
    let wrong = base64_pem(&install::Pki::new().ca_pem());
    let right = base64_pem(&install.pki.ca_pem());
    // A JSON patch of one webhook's caBundle: `op` with `bundle` as the value, if any.
    let bundle_patch = |op: &str, webhook: usize, bundle: Option<&str>| {
        let mut step =
            json!({"op": op, "path": format!("/webhooks/{webhook}/clientConfig/caBundle")});
        if let Some(bundle) = bundle {
            step["value"] = json!(bundle);
        }
        Patch::Json::<()>(serde_json::from_value(json!([step])).unwrap())
    };
    validating
        .patch(
            "myapp-operator",
            &PatchParams::default(),
            &bundle_patch("replace", 0, Some(&wrong)),
        )
        .await
        .unwrap();
    let report = install.report().await;
    assert_eq!(
        failed(&report),
        set(&[
            "webhook.ca-bundle.validate.myapps.example.com",
            "webhook.denies-invalid",
            "webhook.admits-valid"
        ]),
        "{}",
        report.json
    );
    let (_, message, hint) = report.get("webhook.ca-bundle.validate.myapps.example.com");
    assert!(
        message.contains("the caBundle of webhook validate.myapps.example.com (ValidatingWebhookConfiguration myapp-operator) does not verify the serving certificate"),
        "{message}"
    );
    assert!(
        hint.contains("cert-manager.io/inject-ca-from: myapp-system/myapp-operator-webhook"),
        "{hint}"
    );
    validating
        .patch(
            "myapp-operator",
            &PatchParams::default(),
            &bundle_patch("replace", 0, Some(&right)),
        )
        .await
        .unwrap();

    // The scale webhook without its bundle (the old recipe without cert-manager did this):
    // only `kubectl scale` and autoscalers would be refused, so no dry run notices; its own
    // check names it.
    validating
        .patch(
            "myapp-operator",
            &PatchParams::default(),
            &bundle_patch("remove", 1, None),
        )
        .await
        .unwrap();
    let report = install.report().await;
    assert_eq!(
        failed(&report),
        set(&["webhook.ca-bundle.scale.myapps.example.com"]),
        "{}",
        report.json
    );
    let (_, message, _) = report.get("webhook.ca-bundle.scale.myapps.example.com");
    assert!(
        message.contains("webhook scale.myapps.example.com (ValidatingWebhookConfiguration myapp-operator) has no caBundle"),
        "{message}"
    );
    validating
        .patch(
            "myapp-operator",
            &PatchParams::default(),
            &bundle_patch("add", 1, Some(&right)),
        )
        .await
        .unwrap();

    // No Ready endpoint behind the webhook Service.
    install.publish_endpoint(false).await;
    let report = install.report().await;
    assert_eq!(
        failed(&report),
        set(&[
            "webhook.endpoints",
            "webhook.denies-invalid",
            "webhook.admits-valid"
        ]),
        "{}",
        report.json
    );
    let (_, message, hint) = report.get("webhook.endpoints");
    assert!(
        message.contains("has no Ready endpoint (1 not ready)"),
        "{message}"
    );
    assert!(hint.contains("/readyz"), "{hint}");
    let (_, denial, _) = report.get("webhook.denies-invalid");
    assert!(denial.contains("no endpoints available"), "{denial}");
    install.publish_endpoint(true).await;

    // An expired serving certificate in the Secret (same CA), then one about to expire.
    let (cert, key) = install.pki.serving(-30, -1);
    install.put_secret(&cert, &key).await;
    let report = install.report().await;
    assert_eq!(
        failed(&report),
        set(&["webhook.certificate-validity"]),
        "{}",
        report.json
    );
    let (_, message, hint) = report.get("webhook.certificate-validity");
    assert!(message.contains("expired at"), "{message}");
    assert!(
        hint.contains("cmctl renew -n myapp-system myapp-operator-webhook"),
        "{hint}"
    );
    let (cert, key) = install.pki.serving(-80, 3);
    install.put_secret(&cert, &key).await;
    let report = install.report().await;
    assert!(report.failed().is_empty(), "{}", report.json);
    assert_eq!(report.ran.code, Some(0), "a warning does not fail the run");
    assert_eq!(report.with_status("warn"), ["webhook.certificate-validity"]);
    let (cert, key) = install.pki.serving(-1, 90);
    install.put_secret(&cert, &key).await;
    assert!(install.report().await.failed().is_empty());

    // The webhook down (its endpoint still listed, as for the seconds before a kubelet
    // notices): both dry runs fail with the API server's reason.
    let mut replica = install.replica.take().unwrap();
    replica.0.kill().unwrap();
    replica.0.wait().unwrap();
    let report = install.report().await;
    let failing = failed(&report);
    assert!(
        failing.contains("webhook.denies-invalid") && failing.contains("webhook.admits-valid"),
        "{}",
        report.json
    );
    assert!(
        failing
            .iter()
            .all(|id| id.starts_with("webhook.") || id.starts_with("controller.")),
        "{failing:?}"
    );
    let (_, message, hint) = report.get("webhook.admits-valid");
    assert!(message.contains("failed calling webhook"), "{message}");
    assert!(hint.contains("endpoints"), "{hint}");

    // No CRD: the one API check fails with the command that installs it; what needs MyApps is
    // skipped, not failed.
    crds.delete("myapps.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let report = install.report().await;
    let failing = failed(&report);
    assert!(failing.contains("api.crd"), "{}", report.json);
    assert!(
        !failing
            .iter()
            .any(|id| id.starts_with("children") || id.contains("dry-run")),
        "{failing:?}"
    );
    let (_, message, hint) = report.get("api.crd");
    assert_eq!(
        message,
        "the CustomResourceDefinition myapps.example.com is not installed"
    );
    assert!(
        hint.starts_with("kubectl apply -f deploy/base/crd.yaml"),
        "{hint}"
    );
    assert_eq!(report.get("children").0, "skip");
    install.served.shutdown().await.unwrap();
}

/// The text between the `check-healthy` markers of deploy/README.md equals `output`, up to
/// what differs between runs (dates, digests, ages, days left).
fn readme_shows(output: &str) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/README.md")).unwrap();
    let start = readme
        .find("<!-- check-healthy -->\n```console\n$ myapp-operator check\n")
        .expect("deploy/README.md has the check-healthy sample");
    let sample = &readme[start..];
    let sample = &sample[sample.find("check\n").unwrap() + 6..];
    let sample = &sample[..sample.find("```").unwrap()];
    let normal = |text: &str| {
        let mut text = text.to_owned();
        for (pattern, with) in [
            (r"\d{4}-\d\d-\d\dT[0-9:.]+Z", "<date>"),
            (r"sha256:[0-9a-f]+", "sha256:<digest>"),
            (r"\d+ s ago", "<n> s ago"),
            (r"\(\d+ days\)", "(<n> days)"),
        ] {
            text = regex::Regex::new(pattern)
                .unwrap()
                .replace_all(&text, with)
                .into_owned();
        }
        text
    };
    assert!(
        normal(sample) == normal(output),
        "deploy/README.md's sample of a healthy check is stale; this run printed:\n{output}"
    );
}

#[test]
fn an_unreachable_api_server_is_one_failed_check_and_exit_1() {
    // A port nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        kube_sandbox::kubeconfig_for(([127, 0, 0, 1], port).into()),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
        .args(["check", "-o", "json"])
        .env("MYAPP_KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let checks = &report["groups"][0]["checks"];
    assert_eq!(report["groups"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(checks[0]["id"], "api.reachable");
    assert_eq!(checks[0]["status"], "fail");
    assert!(
        checks[0]["hint"].as_str().unwrap().contains("--kubeconfig"),
        "{report}"
    );
}

fn base64_pem(pem: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_each_rbac_rule_exactly_its_check_fails_naming_the_rule_to_add() {
    let install = Install::bare().await;
    let baseline = install.report().await;
    let rbac_failed: Vec<String> = baseline
        .failed()
        .into_iter()
        .filter(|id| id.starts_with("rbac."))
        .collect();
    assert!(rbac_failed.is_empty(), "{}", baseline.json);

    let roles = Api::<ClusterRole>::all(install.admin.clone());
    let leader_roles =
        Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(install.admin.clone(), NS);
    let documents = crate::support::install::rbac_documents();
    for permission in operator_permissions() {
        let removed = (
            permission.group.to_owned(),
            permission.resource.to_owned(),
            permission.verb.to_owned(),
        );
        let without = crate::rbac::rbac_documents_without(&removed);
        let rules_of = |docs: &[serde_json::Value], kind: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind)
                .map(|d| d["rules"].clone())
                .unwrap()
        };
        let (role_api_patch, kind) = match permission.scope {
            Scope::Cluster => (true, "ClusterRole"),
            Scope::OperatorNamespace => (false, "Role"),
        };
        let patch =
            |docs: &[serde_json::Value]| Patch::Merge(json!({"rules": rules_of(docs, kind)}));
        if role_api_patch {
            roles
                .patch("myapp-operator", &PatchParams::default(), &patch(&without))
                .await
                .unwrap();
        } else {
            leader_roles
                .patch(
                    "myapp-operator-leader-election",
                    &PatchParams::default(),
                    &patch(&without),
                )
                .await
                .unwrap();
        }
        let report = install.report().await;
        let group = if permission.group.is_empty() {
            "core"
        } else {
            permission.group
        };
        let id = format!("rbac.{group}/{}/{}", permission.resource, permission.verb);
        let rbac_failed: Vec<String> = report
            .failed()
            .into_iter()
            .filter(|id| id.starts_with("rbac."))
            .collect();
        assert_eq!(rbac_failed, std::slice::from_ref(&id), "{}", report.json);
        assert_eq!(report.ran.code, Some(1));
        let (_, _, hint) = report.get(&id);
        assert!(hint.contains(&permission.rule()), "{hint}");
        let role = match permission.scope {
            Scope::Cluster => "to the ClusterRole myapp-operator",
            Scope::OperatorNamespace => {
                "to the Role myapp-operator-leader-election in myapp-system"
            }
        };
        assert!(hint.contains(role), "{hint}");
        // Restore.
        if role_api_patch {
            roles
                .patch(
                    "myapp-operator",
                    &PatchParams::default(),
                    &patch(&documents),
                )
                .await
                .unwrap();
        } else {
            leader_roles
                .patch(
                    "myapp-operator-leader-election",
                    &PatchParams::default(),
                    &patch(&documents),
                )
                .await
                .unwrap();
        }
    }
    install.served.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharding_turned_on_is_checked_and_the_webhook_places_a_new_myapp_on_its_shard() {
    let mut install = Install::healthy().await;
    // The Deployment turned to sharding (the component applied by half: no permissions, and
    // the pods not restarted): each missing part fails its own check.
    let deployments = Api::<Deployment>::namespaced(install.admin.clone(), NS);
    let sharding_env = json!({"spec": {"template": {"spec": {"containers": [{
        "name": "operator", "env": [{"name": "MYAPP_SHARDING", "value": "true"}]}]}}}});
    deployments
        .patch(
            "myapp-operator",
            &PatchParams::default(),
            &Patch::Strategic(sharding_env),
        )
        .await
        .unwrap();
    let half = install.report().await;
    assert_eq!(
        failed(&half),
        set(&[
            "rbac.example.com/myapps/patch",
            "rbac.coordination.k8s.io/leases/list",
            "rbac.coordination.k8s.io/leases/watch",
            "rbac.coordination.k8s.io/leases/delete",
            "sharding.shards",
        ]),
        "{}",
        half.json
    );
    let (_, _, fix) = half.get("rbac.example.com/myapps/patch");
    assert!(
        fix.contains("ClusterRole myapp-operator-sharding (deploy/sharding/rbac.yaml"),
        "{fix}"
    );
    // web, on no shard for longer than the check's bound (timestamps count whole seconds):
    // nobody reconciles it.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let ran = install.check(&["-o", "json", "--lag-bound", "0s"]).await;
    assert!(
        ran.stdout.contains("default/web (on no shard"),
        "{}",
        ran.stdout
    );

    // The whole component: its permissions, and the replica restarted with sharding on.
    crate::support::install::apply(
        &install.admin,
        crate::support::install::deploy_documents("sharding/rbac.yaml"),
    )
    .await;
    install.replica = None;
    let (cert, key) = install.pki.serving(-1, 90);
    let (replica, lines) = install.spawn_replica_with(&cert, &key, &["--sharding"]);
    install.replica = Some(replica);
    install.webhook = Some(kube_sandbox::testing::wait_for_addr(
        &lines,
        "Webhook serving",
    ));
    std::thread::spawn(move || while lines.recv().is_ok() {});
    install.publish_endpoint(true).await;
    let apps = Api::<myapp_operator::crd::MyApp>::namespaced(install.admin.clone(), "default");
    kube_sandbox::testing::eventually("web is on the replica's shard", || async {
        let web = apps.get("web").await.ok()?;
        (web.labels()
            .get(myapp_operator::shard::SHARD_LABEL)
            .map(String::as_str)
            == Some(install::IDENTITY))
        .then_some(())
    })
    .await;
    // A MyApp created now is stored on its shard already: the webhook labelled it from its
    // replica's view of the ring (the stored object the create returns is the webhook's).
    let on_shard = |app: &myapp_operator::crd::MyApp| {
        app.labels()
            .get(myapp_operator::shard::SHARD_LABEL)
            .map(String::as_str)
            == Some(install::IDENTITY)
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    kube_sandbox::testing::eventually("the webhook's view knows the shard", || async {
        let app = apps
            .create(&dry_run, &myapp_operator::crd::MyApp::test("api"))
            .await
            .ok()?;
        on_shard(&app).then_some(())
    })
    .await;
    let created = apps
        .create(
            &PostParams::default(),
            &myapp_operator::crd::MyApp::test("api"),
        )
        .await
        .unwrap();
    assert!(on_shard(&created), "{:?}", created.metadata.labels);
    crate::support::converge::converged(&apps, "api", myapp_operator::crd::Phase::Running).await;

    let sharded = install.report().await;
    assert!(sharded.failed().is_empty(), "{}", sharded.json);
    assert!(sharded.with_status("warn").is_empty(), "{}", sharded.json);
    let (status, shards, _) = sharded.get("sharding.shards");
    assert_eq!(status, "ok");
    assert!(shards.contains(install::IDENTITY), "{shards}");
    assert_eq!(sharded.get("sharding.coverage").0, "ok");
    assert_eq!(sharded.get("sharding.claims").0, "ok");
    assert_eq!(sharded.get("rbac.example.com/myapps/patch").0, "ok");
}
