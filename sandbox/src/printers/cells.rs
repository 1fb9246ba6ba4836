//! The cells of one object of each built-in kind, as `printers.go`'s print functions make them.

use serde_json::{Value, json};

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn int(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".into()
    } else {
        s.into()
    }
}

/// `translateTimestampSince`: how long ago, or `<unknown>` for no time.
fn since(obj: &Value, pointer: &str) -> String {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or_else(
            || "<unknown>".into(),
            |t| human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        )
}

fn age(obj: &Value) -> Value {
    json!(since(obj, "/metadata/creationTimestamp"))
}

/// `layoutContainerCells`: container names and images, comma-separated.
fn containers_and_images(obj: &Value, pointer: &str) -> [Value; 2] {
    let containers = obj
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let join = |field: &str| {
        containers
            .iter()
            .map(|c| c[field].as_str().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(",")
    };
    [json!(join("name")), json!(join("image"))]
}

/// `labels.FormatLabels`: `k=v,...` in key order, `<none>` when empty.
pub(super) fn format_labels(map: Option<&Value>) -> String {
    let Some(map) = map.and_then(Value::as_object) else {
        return "<none>".into();
    };
    let mut pairs: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    pairs.sort();
    or_none(&pairs.join(","))
}

/// `metav1.LabelSelectorAsSelector(...).String()`: requirements sorted by key, `in`/`notin`
/// with sorted values; an absent or empty selector prints as nothing.
pub(super) fn format_selector(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return String::new();
    };
    let mut requirements: Vec<(String, String)> = Vec::new();
    for (key, value) in selector["matchLabels"].as_object().into_iter().flatten() {
        requirements.push((
            key.clone(),
            format!("{key}={}", value.as_str().unwrap_or("")),
        ));
    }
    for expr in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expr["key"].as_str().unwrap_or("");
        let mut values: Vec<&str> = expr["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        values.dedup();
        let printed = match expr["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            _ => return "<invalid>".into(),
        };
        requirements.push((key.to_owned(), printed));
    }
    requirements.sort();
    requirements
        .into_iter()
        .map(|(_, r)| r)
        .collect::<Vec<_>>()
        .join(",")
}

/// The default Table's cells: the name and the creation time (RFC 3339, UTC, as stored).
pub(super) fn created_at(obj: &Value) -> Vec<Value> {
    vec![
        json!(text(obj, "/metadata/name")),
        json!(text(obj, "/metadata/creationTimestamp")),
    ]
}

pub(super) fn deployment(obj: &Value) -> Vec<Value> {
    let [containers, images] = containers_and_images(obj, "/spec/template/spec/containers");
    vec![
        json!(text(obj, "/metadata/name")),
        json!(format!(
            "{}/{}",
            int(obj, "/status/readyReplicas"),
            int(obj, "/spec/replicas")
        )),
        json!(int(obj, "/status/updatedReplicas")),
        json!(int(obj, "/status/availableReplicas")),
        age(obj),
        containers,
        images,
        json!(format_selector(obj.pointer("/spec/selector"))),
    ]
}

pub(super) fn replica_set(obj: &Value) -> Vec<Value> {
    let [containers, images] = containers_and_images(obj, "/spec/template/spec/containers");
    vec![
        json!(text(obj, "/metadata/name")),
        json!(int(obj, "/spec/replicas")),
        json!(int(obj, "/status/replicas")),
        json!(int(obj, "/status/readyReplicas")),
        age(obj),
        containers,
        images,
        json!(format_selector(obj.pointer("/spec/selector"))),
    ]
}

/// `printPod`: READY counts ready containers; STATUS is the phase, or the pod's reason, or the
/// last container's waiting/terminated reason, `Init:...` while init containers run, and
/// `Terminating` once deleted; RESTARTS shows when the last restart was.
pub(super) fn pod(obj: &Value) -> Vec<Value> {
    let statuses = |field: &str| {
        obj.pointer(&format!("/status/{field}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let total = obj
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let mut reason = text(obj, "/status/phase").to_owned();
    if !text(obj, "/status/reason").is_empty() {
        reason = text(obj, "/status/reason").to_owned();
    }
    let conditions = statuses("conditions");
    let condition = |kind: &str| conditions.iter().find(|c| c["type"] == kind);
    if condition("PodScheduled")
        .is_some_and(|c| c["status"] == "False" && c["reason"] == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }
    let mut restarts = 0;
    let mut last_restart: Option<jiff::Timestamp> = None;
    let mut note_restart = |status: &Value| {
        restarts += status["restartCount"].as_i64().unwrap_or(0);
        if let Some(finished) = status
            .pointer("/lastState/terminated/finishedAt")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            && last_restart.is_none_or(|last| finished > last)
        {
            last_restart = Some(finished);
        }
    };
    let init_total = obj
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let mut initializing = false;
    for (i, status) in statuses("initContainerStatuses").iter().enumerate() {
        note_restart(status);
        let terminated = status.pointer("/state/terminated");
        if terminated.is_some_and(|t| t["exitCode"].as_i64() == Some(0)) {
            continue;
        }
        let waiting = text(status, "/state/waiting/reason");
        reason = if let Some(t) = terminated {
            let r = t["reason"].as_str().unwrap_or("");
            if r.is_empty() {
                match t["signal"].as_i64().unwrap_or(0) {
                    0 => format!("Init:ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
                    signal => format!("Init:Signal:{signal}"),
                }
            } else {
                format!("Init:{r}")
            }
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{i}/{init_total}")
        };
        initializing = true;
        break;
    }
    let mut ready = 0;
    let mut running = false;
    if !initializing || condition("Initialized").is_some_and(|c| c["status"] == "True") {
        restarts = 0;
        last_restart = None;
        let containers = statuses("containerStatuses");
        for status in containers.iter().rev() {
            restarts += status["restartCount"].as_i64().unwrap_or(0);
            if let Some(finished) = status
                .pointer("/lastState/terminated/finishedAt")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                && last_restart.is_none_or(|last| finished > last)
            {
                last_restart = Some(finished);
            }
            let waiting = text(status, "/state/waiting/reason");
            let terminated = status.pointer("/state/terminated");
            if !waiting.is_empty() {
                reason = waiting.to_owned();
            } else if let Some(t) = terminated {
                let r = t["reason"].as_str().unwrap_or("");
                reason = if !r.is_empty() {
                    r.to_owned()
                } else {
                    match t["signal"].as_i64().unwrap_or(0) {
                        0 => format!("ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
                        signal => format!("Signal:{signal}"),
                    }
                };
            } else if status["ready"] == true && status.pointer("/state/running").is_some() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            reason = if condition("Ready").is_some_and(|c| c["status"] == "True") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }
    let phase = text(obj, "/status/phase");
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        if text(obj, "/status/reason") == "NodeLost" {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }
    let restarts = match last_restart {
        Some(at) if restarts != 0 => format!(
            "{restarts} ({} ago)",
            human_duration(jiff::Timestamp::now().as_second() - at.as_second())
        ),
        _ => restarts.to_string(),
    };
    let gates = obj
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let gates = if gates.is_empty() {
        "<none>".to_owned()
    } else {
        let met = gates
            .iter()
            .filter(|g| {
                condition(g["conditionType"].as_str().unwrap_or(""))
                    .is_some_and(|c| c["status"] == "True")
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    vec![
        json!(text(obj, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        age(obj),
        json!(or_none(text(obj, "/status/podIPs/0/ip"))),
        json!(or_none(text(obj, "/spec/nodeName"))),
        json!(or_none(text(obj, "/status/nominatedNodeName"))),
        json!(gates),
    ]
}

/// `getServiceExternalIP` (wide): external IPs, the load balancer's ingress, or the
/// ExternalName.
fn service_external_ip(obj: &Value) -> String {
    let list = |pointer: &str, field: Option<&str>| -> Vec<String> {
        obj.pointer(pointer)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| match field {
                Some(f) => v[f].as_str().filter(|s| !s.is_empty()).map(str::to_owned),
                None => v.as_str().map(str::to_owned),
            })
            .collect()
    };
    let external = list("/spec/externalIPs", None);
    match text(obj, "/spec/type") {
        "ClusterIP" | "NodePort" => or_none(&external.join(",")),
        "LoadBalancer" => {
            let ingress = obj
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    i["ip"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .or_else(|| i["hostname"].as_str().filter(|s| !s.is_empty()))
                        .map(str::to_owned)
                })
                .collect::<Vec<_>>();
            let all: Vec<String> = ingress.into_iter().chain(external).collect();
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => text(obj, "/spec/externalName").to_owned(),
        _ => "<unknown>".into(),
    }
}

pub(super) fn service(obj: &Value) -> Vec<Value> {
    let ports: Vec<String> = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP");
            let port = p["port"].as_i64().unwrap_or(0);
            match p["nodePort"].as_i64().unwrap_or(0) {
                0 => format!("{port}/{protocol}"),
                node => format!("{port}:{node}/{protocol}"),
            }
        })
        .collect();
    let cluster_ip = obj
        .pointer("/spec/clusterIPs/0")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    vec![
        json!(text(obj, "/metadata/name")),
        json!(text(obj, "/spec/type")),
        json!(cluster_ip),
        json!(service_external_ip(obj)),
        json!(or_none(&ports.join(","))),
        age(obj),
        json!(format_labels(obj.pointer("/spec/selector"))),
    ]
}

/// `printEvent`, over the stored (core) form: first/last seen fall back to `eventTime` and a
/// series' last observation, the count to a series' count or 1.
pub(super) fn event(obj: &Value) -> Vec<Value> {
    let first = if obj.pointer("/firstTimestamp").is_some_and(|t| !t.is_null()) {
        since(obj, "/firstTimestamp")
    } else {
        since(obj, "/eventTime")
    };
    let mut last = if obj.pointer("/lastTimestamp").is_some_and(|t| !t.is_null()) {
        since(obj, "/lastTimestamp")
    } else {
        first.clone()
    };
    let mut count = int(obj, "/count");
    if obj.get("series").is_some_and(Value::is_object) {
        last = since(obj, "/series/lastObservedTime");
        count = int(obj, "/series/count");
    } else if count == 0 {
        count = 1;
    }
    let kind = text(obj, "/involvedObject/kind").to_lowercase();
    let name = text(obj, "/involvedObject/name");
    let target = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    let first_non_empty = |a: &str, b: &str| if a.is_empty() { b } else { a }.to_owned();
    let component = first_non_empty(
        text(obj, "/source/component"),
        text(obj, "/reportingComponent"),
    );
    let instance = first_non_empty(text(obj, "/source/host"), text(obj, "/reportingInstance"));
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(text(obj, "/type")),
        json!(text(obj, "/reason")),
        json!(target),
        json!(text(obj, "/involvedObject/fieldPath")),
        json!(source),
        json!(text(obj, "/message").trim()),
        json!(first),
        json!(count),
        json!(text(obj, "/metadata/name")),
    ]
}

/// `5s`, `3m20s`, `2d3h`... like the API server's human-readable durations.
pub fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}
