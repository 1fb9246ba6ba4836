//! Which shards are live, from the shard Leases this replica has seen.
//!
//! Each replica holds a Lease of its own, and the ring is built from the holders of the live
//! ones. A holder is live from when this replica sees its Lease held until the Lease's duration
//! has passed since this replica last saw it change, and no longer once it is released or
//! deleted. As in the election (`leader.rs`), a renewal is a new holder or renewTime, and expiry
//! is judged on this replica's boot clock from when it *observed* each renewal, never from the
//! renewTime the holder wrote, so the nodes' clocks never have to agree: a holder that stopped
//! renewing is dropped at most its duration after its last renewal reached this replica, and a
//! lagging clock on its node changes nothing.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};

use crate::fence::BootTime;

/// The shard Leases seen, by Lease name.
#[derive(Debug, Default)]
pub struct Members {
    leases: HashMap<String, Seen>,
}

/// A held Lease as last seen renewed.
#[derive(Debug)]
struct Seen {
    holder: String,
    renewed: Option<MicroTime>,
    changed: BootTime,
    duration: Duration,
}

impl Members {
    /// Takes in `lease` as a list or watch event gave it at `now`. The same holder and renewTime
    /// seen again (a relist, or a write to the Lease's labels) is no renewal and extends nothing.
    pub fn observe(&mut self, lease: &Lease, now: BootTime) {
        let Some(name) = lease.metadata.name.as_deref() else {
            return;
        };
        let spec = lease.spec.as_ref();
        let holder = spec
            .and_then(|spec| spec.holder_identity.as_deref())
            .filter(|holder| !holder.is_empty());
        // A Lease that names no duration cannot be judged alive: it counts as released.
        let duration = spec
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|&seconds| seconds > 0)
            .map(Duration::from_secs);
        let (Some(holder), Some(duration)) = (holder, duration) else {
            self.leases.remove(name);
            return;
        };
        let renewed = spec.and_then(|spec| spec.renew_time.as_ref());
        if let Some(seen) = self.leases.get(name)
            && seen.holder == holder
            && seen.renewed.as_ref() == renewed
        {
            return;
        }
        self.leases.insert(
            name.to_owned(),
            Seen {
                holder: holder.to_owned(),
                renewed: renewed.cloned(),
                changed: now,
                duration,
            },
        );
    }

    /// Keeps only the Leases named so (those a relist showed).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.leases.retain(|name, _| keep(name));
    }

    /// Forgets a deleted Lease.
    pub fn forget(&mut self, name: &str) {
        self.leases.remove(name);
    }

    /// The holders live at `now`.
    pub fn live(&self, now: BootTime) -> BTreeSet<&str> {
        self.leases
            .values()
            .filter(|seen| now < seen.changed.after(seen.duration))
            .map(|seen| seen.holder.as_str())
            .collect()
    }

    /// How long until a holder live at `now` stops being live unless its Lease changes first:
    /// when to look at the ring again.
    pub fn next_expiry(&self, now: BootTime) -> Option<Duration> {
        self.leases
            .values()
            .map(|seen| seen.changed.after(seen.duration))
            .filter(|&expiry| now < expiry)
            .map(|expiry| expiry.since(now))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta,
        jiff::Timestamp,
    };

    use super::*;

    /// A Lease held by `holder` for `seconds`, renewed at `renewed` by the holder's clock.
    fn lease(name: &str, holder: Option<&str>, renewed: i64, seconds: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                lease_duration_seconds: seconds,
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    fn at(seconds: u64) -> BootTime {
        BootTime::from_since_boot(Duration::from_secs(seconds))
    }

    #[test]
    fn a_held_lease_is_live_for_its_duration_after_it_was_seen_changing() {
        let mut members = Members::default();
        members.observe(&lease("shard-a", Some("pod-a"), 1, Some(10)), at(100));
        assert_eq!(members.live(at(100)), BTreeSet::from(["pod-a"]));
        assert_eq!(members.live(at(109)), BTreeSet::from(["pod-a"]));
        assert_eq!(members.next_expiry(at(104)), Some(Duration::from_secs(6)));
        assert!(members.live(at(110)).is_empty(), "expired");
        assert_eq!(members.next_expiry(at(110)), None);
    }

    #[test]
    fn a_renewal_extends_the_lease_and_the_same_renewal_seen_again_does_not() {
        let mut members = Members::default();
        members.observe(&lease("shard-a", Some("pod-a"), 1, Some(10)), at(100));
        members.observe(&lease("shard-a", Some("pod-a"), 1, Some(10)), at(108));
        assert!(
            members.live(at(110)).is_empty(),
            "the same renewal seen again is none"
        );

        members.observe(&lease("shard-a", Some("pod-a"), 2, Some(10)), at(112));
        assert_eq!(members.live(at(121)), BTreeSet::from(["pod-a"]));
        assert!(members.live(at(122)).is_empty());

        // Another replica taking the Lease over is a renewal, whatever its clock wrote.
        members.observe(&lease("shard-a", Some("pod-b"), 2, Some(10)), at(130));
        assert_eq!(members.live(at(139)), BTreeSet::from(["pod-b"]));
    }

    #[test]
    fn a_released_deleted_or_durationless_lease_is_not_live() {
        let mut members = Members::default();
        for name in ["released", "deleted", "durationless"] {
            members.observe(&lease(name, Some(name), 1, Some(10)), at(100));
        }
        members.observe(&lease("released", None, 2, Some(10)), at(101));
        members.forget("deleted");
        members.observe(
            &lease("durationless", Some("durationless"), 2, None),
            at(101),
        );
        members.observe(&lease("empty", Some(""), 1, Some(10)), at(101));
        assert!(members.live(at(101)).is_empty());
    }

    #[test]
    fn each_holder_counts_once_whatever_the_number_of_its_leases() {
        let mut members = Members::default();
        members.observe(&lease("shard-a", Some("pod-a"), 1, Some(10)), at(100));
        members.observe(&lease("shard-a-old", Some("pod-a"), 7, Some(10)), at(100));
        members.observe(&lease("shard-b", Some("pod-b"), 3, Some(10)), at(100));
        assert_eq!(members.live(at(105)), BTreeSet::from(["pod-a", "pod-b"]));
    }
}
