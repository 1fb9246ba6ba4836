//! Children: Deployments and Services with the operator's labels whose MyApp is gone, and
//! MyApps whose status has lagged their spec for too long.

use std::collections::BTreeSet;

use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{Api, Client, Resource, ResourceExt, api::ListParams};

use super::{
    report::{Check, Group},
    target::{Target, api_message},
};
use crate::{crd::MyApp, resources::FIELD_MANAGER};

/// The Children group.
pub async fn checks(client: &Client, target: &Target, crd_installed: bool) -> Group {
    let group = |checks| Group {
        name: "Children",
        checks,
    };
    if !crd_installed {
        return group(vec![Check::skip(
            "children",
            "MyApps cannot be listed without the CRD: skipped",
        )]);
    }
    let apps = match Api::<MyApp>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            return group(vec![Check::fail(
                "children",
                format!("MyApps cannot be listed: {}", api_message(&error)),
                "run check as a user who may list myapps in every namespace",
                "children",
            )]);
        }
    };
    group(vec![leaks(client, &apps).await, lagging(&apps, target)])
}

async fn leaks(client: &Client, apps: &[MyApp]) -> Check {
    const ID: &str = "children.leaks";
    let owners: BTreeSet<String> = apps.iter().filter_map(|a| a.uid()).collect();
    let children = match labelled_children(client).await {
        Ok(children) => children,
        Err(error) => return unlisted(ID, &error, "children"),
    };
    let total = children.len();
    let orphan = |meta: &ObjectMeta| {
        !meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.kind == "MyApp" && owners.contains(&o.uid))
    };
    let mut leaked = Vec::new();
    for (kind, meta) in &children {
        if orphan(meta) {
            leaked.push(format!(
                "{kind} {}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ));
        }
    }
    if leaked.is_empty() {
        return Check::ok(
            ID,
            format!(
                "all {total} Deployments and Services with the operator's labels belong to a MyApp"
            ),
        );
    }
    let first = leaked[0].split_once(' ').map(|(kind, at)| {
        let (ns, name) = at.split_once('/').unwrap_or(("default", at));
        format!("kubectl -n {ns} delete {kind} {name}")
    });
    Check::fail(
        ID,
        format!(
            "{} children outlived their MyApp (leaked): {}",
            leaked.len(),
            leaked.join(", ")
        ),
        format!(
            "delete each, e.g. {}, or re-create its MyApp; the garbage collector only removes children through a controller ownerReference to a live MyApp",
            first.unwrap_or_default()
        ),
        "children",
    )
}

/// The metadata of every Deployment and Service with the operator's managed-by label, each with
/// its kind as kubectl names it (`deployment`, `service`).
pub(super) async fn labelled_children(
    client: &Client,
) -> Result<Vec<(&'static str, ObjectMeta)>, kube::Error> {
    let labelled =
        ListParams::default().labels(&format!("app.kubernetes.io/managed-by={FIELD_MANAGER}"));
    let deployments = Api::<Deployment>::all(client.clone())
        .list_metadata(&labelled)
        .await?;
    let services = Api::<Service>::all(client.clone())
        .list_metadata(&labelled)
        .await?;
    Ok(deployments
        .items
        .into_iter()
        .map(|d| ("deployment", d.metadata))
        .chain(services.items.into_iter().map(|s| ("service", s.metadata)))
        .collect())
}

/// The check `id` failed because the children could not be listed.
pub(super) fn unlisted(id: &str, error: &kube::Error, anchor: &str) -> Check {
    Check::fail(
        id,
        format!(
            "the operator's Deployments and Services cannot be listed: {}",
            api_message(error)
        ),
        "run check as a user who may list deployments and services in every namespace",
        anchor,
    )
}

/// MyApps whose status has not reported their generation since longer than the bound, as
/// told by the newest lastTransitionTime of their conditions (or their creation).
fn lagging(apps: &[MyApp], target: &Target) -> Check {
    const ID: &str = "children.lagging";
    let now = Timestamp::now().as_second();
    let bound = target.lag_bound.as_secs() as i64;
    let mut late = Vec::new();
    for app in apps {
        if app.meta().deletion_timestamp.is_some() {
            continue;
        }
        let generation = app.meta().generation.unwrap_or(0);
        let status = app.status.as_ref();
        let observed = status.and_then(|s| s.observed_generation).unwrap_or(0);
        if observed >= generation {
            continue;
        }
        let since = status
            .into_iter()
            .flat_map(|s| &s.conditions)
            .map(|c| c.last_transition_time.0.as_second())
            .max()
            .or_else(|| {
                app.meta()
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second())
            });
        let Some(since) = since else { continue };
        if now - since > bound {
            late.push(format!(
                "{}/{} (generation {generation}, status reports {observed}, for {} s)",
                app.namespace().unwrap_or_default(),
                app.name_any(),
                now - since
            ));
        }
    }
    if late.is_empty() {
        return Check::ok(
            ID,
            format!(
                "no MyApp's status has lagged its spec for more than {bound} s ({} MyApps)",
                apps.len()
            ),
        );
    }
    Check::fail(
        ID,
        format!(
            "{} MyApps' status has lagged their spec for more than {bound} s: {}",
            late.len(),
            late.join(", ")
        ),
        "the controller is not reconciling them: see the Controller checks, kubectl describe myapp <name> (Events), and the leader's log",
        "children",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check::report::Status, crd::MyAppStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn app(name: &str, generation: i64, observed: i64, changed_secs_ago: i64) -> MyApp {
        let at = Timestamp::from_second(Timestamp::now().as_second() - changed_secs_ago).unwrap();
        MyApp::test(name)
            .stored()
            .generation(generation)
            .status(MyAppStatus {
                observed_generation: Some(observed),
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: "Progressing".into(),
                    message: String::new(),
                    last_transition_time: Time(at),
                    observed_generation: Some(observed),
                }],
                ..MyAppStatus::default()
            })
    }

    #[test]
    fn only_a_lag_older_than_the_bound_fails_and_deleting_apps_are_left_out() {
        let target = Target {
            namespace: "myapp-system".into(),
            probe_namespace: "default".into(),
            lag_bound: std::time::Duration::from_secs(300),
            install: Default::default(),
            sharding: None,
        };
        let fresh = app("fresh", 3, 2, 10);
        let current = app("current", 3, 3, 3600);
        let deleting = app("deleting", 3, 2, 3600).deleted();
        assert_eq!(
            lagging(&[fresh.clone(), current.clone(), deleting], &target).status,
            Status::Ok
        );
        let stuck = app("stuck", 5, 3, 900);
        let check = lagging(&[fresh, current, stuck], &target);
        assert_eq!(check.status, Status::Fail);
        assert!(
            check
                .message
                .contains("default/stuck (generation 5, status reports 3, for 900 s)")
                || check
                    .message
                    .contains("default/stuck (generation 5, status reports 3, for 901 s)"),
            "{}",
            check.message
        );
    }
}
