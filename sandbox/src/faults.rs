//! Fault injection and the request log, driven by tests through a handle.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::status::ApiError;

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
    /// Every request since the last clear, counted by client and kind (never truncated).
    counts: HashMap<RequestKey, u64>,
    /// Per user agent: requests being served now, and the most at once since the last clear.
    in_flight: HashMap<String, (usize, usize)>,
}

/// Shared fault state.
pub(crate) struct Faults {
    state: Mutex<FaultState>,
    close_tx: watch::Sender<u64>,
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
        };
        Faults {
            state: Mutex::new(state),
            close_tx: watch::channel(0).0,
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
        *s.counts.entry(RequestKey::of(&record)).or_default() += 1;
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
}

/// What a test uses to break the sandbox on purpose and to see what it was asked.
#[derive(Clone)]
pub struct FaultHandle(pub(crate) Arc<Faults>);

impl FaultHandle {
    /// Ends every open watch stream now (clients see a clean end of stream and re-watch).
    pub fn close_watches(&self) {
        self.0.close_tx.send_modify(|n| *n += 1);
    }

    /// Answers the next `count` writes (create, update, patch, delete) with `fault`.
    pub fn fail_next_writes(&self, count: usize, fault: WriteFault) {
        let mut s = self.0.lock();
        s.write_faults
            .extend(std::iter::repeat_n((None, fault), count));
    }

    /// Fails the next `count` writes made under `field_manager` (others pass), so a test can
    /// aim faults at one client while its own writes go through.
    pub fn fail_next_writes_by(&self, field_manager: &str, count: usize, fault: WriteFault) {
        let mut s = self.0.lock();
        s.write_faults.extend(std::iter::repeat_n(
            (Some(field_manager.to_owned()), fault),
            count,
        ));
    }

    /// Delays every response by `delay` (zero turns it off).
    pub fn set_delay(&self, delay: Duration) {
        self.0.lock().delay = delay;
    }

    /// The next watch that resumes from a resourceVersion gets a 410 `Expired` ERROR event.
    pub fn expire_next_watch(&self) {
        self.0.lock().expire_watches += 1;
    }

    /// Every request so far (the last 100,000, or the builder's
    /// [`request_log_capacity`](crate::SandboxBuilder::request_log_capacity)), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.0.lock().requests.iter().cloned().collect()
    }

    /// How many requests the log has dropped (the oldest first) since the last clear: nonzero
    /// means [`requests`](Self::requests) no longer holds them all; the counts still do.
    pub fn requests_dropped(&self) -> u64 {
        self.0.lock().dropped
    }

    /// Every request since the last clear, counted by user agent, verb, resource and
    /// subresource. Unlike the log, the counts never drop a request.
    pub fn request_counts(&self) -> BTreeMap<RequestKey, u64> {
        let s = self.0.lock();
        s.counts.iter().map(|(k, n)| (k.clone(), *n)).collect()
    }

    /// Forgets the recorded requests and their counts, and restarts the in-flight peaks from
    /// the current counts.
    pub fn clear_requests(&self) {
        let mut s = self.0.lock();
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
        self.0
            .lock()
            .in_flight
            .get(user_agent)
            .map_or(0, |(_, peak)| *peak)
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
