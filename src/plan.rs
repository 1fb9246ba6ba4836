//! What one reconcile does, decided without IO: from a MyApp, what the watch caches observed,
//! which of our writes they have not seen yet, the state of a fight and the time, to the
//! writes to make (each as the object or patch to send), the Events to publish and when to
//! look again. The controller gathers the inputs and carries the plan out, branching only on
//! whether each write landed.

use std::time::Duration;

use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Service},
    jiff::Timestamp,
};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::{
    cache::{CachedDeployment, CachedMyApp, CachedService, ReportedStatus},
    crd::{MyAppStatus, Phase},
    fight,
    resources::{self, Desired},
    status::{self, Rollout},
};

/// How long after applying a Deployment the status waits for the Deployment controller to
/// observe it before reporting what is known without it: `Pending` for a new app,
/// `Progressing` for a change. The controller usually answers within milliseconds, and its
/// answer triggers the next reconcile; a status written in between would be overwritten at
/// once, so waiting saves one status write per change. Under a second, so that a new app's
/// PHASE is never blank, and an edited app's never stale, for longer than that: a rollout
/// whose controller stays silent longer costs that one status write.
pub const PENDING_GRACE: Duration = Duration::from_millis(500);

/// How long after a child's deletion it is not created again. The garbage collector deletes
/// the children of a deleted MyApp, and their delete events can arrive before the MyApp's own:
/// created again at once, a child would be collected again, in a loop as fast as the collector,
/// for as long as that event lags. A child a user deletes comes back after this long.
pub const RECREATE_HOLD: Duration = Duration::from_secs(1);

/// What a reconcile knows besides the MyApp itself.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    /// The shard this replica reconciles, when sharding is on: every MyApp it caches is
    /// labelled for it (its watch selects them so), and so are the children it applies.
    pub shard: Option<&'a str>,
    /// The child Deployment as the watch cache holds it.
    pub deployment: Option<&'a CachedDeployment>,
    /// The child Service as the watch cache holds it.
    pub service: Option<&'a CachedService>,
    /// Digest of our last Deployment apply, if the cache has not seen it yet.
    pub unseen_deployment: Option<String>,
    /// Digest of our last Service apply, if the cache has not seen it yet.
    pub unseen_service: Option<String>,
    /// Our last status write, if the MyApp cache has not seen it yet.
    pub unseen_status: Option<ReportedStatus>,
    /// How long ago we applied a Deployment whose controller has not observed it yet.
    pub awaiting_rollout: Option<Duration>,
    /// How much longer a fight holds rewrites of the Deployment off, if one does.
    pub fight_hold_off: Option<Duration>,
    /// Whether rewriting the Deployment now would make a fight: its field managers are read
    /// first, so the Event can name the other writer.
    pub would_fight: bool,
    /// How long ago the Deployment was deleted, while under [`RECREATE_HOLD`].
    pub deployment_deleted: Option<Duration>,
    /// How long ago the Service was deleted, while under [`RECREATE_HOLD`].
    pub service_deleted: Option<Duration>,
    /// Whether the cached Deployment was already found to hold what the MyApp, at its
    /// version, asks of it: then it is not built and compared again.
    pub deployment_holds: bool,
    /// The same of the cached Service.
    pub service_holds: bool,
}

/// What to do, in this order: hand over replicas, apply the Deployment (after reading its
/// field managers when the rewrite makes a fight), apply the Service (beside the Deployment),
/// write the status, then publish the Event (only once the status write succeeded).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Apply this patch (the Deployment's current replica count) under the hand-off manager
    /// first.
    pub hand_off: Option<Value>,
    /// Apply this Deployment.
    pub deployment: Option<ChildApply<Deployment>>,
    /// Apply this Service.
    pub service: Option<ChildApply<Service>>,
    /// Write this status (what a plan reads of it is remembered until the MyApp cache shows
    /// it).
    pub status: Option<MyAppStatus>,
    /// Publish this Event once the status is written.
    pub event: Option<PhaseEvent>,
    /// A child's write is held off this much longer: a fight over the Deployment, or a child
    /// deleted a moment ago (see [`RECREATE_HOLD`]).
    pub held_off: Option<Duration>,
    /// The Deployment's controller has observed our last apply: stop waiting for it.
    pub rollout_observed: bool,
    /// Look again this soon (instead of the resync period).
    pub recheck: Option<Duration>,
    /// The cached Deployment was built and compared, and holds what the MyApp asks: worth
    /// remembering, so that the next plan at the same versions skips that.
    pub deployment_found_holding: bool,
    /// The same of the cached Service.
    pub service_found_holding: bool,
    /// Once this plan's status write (if any) has landed, nothing is left to write or wait
    /// for until the MyApp or a child changes: both children hold, no write of ours is
    /// outstanding, nothing is held off or rechecked, and the status does not depend on the
    /// time. A later plan at the same versions would come out empty, so it need not be made.
    pub settles: bool,
}

/// A child to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildApply<K> {
    /// The object, applied whole under our field manager.
    pub object: K,
    /// Its digest (also in its applied-digest annotation): what read-your-writes remembers.
    pub digest: String,
    /// A rewrite of an existing child: the fields the apply takes back, by path (none for a
    /// create).
    pub rewrites: Option<Vec<String>>,
    /// The object as JSON when the rewrite makes a fight: its field managers are read against
    /// it first, to name the other writer.
    pub look_up_rivals: Option<Value>,
}

impl<K> ChildApply<K> {
    fn new(desired: Desired<K>) -> Self {
        Self {
            digest: desired.digest().to_owned(),
            object: desired.into_object(),
            rewrites: None,
            look_up_rivals: None,
        }
    }
}

/// The Event reason for a MyApp entering `status`'s phase: what happened, in the CamelCase of
/// Kubernetes' own reasons (a Deployment's `ScalingReplicaSet`), not the phase's name.
fn event_reason(status: &MyAppStatus) -> &'static str {
    match status.phase {
        Some(Phase::Pending) | None => "RolloutPending",
        Some(Phase::Progressing) => "RollingOut",
        Some(Phase::Running) => "RolloutComplete",
        Some(Phase::Degraded) => {
            let deadline = status.conditions.iter().any(|c| {
                c.type_ == "Degraded"
                    && c.status == "True"
                    && c.reason == "ProgressDeadlineExceeded"
            });
            if deadline {
                "RolloutFailed"
            } else {
                "ReplicasUnavailable"
            }
        }
    }
}

/// An Event about a phase change of the MyApp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseEvent {
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// What happened: `RolloutPending`, `RollingOut`, `RolloutComplete`, `RolloutFailed` or
    /// `ReplicasUnavailable`.
    pub reason: String,
    /// What changed, for people.
    pub note: String,
}

/// What a child's cached state says, against what we would apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChildState {
    /// The cache holds it as we would apply it.
    Current,
    /// We applied it as desired; the cache has not seen that apply yet.
    Unseen,
    /// Missing or different: apply.
    Stale,
}

/// Decides one reconcile of `app`.
pub fn plan(app: &CachedMyApp, observed: &Observed<'_>, now: Timestamp) -> Plan {
    let mut plan = decide(app, observed, now);
    if let Some(held) = plan.held_off {
        // Look again when the hold ends, at the latest.
        plan.recheck = Some(plan.recheck.map_or(held, |r| r.min(held)));
    }
    plan
}

fn decide(app: &CachedMyApp, observed: &Observed<'_>, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    if app.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the children; there is nothing to converge towards.
        return plan;
    }

    if planned_from_a_newer_spec(app, observed.deployment) {
        // Our MyApp cache lags behind a spec already applied (by this replica before, or by
        // another): nothing planned from this view may land. Its watch event comes.
        plan.recheck = Some(PENDING_GRACE);
        return plan;
    }

    let deployment = if observed.deployment_holds {
        ChildState::Current
    } else {
        let desired = resources::desired_deployment(app, observed.shard);
        let state = child_state(
            &desired,
            observed.deployment,
            observed.unseen_deployment.as_deref(),
        );
        if state == ChildState::Stale {
            // A fight holds off rewrites of an existing Deployment, never its creation.
            let held = observed.deployment.and(observed.fight_hold_off);
            let held =
                held.or_else(|| gone_again(observed.deployment, observed.deployment_deleted));
            hold(&mut plan, held);
            if held.is_none() {
                plan.hand_off = hand_off(app, observed.deployment);
                plan.deployment = Some(deployment_apply(desired, observed));
            }
        }
        plan.deployment_found_holding = state == ChildState::Current;
        state
    };
    let mut service = ChildState::Current;
    if !observed.service_holds {
        let desired = resources::desired_service(app, observed.shard);
        let state = child_state(
            &desired,
            observed.service,
            observed.unseen_service.as_deref(),
        );
        if state == ChildState::Stale {
            let held = gone_again(observed.service, observed.service_deleted);
            hold(&mut plan, held);
            if held.is_none() {
                plan.service = Some(ChildApply::new(desired));
            }
        }
        plan.service_found_holding = state == ChildState::Current;
        service = state;
    }

    if deployment != ChildState::Current {
        // The cache holds the Deployment as it was before our apply. The next reconcile (its
        // controller's answer to the apply, or this recheck if it stays silent; the apply's
        // own watch event triggers none) reports on the new one, so a status written now
        // would be overwritten at once (one write saved per change).
        plan.recheck = Some(PENDING_GRACE);
        return plan;
    }
    let rollout = observed.deployment.map(Rollout::from_deployment);
    plan.rollout_observed = rollout.as_ref().is_some_and(Rollout::is_current);
    if !plan.rollout_observed
        && let Some(waited) = observed.awaiting_rollout
        && let Some(left) = PENDING_GRACE.checked_sub(waited).filter(|l| !l.is_zero())
    {
        // Its controller has not answered our apply yet; its answer triggers a reconcile.
        plan.recheck = Some(left);
        return plan;
    }

    // Compare with our last status write if the cache has not seen it yet.
    let reported = observed.unseen_status.as_ref().or(app.status.as_ref());
    let status = status::status(app, reported, rollout.as_ref(), now);
    if !reported.is_some_and(|r| r.is(&status)) {
        let before = reported.and_then(|r| r.phase);
        plan.event = phase_event(before, &status);
        plan.status = Some(status);
    }
    plan.settles = service == ChildState::Current
        && plan.held_off.is_none()
        && plan.recheck.is_none()
        && nothing_outstanding(observed)
        && rollout
            .as_ref()
            .is_none_or(|r| r.unavailable_since.is_none());
    plan
}

/// No write of ours the caches have not seen, no rollout awaited, no fight, no child deleted
/// a moment ago.
fn nothing_outstanding(observed: &Observed<'_>) -> bool {
    observed.unseen_deployment.is_none()
        && observed.unseen_service.is_none()
        && observed.unseen_status.is_none()
        && observed.awaiting_rollout.is_none()
        && observed.fight_hold_off.is_none()
        && !observed.would_fight
        && observed.deployment_deleted.is_none()
        && observed.service_deleted.is_none()
}

/// Whether `deployment`, controlled by `app`, was planned from a newer generation than the one
/// `app` is at (see [`resources::GENERATION_ANNOTATION`]).
fn planned_from_a_newer_spec(app: &CachedMyApp, deployment: Option<&CachedDeployment>) -> bool {
    let Some(deployment) = deployment else {
        return false;
    };
    let controlled = deployment
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| app.metadata.uid.as_ref() == Some(&owner.uid));
    let stamped = deployment.annotations.get(resources::GENERATION_ANNOTATION);
    let stamped = stamped.and_then(|g| g.parse::<i64>().ok());
    controlled && stamped.is_some_and(|s| app.metadata.generation.is_some_and(|g| g < s))
}

/// How much longer a missing child deleted `deleted` ago waits before it is created again.
fn gone_again<K>(observed: Option<&K>, deleted: Option<Duration>) -> Option<Duration> {
    let deleted = deleted.filter(|_| observed.is_none())?;
    RECREATE_HOLD
        .checked_sub(deleted)
        .filter(|left| !left.is_zero())
}

/// Holds a child's write off for `held`, if any: the plan looks again by then.
fn hold(plan: &mut Plan, held: Option<Duration>) {
    plan.held_off = match (plan.held_off, held) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
}

/// The Deployment apply, with the fields it takes back from the existing one and, when that
/// rewrite makes a fight, the object to name the other writer's fields against.
fn deployment_apply(
    desired: Desired<Deployment>,
    observed: &Observed<'_>,
) -> ChildApply<Deployment> {
    let rewrites = observed.deployment.map(|existing| {
        let existing = serde_json::to_value(existing).unwrap_or_default();
        fight::changed_fields(desired.json(), &existing)
    });
    let look_up_rivals = observed
        .would_fight
        .then(|| rewrites.as_ref().map(|_| desired.json().clone()))
        .flatten();
    ChildApply {
        rewrites,
        look_up_rivals,
        ..ChildApply::new(desired)
    }
}

fn child_state<D: Resource + serde::Serialize, O: serde::Serialize>(
    desired: &Desired<D>,
    observed: Option<&O>,
    unseen: Option<&str>,
) -> ChildState {
    if observed.is_some_and(|o| desired.is_applied_to(o)) {
        ChildState::Current
    } else if unseen.is_some_and(|written| written == desired.digest()) {
        ChildState::Unseen
    } else {
        ChildState::Stale
    }
}

/// When a MyApp stops setting `spec.replicas`, the Deployment must keep its current count: a
/// field its only manager stops applying is removed (and would default to 1). So the count
/// is first applied by a second manager, which keeps owning it until the MyApp sets it again.
fn replicas_to_hand_over(app: &CachedMyApp, observed: Option<&CachedDeployment>) -> Option<i32> {
    let observed = observed?;
    let we_set_it = observed.annotations.get(resources::REPLICAS_ANNOTATION) == Some("true");
    (app.spec.replicas.is_none() && we_set_it)
        .then(|| observed.spec.as_ref().and_then(|s| s.replicas))
        .flatten()
}

/// The hand-off's apply patch (see [`replicas_to_hand_over`]), when replicas change owner.
fn hand_off(app: &CachedMyApp, observed: Option<&CachedDeployment>) -> Option<Value> {
    let replicas = replicas_to_hand_over(app, observed)?;
    Some(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app.name_any(), "namespace": app.namespace()},
        "spec": {"replicas": replicas},
    }))
}

/// An Event when the app reaches a settled phase (`Running`, `Degraded`) or leaves one. The
/// way of a new app to its first settled phase is not news, its outcome is: a create
/// publishes one Event however many phases it passes.
fn phase_event(before: Option<Phase>, status: &MyAppStatus) -> Option<PhaseEvent> {
    let after = status.phase?;
    let settled = |phase: Option<Phase>| matches!(phase, Some(Phase::Running | Phase::Degraded));
    if before == Some(after) || !(settled(before) || settled(Some(after))) {
        return None;
    }
    Some(PhaseEvent {
        warning: after == Phase::Degraded,
        reason: event_reason(status).into(),
        note: match before {
            Some(before) => format!("phase changed from {before:?} to {after:?}"),
            None => format!("phase is {after:?}"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cache::{self, SlimDeploymentStatus},
        crd::MyApp,
    };

    const NOW: Timestamp = Timestamp::UNIX_EPOCH;

    /// The plan for `app` as the MyApp cache holds it, status reduced to what a plan reads.
    fn plan(app: &MyApp, observed: &Observed<'_>, now: Timestamp) -> Plan {
        super::plan(&CachedMyApp::from(app.clone()), observed, now)
    }

    /// The Deployment we apply for `app`, as the cache holds it once its controller has rolled
    /// it out completely.
    fn rolled_out(app: &MyApp) -> CachedDeployment {
        let mut deployment: CachedDeployment = cache::cached(&resources::deployment(app, None));
        let replicas = app.spec.replicas.unwrap_or(1);
        deployment.metadata.generation = Some(1);
        deployment.metadata.resource_version = Some("10".into());
        deployment.status = Some(SlimDeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(replicas),
            updated_replicas: Some(replicas),
            available_replicas: Some(replicas),
            conditions: None,
        });
        deployment
    }

    /// The same, before its controller has observed it.
    fn unobserved(app: &MyApp) -> CachedDeployment {
        let mut deployment = rolled_out(app);
        deployment.status = None;
        deployment
    }

    fn service(app: &MyApp) -> CachedService {
        cache::cached(&resources::service(app, None))
    }

    /// The same after an edit to generation 2, which its controller has not picked up yet.
    fn not_picked_up(app: &MyApp) -> CachedDeployment {
        let mut deployment = rolled_out(app);
        deployment.metadata.generation = Some(2);
        deployment
    }

    /// The same with its controller's first answer: nothing updated or available yet.
    fn starting(app: &MyApp) -> CachedDeployment {
        let mut deployment = rolled_out(app);
        deployment.status = Some(SlimDeploymentStatus {
            observed_generation: Some(1),
            ..SlimDeploymentStatus::default()
        });
        deployment
    }

    fn running(app: &MyApp) -> MyAppStatus {
        let deployment = rolled_out(app);
        status::status(app, None, Some(&Rollout::from_deployment(&deployment)), NOW)
    }

    fn pending_status(app: &MyApp) -> MyAppStatus {
        let deployment = unobserved(app);
        status::status(app, None, Some(&Rollout::from_deployment(&deployment)), NOW)
    }

    /// What a plan writes, in a line a table can compare.
    fn summary(plan: &Plan) -> String {
        let mut parts = Vec::new();
        if let Some(patch) = &plan.hand_off {
            parts.push(format!("hand over {}", patch["spec"]["replicas"]));
        }
        if let Some(deployment) = &plan.deployment {
            let rewrite = if deployment.rewrites.is_some() {
                " (rewrite)"
            } else {
                ""
            };
            let rivals = if deployment.look_up_rivals.is_some() {
                " naming rivals first"
            } else {
                ""
            };
            parts.push(format!("apply Deployment{rewrite}{rivals}"));
        }
        if let Some(wait) = plan.held_off {
            parts.push(format!("hold off {}ms", wait.as_millis()));
        }
        if plan.service.is_some() {
            parts.push("apply Service".into());
        }
        if let Some(status) = &plan.status {
            parts.push(format!("status {:?}", status.phase.unwrap()));
        }
        if let Some(event) = &plan.event {
            parts.push(format!("event {}", event.reason));
        }
        if let Some(recheck) = plan.recheck {
            parts.push(format!("recheck {}ms", recheck.as_millis()));
        }
        if plan.settles {
            parts.push("then settled".into());
        }
        if parts.is_empty() {
            "nothing".into()
        } else {
            parts.join(", ")
        }
    }

    #[test]
    fn the_plan_writes_what_differs_and_nothing_at_steady_state() {
        let app = MyApp::test("web").stored();
        let deployment = rolled_out(&app);
        let pending = unobserved(&app);
        let svc = service(&app);
        let steady = app.clone().status(running(&app));
        let stopped_setting = steady.clone().replicas(None).generation(2);
        let observed_replicas = rolled_out(&steady);
        let just_applied = resources::desired_deployment(&app, None);
        let deleted = app.clone().deleted();
        let reported_pending = app.clone().status(pending_status(&app));
        let starting = starting(&app);
        let edited = steady
            .clone()
            .image("ghcr.io/example/web:1.5.0")
            .generation(2);
        let edit_unseen = not_picked_up(&edited);
        let mut edit_done = rolled_out(&edited);
        edit_done.metadata.generation = Some(2);
        edit_done.status.as_mut().unwrap().observed_generation = Some(2);
        let mut unavailable = rolled_out(&app);
        let rollout = unavailable.status.as_mut().unwrap();
        rollout.available_replicas = Some(0);
        rollout.conditions = Some(vec![cache::SlimDeploymentCondition {
            type_: "Available".into(),
            status: "False".into(),
            reason: Some("MinimumReplicasUnavailable".into()),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(NOW)),
        }]);
        let reported_unavailable = app.clone().status(status::status(
            &app,
            None,
            Some(&Rollout::from_deployment(&unavailable)),
            NOW,
        ));
        let cases: Vec<(&str, &MyApp, Observed<'_>, &str)> = vec![
            (
                "a new MyApp gets both children, and its status waits for their watch events",
                &app,
                Observed::default(),
                "apply Deployment, apply Service, recheck 500ms",
            ),
            (
                "our applies the caches have not seen are not repeated",
                &app,
                Observed {
                    unseen_deployment: Some(just_applied.digest().to_owned()),
                    unseen_service: Some(
                        resources::desired_service(&app, None).digest().to_owned(),
                    ),
                    ..Observed::default()
                },
                "recheck 500ms",
            ),
            (
                "a rolled-out Deployment is reported Running, once",
                &app,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "status Running, event RolloutComplete, then settled",
            ),
            (
                "steady state: no write, no Event, the resync period",
                &steady,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "then settled",
            ),
            (
                "our status write the cache has not seen is not repeated",
                &app,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    unseen_status: Some(ReportedStatus::of(&running(&app))),
                    ..Observed::default()
                },
                "nothing",
            ),
            (
                "a Deployment its controller has not observed waits out the grace",
                &app,
                Observed {
                    deployment: Some(&pending),
                    service: Some(&svc),
                    awaiting_rollout: Some(Duration::from_millis(200)),
                    ..Observed::default()
                },
                "recheck 300ms",
            ),
            (
                "past the grace a new app is reported Pending, without an Event",
                &app,
                Observed {
                    deployment: Some(&pending),
                    service: Some(&svc),
                    awaiting_rollout: Some(PENDING_GRACE),
                    ..Observed::default()
                },
                "status Pending",
            ),
            (
                "the Pending written is not written again while its controller stays silent",
                &reported_pending,
                Observed {
                    deployment: Some(&pending),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "then settled",
            ),
            (
                "its controller's answer after the Pending: Running, the create's one Event",
                &reported_pending,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "status Running, event RolloutComplete, then settled",
            ),
            (
                "replicas unavailable for a while: nothing to write, but time alone can make \
                 the app Degraded, so it is never settled",
                &reported_unavailable,
                Observed {
                    deployment: Some(&unavailable),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "nothing",
            ),
            (
                "a rollout under way after the Pending is no Event either",
                &reported_pending,
                Observed {
                    deployment: Some(&starting),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "status Progressing, then settled",
            ),
            (
                "an edit its controller has not picked up waits out the grace",
                &edited,
                Observed {
                    deployment: Some(&edit_unseen),
                    service: Some(&svc),
                    awaiting_rollout: Some(Duration::from_millis(100)),
                    ..Observed::default()
                },
                "recheck 400ms",
            ),
            (
                "past the grace the edit is reported Progressing: the app left Running",
                &edited,
                Observed {
                    deployment: Some(&edit_unseen),
                    service: Some(&svc),
                    awaiting_rollout: Some(PENDING_GRACE),
                    ..Observed::default()
                },
                "status Progressing, event RollingOut",
            ),
            (
                "an edit rolled out before the grace ended goes straight back to Running",
                &edited,
                Observed {
                    deployment: Some(&edit_done),
                    service: Some(&svc),
                    awaiting_rollout: Some(Duration::from_millis(100)),
                    ..Observed::default()
                },
                "status Running",
            ),
            (
                "a spec that stops setting replicas hands the count over first",
                &stopped_setting,
                Observed {
                    deployment: Some(&observed_replicas),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "hand over 2, apply Deployment (rewrite), recheck 500ms",
            ),
            (
                "a fight holds off rewriting the Deployment, and looks again",
                &edited,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    fight_hold_off: Some(Duration::from_secs(30)),
                    ..Observed::default()
                },
                "hold off 30000ms, recheck 500ms",
            ),
            (
                "a fight never holds off creating the Deployment",
                &app,
                Observed {
                    service: Some(&svc),
                    fight_hold_off: Some(Duration::from_secs(30)),
                    would_fight: true,
                    ..Observed::default()
                },
                "apply Deployment, recheck 500ms",
            ),
            (
                "a rewrite that makes a fight names the other writers first",
                &edited,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    would_fight: true,
                    ..Observed::default()
                },
                "apply Deployment (rewrite) naming rivals first, recheck 500ms",
            ),
            (
                "a child deleted a moment ago is not created again yet",
                &app,
                Observed {
                    service: Some(&svc),
                    deployment_deleted: Some(Duration::from_millis(300)),
                    ..Observed::default()
                },
                "hold off 700ms, recheck 500ms",
            ),
            (
                "a Service deleted a moment ago waits too, and the look again comes by its end",
                &steady,
                Observed {
                    deployment: Some(&deployment),
                    service_deleted: Some(Duration::from_millis(900)),
                    ..Observed::default()
                },
                "hold off 100ms, recheck 100ms",
            ),
            (
                "a deletion is no reason to hold a child that exists again",
                &steady,
                Observed {
                    deployment: Some(&deployment),
                    service: Some(&svc),
                    deployment_deleted: Some(Duration::from_millis(300)),
                    ..Observed::default()
                },
                "nothing",
            ),
            (
                "a Deployment planned from a newer spec than the cached MyApp's: nothing is written",
                &steady,
                Observed {
                    deployment: Some(&edit_done),
                    service: Some(&svc),
                    ..Observed::default()
                },
                "recheck 500ms",
            ),
            (
                "a MyApp being deleted is left to the garbage collector",
                &deleted,
                Observed::default(),
                "nothing",
            ),
        ];
        let wrong: Vec<String> = cases
            .into_iter()
            .filter_map(|(case, app, observed, expected)| {
                let got = summary(&plan(app, &observed, NOW));
                (got != expected).then(|| format!("{case}: {got:?}, expected {expected:?}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_child_found_holding_at_these_versions_is_neither_built_nor_compared_again() {
        let app = MyApp::test("web")
            .stored()
            .status(running(&MyApp::test("web").stored()));
        let deployment = rolled_out(&app);
        let svc = service(&app);
        let observed = Observed {
            deployment: Some(&deployment),
            service: Some(&svc),
            ..Observed::default()
        };
        let compared = plan(&app, &observed, NOW);
        assert_eq!(summary(&compared), "then settled");
        assert!(
            compared.deployment_found_holding && compared.service_found_holding,
            "compared and found holding: worth remembering"
        );

        // Found before at these versions: the plan trusts it and compares nothing. (That the
        // cached children here ask for something else shows it: they are not looked at.)
        let edited = app.clone().image("ghcr.io/example/web:1.5.0").port(9090);
        let remembered = Observed {
            deployment_holds: true,
            service_holds: true,
            ..observed
        };
        let trusted = plan(&edited, &remembered, NOW);
        assert!(trusted.deployment.is_none() && trusted.service.is_none());
        assert!(!trusted.deployment_found_holding && !trusted.service_found_holding);
    }

    #[test]
    fn a_changed_spec_reapplies_only_the_child_it_changes() {
        let app = MyApp::test("web").stored().status(MyAppStatus::default());
        let deployment = rolled_out(&app);
        let svc = service(&app);
        let observed = Observed {
            deployment: Some(&deployment),
            service: Some(&svc),
            ..Observed::default()
        };
        let edited = app.clone().image("ghcr.io/example/web:1.5.0").generation(2);
        let image_edit = plan(&edited, &observed, NOW);
        assert_eq!(
            summary(&image_edit),
            "apply Deployment (rewrite), recheck 500ms"
        );
        let rewrites = image_edit.deployment.unwrap().rewrites.unwrap();
        assert!(
            rewrites.iter().any(|field| field.contains("image")),
            "the rewrite names the image it takes back: {rewrites:?}"
        );
        let edited = app.clone().port(9090).generation(2);
        assert_eq!(
            summary(&plan(&edited, &observed, NOW)),
            "apply Deployment (rewrite), apply Service, recheck 500ms"
        );
    }

    #[test]
    fn replicas_are_handed_over_only_when_the_spec_stops_setting_them() {
        let app = MyApp::test("web").stored().replicas(Some(5));
        let applied: CachedDeployment = cache::cached(&resources::deployment(&app, None));
        assert_eq!(
            replicas_to_hand_over(&app.clone().into(), Some(&applied)),
            None,
            "spec still sets replicas"
        );
        let app = app.replicas(None);
        assert_eq!(
            replicas_to_hand_over(&app.clone().into(), Some(&applied)),
            Some(5)
        );
        let unmanaged: CachedDeployment = cache::cached(&resources::deployment(&app, None));
        assert_eq!(
            replicas_to_hand_over(&app.clone().into(), Some(&unmanaged)),
            None,
            "we never set them"
        );
        assert_eq!(replicas_to_hand_over(&app.clone().into(), None), None);
    }
}
