//! What a MyApp reports: its phase and conditions, from its Deployment as the watch cache
//! holds it.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

use crate::{
    cache::{CachedDeployment, ReportedStatus, SlimDeploymentStatus},
    crd::{CONDITION_TYPES, MyAppLike, MyAppStatus, Phase},
    resources::selector_string,
};

/// How long available replicas may stay below desired before the app counts as Degraded.
pub const DEGRADED_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// What the observed Deployment says, reduced to what status needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rollout {
    /// `metadata.generation` of the Deployment.
    pub generation: Option<i64>,
    /// `status.observedGeneration`: the Deployment controller has seen this generation.
    pub observed_generation: Option<i64>,
    /// `spec.replicas` (the API server defaults it to 1).
    pub desired: i32,
    pub replicas: i32,
    pub updated: i32,
    pub available: i32,
    /// The `Progressing` condition says `ProgressDeadlineExceeded`.
    pub deadline_exceeded: bool,
    /// Since when the `Available` condition has been `False`, if it is.
    pub unavailable_since: Option<Timestamp>,
}

impl Rollout {
    /// Reads a Deployment as cached from the API.
    pub fn from_deployment(d: &CachedDeployment) -> Self {
        let status = d.status.as_ref();
        let count =
            |field: fn(&SlimDeploymentStatus) -> Option<i32>| status.and_then(field).unwrap_or(0);
        let conditions = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let condition = |t: &str| conditions.iter().find(|c| c.type_ == t);
        Self {
            generation: d.metadata.generation,
            observed_generation: status.and_then(|s| s.observed_generation),
            desired: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            replicas: count(|s| s.replicas),
            updated: count(|s| s.updated_replicas),
            available: count(|s| s.available_replicas),
            deadline_exceeded: condition("Progressing").is_some_and(|c| {
                c.status == "False" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
            }),
            unavailable_since: condition("Available")
                .filter(|c| c.status == "False")
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
        }
    }

    /// The Deployment controller has observed the current generation.
    pub fn is_current(&self) -> bool {
        self.generation.is_some() && self.observed_generation >= self.generation
    }

    fn is_complete(&self) -> bool {
        self.is_current()
            && self.updated == self.desired
            && self.replicas == self.desired
            && self.available == self.desired
    }
}

/// The phase, derived in this order:
/// - `Pending`: no Deployment observed yet, or its controller has never reported on it (a new
///   app: nothing runs yet);
/// - `Progressing`: its controller has reported on an older generation only: a change is
///   rolling out while the old spec still runs.
///
/// The controller reports these two only once they have lasted the pending grace
/// (`plan::PENDING_GRACE`) after its apply. Then, for the current generation:
/// - `Degraded`: the rollout failed (`Progressing=False`, `ProgressDeadlineExceeded`), or the
///   Deployment has reported `Available=False` for longer than [`DEGRADED_AFTER`];
/// - `Running`: every desired replica is updated and available, and no old ones remain;
/// - `Progressing`: anything else (rolling out, scaling).
pub fn phase(rollout: Option<&Rollout>, now: Timestamp) -> Phase {
    let Some(r) = rollout.filter(|r| r.observed_generation.is_some()) else {
        return Phase::Pending;
    };
    if !r.is_current() {
        return Phase::Progressing;
    }
    let unavailable_too_long = r.unavailable_since.is_some_and(|since| {
        now.duration_since(since).as_secs() >= DEGRADED_AFTER.as_secs() as i64
    });
    if r.deadline_exceeded || unavailable_too_long {
        Phase::Degraded
    } else if r.is_complete() {
        Phase::Running
    } else {
        Phase::Progressing
    }
}

/// The status a MyApp should report, given its Deployment as observed and the status it
/// reports (whose conditions keep their `lastTransitionTime` unless their status flips).
pub fn status(
    app: &impl MyAppLike,
    reported: Option<&ReportedStatus>,
    rollout: Option<&Rollout>,
    now: Timestamp,
) -> MyAppStatus {
    let phase = phase(rollout, now);
    let generation = app.meta().generation;
    let (desired, available) = rollout.map_or((app.spec().replicas.unwrap_or(0), 0), |r| {
        (r.desired, r.available)
    });
    let availability = format!("{available}/{desired} replicas available");
    let (ready, progressing, degraded) = match phase {
        Phase::Pending => (
            (
                "False",
                "Pending",
                "waiting for the Deployment to observe the current spec".to_owned(),
            ),
            (
                "True",
                "Pending",
                "waiting for the Deployment to observe the current spec".to_owned(),
            ),
            ("False", "AsExpected", availability.clone()),
        ),
        Phase::Progressing => {
            // A change its controller has not picked up yet: say so, the counts are the old
            // spec's.
            let message = if rollout.is_some_and(Rollout::is_current) {
                availability.clone()
            } else {
                format!("waiting for the Deployment to observe the current spec; {availability}")
            };
            (
                ("False", "RollingOut", message.clone()),
                ("True", "RollingOut", message),
                ("False", "AsExpected", availability.clone()),
            )
        }
        Phase::Running => (
            ("True", "Available", availability.clone()),
            ("False", "RolloutComplete", availability.clone()),
            ("False", "AsExpected", availability.clone()),
        ),
        Phase::Degraded => {
            let reason = if rollout.is_some_and(|r| r.deadline_exceeded) {
                "ProgressDeadlineExceeded"
            } else {
                "Unavailable"
            };
            (
                ("False", reason, availability.clone()),
                ("False", reason, availability.clone()),
                ("True", reason, availability.clone()),
            )
        }
    };
    let conditions = CONDITION_TYPES
        .into_iter()
        .zip([ready, progressing, degraded])
        .map(|(type_, (status, reason, message))| {
            condition(reported, type_, status, reason, message, generation, now)
        })
        .collect();
    MyAppStatus {
        observed_generation: generation,
        replicas: rollout.map(|r| r.replicas),
        available_replicas: rollout.map(|r| r.available),
        phase: Some(phase),
        selector: Some(selector_string(app)),
        conditions,
    }
}

fn condition(
    reported: Option<&ReportedStatus>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let last_transition_time = reported
        .and_then(|r| r.transitioned(type_, status))
        .map_or(Time(now), Time::clone);
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cache::cached, crd::MyApp, resources::deployment};
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};

    fn app() -> MyApp {
        MyApp::test("web")
            .in_namespace("shop")
            .stored()
            .replicas(Some(3))
            .generation(2)
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn rollout(desired: i32, updated: i32, available: i32) -> Rollout {
        Rollout {
            generation: Some(4),
            observed_generation: Some(4),
            desired,
            replicas: desired,
            updated,
            available,
            ..Rollout::default()
        }
    }

    #[test]
    fn phase_follows_the_rollout() {
        let now = at(10_000);
        assert_eq!(phase(None, now), Phase::Pending);
        let never_observed = Rollout {
            observed_generation: None,
            ..rollout(3, 0, 0)
        };
        assert_eq!(phase(Some(&never_observed), now), Phase::Pending);
        let stale = Rollout {
            observed_generation: Some(3),
            ..rollout(3, 3, 3)
        };
        assert_eq!(
            phase(Some(&stale), now),
            Phase::Progressing,
            "a change its controller has not picked up yet, the old spec still running"
        );
        let stale_failed = Rollout {
            deadline_exceeded: true,
            ..stale.clone()
        };
        assert_eq!(
            phase(Some(&stale_failed), now),
            Phase::Progressing,
            "a change rolls out over a failed rollout"
        );
        assert_eq!(phase(Some(&rollout(3, 3, 3)), now), Phase::Running);
        assert_eq!(phase(Some(&rollout(3, 1, 2)), now), Phase::Progressing);
        let surplus = Rollout {
            replicas: 4,
            ..rollout(3, 3, 3)
        };
        assert_eq!(
            phase(Some(&surplus), now),
            Phase::Progressing,
            "old pods still terminating"
        );
        let failed = Rollout {
            deadline_exceeded: true,
            ..rollout(3, 1, 1)
        };
        assert_eq!(phase(Some(&failed), now), Phase::Degraded);
        let briefly = Rollout {
            unavailable_since: Some(at(10_000 - 60)),
            ..rollout(3, 3, 1)
        };
        assert_eq!(phase(Some(&briefly), now), Phase::Progressing);
        let long = Rollout {
            unavailable_since: Some(at(10_000 - 301)),
            ..rollout(3, 3, 1)
        };
        assert_eq!(phase(Some(&long), now), Phase::Degraded);
    }

    #[test]
    fn rollout_reads_a_failed_deployment() {
        let mut d = deployment(&app(), None);
        d.metadata.generation = Some(5);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(5),
            replicas: Some(3),
            updated_replicas: Some(3),
            available_replicas: Some(1),
            conditions: Some(vec![
                DeploymentCondition {
                    type_: "Progressing".into(),
                    status: "False".into(),
                    reason: Some("ProgressDeadlineExceeded".into()),
                    ..DeploymentCondition::default()
                },
                DeploymentCondition {
                    type_: "Available".into(),
                    status: "False".into(),
                    last_transition_time: Some(Time(at(0))),
                    ..DeploymentCondition::default()
                },
            ]),
            ..DeploymentStatus::default()
        });
        let r = Rollout::from_deployment(&cached(&d));
        assert_eq!(
            (r.desired, r.replicas, r.updated, r.available),
            (3, 3, 3, 1)
        );
        assert!(r.deadline_exceeded);
        assert_eq!(r.unavailable_since, Some(at(0)));
        assert_eq!(phase(Some(&r), at(1)), Phase::Degraded);
    }

    #[test]
    fn status_reports_counts_selector_and_generation() {
        let s = status(&app(), None, Some(&rollout(3, 3, 2)), at(0));
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!((s.replicas, s.available_replicas), (Some(3), Some(2)));
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert_eq!(
            s.selector.as_deref(),
            Some("app.kubernetes.io/instance=web,app.kubernetes.io/name=myapp")
        );
        let types: Vec<(&str, &str)> = s
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [
                ("Ready", "False"),
                ("Progressing", "True"),
                ("Degraded", "False")
            ]
        );
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(2))
        );
    }

    #[test]
    fn a_change_not_yet_picked_up_is_progressing_with_the_old_counts() {
        let stale = Rollout {
            generation: Some(5),
            ..rollout(3, 3, 3)
        };
        let s = status(&app(), None, Some(&stale), at(0));
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert_eq!((s.replicas, s.available_replicas), (Some(3), Some(3)));
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            (
                "False",
                "RollingOut",
                "waiting for the Deployment to observe the current spec; 3/3 replicas available"
            )
        );
        let new = Rollout {
            observed_generation: None,
            ..stale
        };
        assert_eq!(
            status(&app(), None, Some(&new), at(0)).phase,
            Some(Phase::Pending)
        );
    }

    #[test]
    fn status_is_unchanged_when_nothing_changed_so_no_write_is_needed() {
        let a = app();
        let reported = status(&a, None, Some(&rollout(3, 3, 3)), at(0));
        let cached = ReportedStatus::of(&reported);
        let again = status(&a, Some(&cached), Some(&rollout(3, 3, 3)), at(500));
        assert_eq!(reported, again);
        assert!(cached.is(&again));
    }

    #[test]
    fn condition_transition_time_changes_only_on_a_flip() {
        let a = app();
        let reported = status(&a, None, Some(&rollout(3, 3, 2)), at(0));
        let cached = ReportedStatus::of(&reported);
        let s = status(&a, Some(&cached), Some(&rollout(3, 3, 3)), at(100));
        let time = |s: &MyAppStatus, t: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .last_transition_time
                .0
        };
        assert_eq!(time(&s, "Ready"), at(100), "Ready flipped to True");
        assert_eq!(time(&s, "Degraded"), at(0), "Degraded stayed False");
    }
}
