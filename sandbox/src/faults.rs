//! Fault injection and the request log, driven by tests through a handle.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::status::ApiError;
use crate::store::{Snapshot, Store};

/// One request as the sandbox saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection (or the
    /// HTTP method for non-resource paths).
    pub verb: String,
    /// Request path without the query.
    pub path: String,
    /// Resource plural, for resource requests.
    pub resource: Option<String>,
    /// Subresource (`status`), if any.
    pub subresource: Option<String>,
    /// Namespace from the URL, if any.
    pub namespace: Option<String>,
    /// Object name from the URL, if any.
    pub name: Option<String>,
    /// The `fieldManager` query parameter, if any.
    pub field_manager: Option<String>,
    /// The `User-Agent` header, if any: tells one client's requests from another's.
    pub user_agent: Option<String>,
    /// The authenticated username (the impersonated one, if any); None when authentication is
    /// off.
    pub user: Option<String>,
    /// The id of the bearer token that authenticated the request (one per replica for a
    /// ServiceAccount's bound tokens); None when authentication is off.
    pub token_id: Option<String>,
    /// HTTP status code of the answer (200 for a watch that started streaming).
    pub status: u16,
}

/// What the request counters count by: one client's requests of one kind.
///
/// The counters never truncate (the request log keeps only its most recent requests), so a
/// benchmark at any scale can attribute every request of a run to its client.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// The `User-Agent` header, if any.
    pub user_agent: Option<String>,
    /// Kubernetes verb, as in [`RequestRecord::verb`].
    pub verb: String,
    /// Resource plural, for resource requests.
    pub resource: Option<String>,
    /// Subresource (`status`), if any.
    pub subresource: Option<String>,
}

impl RequestKey {
    fn of(record: &RequestRecord) -> Self {
        RequestKey {
            user_agent: record.user_agent.clone(),
            verb: record.verb.clone(),
            resource: record.resource.clone(),
            subresource: record.subresource.clone(),
        }
    }
}

/// How an injected write failure answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFault {
    /// 409 Conflict, as for a stale resourceVersion.
    Conflict,
    /// 500 InternalError.
    Internal,
    /// 429 TooManyRequests with `Retry-After: seconds`.
    TooManyRequests {
        /// Value of the `Retry-After` header.
        retry_after: u64,
    },
}

/// Writes of the clients whose user agent starts with `prefix`, stalled once `after` of them
/// were accepted (see [`FaultHandle::stall_writes_after`]).
struct WriteStall {
    /// Tells this stall's slots from those of an earlier one.
    id: u64,
    prefix: String,
    after: usize,
    /// Writes that took a slot and were answered below 400, not as a dry run.
    accepted: usize,
    /// Writes that took a slot and are not answered yet.
    in_flight: usize,
    /// Cleared by a release: the count stays readable, writes pass.
    armed: bool,
}

/// Reads of the clients whose user agent starts with `prefix`, answered from a snapshot (see
/// [`FaultHandle::hold_reads`]).
pub(crate) struct ReadHold {
    /// Tells this hold from an earlier one, for watches that have not yet sent what it withheld.
    id: u64,
    prefix: String,
    /// The store when the hold began: its version is the newest these clients see.
    pub(crate) snapshot: Snapshot,
}

/// How a watch reads now (see [`Faults::watch_view`]).
pub(crate) struct WatchView {
    /// The hold its client is under, if any: it sends nothing newer than its snapshot.
    pub(crate) hold: Option<Arc<ReadHold>>,
    /// Whether it sends only each object's newest event of the events it sends next.
    pub(crate) coalesce: bool,
}

impl WatchView {
    /// The newest resourceVersion the watch may send, if it is held.
    pub(crate) fn until(&self) -> Option<u64> {
        self.hold.as_ref().map(|h| h.snapshot.rv)
    }
}

/// How many ended read holds keep their release mode for watches that have yet to send what the
/// hold withheld (a watch whose hold is older sends its events one by one: never a wrong state).
const RELEASED_READ_HOLDS: usize = 64;

/// The request log keeps this many most recent requests by default (a long `dev` session must
/// not grow without bound).
pub(crate) const REQUEST_LOG_CAPACITY: usize = 100_000;

struct FaultState {
    /// Queued failures, each for any writer or only for one field manager's writes.
    write_faults: VecDeque<(Option<String>, WriteFault)>,
    delay: Duration,
    expire_watches: usize,
    requests: VecDeque<RequestRecord>,
    /// How many requests `requests` holds at most.
    log_capacity: usize,
    /// Requests dropped from the front of `requests` since the last clear.
    dropped: u64,
    /// Every request since the last clear, counted by client, kind and the HTTP status of its
    /// answer (never truncated).
    counts: HashMap<(RequestKey, u16), u64>,
    /// Per user agent: requests being served now, and the most at once since the last clear.
    in_flight: HashMap<String, (usize, usize)>,
    /// The current or last write stall.
    stall: Option<WriteStall>,
    /// Writes waiting for a release of the stall.
    held_writes: usize,
    read_hold: Option<Arc<ReadHold>>,
    /// The ended read holds, newest last: (id, whether their withheld events are coalesced).
    released_reads: VecDeque<(u64, bool)>,
    /// Whether every watch sends only each object's newest event of a batch.
    coalesce_watches: bool,
    /// The last id given to a stall or a read hold.
    last_id: u64,
}

/// Shared fault state.
pub(crate) struct Faults {
    state: Mutex<FaultState>,
    close_tx: watch::Sender<u64>,
    /// Bumped when stalled writes are released.
    stall_tx: watch::Sender<u64>,
    /// Bumped when a read hold begins or ends, so watches look again.
    reads_tx: watch::Sender<u64>,
}

impl Faults {
    /// Fault state whose request log keeps the last `log_capacity` requests (at least one).
    pub(crate) fn new(log_capacity: usize) -> Self {
        let state = FaultState {
            write_faults: VecDeque::new(),
            delay: Duration::ZERO,
            expire_watches: 0,
            requests: VecDeque::new(),
            log_capacity: log_capacity.max(1),
            dropped: 0,
            counts: HashMap::new(),
            in_flight: HashMap::new(),
            stall: None,
            held_writes: 0,
            read_hold: None,
            released_reads: VecDeque::new(),
            coalesce_watches: false,
            last_id: 0,
        };
        Faults {
            state: Mutex::new(state),
            close_tx: watch::channel(0).0,
            stall_tx: watch::channel(0).0,
            reads_tx: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The injected failure for this write by `field_manager`, if one is queued for it.
    pub(crate) fn take_write_fault(&self, field_manager: Option<&str>) -> Option<ApiError> {
        let fault = {
            let mut s = self.lock();
            let at = s
                .write_faults
                .iter()
                .position(|(only, _)| only.is_none() || only.as_deref() == field_manager)?;
            s.write_faults.remove(at)?.1
        };
        Some(match fault {
            WriteFault::Conflict => ApiError::new(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again (injected)",
            ),
            WriteFault::Internal => ApiError::internal("Internal error occurred: injected failure"),
            WriteFault::TooManyRequests { retry_after } => {
                let mut e = ApiError::new(
                    429,
                    "TooManyRequests",
                    "the server has received too many requests and has asked us to try again later (injected)",
                );
                e.retry_after = Some(retry_after);
                e
            }
        })
    }

    pub(crate) fn delay(&self) -> Duration {
        self.lock().delay
    }

    pub(crate) fn take_expired_watch(&self) -> bool {
        let mut s = self.lock();
        if s.expire_watches > 0 {
            s.expire_watches -= 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn record(&self, record: RequestRecord) {
        let mut s = self.lock();
        *s.counts
            .entry((RequestKey::of(&record), record.status))
            .or_default() += 1;
        if s.requests.len() >= s.log_capacity {
            s.requests.pop_front();
            s.dropped += 1;
        }
        s.requests.push_back(record);
    }

    /// Counts a request of `user_agent` as in flight until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, user_agent: &str) -> InFlight {
        let mut s = self.lock();
        let (now, peak) = s.in_flight.entry(user_agent.to_owned()).or_default();
        *now += 1;
        *peak = (*peak).max(*now);
        InFlight {
            faults: self.clone(),
            user_agent: user_agent.to_owned(),
        }
    }

    pub(crate) fn close_signal(&self) -> watch::Receiver<u64> {
        self.close_tx.subscribe()
    }

    /// Where a write of `user_agent` passes the armed stall: `None` when no stall is aimed at
    /// it, a slot to settle when one is left, and when none is left it waits for
    /// [`FaultHandle::release_stalled`] and is refused with 503 (never carried out).
    ///
    /// A slot is taken when the write starts and given back if it is refused, so at most `k`
    /// writes land even when they race; a write that finds every slot taken stays held even if
    /// a slot is given back later (a client killed while held must not write after its death).
    pub(crate) async fn stall_write(
        self: &Arc<Self>,
        user_agent: &str,
    ) -> Result<Option<StallSlot>, ApiError> {
        let (mut released, _held) = {
            let mut s = self.lock();
            let Some(stall) = s
                .stall
                .as_mut()
                .filter(|st| st.armed && user_agent.starts_with(&st.prefix))
            else {
                return Ok(None);
            };
            if stall.accepted + stall.in_flight < stall.after {
                stall.in_flight += 1;
                return Ok(Some(StallSlot {
                    faults: self.clone(),
                    stall: stall.id,
                    accepted: false,
                }));
            }
            s.held_writes += 1;
            // Subscribed under the lock a release takes to send: no release is missed.
            let released = self.stall_tx.subscribe();
            (released, HeldWrite(self.clone()))
        };
        // The sender lives as long as `self`: this ends only with a release.
        let _ = released.changed().await;
        Err(ApiError::new(
            503,
            "ServiceUnavailable",
            "the write was held by an injected stall (kube-sandbox stall_writes_after) and was not carried out",
        ))
    }

    /// The read hold `user_agent` is under, if any.
    pub(crate) fn read_hold(&self, user_agent: &str) -> Option<Arc<ReadHold>> {
        self.lock()
            .read_hold
            .clone()
            .filter(|h| user_agent.starts_with(&h.prefix))
    }

    /// How a watch of `user_agent` reads its next batch. `held_under` is the watch's memory of
    /// the hold it was last under: when that hold has ended, the batch carries what it withheld,
    /// coalesced as its release said. Call it under the store lock, so a hold (which begins
    /// under that lock) is never half seen.
    pub(crate) fn watch_view(&self, user_agent: &str, held_under: &mut Option<u64>) -> WatchView {
        let s = self.lock();
        let hold = s
            .read_hold
            .clone()
            .filter(|h| user_agent.starts_with(&h.prefix));
        let mut coalesce = s.coalesce_watches;
        if let Some(id) = *held_under
            && hold.as_ref().map(|h| h.id) != Some(id)
        {
            coalesce |= s
                .released_reads
                .iter()
                .any(|&(released, coalesced)| released == id && coalesced);
        }
        *held_under = hold.as_ref().map(|h| h.id);
        WatchView { hold, coalesce }
    }

    /// A receiver told when a read hold begins or ends.
    pub(crate) fn read_signal(&self) -> watch::Receiver<u64> {
        self.reads_tx.subscribe()
    }

    /// Answers every held write (503) and disarms the stall.
    pub(crate) fn release_stalled(&self) {
        let mut s = self.lock();
        if let Some(stall) = s.stall.as_mut() {
            stall.armed = false;
        }
        self.stall_tx.send_modify(|n| *n += 1);
    }

    fn next_id(s: &mut FaultState) -> u64 {
        s.last_id += 1;
        s.last_id
    }
}

/// What a test uses to break the sandbox on purpose and to see what it was asked.
#[derive(Clone)]
pub struct FaultHandle {
    pub(crate) faults: Arc<Faults>,
    /// What a read hold snapshots.
    pub(crate) store: Arc<Store>,
}

impl FaultHandle {
    /// Ends every open watch stream now (clients see a clean end of stream and re-watch).
    pub fn close_watches(&self) {
        self.faults.close_tx.send_modify(|n| *n += 1);
    }

    /// Answers the next `count` writes (create, update, patch, delete) with `fault`.
    pub fn fail_next_writes(&self, count: usize, fault: WriteFault) {
        let mut s = self.faults.lock();
        s.write_faults
            .extend(std::iter::repeat_n((None, fault), count));
    }

    /// Fails the next `count` writes made under `field_manager` (others pass), so a test can
    /// aim faults at one client while its own writes go through.
    pub fn fail_next_writes_by(&self, field_manager: &str, count: usize, fault: WriteFault) {
        let mut s = self.faults.lock();
        s.write_faults.extend(std::iter::repeat_n(
            (Some(field_manager.to_owned()), fault),
            count,
        ));
    }

    /// Delays every response by `delay` (zero turns it off).
    pub fn set_delay(&self, delay: Duration) {
        self.faults.lock().delay = delay;
    }

    /// The next watch that resumes from a resourceVersion gets a 410 `Expired` ERROR event.
    pub fn expire_next_watch(&self) {
        self.faults.lock().expire_watches += 1;
    }

    /// Every request so far (the last 100,000, or the builder's
    /// [`request_log_capacity`](crate::SandboxBuilder::request_log_capacity)), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.faults.lock().requests.iter().cloned().collect()
    }

    /// How many requests the log has dropped (the oldest first) since the last clear: nonzero
    /// means [`requests`](Self::requests) no longer holds them all; the counts still do.
    pub fn requests_dropped(&self) -> u64 {
        self.faults.lock().dropped
    }

    /// Every request since the last clear, counted by user agent, verb, resource and
    /// subresource. Unlike the log, the counts never drop a request.
    pub fn request_counts(&self) -> BTreeMap<RequestKey, u64> {
        let s = self.faults.lock();
        let mut counts = BTreeMap::<RequestKey, u64>::new();
        for ((key, _), n) in &s.counts {
            *counts.entry(key.clone()).or_default() += n;
        }
        counts
    }

    /// Every answer since the last clear, counted by the request's user agent, verb, resource
    /// and subresource, and the answer's HTTP status (200 for a watch that started streaming):
    /// which client's writes were refused, and how (409 Conflict for a failed resourceVersion
    /// precondition or an existing name, 422 Invalid, ...). Never truncated, as
    /// [`request_counts`](Self::request_counts), whose counts these split by status.
    pub fn status_counts(&self) -> BTreeMap<(RequestKey, u16), u64> {
        let s = self.faults.lock();
        s.counts.iter().map(|(k, n)| (k.clone(), *n)).collect()
    }

    /// Forgets the recorded requests and their counts (by kind and by status), and restarts the
    /// in-flight peaks from the current counts.
    pub fn clear_requests(&self) {
        let mut s = self.faults.lock();
        s.requests.clear();
        s.dropped = 0;
        s.counts.clear();
        for (now, peak) in s.in_flight.values_mut() {
            *peak = *now;
        }
    }

    /// The most requests (watches excepted) of `user_agent` served at once since the last
    /// [`clear_requests`](Self::clear_requests): the pressure a client puts on the API server.
    pub fn peak_in_flight(&self, user_agent: &str) -> usize {
        self.faults
            .lock()
            .in_flight
            .get(user_agent)
            .map_or(0, |(_, peak)| *peak)
    }

    /// Crashes a client right after its `k`-th accepted write: from now on, the writes (create,
    /// update, patch, delete, deletecollection, on any resource or subresource) of clients whose
    /// `User-Agent` starts with `user_agent_prefix` are counted, and once `k` were accepted
    /// (answered below 400, not as a dry run) every further one is held before it reaches
    /// admission or the store: it is answered nothing until
    /// [`release_stalled`](Self::release_stalled) or until the served sandbox shuts down or
    /// drops, then 503 ServiceUnavailable, not carried out. Reads and watches pass. `k` = 0
    /// holds the very next.
    ///
    /// Concurrent writes: each takes a slot when it starts (before admission) and gives it back
    /// if it is refused; a write that finds `k` slots taken (accepted or in flight) is held and
    /// stays held. So at most `k` writes land, exactly `k` when none of those in flight is
    /// refused. Replaces an earlier stall (its held writes stay held until the release).
    ///
    /// A client that retries 503 (kube's default client does) writes again after the release:
    /// the release is for a new process, after the stalled one was killed.
    pub fn stall_writes_after(&self, user_agent_prefix: &str, k: usize) {
        let mut s = self.faults.lock();
        let id = Faults::next_id(&mut s);
        s.stall = Some(WriteStall {
            id,
            prefix: user_agent_prefix.to_owned(),
            after: k,
            accepted: 0,
            in_flight: 0,
            armed: true,
        });
    }

    /// How many writes the current (or, once released, the last) stall counted as accepted.
    pub fn stalled_writes_accepted(&self) -> usize {
        self.faults
            .lock()
            .stall
            .as_ref()
            .map_or(0, |st| st.accepted)
    }

    /// How many writes are held by a stall right now: once one is, the client has made its
    /// last write.
    pub fn writes_held(&self) -> usize {
        self.faults.lock().held_writes
    }

    /// Answers every held write with 503 (none is carried out) and disarms the stall, so a new
    /// process with the same user agent writes freely.
    pub fn release_stalled(&self) {
        self.faults.release_stalled();
    }

    /// A lagging read view, as a second API server behind in an HA pair or a watch cache behind
    /// the store shows: the store as it is now (resourceVersion H) is kept, and from now on, for
    /// clients whose `User-Agent` starts with `user_agent_prefix`, LIST (whatever its
    /// resourceVersion, continue token or limit) and GET answer from it, with resourceVersion
    /// H, and watches, new or open, send no event newer than H (nor a bookmark beyond it; a
    /// watch from a version beyond H waits). Writes of those clients reach the live store;
    /// other clients see it as usual. Replaces an earlier hold (what that one withheld is sent
    /// up to the new H, one event at a time).
    pub fn hold_reads(&self, user_agent_prefix: &str) {
        // Under the store lock, so no watch sees the new version without the hold.
        let state = self.store.lock();
        let snapshot = state.snapshot();
        {
            let mut s = self.faults.lock();
            let id = Faults::next_id(&mut s);
            s.read_hold = Some(Arc::new(ReadHold {
                id,
                prefix: user_agent_prefix.to_owned(),
                snapshot,
            }));
        }
        drop(state);
        self.faults.reads_tx.send_modify(|n| *n += 1);
    }

    /// Ends the read hold: its clients read the live store again, and their watches send
    /// everything after H. With `coalesce`, a watch sends, per object, only its net change over
    /// the events it withheld, as a coalescing watch cache does: a chain of MODIFIED becomes
    /// its last state; created then deleted sends nothing (the client never saw it); deleted
    /// and created again (a new uid) sends DELETED then ADDED; with a label selector, an object
    /// that entered or left the selection is ADDED or DELETED. Each is sent in the order of the
    /// newest event it stands for.
    pub fn release_reads(&self, coalesce: bool) {
        {
            let mut s = self.faults.lock();
            if let Some(hold) = s.read_hold.take() {
                s.released_reads.push_back((hold.id, coalesce));
                if s.released_reads.len() > RELEASED_READ_HOLDS {
                    s.released_reads.pop_front();
                }
            }
        }
        self.faults.reads_tx.send_modify(|n| *n += 1);
    }

    /// Whether every watch sends only each object's net change (as
    /// [`release_reads`](Self::release_reads) with `coalesce` describes) over the events it
    /// sends at once: the events written since it last woke, or a replay from a
    /// resourceVersion.
    pub fn coalesce_watch_events(&self, on: bool) {
        self.faults.lock().coalesce_watches = on;
    }
}

/// A write's slot under an armed stall (see [`Faults::stall_write`]): counted as accepted if
/// [`accept`](Self::accept)ed, else given back when dropped.
pub(crate) struct StallSlot {
    faults: Arc<Faults>,
    stall: u64,
    accepted: bool,
}

impl StallSlot {
    /// The write was committed.
    pub(crate) fn accept(mut self) {
        self.accepted = true;
    }
}

impl Drop for StallSlot {
    fn drop(&mut self) {
        let mut s = self.faults.lock();
        if let Some(stall) = s.stall.as_mut().filter(|st| st.id == self.stall) {
            stall.in_flight = stall.in_flight.saturating_sub(1);
            if self.accepted {
                stall.accepted += 1;
            }
        }
    }
}

/// A write counted as held until it is answered or its request is dropped.
struct HeldWrite(Arc<Faults>);

impl Drop for HeldWrite {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.held_writes = s.held_writes.saturating_sub(1);
    }
}

/// A request counted as in flight (see [`Faults::enter`]).
pub(crate) struct InFlight {
    faults: Arc<Faults>,
    user_agent: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((now, _)) = self.faults.lock().in_flight.get_mut(&self.user_agent) {
            *now = now.saturating_sub(1);
        }
    }
}
