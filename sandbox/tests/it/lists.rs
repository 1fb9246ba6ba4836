//! What a paged list tells its reader, as kube-apiserver's etcd3 store answers it.

use crate::support::fixtures::client;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube_sandbox::Sandbox;
use serde_json::json;

#[tokio::test]
async fn a_paged_list_says_how_many_items_remain_unless_it_has_selectors() {
    let sandbox = Sandbox::new();
    let maps: Api<ConfigMap> = Api::namespaced(client(&sandbox), "default");
    for i in 0..5 {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{i}"), "labels": {"parity": (i % 2).to_string()}},
        }))
        .unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }

    let first = maps.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    let second = maps
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.metadata.remaining_item_count, Some(1));
    let token = second.metadata.continue_.clone().unwrap();
    let last = maps
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(last.items.len(), 1);
    assert_eq!(last.metadata.remaining_item_count, None, "nothing remains");
    assert_eq!(last.metadata.continue_, None);

    // With a selector the store cannot count what would match, so it does not say.
    let selected = maps
        .list(&ListParams::default().limit(1).labels("parity=0"))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    assert!(selected.metadata.continue_.is_some());
    assert_eq!(selected.metadata.remaining_item_count, None);
}

/// A list or watch URL of the ConfigMaps in `default` with KEP-5866's `shardSelector`.
fn sharded(query: &str, selector: &str) -> axum::http::Request<Vec<u8>> {
    let selector: String = selector
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    axum::http::Request::get(format!(
        "/api/v1/namespaces/default/configmaps?{query}shardSelector={selector}"
    ))
    .body(Vec::new())
    .unwrap()
}

const LOW: &str = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";
const HIGH: &str = "shardRange(object.metadata.uid, '0x8000000000000000', '0xffffffffffffffff')";

#[tokio::test]
async fn with_the_gate_a_shard_selector_splits_lists_and_watches_and_is_echoed() {
    let sandbox = Sandbox::builder().sharded_list_watch(true).build();
    let client = client(&sandbox);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..40 {
        let map: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    let names = |list: &serde_json::Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let list = |selector: &'static str| {
        let client = client.clone();
        async move {
            let text = client.request_text(sharded("", selector)).await.unwrap();
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        }
    };
    let (low, high) = (list(LOW).await, list(HIGH).await);
    assert_eq!(low["metadata"]["shardInfo"]["selector"], LOW);
    let (mut low_names, high_names) = (names(&low), names(&high));
    assert!(!low_names.is_empty() && !high_names.is_empty());
    assert!(low_names.iter().all(|n| !high_names.contains(n)));
    low_names.extend(high_names);
    assert_eq!(
        low_names.len(),
        40,
        "the two halves hold every ConfigMap once"
    );

    // A watch from the list's version sees only its half's changes.
    let version = low["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    for i in 0..40 {
        maps.patch(
            &format!("cm-{i}"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .unwrap();
    }
    let watched = client
        .request_text(sharded(
            &format!("watch=true&resourceVersion={version}&timeoutSeconds=1&"),
            LOW,
        ))
        .await
        .unwrap();
    let mut seen: Vec<String> = watched
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .map(|event| {
            event["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    seen.sort();
    let mut want = names(&low);
    want.sort();
    assert_eq!(seen, want);

    // A malformed selector is refused, saying why.
    let refused = client
        .request_text(sharded(
            "",
            "shardRange(object.metadata.name, '0x0', '0x1')",
        ))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("unsupported field"),
        "{refused}"
    );
}

#[tokio::test]
async fn without_the_gate_a_shard_selector_is_ignored_as_an_older_server_ignores_it() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..10 {
        let map: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    let text = client.request_text(sharded("", LOW)).await.unwrap();
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 10);
    assert!(
        list["metadata"].get("shardInfo").is_none(),
        "{}",
        list["metadata"]
    );
}
