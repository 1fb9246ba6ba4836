//! What the scheduler and a kubelet write on a Pod, without running anything: bound to the
//! sandbox's one node, `Pending` while its containers are being created, then `Running` and
//! Ready (or stuck pulling its image, when rollouts are set to fail). The conditions and
//! container states are the kubelet's (`pkg/kubelet/status/generate.go`,
//! `pkg/kubelet/kubelet_pods.go` `generateAPIPodStatus`).

use serde_json::{Value, json};

use crate::store::{EventType, State, meta_str, now};

/// The node every simulated Pod is bound to.
pub(crate) const NODE_NAME: &str = "sandbox-node";
const HOST_IP: &str = "172.18.0.2";

/// The Pod as the scheduler binds it and the kubelet first reports it: `Pending`, its
/// containers waiting in `ContainerCreating`.
pub(crate) fn scheduled(mut pod: Value) -> Value {
    let ts = now();
    pod["spec"]["nodeName"] = json!(NODE_NAME);
    let containers = container_names(&pod, "containers");
    let has_init = !container_names(&pod, "initContainers").is_empty();
    let waiting = |name: &str, image: &str| {
        json!({
            "name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "started": false, "state": {"waiting": {"reason": "ContainerCreating"}},
        })
    };
    let unready = unready_message(&containers);
    pod["status"] = json!({
        "phase": "Pending",
        "conditions": [
            condition("PodReadyToStartContainers", "False", None, &ts),
            if has_init {
                condition("Initialized", "False", Some(("ContainersNotInitialized",
                    format!("containers with incomplete status: [{}]",
                        container_names(&pod, "initContainers").join(" ")))), &ts)
            } else {
                condition("Initialized", "True", None, &ts)
            },
            condition("Ready", "False", Some(("ContainersNotReady", unready.clone())), &ts),
            condition("ContainersReady", "False", Some(("ContainersNotReady", unready)), &ts),
            condition("PodScheduled", "True", None, &ts),
        ],
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "startTime": ts,
        "qosClass": qos_class(&pod),
        "containerStatuses": images(&pod, "containers").iter()
            .map(|(n, i)| waiting(n, i)).collect::<Vec<_>>(),
    });
    pod
}

/// The Pod once the kubelet has started its containers: `Running` and Ready; or, when
/// `failing`, still `Pending` with every container in `ImagePullBackOff`.
pub(crate) fn started(mut pod: Value, failing: bool) -> Value {
    let ts = now();
    let init_done: Vec<Value> = images(&pod, "initContainers")
        .into_iter()
        .map(|(name, image)| {
            json!({
                "name": name, "image": image, "imageID": "", "ready": true, "restartCount": 0,
                "started": false, "containerID": container_id(),
                "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                         "startedAt": ts, "finishedAt": ts,
                                         "containerID": container_id()}},
            })
        })
        .collect();
    let images = images(&pod, "containers");
    let status = &mut pod["status"];
    let ip = pod_ip();
    status["podIP"] = json!(ip);
    status["podIPs"] = json!([{"ip": ip}]);
    if !init_done.is_empty() {
        status["initContainerStatuses"] = json!(init_done);
    }
    let set = |status: &mut Value, type_: &str, value: &str, reason: Option<(&str, String)>| {
        if let Some(conditions) = status["conditions"].as_array_mut()
            && let Some(c) = conditions.iter_mut().find(|c| c["type"] == type_)
        {
            let mut replacement = condition(type_, value, reason, &ts);
            if c["status"] == value {
                replacement["lastTransitionTime"] = c["lastTransitionTime"].clone();
            }
            *c = replacement;
        }
    };
    set(status, "PodReadyToStartContainers", "True", None);
    set(status, "Initialized", "True", None);
    if failing {
        status["containerStatuses"] = json!(images.iter().map(|(name, image)| json!({
            "name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "started": false,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": format!("Back-off pulling image \"{image}\"")}},
        })).collect::<Vec<_>>());
        return pod;
    }
    status["phase"] = json!("Running");
    set(status, "Ready", "True", None);
    set(status, "ContainersReady", "True", None);
    status["containerStatuses"] = json!(
        images
            .iter()
            .map(|(name, image)| json!({
                "name": name, "image": image, "imageID": "", "ready": true, "restartCount": 0,
                "started": true, "containerID": container_id(),
                "state": {"running": {"startedAt": ts}},
            }))
            .collect::<Vec<_>>()
    );
    pod
}

/// Whether the Pod's `Ready` condition is `True`.
pub(crate) fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Whether the kubelet has reported the Pod's containers as started (or failing to start).
pub(crate) fn is_started(pod: &Value) -> bool {
    pod.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            !cs.iter()
                .any(|c| c.pointer("/state/waiting/reason") == Some(&json!("ContainerCreating")))
        })
}

/// Whether a container of the Pod cannot pull its image (a rollout set to fail).
pub(crate) fn is_failing(pod: &Value) -> bool {
    pod.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.pointer("/state/waiting/reason") == Some(&json!("ImagePullBackOff")))
        })
}

fn condition(type_: &str, status: &str, reason: Option<(&str, String)>, ts: &str) -> Value {
    let mut c = json!({"type": type_, "status": status, "lastProbeTime": null,
                       "lastTransitionTime": ts});
    if let Some((reason, message)) = reason {
        c["reason"] = json!(reason);
        c["message"] = json!(message);
    }
    c
}

fn unready_message(containers: &[String]) -> String {
    format!("containers with unready status: [{}]", containers.join(" "))
}

fn container_names(pod: &Value, field: &str) -> Vec<String> {
    images(pod, field).into_iter().map(|(n, _)| n).collect()
}

fn images(pod: &Value, field: &str) -> Vec<(String, String)> {
    pod["spec"][field]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_string(),
                c["image"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The QoS class (`pkg/apis/core/helper/qos/qos.go`): `Guaranteed` when every container
/// limits cpu and memory to what it requests, `BestEffort` when none requests or limits
/// anything, `Burstable` otherwise.
pub(crate) fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .flat_map(|f| pod["spec"][f].as_array().into_iter().flatten())
        .collect();
    let empty = |v: &Value| v.as_object().is_none_or(|m| m.is_empty());
    if containers
        .iter()
        .all(|c| empty(&c["resources"]["requests"]) && empty(&c["resources"]["limits"]))
    {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = &c["resources"]["limits"][r];
            let request = &c["resources"]["requests"][r];
            !limit.is_null() && (request.is_null() || request == limit)
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn container_id() -> String {
    let id = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    format!("containerd://{id}")
}

fn pod_ip() -> String {
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    format!("10.244.{}.{}", bytes[0], 2 + bytes[1] % 250)
}

/// Reports the named Pods of `ns` as started (see [`started`]), those not started yet.
pub(crate) fn start(state: &mut State, ns: &str, names: &[String], failing: bool) {
    let Some(rt) = state.registry.get("", "v1", "pods") else {
        return;
    };
    for name in names {
        let Some(pod) = state.get(&rt.storage(), ns, name).cloned() else {
            continue;
        };
        if is_started(&pod) || meta_str(&pod, "deletionTimestamp").is_some() {
            continue;
        }
        state.put(&rt, started(pod, failing), EventType::Modified);
    }
}
