//! The live shards as one replica follows them: the watch of the Leases in the operator's
//! namespace, taken in event by event, and [`Members`] of those whose name starts with the
//! shard Leases' prefix. The sharder (which moves MyApps) and the webhook's view of the ring
//! (which labels a new MyApp) each follow them so.

use std::{collections::BTreeSet, time::Duration};

use futures::Stream;
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};

use super::members::Members;
use crate::fence::BootTime;

/// A shard Lease whose renewTime is this far behind this replica's wall clock belongs to a
/// replica gone long ago: it is not live, even to a replica that has just seen it for the first
/// time (liveness is otherwise judged from when this replica observed a renewal, which gives
/// any held Lease one lease duration). Far beyond any skew of cluster clocks; the sharder
/// deletes such Leases.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// The shard Leases seen so far.
#[derive(Debug)]
pub struct LiveShards {
    prefix: String,
    members: Members,
    /// Whether the Leases were listed once: until then membership is incomplete.
    listed: bool,
    /// The shard Leases a (re)list under way has shown.
    listing: BTreeSet<String>,
}

impl LiveShards {
    /// Follows the Leases whose name starts with `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            members: Members::default(),
            listed: false,
            listing: BTreeSet::new(),
        }
    }

    /// The watch of the Leases in `namespace` to feed [`LiveShards::event`] from.
    pub fn watch(
        client: Client,
        namespace: &str,
    ) -> impl Stream<Item = Result<watcher::Event<Lease>, watcher::Error>> + Send + use<> {
        watcher(
            Api::<Lease>::namespaced(client, namespace),
            watcher::Config::default(),
        )
        .default_backoff()
    }

    /// Takes in one event of the watch, seen at `now` (`wall` on the wall clock); whether the
    /// live set may have changed.
    pub fn event(&mut self, event: watcher::Event<Lease>, now: BootTime, wall: Timestamp) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing.clear();
                false
            }
            watcher::Event::InitApply(lease) => {
                if self.is_shard_lease(&lease) {
                    self.listing.insert(lease.name_any());
                    self.observe(&lease, now, wall);
                }
                false
            }
            watcher::Event::InitDone => {
                // Leases deleted while the watch was down are gone from the list alone.
                let listed = std::mem::take(&mut self.listing);
                self.members.retain(|name| listed.contains(name));
                self.listed = true;
                true
            }
            watcher::Event::Apply(lease) if self.is_shard_lease(&lease) => {
                self.observe(&lease, now, wall);
                self.listed
            }
            watcher::Event::Delete(lease) if self.is_shard_lease(&lease) => {
                self.members.forget(&lease.name_any());
                self.listed
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => false,
        }
    }

    fn observe(&mut self, lease: &Lease, now: BootTime, wall: Timestamp) {
        if is_stale(lease, wall) {
            self.members.forget(&lease.name_any());
        } else {
            self.members.observe(lease, now);
        }
    }

    fn is_shard_lease(&self, lease: &Lease) -> bool {
        lease.name_any().starts_with(&self.prefix)
    }

    /// Whether the Leases were listed once: before that, the live set is not known.
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// The holders live at `now` (see [`Members::live`]).
    pub fn live(&self, now: BootTime) -> BTreeSet<&str> {
        self.members.live(now)
    }

    /// How long until a live holder expires unless renewed (see [`Members::next_expiry`]).
    pub fn next_expiry(&self, now: BootTime) -> Option<Duration> {
        self.members.next_expiry(now)
    }

    /// Resolves when the next live holder expires unless renewed, as seen at `now`; never if
    /// none is live. What each follower of the Leases waits for besides their watch.
    pub fn expired(&self, now: BootTime) -> impl std::future::Future<Output = ()> + use<> {
        let expiry = self.next_expiry(now);
        async move {
            match expiry {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        }
    }
}

/// Whether `lease` was last renewed (or acquired) [`STALE_AFTER`] or longer before `wall`.
pub fn is_stale(lease: &Lease, wall: Timestamp) -> bool {
    let spec = lease.spec.as_ref();
    let last = spec
        .and_then(|spec| spec.renew_time.as_ref().or(spec.acquire_time.as_ref()))
        .map(|time| time.0)
        .or_else(|| lease.metadata.creation_timestamp.as_ref().map(|t| t.0));
    last.is_some_and(|last| {
        wall.duration_since(last)
            .try_into()
            .is_ok_and(|quiet: Duration| quiet >= STALE_AFTER)
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::coordination::v1::LeaseSpec,
        apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    };

    use super::*;

    fn lease(holder: &str, renewed: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(format!("ops-shard-{holder}")),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_renewed_over_an_hour_ago_is_not_live_even_when_first_seen() {
        let wall = Timestamp::from_second(1_800_000_000).unwrap();
        let boot = BootTime::from_since_boot(Duration::from_secs(100));
        let mut shards = LiveShards::new("ops-shard-");
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(lease("fresh", wall - Duration::from_secs(5))),
            watcher::Event::InitApply(lease("gone", wall - Duration::from_secs(3600))),
            watcher::Event::InitApply(lease("skewed", wall - Duration::from_secs(600))),
            watcher::Event::InitDone,
        ] {
            shards.event(event, boot, wall);
        }
        assert_eq!(
            shards.live(boot),
            BTreeSet::from(["fresh", "skewed"]),
            "a clock ten minutes behind is a renewal like any other"
        );
        // The same holder renewing again is live again.
        shards.event(watcher::Event::Apply(lease("gone", wall)), boot, wall);
        assert!(shards.live(boot).contains("gone"));
    }
}
