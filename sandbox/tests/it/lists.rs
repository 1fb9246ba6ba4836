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
