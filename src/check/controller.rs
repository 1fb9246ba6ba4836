//! Controller: a replica holds the Lease and renews it, and that replica's pod is Ready.

use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
};
use serde_json::Value;

use super::{
    report::{Check, Group},
    target::{Target, api_message, names},
};

/// The Controller group.
pub async fn checks(client: &Client, target: &Target) -> Group {
    if target.is_dev() {
        return group(vec![Check::skip(
            "controller.lease",
            "dev runs one controller in its own process, without leader election: there is no Lease or pod to check",
        )]);
    }
    let ns = &target.namespace;
    let logs = format!(
        "kubectl -n {ns} get pods -l app.kubernetes.io/name=myapp-operator; kubectl -n {ns} logs deploy/myapp-operator"
    );
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(names::LEASE)
        .await;
    let mut checks = Vec::new();
    let spec = match lease {
        Ok(Some(lease)) => lease.spec.unwrap_or_default(),
        Ok(None) => {
            checks.push(Check::fail(
                "controller.lease",
                format!("the Lease {ns}/{} does not exist: no replica has ever led, so no MyApp is reconciled", names::LEASE),
                logs,
                "controller",
            ));
            return group(checks);
        }
        Err(error) => {
            checks.push(Check::fail(
                "controller.lease",
                format!(
                    "the Lease {ns}/{} cannot be read: {}",
                    names::LEASE,
                    api_message(&error)
                ),
                "run check as a user who may get leases in the operator's namespace",
                "controller",
            ));
            return group(checks);
        }
    };
    let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        checks.push(Check::fail(
            "controller.lease",
            format!(
                "the Lease {ns}/{} has no holder: no replica reconciles",
                names::LEASE
            ),
            logs,
            "controller",
        ));
        return group(checks);
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let renewed = spec.renew_time.or(spec.acquire_time).map(|t| t.0);
    let age = renewed.map(|t| Timestamp::now().as_second() - t.as_second());
    match age {
        Some(age) if age <= duration => checks.push(Check::ok(
            "controller.lease",
            format!("{holder} leads: it renewed the Lease {age} s ago (it lasts {duration} s)"),
        )),
        _ => checks.push(Check::fail(
            "controller.lease",
            format!(
                "{holder} holds the Lease but has not renewed it for {} (it lasts {duration} s): the leader is stuck or gone",
                age.map_or("ever".to_owned(), |a| format!("{a} s"))
            ),
            logs.clone(),
            "controller",
        )),
    }
    // The identity is the pod name (deploy/base/deployment.yaml sets MYAPP_IDENTITY from it).
    // As JSON: its Ready condition is all that is read, and a typed Pod would bring a reader
    // for every field of a pod spec into the binary.
    let pods =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ApiResource::erase::<Pod>(&()));
    match pods.get_opt(&holder).await {
        Ok(Some(pod)) => {
            let ready = pod
                .data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            checks.push(if ready {
                Check::ok("controller.pod", format!("the leader's pod {ns}/{holder} is Ready"))
            } else {
                Check::fail(
                    "controller.pod",
                    format!("the leader's pod {ns}/{holder} is not Ready"),
                    format!("kubectl -n {ns} describe pod {holder}"),
                    "controller",
                )
            });
        }
        Ok(None) => checks.push(Check::warn(
            "controller.pod",
            format!("the leader {holder} is not a pod in {ns}: it runs outside the cluster or under another --identity"),
            format!("kubectl -n {ns} get pods; the Deployment sets MYAPP_IDENTITY to the pod name"),
            "controller",
        )),
        Err(error) => checks.push(Check::warn(
            "controller.pod",
            format!("the leader's pod {ns}/{holder} cannot be read: {}", api_message(&error)),
            "run check as a user who may get pods in the operator's namespace",
            "controller",
        )),
    }
    group(checks)
}

fn group(checks: Vec<Check>) -> Group {
    Group {
        name: "Controller",
        checks,
    }
}
