//! Watch streams: replay from a resourceVersion (or synthetic ADDED events), then live events,
//! one JSON object per line.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::context::{Ctx, Selectors, decoded, present, transition};
use crate::status::ApiError;
use crate::store::{Event, Resource};

/// The API server's default watch length when the client sets no `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How often an idle watch that allows bookmarks gets one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

/// Whether `obj` is stored as `api_version` and `kind`: then [`stored_line`] is what
/// `present` would serve.
fn stored_as(obj: &Value, api_version: &str, kind: &str) -> bool {
    obj.get("apiVersion").and_then(Value::as_str) == Some(api_version)
        && obj.get("kind").and_then(Value::as_str) == Some(kind)
}

/// The event line for `obj` written as stored: the same JSON as `line` of `{"type", "object"}`.
fn stored_line(kind: &str, obj: &Value) -> Bytes {
    // Straight into bytes, as `json_response` writes: `Display` passes every token through a
    // `fmt::Formatter`. The same compact JSON; a `Value` always serializes. Trimmed to its
    // length: the log keeps the line as long as the event, and a grown buffer's spare room
    // would be kept with it.
    let mut line = Vec::with_capacity(1024);
    line.extend_from_slice(b"{\"type\":");
    let _ = serde_json::to_writer(&mut line, kind);
    line.extend_from_slice(b",\"object\":");
    let _ = serde_json::to_writer(&mut line, obj);
    line.extend_from_slice(b"}\n");
    Bytes::from(line.into_boxed_slice())
}

/// A logged event's line: its cached line if a watch rendered it, else rendered from its
/// object by `render_line`; then the event may let its object go.
fn render_event(
    kind: &str,
    e: &Event,
    render_line: &impl Fn(&str, &Value, Option<&OnceLock<Bytes>>) -> Bytes,
) -> Bytes {
    let cache = line_cache(kind, e);
    let line = match cache.and_then(OnceLock::get) {
        Some(line) => line.clone(),
        None => render_line(kind, &e.object(), cache),
    };
    e.release_if_superseded();
    line
}

/// Where `e` keeps its line when a watch sends it as the event it was (a label-selector watch
/// may send a MODIFIED as ADDED or DELETED: that line is its own).
fn line_cache<'a>(kind: &str, e: &'a Event) -> Option<&'a OnceLock<Bytes>> {
    (kind == e.kind.as_str()).then_some(&e.line)
}

fn expired_event(requested: u64, oldest: u64) -> Value {
    json!({
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("too old resource version: {requested} ({oldest})"),
            "reason": "Expired",
            "code": 410,
        },
    })
}

/// Starts a watch for the request in `ctx`.
pub(super) fn watch(ctx: &Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::from_request(ctx)?;
    let timeout =
        match ctx.query.get("timeoutSeconds") {
            Some(t) => Duration::from_secs(t.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: invalid value {t:?}"))
            })?),
            None => DEFAULT_TIMEOUT,
        };
    let bookmarks = ctx
        .query
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let send_initial = ctx
        .query
        .get("sendInitialEvents")
        .is_some_and(|b| b == "true");
    let requested = match ctx.query.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {rv:?}: must be an integer"
            ))
        })?),
    };

    let current = ctx.inner.store.lock().rv;
    if let Some(requested) = requested
        && requested > current
    {
        // kube-apiserver's watch cache waits up to 3 s for the revision first; every revision
        // here is written synchronously, so one beyond the current never arrives.
        return Err(ApiError::too_large_resource_version(requested, current));
    }
    let rt = ctx.rt.clone();
    let meta_only = ctx.meta_only;
    let scope = Scope {
        resource: rt.storage(),
        namespace: ctx.path.namespace.clone(),
        selectors,
    };
    let as_table = ctx.table;
    let served_as = (rt.api_version(), rt.kind.clone());
    let render = {
        let rt = rt.clone();
        // kubectl get -w asks for Tables: each event carries a one-row Table, the column
        // definitions only in the first (kubectl prints the header once).
        let first_table = std::sync::atomic::AtomicBool::new(true);
        move |kind: &str, obj: &Value| {
            if as_table {
                let obj = &*decoded(&rt, obj);
                let mut table = crate::table::table(&rt, &[obj], 0);
                if !first_table.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    table["columnDefinitions"] = json!([]);
                }
                if let Some(m) = table.get_mut("metadata") {
                    m["resourceVersion"] = obj
                        .pointer("/metadata/resourceVersion")
                        .cloned()
                        .unwrap_or(Value::Null);
                }
                return json!({"type": kind, "object": table});
            }
            json!({"type": kind, "object": present(&rt, obj, meta_only).into_owned()})
        }
    };
    // An object stored as the version this watch serves (nearly every event: one version per
    // resource, Events aside) is written as stored; `present` would deep-copy it per watcher
    // only to set `apiVersion` and `kind` to what they already are. Tables and metadata-only
    // watches, and objects stored as another version, are presented.
    let plain = !as_table && !meta_only;
    // `cache` is where a logged event keeps its line: an event sent as it happened and as
    // stored is rendered once, for every watch.
    let decode_as = rt.clone();
    let render_line = move |kind: &str, obj: &Value, cache: Option<&OnceLock<Bytes>>| -> Bytes {
        let (api_version, resource_kind) = &served_as;
        let decoded = decoded(&decode_as, obj);
        // Only an object served exactly as stored is cached: the line then holds the stored
        // object, which a logged event may keep in place of its value.
        let cache = cache.filter(|_| matches!(decoded, Cow::Borrowed(_)));
        let obj = &*decoded;
        if plain && stored_as(obj, api_version, resource_kind) {
            return match cache {
                Some(cache) => cache.get_or_init(|| stored_line(kind, obj)).clone(),
                None => stored_line(kind, obj),
            };
        }
        line(&render(kind, obj))
    };
    let bookmark = {
        let rt = rt.clone();
        move |rv: u64, initial_end: bool| {
            let (api_version, kind) = if meta_only {
                (
                    "meta.k8s.io/v1".to_string(),
                    "PartialObjectMetadata".to_string(),
                )
            } else {
                (rt.api_version(), rt.kind.clone())
            };
            let mut obj = json!({"kind": kind, "apiVersion": api_version,
                                 "metadata": {"resourceVersion": rv.to_string()}});
            if initial_end {
                obj["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            json!({"type": "BOOKMARK", "object": obj})
        }
    };

    let inner = ctx.inner.clone();
    let user_agent = ctx.user_agent.clone();
    let mut rv_rx = inner.store.subscribe();
    let mut close_rx = inner.faults.close_signal();
    close_rx.borrow_and_update();
    let mut reads_rx = inner.faults.read_signal();
    reads_rx.borrow_and_update();
    // The read hold this watch was last under, if any (see `Faults::watch_view`).
    let mut held_under = None;

    let mut first: Vec<Bytes> = Vec::new();
    let mut cursor;
    {
        let state = inner.store.lock();
        let view = inner.faults.watch_view(&user_agent, &mut held_under);
        // A held client's watch starts from the snapshot; one from beyond it waits.
        let until = view.until().unwrap_or(state.rv);
        cursor = until;
        match requested {
            Some(rv) if !send_initial => {
                if inner.faults.take_expired_watch() {
                    return Ok(stream_response(
                        vec![line(&expired_event(rv, state.rv))],
                        None,
                    ));
                }
                match state.events_since(rv) {
                    Ok(mut events) => {
                        events.retain(|e| e.rv <= until);
                        for (kind, e) in scope.select(&events, view.coalesce) {
                            first.push(render_event(kind, e, &render_line));
                        }
                        cursor = cursor.max(rv);
                    }
                    Err(expired) => {
                        return Ok(stream_response(
                            vec![line(&expired_event(rv, expired.oldest))],
                            None,
                        ));
                    }
                }
            }
            _ => {
                let ns = scope.namespace.as_deref();
                let objects: Vec<&Value> = match &view.hold {
                    Some(hold) => hold
                        .snapshot
                        .list_after(&scope.resource, ns, None)
                        .map(|(_, o)| o)
                        .collect(),
                    None => state.list(&scope.resource, ns),
                };
                for obj in objects {
                    if scope.selectors.matches(obj) {
                        first.push(render_line("ADDED", obj, None));
                    }
                }
                if send_initial {
                    first.push(line(&bookmark(cursor, true)));
                }
            }
        }
    }

    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        for l in first {
            if tx.send(l).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut ticker = tokio::time::interval(BOOKMARK_INTERVAL);
        ticker.tick().await;
        loop {
            // Biased: a close request or the deadline wins over pending events, so a closed
            // watch never delivers events written after the close.
            tokio::select! {
                biased;
                _ = close_rx.changed() => break,
                _ = tokio::time::sleep_until(deadline) => break,
                _ = tx.closed() => break,
                changed = rv_rx.changed() => if changed.is_err() { break },
                changed = reads_rx.changed() => if changed.is_err() { break },
                _ = ticker.tick(), if bookmarks => {
                    // A held watch that started beyond the snapshot claims nothing until the
                    // release: its client holds no version the held server has reached.
                    let hold = inner.faults.read_hold(&user_agent);
                    let beyond = hold.is_some_and(|h| cursor > h.snapshot.rv);
                    if !beyond && tx.send(line(&bookmark(cursor, false))).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
            // The events are shared (`Arc`): they are rendered after the lock is released, so
            // writers do not wait while every watcher serializes.
            let (batch, coalesce) = {
                let state = inner.store.lock();
                let view = inner.faults.watch_view(&user_agent, &mut held_under);
                let until = view.until().unwrap_or(state.rv);
                if until <= cursor {
                    continue;
                }
                let since = state.events_since(cursor).map(|mut events| {
                    events.retain(|e| e.rv <= until);
                    events
                });
                if since.is_ok() {
                    cursor = until;
                }
                (since, view.coalesce)
            };
            match batch {
                Ok(events) => {
                    for (kind, e) in scope.select(&events, coalesce) {
                        let line = render_event(kind, e, &render_line);
                        if tx.send(line).await.is_err() {
                            return;
                        }
                    }
                }
                // This watcher fell behind the log: tell it to relist.
                Err(expired) => {
                    let _ = tx.send(line(&expired_event(cursor, expired.oldest))).await;
                    return;
                }
            }
        }
    });
    Ok(stream_response(Vec::new(), Some(rx)))
}

/// What one watch is of: a resource, maybe one namespace, and its selectors.
struct Scope {
    resource: Resource,
    namespace: Option<String>,
    selectors: Selectors,
}

impl Scope {
    fn covers(&self, e: &Event) -> bool {
        e.resource == self.resource && self.namespace.as_deref().is_none_or(|ns| ns == e.namespace)
    }

    /// The events of `events` (oldest first) this watch sends, with the type it sends each as.
    /// Coalesced, it sends per object only its net change over them, carrying its newest state,
    /// in the order of the newest events: an object deleted and created again (a new uid) is two
    /// objects, so its client sees the old one go; one created and deleted is not sent at all.
    fn select<'e>(
        &self,
        events: &'e [Arc<Event>],
        coalesce: bool,
    ) -> Vec<(&'static str, &'e Event)> {
        let covered = events.iter().map(|e| &**e).filter(|e| self.covers(e));
        if !coalesce {
            return covered
                .filter_map(|e| Some((self.selectors.event_type(e)?, e)))
                .collect();
        }
        // Per (namespace, name, uid): its first and its last event.
        let mut spans: HashMap<(&str, String, String), (&Event, &Event)> = HashMap::new();
        for e in covered {
            let (name, uid) = e.identity();
            let key = (e.namespace.as_str(), name, uid);
            spans
                .entry(key)
                .and_modify(|span| span.1 = e)
                .or_insert((e, e));
        }
        let mut sent: Vec<(&'static str, &Event)> = spans
            .into_values()
            .filter_map(|(first, last)| {
                let before = self.selectors.selected_before(first);
                let kind = transition(before, self.selectors.selected_after(last))?;
                Some((kind, last))
            })
            .collect();
        sent.sort_unstable_by_key(|(_, e)| e.rv);
        sent
    }
}

fn stream_response(lines: Vec<Bytes>, rx: Option<mpsc::Receiver<Bytes>>) -> Response {
    let head = futures::stream::iter(lines.into_iter().map(Ok::<_, Infallible>));
    let tail = futures::stream::unfold(rx, |rx| async move {
        let mut rx = rx?;
        let next = rx.recv().await?;
        Some((Ok::<_, Infallible>(next), Some(rx)))
    });
    let body = Body::from_stream(futures::StreamExt::chain(head, tail));
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EventType;

    #[test]
    fn an_object_stored_as_served_is_written_as_the_presented_line_would_be() {
        let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": "web", "labels": {"a\"b": "c"}}, "spec": {"replicas": 2}});
        assert!(stored_as(&obj, "apps/v1", "Deployment"));
        let stored = stored_line("MODIFIED", &obj);
        assert!(stored.ends_with(b"\n"));
        let parsed: Value = serde_json::from_slice(&stored).unwrap();
        assert_eq!(parsed, json!({"type": "MODIFIED", "object": obj}));
        assert_eq!(
            parsed,
            serde_json::from_slice::<Value>(&line(&json!({"type": "MODIFIED", "object": obj})))
                .unwrap()
        );
        // Another version or kind is left to `present`.
        assert!(!stored_as(&obj, "apps/v1beta1", "Deployment"));
        assert!(!stored_as(&obj, "apps/v1", "ReplicaSet"));
        assert!(!stored_as(
            &json!({"kind": "Deployment"}),
            "apps/v1",
            "Deployment"
        ));
    }

    #[test]
    fn a_line_is_smaller_than_the_heap_estimate_of_its_object() {
        // The watch log bounds its objects' `heap_bytes`; each event also keeps its rendered
        // line, which this keeps within the same bound again.
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "load", "uid": "0f9a7c1e-3d47-4a0b-9d8e-2b6f1c4e5a73",
                         "resourceVersion": "123456", "generation": 1, "creationTimestamp": "2026-12-03T06:00:00Z",
                         "labels": {"app.kubernetes.io/name": "web"},
                         "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyApp", "name": "web",
                                              "uid": "5b1f3c2d-8e7a-4f60-a1b2-c3d4e5f60718", "controller": true,
                                              "blockOwnerDeletion": true}],
                         "managedFields": [{"manager": "myapp-operator", "operation": "Apply", "apiVersion": "apps/v1",
                                            "time": "2026-12-03T06:00:00Z", "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {
                                                "f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}}}]},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app.kubernetes.io/name": "web"}},
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "web"}},
                                  "spec": {"containers": [{"name": "app", "image": "nginx:1.27", "ports": [{"containerPort": 8080}],
                                                           "env": [{"name": "A", "value": "1"}]}]}}},
            "status": {"replicas": 3, "availableReplicas": 3, "observedGeneration": 1}});
        for obj in [
            deployment,
            json!({"a": [1, 2, 3], "b": ""}),
            json!({"n": 12345678901234i64}),
        ] {
            let line = stored_line("MODIFIED", &obj);
            assert!(
                line.len() < crate::store::heap_bytes(&obj),
                "{} bytes of JSON, heap estimate {}",
                line.len(),
                crate::store::heap_bytes(&obj)
            );
        }
    }

    /// A ConfigMap event in namespace `ns` at version `rv`, labelled `labels` after it (and, if
    /// it is MODIFIED, app=web before it).
    fn event(rv: u64, kind: EventType, name: &str, uid: &str, labels: Value) -> Arc<Event> {
        event_from(rv, kind, name, uid, json!({"app": "web"}), labels)
    }

    fn event_from(
        rv: u64,
        kind: EventType,
        name: &str,
        uid: &str,
        before: Value,
        labels: Value,
    ) -> Arc<Event> {
        let previous_labels = (kind == EventType::Modified).then_some(before);
        Arc::new(Event::new(
            rv,
            kind,
            (String::new(), "configmaps".into()),
            "ns".into(),
            Arc::new(
                json!({"metadata": {"name": name, "namespace": "ns", "uid": uid,
                                         "resourceVersion": rv.to_string(), "labels": labels}}),
            ),
            previous_labels,
        ))
    }

    fn scope(labels: &str) -> Scope {
        Scope {
            resource: (String::new(), "configmaps".into()),
            namespace: Some("ns".into()),
            selectors: Selectors::parse(labels, ""),
        }
    }

    fn sent(selected: Vec<(&'static str, &Event)>) -> Vec<(&'static str, u64)> {
        selected.into_iter().map(|(kind, e)| (kind, e.rv)).collect()
    }

    #[test]
    fn coalescing_sends_each_objects_net_change_at_its_newest_event() {
        use EventType::{Added, Deleted, Modified};
        let web = || json!({"app": "web"});
        let events = [
            event(10, Modified, "chain", "u1", web()),
            event(11, Added, "brief", "u2", web()),
            event(12, Modified, "chain", "u1", web()),
            event(13, Deleted, "brief", "u2", web()),
            event(14, Deleted, "reborn", "u3", web()),
            event(15, Added, "reborn", "u4", web()),
            event(16, Modified, "chain", "u1", web()),
        ];
        assert_eq!(
            sent(scope("").select(&events, true)),
            [("DELETED", 14), ("ADDED", 15), ("MODIFIED", 16)],
            "a chain is its last state; created and deleted is nothing; a new uid is a new object"
        );
        assert_eq!(sent(scope("").select(&events, false)).len(), 7);
    }

    #[test]
    fn coalescing_under_a_label_selector_reports_entering_and_leaving_it() {
        use EventType::Modified;
        let events = [
            event(20, Modified, "leaves", "u1", json!({"app": "db"})),
            event_from(
                21,
                Modified,
                "leaves",
                "u1",
                json!({"app": "db"}),
                json!({"app": "db", "x": "1"}),
            ),
            event(22, Modified, "stays", "u2", json!({"app": "web"})),
            event_from(
                23,
                Modified,
                "enters",
                "u3",
                json!({"app": "db"}),
                json!({"app": "web"}),
            ),
            event(
                24,
                Modified,
                "enters",
                "u3",
                json!({"app": "web", "x": "1"}),
            ),
        ];
        assert_eq!(
            sent(scope("app=web").select(&events, true)),
            [("DELETED", 21), ("MODIFIED", 22), ("ADDED", 24)],
            "what left the selection is DELETED, though its last change was outside it; what \
             entered it is ADDED, though its last change was inside it"
        );
        assert_eq!(
            sent(scope("app=web").select(&events, false)),
            [
                ("DELETED", 20),
                ("MODIFIED", 22),
                ("ADDED", 23),
                ("MODIFIED", 24)
            ]
        );
    }
}
