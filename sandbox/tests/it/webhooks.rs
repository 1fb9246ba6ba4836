//! The sandbox's write path through real HTTPS admission webhooks, and built-in defaults, seen
//! by the kube client and by kubectl.

use crate::support::api::{api_error, widget_yaml};
use crate::support::fixtures;

use crate::support::kubectl::{apply_widget_crd, served_kubectl, stderr};
use crate::support::webhook::{SERVICE, Webhook, create_cluster_object};
use fixtures::{Widget, client, widget};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_sandbox::Sandbox;
use kube_sandbox::admission::ServiceRef;
use kube_sandbox::testing::path_str;
use serde_json::json;

/// A sandbox whose Widget writes go through `webhook`'s `/label` and `/check`.
async fn sandbox_with_webhooks(webhook: &Webhook) -> Sandbox {
    let (mutating, validating) = webhook.configurations("sandbox.test", "widgets");
    webhook.sandbox_with(mutating, validating).await
}

/// [`sandbox_with_webhooks`], and its Widgets in `default`.
async fn widgets_through(webhook: &Webhook) -> (Sandbox, Api<Widget>) {
    let sandbox = sandbox_with_webhooks(webhook).await;
    let widgets = Api::default_namespaced(client(&sandbox));
    (sandbox, widgets)
}

/// Creates the Widget `name` and checks that the mutating webhook labelled it.
async fn created_and_labelled(widgets: &Api<Widget>, name: &str) {
    let created = widgets
        .create(&PostParams::default(), &widget(name, 2, "m"))
        .await
        .unwrap();
    let labels = created.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("mutated").map(String::as_str), Some("yes"));
}

#[tokio::test]
async fn writes_pass_mutating_then_validating_webhooks_and_denials_reach_the_client() {
    let webhook = Webhook::start().await;
    let (_sandbox, widgets) = widgets_through(&webhook).await;

    created_and_labelled(&widgets, "ok").await;

    let status = api_error(
        widgets
            .create(&PostParams::default(), &widget("big", 7, "m"))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "admission webhook \"check.sandbox.test\" denied the request: spec.replicas: Invalid value: 7: must be at most 5"
    );
    assert!(widgets.get_opt("big").await.unwrap().is_none());

    // Deletes are not in the rules: they go through without a call.
    widgets
        .delete("ok", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_scale_write_is_admitted_as_an_autoscaling_v1_scale_as_kube_apiserver_does() {
    let webhook = Webhook::start().await;
    let sandbox = sandbox_with_webhooks(&webhook).await;
    let client = client(&sandbox);
    let (_, mut scale_check) = webhook.configurations("sandbox.test", "widgets/scale");
    scale_check["metadata"]["name"] = json!("scale-check");
    scale_check["webhooks"][0]["name"] = json!("scale.sandbox.test");
    create_cluster_object::<ValidatingWebhookConfiguration>(&client, scale_check).await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    widgets
        .create(&PostParams::default(), &widget("w", 2, "m"))
        .await
        .unwrap();
    webhook.reviews.lock().unwrap().clear();

    let scale_to = |replicas: i32| {
        let widgets = widgets.clone();
        async move {
            let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
            widgets
                .patch_scale("w", &PatchParams::default(), &patch)
                .await
        }
    };
    let status = api_error(scale_to(7).await.unwrap_err());
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("scale.sandbox.test"),
        "{}",
        status.message
    );
    scale_to(4).await.unwrap();
    assert_eq!(widgets.get("w").await.unwrap().spec.replicas, 4);

    let reviews = webhook.reviews.lock().unwrap().clone();
    // Only the scale webhook was called, twice, each time with Scale objects.
    assert_eq!(reviews.len(), 2, "{reviews:?}");
    let request = &reviews[1].1["request"];
    assert_eq!(
        request["kind"],
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    );
    assert_eq!(request["resource"]["resource"], "widgets");
    assert_eq!(request["subResource"], "scale");
    assert_eq!(request["operation"], "UPDATE");
    for (field, replicas) in [("object", 4), ("oldObject", 2)] {
        let scale = &request[field];
        assert_eq!(scale["apiVersion"], "autoscaling/v1", "{field}");
        assert_eq!(scale["kind"], "Scale", "{field}");
        assert_eq!(scale["metadata"]["name"], "w", "{field}");
        assert_eq!(scale["spec"]["replicas"], replicas, "{field}");
        assert!(scale.get("status").is_some(), "{field}");
        assert!(
            scale["spec"].get("message").is_none(),
            "{field}: not the Widget"
        );
    }
}

#[tokio::test]
async fn dry_run_is_admitted_by_side_effect_free_webhooks_and_stores_nothing() {
    let webhook = Webhook::start().await;
    let (_sandbox, widgets) = widgets_through(&webhook).await;
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = widgets.create(&pp, &widget("dry", 1, "m")).await.unwrap();
    assert_eq!(
        answered
            .metadata
            .labels
            .unwrap_or_default()
            .get("mutated")
            .map(String::as_str),
        Some("yes")
    );
    assert!(widgets.get_opt("dry").await.unwrap().is_none());
}

#[tokio::test]
async fn deployments_and_services_read_back_with_the_api_servers_defaults() {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let client = client(&sandbox);
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx",
                                                  "ports": [{"containerPort": 80}]}]}},
        },
    }))
    .unwrap();
    let pp = PostParams::default();
    let spec = deployments.create(&pp, &deployment).await.unwrap().spec;
    let spec = spec.unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.revision_history_limit, Some(10));
    assert_eq!(spec.progress_deadline_seconds, Some(600));
    assert_eq!(
        spec.strategy.unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    let container = &spec.template.spec.unwrap().containers[0];
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        container.ports.as_ref().unwrap()[0].protocol.as_deref(),
        Some("TCP")
    );

    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }))
    .unwrap();
    let spec = services.create(&pp, &service).await.unwrap().spec;
    let spec = spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let ip = spec.cluster_ip.expect("a cluster IP was allocated");
    assert!(!ip.is_empty());
    // An update without the IP keeps it.
    let mut again = services.get("web").await.unwrap();
    again.spec.as_mut().unwrap().cluster_ip = None;
    again.spec.as_mut().unwrap().cluster_ips = None;
    let replaced = services
        .replace("web", &PostParams::default(), &again)
        .await
        .unwrap();
    assert_eq!(replaced.spec.unwrap().cluster_ip, Some(ip));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_denied_object_prints_the_webhook_denial_and_fails() {
    let webhook = Webhook::start().await;
    let sandbox = sandbox_with_webhooks(&webhook).await;
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    // The CRD is already installed; applying it again is a no-op "unchanged".
    apply_widget_crd(&k, &[]).await;

    let bad = k.file("bad.yaml", &widget_yaml("bad", 9, "m"));
    let out = k.run(&["apply", "-f", path_str(&bad)]).await;
    let printed = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(
        printed.contains("admission webhook \"check.sandbox.test\" denied the request: spec.replicas: Invalid value: 9: must be at most 5"),
        "{printed}"
    );

    let edge = k.file("edge.yaml", &widget_yaml("edge", 5, "m"));
    let out = k.run(&["apply", "-f", path_str(&edge)]).await;
    let printed = stderr(&out);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("Warning: spec.replicas is at the limit"),
        "{printed}"
    );
}

#[tokio::test]
async fn webhook_calls_go_only_to_ready_endpoints_of_the_service() {
    let webhook = Webhook::start().await;
    let (sandbox, widgets) = widgets_through(&webhook).await;
    // An address nothing listens on: a call dialled there fails (failurePolicy: Fail).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let service = ServiceRef::new(SERVICE.0, SERVICE.1, SERVICE.2);
    let admission = sandbox.admission();

    // Before any call: the first new connection would go to the first endpoint, were
    // readiness not looked at.
    admission.set_endpoints(
        service.clone(),
        vec![(dead, false), (webhook.address, true)],
    );
    for i in 0..4 {
        widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), 1, "m"))
            .await
            .expect("the Ready endpoint answers every call");
    }

    admission.set_endpoints(service.clone(), vec![(webhook.address, false)]);
    let err = widgets
        .create(&PostParams::default(), &widget("none-ready", 1, "m"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no endpoints available for service \"webhook\""),
        "{err}"
    );

    // Kept-alive connections belong to the Service, not to an endpoint: the open connection
    // to the replica that left the endpoints still carries calls (as the API server's do,
    // through the ClusterIP) until that replica closes it.
    admission.set_endpoints(service, vec![(dead, true)]);
    widgets
        .create(&PostParams::default(), &widget("kept-alive", 1, "m"))
        .await
        .expect("the pooled connection is reused");
}

#[tokio::test]
async fn a_review_the_webhook_hangs_up_on_after_reading_fails_instead_of_being_sent_again() {
    // Go's transport, which kube-apiserver's webhook client uses, retries a POST on a fresh
    // connection only when none of it was written; a webhook that closes kept-alive
    // connections under requests (a careless drain) costs a failed call, and so a refused
    // write with failurePolicy: Fail. The sandbox must not hide that by retrying.
    let webhook = Webhook::start_hanging_up_after_first_answer().await;
    let (_sandbox, widgets) = widgets_through(&webhook).await;
    // The mutating call opens the connection and is answered; the validating call reuses it.
    let err = widgets
        .create(&PostParams::default(), &widget("hung-up", 1, "m"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("failed calling webhook"), "{err}");
    assert!(widgets.get_opt("hung-up").await.unwrap().is_none());
}

#[tokio::test]
async fn a_self_signed_ca_certificate_served_as_its_own_ca_bundle_is_trusted_as_go_trusts_it() {
    // What `openssl req -x509` makes: kube-apiserver (Go's crypto/x509) accepts it because the
    // leaf is one of the roots; webpki alone refuses a CA:TRUE leaf.
    let dns = format!("{}.{}.svc", SERVICE.1, SERVICE.0);
    let webhook = Webhook::start_self_signed_ca(&[&dns]).await;
    let (_sandbox, widgets) = widgets_through(&webhook).await;
    created_and_labelled(&widgets, "ok").await;
}

#[tokio::test]
async fn a_self_signed_ca_certificate_for_another_name_is_still_refused() {
    let webhook = Webhook::start_self_signed_ca(&["elsewhere.ops.svc"]).await;
    let (_sandbox, widgets) = widgets_through(&webhook).await;
    let status = api_error(
        widgets
            .create(&PostParams::default(), &widget("ok", 2, "m"))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        status.message.contains("failed calling webhook") && status.message.contains("certificate"),
        "{}",
        status.message
    );
    assert!(webhook.reviews.lock().unwrap().is_empty());
}
