//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder reconciles.
//!
//! Written here rather than taken from kube-lease-manager (which does support kube 5) for one
//! property that library lacks: when renewals fail (API unreachable), its watch channel keeps
//! saying "leader" after the lease has expired, so a partitioned replica would go on
//! reconciling beside the new holder. Here leadership ends locally at `start of the last
//! successful renewal + renew deadline`, on the boot clock of the replica's [`Gate`], and other
//! replicas only consider the lease expired `duration` after they *observed* its last change
//! (as client-go does), so the two never overlap, whatever the clocks of the nodes say, as long
//! as the renew deadline is shorter than the duration.

use crate::{Error, fence::Gate, permission::Permission};
use std::{future::Future, sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

/// Every permission the election's calls need, in the Lease's namespace: read it, create it
/// once, renew and release it with a resourceVersion-checked update.
pub const PERMISSIONS: &[Permission] = &[
    Permission::namespaced("coordination.k8s.io", "leases", "get"),
    Permission::namespaced("coordination.k8s.io", "leases", "create"),
    Permission::namespaced("coordination.k8s.io", "leases", "update"),
];

/// Lease settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Lease name.
    pub name: String,
    /// Lease namespace (the operator's own).
    pub namespace: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a lease stays valid after its last renewal (whole seconds: the Lease records
    /// seconds).
    pub duration: Duration,
    /// The holder stops writing this long after the start of its last successful renewal;
    /// shorter than `duration`, so that it stops before anyone else may take over.
    pub renew_deadline: Duration,
    /// How often the holder renews, and a candidate retries.
    pub retry_period: Duration,
}

impl Config {
    /// The lease `run` uses by default: 15 s, renewed every 2 s, written for at most 12 s
    /// after a renewal began (client-go's defaults are 15, 10 and 2 s).
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(12),
            retry_period: Duration::from_secs(2),
        }
    }

    /// These timings, after checking that they keep two holders apart: a whole number of
    /// seconds of `duration`, and `retry_period < renew_deadline < duration`.
    pub fn with_timing(
        mut self,
        duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, Error> {
        let invalid = |why: String| Err(Error::LeaseTiming(why));
        if duration.subsec_nanos() != 0 || duration.is_zero() {
            return invalid(format!(
                "--lease-duration {duration:?} must be a whole number of seconds, at least 1s (the Lease records seconds)"
            ));
        }
        if renew_deadline >= duration {
            return invalid(format!(
                "--lease-renew-deadline {renew_deadline:?} must be shorter than --lease-duration {duration:?}, or another replica may take over while this one still writes"
            ));
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return invalid(format!(
                "--lease-retry-period {retry_period:?} must be above zero and shorter than --lease-renew-deadline {renew_deadline:?}, or the lease lapses between renewals"
            ));
        }
        self.duration = duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        Ok(self)
    }
}

/// What a candidate last saw of the Lease, and when it saw it change.
struct Observed {
    record: (Option<String>, Option<MicroTime>),
    at: Instant,
}

/// Takes part in the election until `shutdown` resolves, keeping `gate` open while this replica
/// holds the lease: each successful renewal opens it until its start plus the renew deadline.
/// On shutdown a held lease is released so another replica takes over at once instead of after
/// `duration`.
pub async fn run(
    client: Client,
    config: Config,
    gate: Arc<Gate>,
    shutdown: impl Future<Output = ()>,
) {
    let api = Api::<Lease>::namespaced(client, &config.namespace);
    let mut observed: Option<Observed> = None;
    let mut leading = false;
    tokio::pin!(shutdown);
    let elect = async {
        loop {
            let started = Instant::now();
            let renewal_started = gate.now();
            // A renewal may not outlive leadership: bound each call by what is left of it.
            let held = gate.is_open();
            let budget = gate
                .remaining()
                .unwrap_or(config.retry_period)
                .min(config.renew_deadline);
            let outcome = tokio::time::timeout(
                budget.max(Duration::from_millis(100)),
                try_acquire_or_renew(&api, &config, &mut observed, held),
            )
            .await
            .unwrap_or(Err(Error::LeaseDeadline(budget)));
            match outcome {
                Ok(true) => {
                    gate.open_until(renewal_started.after(config.renew_deadline));
                }
                Ok(false) => gate.close(),
                Err(error) => warn!(
                    error = %crate::error::chain(&error),
                    api_server = crate::telemetry::api_server(),
                    fix = crate::telemetry::unreachable_fix(&error),
                    lease = %config.name,
                    "Lease renewal failed"
                ),
            }
            let is_leader = gate.is_open();
            if leading != is_leader {
                leading = is_leader;
                info!(identity = %config.identity, leader = is_leader, "Leadership changed");
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep_until(started + config.retry_period) => {}
            }
        }
    };
    // The deadline is enforced while a renewal is in flight too, not only between renewals.
    tokio::select! {
        () = elect => {}
        () = gate.enforce() => {}
    }
    if gate.is_open() {
        gate.close();
        match release(&api, &config).await {
            Ok(()) => info!(lease = %config.name, "Lease released"),
            Err(error) => warn!(%error, lease = %config.name, "Failed to release Lease"),
        }
    }
}

/// One election step: returns whether this replica holds the lease afterwards. `held`: whether
/// this replica's gate was open, its hold unbroken since the last renewal.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &Config,
    observed: &mut Option<Observed>,
    held: bool,
) -> Result<bool, Error> {
    let now = MicroTime(Timestamp::now());
    let Some(mut lease) = api.get_opt(&config.name).await.map_err(Error::ReadLease)? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec(config, now.clone(), now, 0)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(Error::CreateLease(error)),
        };
    };
    let current = lease.spec.clone().unwrap_or_default();
    let holder = current.holder_identity.clone().filter(|h| !h.is_empty());
    let record = (holder.clone(), current.renew_time.clone());
    if observed.as_ref().is_none_or(|o| o.record != record) {
        *observed = Some(Observed {
            record,
            at: Instant::now(),
        });
    }
    let mine = holder.as_deref() == Some(config.identity.as_str());
    let lease_duration = current
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(config.duration, Duration::from_secs);
    let expired = observed
        .as_ref()
        .is_some_and(|o| o.at.elapsed() >= lease_duration);
    if holder.is_some() && !mine && !expired {
        return Ok(false);
    }
    let transitions = current.lease_transitions.unwrap_or(0) + i32::from(!mine);
    // A holder that let its Lease lapse (its gate closed) acquires it anew: the acquireTime
    // starts a new term, which is how sharding by namespace tells a replica back from a pause
    // from the one that held the ranges before it.
    let acquired = if mine && held {
        current.acquire_time.unwrap_or_else(|| now.clone())
    } else {
        now.clone()
    };
    lease.spec = Some(spec(config, acquired, now, transitions));
    // `replace` carries the resourceVersion we read: a concurrent writer makes it fail with 409.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(Error::UpdateLease(error)),
    }
}

async fn release(api: &Api<Lease>, config: &Config) -> Result<(), Error> {
    let mut lease = api.get(&config.name).await.map_err(Error::ReadLease)?;
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    api.replace(&config.name, &PostParams::default(), &lease)
        .await
        .map_err(Error::UpdateLease)?;
    Ok(())
}

fn spec(config: &Config, acquired: MicroTime, renewed: MicroTime, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: Some(acquired),
        renew_time: Some(renewed),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(duration: u64, renew_ms: u64, retry_ms: u64) -> Result<Config, Error> {
        Config::new("l", "ns", "me").with_timing(
            Duration::from_secs(duration),
            Duration::from_millis(renew_ms),
            Duration::from_millis(retry_ms),
        )
    }

    #[test]
    fn lease_timings_that_let_two_replicas_write_at_once_are_refused_naming_the_flag() {
        assert!(timing(15, 12_000, 2_000).is_ok());
        assert!(timing(2, 1_500, 200).is_ok());
        let refused = |result: Result<Config, Error>| result.unwrap_err().to_string();
        assert!(refused(timing(15, 15_000, 2_000)).contains("--lease-renew-deadline"));
        assert!(refused(timing(15, 12_000, 12_000)).contains("--lease-retry-period"));
        assert!(refused(timing(0, 0, 0)).contains("--lease-duration"));
        let fractional = Config::new("l", "ns", "me").with_timing(
            Duration::from_millis(2_500),
            Duration::from_secs(1),
            Duration::from_millis(200),
        );
        assert!(refused(fractional).contains("whole number of seconds"));
    }
}
