//! Fault injection: closed watches, expired resourceVersions, failing writes, the request log.

use crate::support::api::{assert_refused, config_map, requests_with_verb};
use crate::support::fixtures;
use crate::support::watch::{initial_names, watch_from};
use crate::support::webhook::{Webhook, create_cluster_object};

use std::collections::BTreeSet;

use fixtures::client;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_sandbox::testing::eventually;
use kube_sandbox::{Sandbox, WriteFault};
use serde_json::json;

#[tokio::test]
async fn a_watch_closed_mid_stream_resumes_from_its_version_without_losing_events() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    initial_names(&mut events).await;
    cms.create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    while !seen.contains("before") {
        if let watcher::Event::Apply(cm) = events.next().await.unwrap().unwrap() {
            seen.insert(cm.name_any());
        }
    }
    // Close the stream, then write while no watch is open: the re-watch must replay these.
    sandbox.faults().close_watches();
    for name in ["during-1", "during-2", "during-3"] {
        cms.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let mut relisted = false;
    while seen.len() < 4 {
        match events.next().await.unwrap().unwrap() {
            watcher::Event::Apply(cm) => {
                seen.insert(cm.name_any());
            }
            watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {
                relisted = true;
            }
            watcher::Event::Delete(_) => {}
        }
    }
    assert!(
        !relisted,
        "the watcher resumed from its version instead of relisting"
    );
    let watches = requests_with_verb(&sandbox, "watch");
    assert!(watches >= 2, "a second watch was opened: {watches} watches");
}

#[tokio::test]
async fn an_expired_version_makes_the_kube_watcher_relist_and_converge() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = watcher(cms.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .for_each(|_| async {});
    let task = tokio::spawn(stream);
    cms.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    eventually("first object in the store", || async {
        reader
            .get(&reflector::ObjectRef::new("a").within("default"))
            .map(|_| ())
    })
    .await;

    let lists_before = requests_with_verb(&sandbox, "list");
    sandbox.faults().expire_next_watch();
    sandbox.faults().close_watches();
    cms.create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap();
    eventually("store converged after the relist", || async {
        let names: BTreeSet<String> = reader.state().iter().map(|c| c.name_any()).collect();
        (names == BTreeSet::from(["a".to_string(), "b".to_string()])).then_some(())
    })
    .await;
    let lists_after = requests_with_verb(&sandbox, "list");
    assert!(lists_after > lists_before, "the 410 led to a new list");
    task.abort();
}

#[tokio::test]
async fn injected_write_failures_answer_with_their_status_then_writes_succeed() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    sandbox.faults().fail_next_writes(1, WriteFault::Conflict);
    sandbox.faults().fail_next_writes(1, WriteFault::Internal);
    sandbox
        .faults()
        .fail_next_writes(1, WriteFault::TooManyRequests { retry_after: 3 });
    let mut codes = Vec::new();
    // A caller's retry loop: retry on 409/429/500 until the write goes through.
    let created = loop {
        match cms.create(&PostParams::default(), &config_map("c")).await {
            Ok(cm) => break cm,
            Err(kube::Error::Api(status)) => codes.push(status.code),
            Err(other) => panic!("unexpected error: {other}"),
        }
    };
    assert_eq!(codes, [409, 500, 429]);
    assert_eq!(created.name_any(), "c");
}

#[tokio::test]
async fn failures_aimed_at_a_field_manager_spare_other_writers() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    sandbox
        .faults()
        .fail_next_writes_by("operator", 1, WriteFault::Conflict);
    let apply =
        |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    cms.create(&PostParams::default(), &config_map("by-someone"))
        .await
        .expect("a write without that manager passes");
    cms.patch(
        "a",
        &PatchParams::apply("tester"),
        &Patch::Apply(apply("a")),
    )
    .await
    .expect("another manager's apply passes");
    let ours = PatchParams::apply("operator");
    let refused = cms.patch("b", &ours, &Patch::Apply(apply("b"))).await;
    assert_refused(&refused, 409);
    cms.patch("b", &ours, &Patch::Apply(apply("b")))
        .await
        .expect("the fault is spent");
}

#[tokio::test]
async fn the_request_log_records_verb_resource_subresource_manager_and_status() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let apply = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    cms.patch("c", &PatchParams::apply("tester"), &Patch::Apply(&apply))
        .await
        .unwrap();
    let _ = cms.get("missing").await;
    let log = sandbox.faults().requests();
    let patch = log
        .iter()
        .find(|r| r.verb == "patch")
        .expect("patch logged");
    assert_eq!(patch.resource.as_deref(), Some("configmaps"));
    assert_eq!(patch.field_manager.as_deref(), Some("tester"));
    assert_eq!(patch.status, 201);
    let get = log.iter().find(|r| r.verb == "get").expect("get logged");
    assert_eq!(get.status, 404);
    assert_eq!(get.name.as_deref(), Some("missing"));
}

/// The events of a raw watch of the ConfigMaps in `default` with `query`, read to the end of its
/// stream, and the body they came in.
async fn watched(client: &kube::Client, query: &str) -> (Vec<serde_json::Value>, String) {
    let uri = format!("/api/v1/namespaces/default/configmaps?watch=true&{query}");
    let request = axum::http::Request::get(uri).body(Vec::new()).unwrap();
    let body = client.request_text(request).await.unwrap();
    let events = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (events, body)
}

#[tokio::test]
async fn a_watch_from_a_version_older_than_the_log_gets_one_410_error_event() {
    let sandbox = Sandbox::builder().event_log_capacity(2).build();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for name in ["a", "b", "c", "d"] {
        cms.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let (lines, body) = watched(&client, "resourceVersion=1&timeoutSeconds=5").await;
    assert_eq!(lines.len(), 1, "{body}");
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn a_watch_ends_after_its_timeout_seconds() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    // The watch is read to the end of its stream: this returns only because the watch ends.
    let (events, body) = watched(&client, "timeoutSeconds=1").await;
    assert_eq!(events.len(), 1, "{body}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "a");
    assert!(events[0]["object"]["metadata"]["resourceVersion"].is_string());
}

#[tokio::test]
async fn the_peak_of_requests_in_flight_is_counted_per_user_agent_without_watches() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    cms.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    // A watch stays open throughout and is not counted.
    let watch =
        tokio::spawn(watcher(cms.clone(), watcher::Config::default()).for_each(|_| async {}));
    eventually("the watch is open", || async {
        sandbox
            .faults()
            .requests()
            .iter()
            .any(|r| r.verb == "watch")
            .then_some(())
    })
    .await;
    sandbox.faults().clear_requests();
    sandbox
        .faults()
        .set_delay(std::time::Duration::from_millis(200));
    let gets = (0..5).map(|_| cms.get("a"));
    for got in futures::future::join_all(gets).await {
        got.unwrap();
    }
    sandbox.faults().set_delay(std::time::Duration::ZERO);
    // This client sends no User-Agent: its requests count under "".
    assert_eq!(sandbox.faults().peak_in_flight(""), 5);
    assert_eq!(sandbox.faults().peak_in_flight("someone-else"), 0);
    sandbox.faults().clear_requests();
    cms.get("a").await.unwrap();
    assert_eq!(
        sandbox.faults().peak_in_flight(""),
        1,
        "cleared, then one at a time"
    );
    watch.abort();
}

/// A client of the served sandbox that sends `user_agent`.
fn client_as(served: &kube_sandbox::Served, user_agent: &'static str) -> kube::Client {
    let url = format!("http://{}", served.addr()).parse().unwrap();
    let mut config = kube::Config::new(url);
    config.headers.push((
        axum::http::header::USER_AGENT,
        axum::http::HeaderValue::from_static(user_agent),
    ));
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn request_counts_keep_every_request_by_client_after_the_log_drops_the_oldest() {
    let sandbox = Sandbox::builder().request_log_capacity(3).build();
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (writer, reader) = (
        client_as(&served, "writer/1"),
        client_as(&served, "reader/1"),
    );
    let written: Api<ConfigMap> = Api::default_namespaced(writer);
    for name in ["a", "b", "c", "d"] {
        written
            .create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    written
        .patch(
            "a",
            &PatchParams::apply("writer"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                                 "data": {"k": "v"}})),
        )
        .await
        .unwrap();
    let read: Api<ConfigMap> = Api::default_namespaced(reader);
    read.get("a").await.unwrap();
    read.list(&Default::default()).await.unwrap();

    let faults = sandbox.faults();
    assert_eq!(faults.requests().len(), 3, "the log keeps its capacity");
    assert_eq!(faults.requests_dropped(), 4);
    let count = |agent: &str, verb: &str| {
        faults
            .request_counts()
            .iter()
            .filter(|(k, _)| {
                k.user_agent.as_deref() == Some(agent)
                    && k.verb == verb
                    && k.resource.as_deref() == Some("configmaps")
            })
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    assert_eq!(count("writer/1", "create"), 4);
    assert_eq!(count("writer/1", "patch"), 1);
    assert_eq!(count("reader/1", "get"), 1);
    assert_eq!(count("reader/1", "list"), 1);
    assert_eq!(count("reader/1", "create"), 0);

    faults.clear_requests();
    assert_eq!(faults.request_counts().len(), 0);
    assert_eq!(faults.requests_dropped(), 0);
    served.shutdown().await.unwrap();
}

#[tokio::test]
async fn status_counts_keep_every_answer_by_client_and_status_after_the_log_drops_the_oldest() {
    let sandbox = Sandbox::builder().request_log_capacity(1).build();
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let writer = client_without_retries(&served, "writer/1");
    let reader = client_without_retries(&served, "reader/1");
    let written: Api<ConfigMap> = Api::default_namespaced(writer);
    let read: Api<ConfigMap> = Api::default_namespaced(reader);
    written
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let taken = written
        .create(&PostParams::default(), &config_map("a"))
        .await;
    assert_refused(&taken, 409);
    // A stale resourceVersion precondition, as an operator's apply planned from its cache.
    let stale = json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "a", "resourceVersion": "1"}, "data": {"k": "v"}});
    let refused = written
        .patch(
            "a",
            &PatchParams::apply("writer").force(),
            &Patch::Apply(&stale),
        )
        .await;
    assert_refused(&refused, 409);
    sandbox.faults().fail_next_writes(1, WriteFault::Internal);
    let failed = written
        .create(&PostParams::default(), &config_map("b"))
        .await;
    assert_refused(&failed, 500);
    read.get("a").await.unwrap();
    let _ = read.get("missing").await;

    let faults = sandbox.faults();
    assert_eq!(faults.requests().len(), 1, "the log keeps its capacity");
    let by_status = |agent: &str, verb: &str| {
        let mut answers = Vec::new();
        for ((key, status), n) in faults.status_counts() {
            if key.user_agent.as_deref() == Some(agent)
                && key.verb == verb
                && key.resource.as_deref() == Some("configmaps")
            {
                answers.push((status, n));
            }
        }
        answers
    };
    assert_eq!(
        by_status("writer/1", "create"),
        [(201, 1), (409, 1), (500, 1)]
    );
    assert_eq!(by_status("writer/1", "patch"), [(409, 1)]);
    assert_eq!(by_status("reader/1", "get"), [(200, 1), (404, 1)]);
    assert_eq!(by_status("reader/1", "create"), []);
    // The counts by kind are the same answers, summed over their statuses.
    let total: u64 = faults.status_counts().values().sum();
    assert_eq!(total, faults.request_counts().values().sum::<u64>());
    assert_eq!(total, 6);

    faults.clear_requests();
    assert!(faults.status_counts().is_empty());
    read.get("a").await.unwrap();
    assert_eq!(by_status("reader/1", "get"), [(200, 1)], "counted afresh");
    served.shutdown().await.unwrap();
}

/// A client of the served sandbox that sends `user_agent` and does not retry: kube's default
/// client retries a 503, which is what a stalled write is answered with.
fn client_without_retries(served: &kube_sandbox::Served, user_agent: &'static str) -> kube::Client {
    let url = format!("http://{}", served.addr()).parse().unwrap();
    let mut config = kube::Config::new(url);
    config.default_retry = false;
    config.headers.push((
        axum::http::header::USER_AGENT,
        axum::http::HeaderValue::from_static(user_agent),
    ));
    kube::Client::try_from(config).unwrap()
}

/// The names of the ConfigMaps in default, as the store holds them.
async fn names(cms: &Api<ConfigMap>) -> BTreeSet<String> {
    let list = cms.list(&Default::default()).await.unwrap();
    list.items.iter().map(ResourceExt::name_any).collect()
}

#[tokio::test]
async fn a_write_stall_lets_k_concurrent_writes_land_and_refuses_the_rest_once_released() {
    // A mutating webhook keeps each create in flight (in admission) while the others arrive: a
    // write that finds k slots taken by writes not yet committed must be held too.
    let webhook = Webhook::start().await;
    let sandbox = webhook.sandbox();
    let (mutating, _) = webhook.configurations("", "configmaps");
    create_cluster_object::<MutatingWebhookConfiguration>(&client(&sandbox), mutating).await;
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let faults = sandbox.faults();
    faults.stall_writes_after("crashing-operator", 2);
    let stalled: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(&served, "crashing-operator/1.0"));
    let bystander: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(&served, "bystander/1.0"));

    let creates = tokio::spawn({
        let stalled = stalled.clone();
        async move {
            let creates = (0..5).map(|i| {
                let stalled = stalled.clone();
                async move {
                    let name = format!("c-{i}");
                    let created = stalled
                        .create(&PostParams::default(), &config_map(&name))
                        .await;
                    (name, created)
                }
            });
            futures::future::join_all(creates).await
        }
    });
    eventually("three of the five writes held, two committed", || async {
        (faults.writes_held() == 3 && faults.stalled_writes_accepted() == 2).then_some(())
    })
    .await;
    // Reads of the stalled client, and writes of others, pass.
    assert_eq!(names(&stalled).await.len(), 2);
    bystander
        .create(&PostParams::default(), &config_map("bystander"))
        .await
        .expect("another client writes");

    faults.release_stalled();
    let results = creates.await.unwrap();
    let landed: BTreeSet<String> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(landed.len(), 2, "{results:?}");
    for (_, refused) in results.iter().filter(|(_, r)| r.is_err()) {
        assert!(
            matches!(refused, Err(kube::Error::Api(s))
                if s.code == 503 && s.reason == "ServiceUnavailable" && s.message.contains("stall")),
            "{refused:?}"
        );
    }
    assert_eq!(faults.writes_held(), 0);
    let reviewed: BTreeSet<String> = webhook
        .reviews
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, review)| review["request"]["name"].as_str().map(str::to_owned))
        .filter(|name| name.starts_with("c-"))
        .collect();
    assert_eq!(reviewed, landed, "held writes never reach admission");
    let mut expected = landed.clone();
    expected.insert("bystander".into());
    assert_eq!(names(&stalled).await, expected, "a held write never lands");

    stalled
        .create(&PostParams::default(), &config_map("after-release"))
        .await
        .expect("the release disarms the stall");
    assert_eq!(
        faults.stalled_writes_accepted(),
        2,
        "a disarmed stall counts no more"
    );
    served.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_write_stall_counts_only_accepted_writes_of_any_verb_and_holds_the_next() {
    let sandbox = Sandbox::new();
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let faults = sandbox.faults();
    faults.stall_writes_after("crashing-operator", 2);
    let stalled: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(&served, "crashing-operator/1.0"));
    stalled
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let exists = stalled
        .create(&PostParams::default(), &config_map("a"))
        .await;
    assert_refused(&exists, 409);
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let data = |v: &str| Patch::Merge(json!({"data": {"k": v}}));
    stalled.patch("a", &dry_run, &data("dry")).await.unwrap();
    assert_eq!(
        faults.stalled_writes_accepted(),
        1,
        "a refused write and a dry run are not counted"
    );
    stalled
        .patch("a", &PatchParams::default(), &data("last"))
        .await
        .unwrap();
    assert_eq!(faults.stalled_writes_accepted(), 2);

    let delete = tokio::spawn({
        let stalled = stalled.clone();
        async move { stalled.delete("a", &Default::default()).await }
    });
    eventually("the delete is held", || async {
        (faults.writes_held() == 1).then_some(())
    })
    .await;
    faults.release_stalled();
    let refused = delete.await.unwrap();
    assert_refused(&refused, 503);
    let a = stalled
        .get("a")
        .await
        .expect("the held delete was not carried out");
    assert_eq!(a.data.unwrap()["k"], "last");
    served.shutdown().await.unwrap();
}

/// The next event of a watch, or None when none comes within half a second.
async fn next_event(
    events: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
) -> Option<WatchEvent<ConfigMap>> {
    let next = tokio::time::timeout(std::time::Duration::from_millis(500), events.next());
    next.await.ok().flatten().map(Result::unwrap)
}

/// Holds the reads of a client, changes a ConfigMap three times with another, checks what the
/// held client sees, releases, and returns the `data.k` of each event its watch then sends.
async fn modified_under_a_read_hold(coalesce: bool) -> Vec<(String, String)> {
    let sandbox = Sandbox::new();
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let faults = sandbox.faults();
    let held: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(&served, "lagging-reader/1.0"));
    let writer: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(&served, "writer/1.0"));
    let data = |v: &str| Patch::Merge(json!({"data": {"k": v}}));
    writer
        .create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();
    writer
        .patch("cm", &PatchParams::default(), &data("v0"))
        .await
        .unwrap();

    faults.hold_reads("lagging-reader");
    let h = sandbox.resource_version().to_string();
    let mut watch = watch_from(&held, &h).await;
    for v in ["v1", "v2", "v3"] {
        writer
            .patch("cm", &PatchParams::default(), &data(v))
            .await
            .unwrap();
    }
    let live = writer.list(&Default::default()).await.unwrap();
    assert_ne!(live.metadata.resource_version.as_deref(), Some(h.as_str()));
    assert_eq!(writer.get("cm").await.unwrap().data.unwrap()["k"], "v3");

    let list = held.list(&Default::default()).await.unwrap();
    assert_eq!(list.metadata.resource_version.as_deref(), Some(h.as_str()));
    assert_eq!(list.items[0].data.as_ref().unwrap()["k"], "v0");
    assert_eq!(held.get("cm").await.unwrap().data.unwrap()["k"], "v0");
    assert!(
        next_event(&mut watch).await.is_none(),
        "a held watch sends nothing newer than the snapshot"
    );
    // A watch from a version the held client cannot have reached waits for the release.
    let beyond = live.metadata.resource_version.unwrap();
    let mut from_beyond = watch_from(&held, &beyond).await;

    faults.release_reads(coalesce);
    let mut seen = Vec::new();
    while let Some(event) = next_event(&mut watch).await {
        let (kind, cm) = match event {
            WatchEvent::Added(cm) => ("ADDED", cm),
            WatchEvent::Modified(cm) => ("MODIFIED", cm),
            WatchEvent::Deleted(cm) => ("DELETED", cm),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("{e:?}"),
        };
        seen.push((kind.to_owned(), cm.data.unwrap()["k"].clone()));
    }
    assert_eq!(held.get("cm").await.unwrap().data.unwrap()["k"], "v3");
    writer
        .patch("cm", &PatchParams::default(), &data("v4"))
        .await
        .unwrap();
    match next_event(&mut from_beyond).await {
        Some(WatchEvent::Modified(cm)) => assert_eq!(cm.data.unwrap()["k"], "v4"),
        other => panic!("the watch from beyond the snapshot resumes after it: {other:?}"),
    }
    served.shutdown().await.unwrap();
    seen
}

#[tokio::test]
async fn held_reads_serve_the_snapshot_and_a_coalescing_release_sends_only_the_last_state() {
    assert_eq!(
        modified_under_a_read_hold(true).await,
        [("MODIFIED".to_owned(), "v3".to_owned())]
    );
}

#[tokio::test]
async fn held_reads_serve_the_snapshot_and_a_plain_release_sends_every_withheld_event() {
    let modified = |v: &str| ("MODIFIED".to_owned(), v.to_owned());
    assert_eq!(
        modified_under_a_read_hold(false).await,
        [modified("v1"), modified("v2"), modified("v3")]
    );
}
