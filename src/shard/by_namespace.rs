//! Sharding by namespace at work: the record of who serves which namespace ranges (a Lease in
//! the operator's namespace, beside the shard Leases, its annotations holding the sharder's
//! [`Assignment`] and each shard's [`Ack`]), the sharder that keeps it moving towards the live
//! shards, and what a shard reads from it and writes to it. The rules are in [`super::ranges`].
//!
//! The record is written with `update`, the right the election already has on Leases, each
//! write expecting the resourceVersion it was computed from: the sharder's and the shards'
//! writes never overwrite one another, a conflict is read again and retried.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::{
    api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, PostParams},
    runtime::watcher,
};
use tracing::{debug, info, warn};

use super::{
    LiveShards,
    ranges::{self, Ack, Assignment, Range, namespace_hash},
    sharder::{Config, forget_gone_shards},
};
use crate::{crd::MyApp, fence::Gate, metrics::Metrics};

/// The annotation of the record that holds the sharder's [`Assignment`], as JSON.
pub const ASSIGNMENT_ANNOTATION: &str = "shard.example.com/assignment";

/// The annotations of the record that hold each shard's [`Ack`], as JSON: this prefix and the
/// shard's identity (which is why that identity must be a valid annotation name).
pub const ACK_PREFIX: &str = "ack.shard.example.com/";

/// How often the sharder decides again without news: a write that failed is retried.
const RETRY_PERIOD: Duration = Duration::from_secs(5);

/// How often the shard Leases of gone replicas are looked for and deleted.
const FORGET_PERIOD: Duration = Duration::from_secs(300);

/// How often the sharder counts the MyApps per namespace again, and recuts the ranges if that
/// is worth the moves ([`ranges::worth_moving`]).
const RECOUNT_PERIOD: Duration = Duration::from_secs(300);

/// MyApps per page when the sharder counts them per namespace.
const PAGE: u32 = 500;

/// How many times a write of the record is read again and retried after a conflict.
const CONFLICT_RETRIES: usize = 8;

/// The term of a shard Lease: its acquireTime, which the election renews only when the Lease
/// changes hands or its holder takes it again after letting it lapse.
pub fn term_of(lease: &Lease) -> Option<String> {
    let acquired = lease.spec.as_ref()?.acquire_time.as_ref()?;
    Some(acquired.0.to_string())
}

/// The assignment the record holds; none written (or unreadable) is the empty one of
/// generation 0, under which nobody serves anything.
pub fn assignment_of(record: &Lease) -> Assignment {
    record
        .annotations()
        .get(ASSIGNMENT_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// The acks the record holds, by shard identity.
pub fn acks_of(record: &Lease) -> BTreeMap<String, Ack> {
    record
        .annotations()
        .iter()
        .filter_map(|(key, value)| {
            let shard = key.strip_prefix(ACK_PREFIX)?;
            Some((shard.to_owned(), serde_json::from_str(value).ok()?))
        })
        .collect()
}

/// Whether `identity` can name an ack: an annotation name is at most 63 characters of
/// letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
pub fn valid_identity(identity: &str) -> bool {
    let bytes = identity.as_bytes();
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    (1..=63).contains(&bytes.len())
        && edge(bytes.first())
        && edge(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The record as it changes, from the watch of the Leases the sharder follows too (one watch
/// of that type in the binary, rather than a second one selecting the record by name).
pub fn follow_record(
    client: Client,
    config: &Config,
) -> impl Stream<Item = Result<Lease, watcher::Error>> + Send + use<> {
    let record = config.record.clone();
    LiveShards::watch(client, &config.namespace).try_filter_map(move |event| {
        let lease = match event {
            watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => Some(lease),
            _ => None,
        };
        std::future::ready(Ok(lease.filter(|lease| lease.name_any() == record)))
    })
}

/// The term this replica holds its shard Lease in, read from the API server.
pub async fn own_term(client: &Client, config: &Config, identity: &str) -> Result<String, String> {
    let api = Api::<Lease>::namespaced(client.clone(), &config.namespace);
    let name = config.lease_name(identity);
    match api.get_opt(&name).await {
        Ok(Some(lease)) => {
            term_of(&lease).ok_or_else(|| format!("Lease {name} has no acquireTime"))
        }
        Ok(None) => Err(format!("Lease {name} is gone")),
        Err(error) => Err(error.to_string()),
    }
}

/// Writes `identity`'s `ack` into the record, through `gate`, unless `seen` (the record as last
/// seen) already holds it. After a conflict it reads the record again and retries, but only
/// into the same record: one deleted and written again starts over at generation 0, and the
/// ack of a generation of the old one would count there for one the shard never saw.
pub async fn acknowledge(
    client: &Client,
    gate: &Gate,
    config: &Config,
    seen: &Lease,
    identity: &str,
    ack: &Ack,
) -> Result<(), kube::Error> {
    let key = format!("{ACK_PREFIX}{identity}");
    let value = serde_json::to_string(ack).expect("an ack serializes");
    let api = Api::<Lease>::namespaced(client.clone(), &config.namespace);
    let mut record = seen.clone();
    let mut tries = 0;
    loop {
        if record.annotations().get(&key) == Some(&value)
            || record.metadata.uid != seen.metadata.uid
        {
            return Ok(());
        }
        record.annotations_mut().insert(key.clone(), value.clone());
        match replace(client, gate, config, &record).await {
            Err(kube::Error::Api(status)) if status.code == 409 && tries < CONFLICT_RETRIES => {
                tries += 1;
                record = api.get(&config.record).await?;
            }
            other => return other,
        }
    }
}

/// Replaces the record with `record`, expecting its resourceVersion, once `gate` lets it.
async fn replace(
    client: &Client,
    gate: &Gate,
    config: &Config,
    record: &Lease,
) -> Result<(), kube::Error> {
    let request = kube::core::Request::new(Lease::url_path(&(), Some(&config.namespace)))
        .replace(&config.record, &PostParams::default(), body(record))
        .map_err(kube::Error::BuildRequest)?;
    let request = gate.pass(request, "replace")?;
    client.request_text(request).await?;
    Ok(())
}

fn body(record: &Lease) -> Vec<u8> {
    serde_json::to_vec(record).expect("a Lease serializes")
}

/// Creates the empty record, once `gate` lets it.
async fn create(client: &Client, gate: &Gate, config: &Config) -> Result<(), kube::Error> {
    let record = Lease {
        metadata: ObjectMeta {
            name: Some(config.record.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
    };
    let request = kube::core::Request::new(Lease::url_path(&(), Some(&config.namespace)))
        .create(&PostParams::default(), body(&record))
        .map_err(kube::Error::BuildRequest)?;
    let request = gate.pass(request, "create")?;
    client.request_text(request).await?;
    Ok(())
}

/// MyApps per namespace hash: what the target balances.
async fn weights(client: &Client) -> Result<BTreeMap<u64, u64>, kube::Error> {
    let api = Api::<MyApp>::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    let mut weights = BTreeMap::new();
    loop {
        let page = api.list_metadata(&params).await?;
        for app in &page.items {
            if let Some(namespace) = &app.metadata.namespace {
                *weights.entry(namespace_hash(namespace)).or_default() += 1;
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(weights),
        }
    }
}

/// The sharder by namespace: until dropped (when its gate closes, the caller drops it), moves
/// the record's assignment towards one range per live shard, each holding about as many
/// MyApps (counted when the live set changes; a namespace is never split), one
/// [`ranges::next`] step at a time. Each assignment written counts as a `shard_move` write.
pub async fn assign(client: Client, config: Config, gate: Arc<Gate>, metrics: Arc<Metrics>) {
    let events = LiveShards::watch(client.clone(), &config.namespace);
    tokio::pin!(events);
    let mut shards = LiveShards::new(&config.lease_prefix);
    // Each shard's term, by holder.
    let mut terms: BTreeMap<String, String> = BTreeMap::new();
    let mut record: Option<Lease> = None;
    let mut target: Option<Target> = None;
    let mut retry = tokio::time::interval(RETRY_PERIOD);
    let mut forget = tokio::time::interval(FORGET_PERIOD);
    let mut recount = tokio::time::interval(RECOUNT_PERIOD);
    recount.reset();
    loop {
        let expired = shards.expired(gate.now());
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => {
                    take_in(&event, &config, &mut record, &mut terms);
                    shards.event(event, gate.now(), Timestamp::now());
                }
                Some(Err(error)) => {
                    warn!(%error, "Shard Lease watch failed");
                    continue;
                }
                None => return,
            },
            () = expired => {}
            _ = retry.tick() => {}
            _ = forget.tick() => forget_gone_shards(&client, &gate, &config).await,
            _ = recount.tick() => {
                if let Some(target) = &mut target {
                    target.recount(&client).await;
                }
            }
        }
        // No settling (`Config::settle`) here: a move of ranges writes nothing per MyApp, and
        // until the first growth nobody serves anything.
        if !shards.listed() {
            continue;
        }
        let live: BTreeMap<String, String> = shards
            .live(gate.now())
            .into_iter()
            .filter_map(|shard| Some((shard.to_owned(), terms.get(shard)?.clone())))
            .collect();
        let members: BTreeSet<String> = live.keys().cloned().collect();
        if target.as_ref().is_none_or(|target| target.of != members) {
            match weights(&client).await {
                Ok(weights) => {
                    let ranges = ranges::target(members.iter().map(String::as_str), &weights);
                    info!(
                        shards = members.len(),
                        namespaces = weights.len(),
                        "Namespace ranges computed for the live shards"
                    );
                    target = Some(Target {
                        of: members,
                        ranges,
                        weights,
                    });
                }
                Err(error) => {
                    warn!(%error, "Counting the MyApps per namespace failed");
                    continue;
                }
            }
        }
        let Some(target) = &target else { continue };
        let Some(record) = &record else {
            match create(&client, &gate, &config).await {
                Ok(()) => info!(record = %config.record, "Created the record of namespace ranges"),
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => {
                    warn!(%error, record = %config.record, "Creating the record of namespace ranges failed")
                }
            }
            continue;
        };
        let current = assignment_of(record);
        let unassigned = target.uncovered(&current, &live);
        metrics
            .shards
            .unassigned
            .set(i64::try_from(unassigned).unwrap_or(i64::MAX));
        let acks = acks_of(record);
        let Some(next) = ranges::next(&current, &acks, &live, &target.ranges) else {
            continue;
        };
        let mut written = record.clone();
        let annotations = written.annotations_mut();
        annotations.insert(
            ASSIGNMENT_ANNOTATION.to_owned(),
            serde_json::to_string(&next).expect("an assignment serializes"),
        );
        // Acks of shards that are gone are dropped with their entries.
        annotations.retain(|key, _| {
            key.strip_prefix(ACK_PREFIX)
                .is_none_or(|shard| live.contains_key(shard))
        });
        match replace(&client, &gate, &config, &written).await {
            Ok(()) => {
                metrics.wrote("shard_move");
                debug!(generation = next.generation, "Namespace ranges assigned");
            }
            // Changed since seen: its watch event brings the newer record.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => warn!(%error, "Writing the namespace ranges failed"),
        }
    }
}

/// Where the sharder is heading, for one set of live shards.
struct Target {
    /// The live shards it is for.
    of: BTreeSet<String>,
    /// Their ranges.
    ranges: BTreeMap<String, Vec<Range>>,
    /// MyApps per namespace hash, as counted for it.
    weights: BTreeMap<u64, u64>,
}

impl Target {
    /// Counts the MyApps per namespace again, and moves to new cuts for the same shards if
    /// that is worth it.
    async fn recount(&mut self, client: &Client) {
        let weights = match weights(client).await {
            Ok(weights) => weights,
            Err(error) => {
                warn!(%error, "Counting the MyApps per namespace failed");
                return;
            }
        };
        let proposed = ranges::target(self.of.iter().map(String::as_str), &weights);
        if ranges::worth_moving(&self.ranges, &proposed, &weights) {
            info!(
                shards = self.of.len(),
                namespaces = weights.len(),
                "Namespace ranges recut: the MyApps per namespace changed"
            );
            self.ranges = proposed;
        }
        self.weights = weights;
    }

    /// The MyApps (as counted) in namespaces `current` gives no live shard in its term.
    fn uncovered(&self, current: &Assignment, live: &BTreeMap<String, String>) -> u64 {
        let covered: Vec<Range> = live
            .iter()
            .flat_map(|(shard, term)| current.ranges_of(shard, term).iter().copied())
            .collect();
        self.weights
            .iter()
            .filter(|(hash, _)| !ranges::contains(&covered, **hash))
            .map(|(_, count)| count)
            .sum()
    }
}

/// Keeps the record and the shards' terms from one event of the Lease watch.
fn take_in(
    event: &watcher::Event<Lease>,
    config: &Config,
    record: &mut Option<Lease>,
    terms: &mut BTreeMap<String, String>,
) {
    let (watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event else {
        // A relist shows the record again if it still exists.
        let gone = match event {
            watcher::Event::Delete(lease) => lease.name_any() == config.record,
            _ => matches!(event, watcher::Event::Init),
        };
        if gone {
            *record = None;
        }
        return;
    };
    if lease.name_any() == config.record {
        *record = Some(lease.clone());
    } else if lease.name_any().starts_with(&config.lease_prefix)
        && let Some(holder) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
        && let Some(term) = term_of(lease)
    {
        terms.insert(holder, term);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_must_be_an_annotation_name_to_acknowledge() {
        assert!(valid_identity("myapp-operator-7d9f8c6b5-x2k4p"));
        assert!(valid_identity("a.b_c"));
        assert!(!valid_identity(""));
        assert!(!valid_identity("-pod"));
        assert!(!valid_identity("pod/0"));
        assert!(!valid_identity(&"p".repeat(64)));
    }
}
