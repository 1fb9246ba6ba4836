//! Watching in tests: kube's watcher streams read through the initial list, then change by
//! change, and raw watches from a version.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// Reads `events` through the end of its initial list, returning the names listed.
pub async fn initial_names<K: ResourceExt>(
    events: &mut (impl Stream<Item = watcher::Result<Event<K>>> + Unpin),
) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        match events.next().await.unwrap().unwrap() {
            Event::InitApply(object) => names.push(object.name_any()),
            Event::InitDone => return names,
            _ => {}
        }
    }
}

/// The next `count` changes `events` reports, as ("apply" or "delete", object).
pub async fn changes<K>(
    events: &mut (impl Stream<Item = watcher::Result<Event<K>>> + Unpin),
    count: usize,
) -> Vec<(&'static str, K)> {
    let mut seen = Vec::new();
    while seen.len() < count {
        match events.next().await.unwrap().unwrap() {
            Event::Apply(object) => seen.push(("apply", object)),
            Event::Delete(object) => seen.push(("delete", object)),
            _ => {}
        }
    }
    seen
}

/// A watch of `api` from `version`, as its raw events.
pub async fn watch_from<K>(
    api: &Api<K>,
    version: &str,
) -> BoxStream<'static, kube::Result<WatchEvent<K>>>
where
    K: Clone + DeserializeOwned + Debug + Send + 'static,
{
    api.watch(&WatchParams::default(), version)
        .await
        .unwrap()
        .boxed()
}
