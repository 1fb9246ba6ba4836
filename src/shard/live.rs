//! The live shards as one replica follows them: the watch of the Leases in the operator's
//! namespace, taken in event by event, and [`Members`] of those whose name starts with the
//! shard Leases' prefix. The sharder (which moves MyApps) and the webhook's view of the ring
//! (which labels a new MyApp) each follow them so.

use std::{collections::BTreeSet, time::Duration};

use futures::Stream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};

use super::members::Members;
use crate::fence::BootTime;

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

    /// Takes in one event of the watch, seen at `now`; whether the live set may have changed.
    pub fn event(&mut self, event: watcher::Event<Lease>, now: BootTime) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing.clear();
                false
            }
            watcher::Event::InitApply(lease) => {
                if self.is_shard_lease(&lease) {
                    self.listing.insert(lease.name_any());
                    self.members.observe(&lease, now);
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
                self.members.observe(&lease, now);
                self.listed
            }
            watcher::Event::Delete(lease) if self.is_shard_lease(&lease) => {
                self.members.forget(&lease.name_any());
                self.listed
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => false,
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
}
