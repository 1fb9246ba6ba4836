//! Attribution: which of the sandbox's requests the operator made, by its `User-Agent`.
//!
//! The sandbox counts every request by user agent, verb, resource and subresource, and every answer
//! by those and its HTTP status, without the request log's truncation. The operator sends one
//! `User-Agent` on every request (its applies, status writes, Events, lists and watches), so
//! nothing it does escapes the count, whatever field manager it writes under. A phase that should
//! show the operator's requests and shows none fails the bench with the user agents the sandbox did
//! see.

use std::collections::BTreeMap;

use kube_sandbox::{RequestKey, Sandbox};

/// How the bench attributes requests, for failure messages.
pub const HOW: &str = "the bench attributes a request to the operator by its User-Agent header \
    (myapp-operator sends myapp_operator::run::USER_AGENT on every request); to measure an \
    operator that sends another one, set MYAPP_BENCH_USER_AGENT to it";

/// The operator's requests in one phase of the bench, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Writes of Deployments and Services (server-side applies, creates, deletes).
    pub child_writes: u64,
    /// Writes of a MyApp's status subresource.
    pub status_writes: u64,
    /// Creates and patches of Events (either API group).
    pub events: u64,
    /// Every other write.
    pub other_writes: u64,
    /// Gets and lists.
    pub reads: u64,
    /// Watches opened.
    pub watches: u64,
}

impl Requests {
    /// Object writes: children and status, Events not included.
    pub fn object_writes(&self) -> u64 {
        self.child_writes + self.status_writes + self.other_writes
    }

    /// Every write: object writes and Events.
    pub fn writes(&self) -> u64 {
        self.object_writes() + self.events
    }

    /// One line: per kind, in total and per MyApp.
    pub fn per_app(&self, apps: usize) -> String {
        let per = |n: u64| n as f64 / apps as f64;
        format!(
            "object writes {} ({:.2}/MyApp: child writes {:.2}, status writes {:.2}, other {:.2}), \
             Events {} ({:.2}/MyApp), reads {} ({:.2}/MyApp), watches opened {}",
            self.object_writes(),
            per(self.object_writes()),
            per(self.child_writes),
            per(self.status_writes),
            per(self.other_writes),
            self.events,
            per(self.events),
            self.reads,
            per(self.reads),
            self.watches,
        )
    }
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// The requests of `agent` since the sandbox's last `clear_requests`.
pub fn of(sandbox: &Sandbox, agent: &str) -> Requests {
    tally(sandbox.faults().request_counts(), agent)
}

/// The requests of `agent` since the sandbox's last `clear_requests` whose answer's HTTP status
/// passes `status` (by the sandbox's counts of answers, not the operator's own metrics, so an
/// operator build without such a metric is measured alike).
pub fn answered(sandbox: &Sandbox, agent: &str, status: impl Fn(u16) -> bool) -> Requests {
    let counts = sandbox.faults().status_counts().into_iter();
    tally(
        counts.filter_map(|((key, code), n)| status(code).then_some((key, n))),
        agent,
    )
}

/// The requests of `agent` among `counts`, by kind.
fn tally(counts: impl IntoIterator<Item = (RequestKey, u64)>, agent: &str) -> Requests {
    let mut requests = Requests::default();
    for (key, n) in counts {
        if key.user_agent.as_deref() != Some(agent) {
            continue;
        }
        let resource = key.resource.as_deref().unwrap_or_default();
        let count = match key.verb.as_str() {
            "get" | "list" => &mut requests.reads,
            "watch" => &mut requests.watches,
            verb if is_write(verb) => match (resource, key.subresource.as_deref()) {
                ("events", _) => &mut requests.events,
                ("deployments" | "services", None) => &mut requests.child_writes,
                ("myapps", Some("status")) => &mut requests.status_writes,
                _ => &mut requests.other_writes,
            },
            _ => continue,
        };
        *count += n;
    }
    requests
}

/// Watches opened and lists made by `agent`, per resource, since the last clear.
pub fn watches_and_lists(sandbox: &Sandbox, agent: &str) -> BTreeMap<String, (u64, u64)> {
    let mut per_resource = BTreeMap::<String, (u64, u64)>::new();
    for (key, n) in sandbox.faults().request_counts() {
        if key.user_agent.as_deref() != Some(agent) {
            continue;
        }
        let Some(resource) = key.resource else {
            continue;
        };
        match key.verb.as_str() {
            "watch" => per_resource.entry(resource).or_default().0 += n,
            "list" => per_resource.entry(resource).or_default().1 += n,
            _ => {}
        }
    }
    per_resource
}

/// Writes of the operator's kinds (children, MyApp status, Events) by any client other than
/// `agent` and the bench itself (its in-process client sends no user agent).
pub fn others_writes(sandbox: &Sandbox, agent: &str) -> u64 {
    sandbox
        .faults()
        .request_counts()
        .iter()
        .filter(|(key, _)| {
            let agent_of = key.user_agent.as_deref();
            agent_of.is_some() && agent_of != Some(agent) && is_write(&key.verb)
        })
        .filter(|(key, _)| {
            matches!(
                (key.resource.as_deref(), key.subresource.as_deref()),
                (Some("deployments" | "services" | "events"), _) | (Some("myapps"), Some("status"))
            )
        })
        .map(|(_, n)| n)
        .sum()
}

/// The HTTP statuses of `agent`'s writes answered 400 or above, except `except`, with their
/// counts: "422: 3, 500: 1", or "none".
pub fn refused_statuses(sandbox: &Sandbox, agent: &str, except: u16) -> String {
    let mut statuses = BTreeMap::<u16, u64>::new();
    for ((key, status), n) in sandbox.faults().status_counts() {
        if key.user_agent.as_deref() == Some(agent)
            && is_write(&key.verb)
            && status >= 400
            && status != except
        {
            *statuses.entry(status).or_default() += n;
        }
    }
    if statuses.is_empty() {
        return "none".into();
    }
    statuses
        .iter()
        .map(|(status, n)| format!("{status}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every user agent the sandbox saw since the last clear, with its request count.
pub fn seen_agents(sandbox: &Sandbox) -> String {
    let mut agents = BTreeMap::<String, u64>::new();
    for (RequestKey { user_agent, .. }, n) in sandbox.faults().request_counts() {
        let name = user_agent.unwrap_or_else(|| "(none: the bench's own client)".into());
        *agents.entry(name).or_default() += n;
    }
    if agents.is_empty() {
        return "none".into();
    }
    agents
        .iter()
        .map(|(agent, n)| format!("{agent:?}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The message of a phase whose `what` could not be attributed to `agent`.
pub fn unattributed(sandbox: &Sandbox, agent: &str, what: &str) -> String {
    format!(
        "cannot attribute {what} to the operator: the sandbox saw no such request with \
         User-Agent {agent:?}. Requests by user agent in this phase: {}. How: {HOW}",
        seen_agents(sandbox)
    )
}
