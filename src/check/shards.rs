//! Sharding, when the operator's Deployment turns it on: which shards are live, whether every
//! MyApp is on one of them, and whether any child is claimed by a shard its MyApp is not on.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{apps::v1::Deployment, coordination::v1::Lease},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams},
};
use serde_json::Value;

use super::{
    report::{Check, Group},
    target::{Target, api_message, names},
};
use crate::{
    crd::MyApp,
    shard::{SHARD_LABEL, by_namespace, ranges, sharder::By},
};

/// The name every shard Lease starts with, for `deploy/`'s Lease name.
fn lease_prefix() -> String {
    format!("{}-shard-", names::LEASE)
}

/// How the operator's Deployment shards, if it turns sharding on (`MYAPP_SHARDING=true` or
/// `--sharding` on its operator container; `MYAPP_SHARD_BY` or `--shard-by` for how). A
/// Deployment that cannot be read counts as off: the Controller group says what is wrong with
/// it.
pub async fn mode(client: &Client, namespace: &str) -> Option<By> {
    // As JSON: the containers' env and args are all that is read.
    let deployments = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<Deployment>(&()),
    );
    let Ok(Some(deployment)) = deployments.get_opt(names::DEPLOYMENT).await else {
        return None;
    };
    deployment
        .data
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(container_shards)
}

/// How a container's env or args shard, if they turn sharding on (a flag, which `run` takes
/// once, overrides its variable).
fn container_shards(container: &Value) -> Option<By> {
    let args: Vec<&str> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let env = |name: &str| {
        container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
    };
    let flag = args.iter().find_map(|arg| match *arg {
        "--sharding" | "--sharding=true" => Some(true),
        "--sharding=false" => Some(false),
        _ => None,
    });
    if !flag.unwrap_or_else(|| env("MYAPP_SHARDING") == Some("true")) {
        return None;
    }
    let by = args
        .iter()
        .enumerate()
        .find_map(|(i, arg)| match arg.strip_prefix("--shard-by") {
            Some("") => args.get(i + 1).copied(),
            Some(value) => value.strip_prefix('='),
            None => None,
        })
        .or_else(|| env("MYAPP_SHARD_BY"));
    Some(match by {
        Some("namespace") => By::Namespace,
        _ => By::Label,
    })
}

/// The Sharding group.
pub async fn checks(client: &Client, target: &Target, crd_installed: bool) -> Group {
    let group = |checks| Group {
        name: "Sharding",
        checks,
    };
    let ns = &target.namespace;
    let now = Timestamp::now().as_second();
    let leases = match Api::<Lease>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            return group(vec![Check::fail(
                "sharding.shards",
                format!(
                    "the Leases in {ns} cannot be listed: {}",
                    api_message(&error)
                ),
                "run check as a user who may list leases in the operator's namespace",
                "sharding",
            )]);
        }
    };
    let shards = Shards::from_leases(&leases, now);
    let mut checks = vec![shards.check(ns)];
    if !crd_installed {
        checks.push(Check::skip(
            "sharding.coverage",
            "MyApps cannot be listed without the CRD: skipped",
        ));
        return group(checks);
    }
    let apps = match Api::<MyApp>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            checks.push(Check::fail(
                "sharding.coverage",
                format!("MyApps cannot be listed: {}", api_message(&error)),
                "run check as a user who may list myapps in every namespace",
                "sharding",
            ));
            return group(checks);
        }
    };
    let apps: Vec<ObjectMeta> = apps.into_iter().map(|a| a.metadata).collect();
    if target.sharding == Some(By::Namespace) {
        let record = format!("{}-ranges", names::LEASE);
        let found = leases.iter().find(|lease| lease.name_any() == record);
        let assignment = found.map(by_namespace::assignment_of).unwrap_or_default();
        let changed = found.and_then(|lease| {
            let writes = lease.metadata.managed_fields.iter().flatten();
            writes
                .filter_map(|w| Some(w.time.as_ref()?.0.as_second()))
                .max()
        });
        let on = |app: &ObjectMeta| shards.serving(&assignment, app);
        checks.push(shards.coverage(&apps, target, now, on, changed));
        checks.push(shards.disjoint(&assignment, &record));
    } else {
        let on = |app: &ObjectMeta| app.labels.as_ref()?.get(SHARD_LABEL).cloned();
        checks.push(shards.coverage(&apps, target, now, on, None));
        checks.push(claims(client, &apps).await);
    }
    group(checks)
}

/// The shard Leases: live ones by holder, and since when each dead one is dead.
struct Shards {
    live: BTreeSet<String>,
    /// Each live holder's term (its Lease's acquireTime).
    terms: BTreeMap<String, String>,
    /// A holder whose Lease ran out: when it did (seconds since the epoch).
    dead_since: BTreeMap<String, i64>,
}

impl Shards {
    fn from_leases(leases: &[Lease], now: i64) -> Self {
        let prefix = lease_prefix();
        let mut shards = Self {
            live: BTreeSet::new(),
            terms: BTreeMap::new(),
            dead_since: BTreeMap::new(),
        };
        for lease in leases {
            if !lease.name_any().starts_with(&prefix) {
                continue;
            }
            let Some(spec) = &lease.spec else { continue };
            let Some(holder) = spec.holder_identity.clone().filter(|h| !h.is_empty()) else {
                continue;
            };
            let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref());
            let until = renewed.map_or(0, |t| t.0.as_second())
                + i64::from(spec.lease_duration_seconds.unwrap_or(0));
            if until >= now {
                if let Some(term) = by_namespace::term_of(lease) {
                    shards.terms.insert(holder.clone(), term);
                }
                shards.live.insert(holder);
            } else {
                shards.dead_since.insert(holder, until);
            }
        }
        shards.dead_since.retain(|h, _| !shards.live.contains(h));
        shards
    }

    fn check(&self, ns: &str) -> Check {
        if self.live.is_empty() {
            return Check::fail(
                "sharding.shards",
                format!(
                    "no shard is live (no Lease {ns}/{}* is held and renewed): no MyApp is reconciled",
                    lease_prefix()
                ),
                format!(
                    "kubectl -n {ns} get pods -l app.kubernetes.io/name=myapp-operator; kubectl -n {ns} logs deploy/myapp-operator"
                ),
                "sharding",
            );
        }
        Check::ok(
            "sharding.shards",
            format!(
                "{} live shards: {}",
                self.live.len(),
                self.live.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    }

    /// Sharding by namespace: the shard whose entry in `assignment` holds `app`'s namespace, if
    /// that entry counts: one of a live shard in its present term, or of a shard no longer live
    /// (whose MyApps have been on no live shard since it died). A live shard's entry of an
    /// earlier term serves nothing.
    fn serving(&self, assignment: &ranges::Assignment, app: &ObjectMeta) -> Option<String> {
        let hash = ranges::namespace_hash(app.namespace.as_deref()?);
        let (shard, entry) = assignment
            .shards
            .iter()
            .find(|(_, entry)| ranges::contains(&entry.ranges, hash))?;
        let counts = match self.terms.get(shard) {
            Some(term) => *term == entry.term,
            None => !self.live.contains(shard),
        };
        counts.then(|| shard.clone())
    }

    /// Sharding by namespace: no two live shards in their terms hold one namespace hash (the
    /// sharder writes none such; a record edited by hand could).
    fn disjoint(&self, assignment: &ranges::Assignment, record: &str) -> Check {
        const ID: &str = "sharding.claims";
        let mut held: Vec<(u64, u64, &str)> = self
            .terms
            .iter()
            .flat_map(|(shard, term)| {
                let ranges = assignment.ranges_of(shard, term);
                ranges
                    .iter()
                    .map(move |&(start, end)| (start, end, shard.as_str()))
            })
            .collect();
        held.sort_unstable();
        let twice: Vec<String> = held
            .windows(2)
            .filter(|pair| pair[1].0 < pair[0].1)
            .map(|pair| format!("{} and {} from {:#x}", pair[0].2, pair[1].2, pair[1].0))
            .collect();
        if twice.is_empty() {
            return Check::ok(ID, "no namespace range is held by two live shards");
        }
        Check::fail(
            ID,
            format!(
                "namespace ranges are held by two live shards at once: {}",
                twice.join(", ")
            ),
            format!(
                "the Lease {record} was edited by hand: delete its annotations and the sharder writes them again"
            ),
            "sharding",
        )
    }

    /// Every MyApp on a live shard, or on none (or a dead one) for no longer than the bound;
    /// `on` says which shard a MyApp is on. A MyApp on no shard has been so since it was
    /// created, or since `unplaced_since` if that is later (sharding by namespace: the record's
    /// last change, which every step of a hand-over is).
    fn coverage(
        &self,
        apps: &[ObjectMeta],
        target: &Target,
        now: i64,
        on: impl Fn(&ObjectMeta) -> Option<String>,
        unplaced_since: Option<i64>,
    ) -> Check {
        const ID: &str = "sharding.coverage";
        let bound = target.lag_bound.as_secs() as i64;
        let mut orphans = Vec::new();
        for app in apps {
            if app.deletion_timestamp.is_some() {
                continue;
            }
            let shard = on(app);
            let created = app.creation_timestamp.as_ref().map(|t| t.0.as_second());
            let since = match &shard {
                Some(shard) if self.live.contains(shard) => continue,
                Some(shard) => self.dead_since.get(shard).copied().or(created),
                None => created.max(unplaced_since),
            }
            .unwrap_or(now);
            if now - since > bound {
                orphans.push(format!(
                    "{}/{} ({} for {} s)",
                    app.namespace.as_deref().unwrap_or_default(),
                    app.name.as_deref().unwrap_or_default(),
                    shard.map_or("on no shard".to_owned(), |s| format!("on {s}, not live")),
                    now - since
                ));
            }
        }
        if orphans.is_empty() {
            return Check::ok(
                ID,
                format!(
                    "every MyApp is on a live shard, or was left without one for less than {bound} s ({} MyApps)",
                    apps.len()
                ),
            );
        }
        Check::fail(
            ID,
            format!(
                "{} MyApps have been on no live shard for more than {bound} s, so no replica reconciles them: {}",
                orphans.len(),
                orphans.join(", ")
            ),
            format!(
                "the holder of the Lease {}/{} assigns them: see the Controller checks and its log",
                target.namespace,
                names::LEASE
            ),
            "sharding",
        )
    }
}

/// Children that carry another shard's label than their MyApp, so that two shards' watches
/// see them. A move relabels the children at the new shard's first reconcile, so a moment's
/// mismatch is normal: this warns rather than fails.
async fn claims(client: &Client, apps: &[ObjectMeta]) -> Check {
    const ID: &str = "sharding.claims";
    let shard_of =
        |meta: &ObjectMeta| -> Option<String> { meta.labels.as_ref()?.get(SHARD_LABEL).cloned() };
    let owners: BTreeMap<String, Option<String>> = apps
        .iter()
        .filter_map(|app| Some((app.uid.clone()?, shard_of(app))))
        .collect();
    let children = match super::children::labelled_children(client).await {
        Ok(children) => children,
        Err(error) => return super::children::unlisted(ID, &error, "sharding"),
    };
    let mut twice = Vec::new();
    for (kind, child) in children {
        let owner = child
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == MyApp::kind(&()))
            .and_then(|o| owners.get(&o.uid));
        let Some(shard) = owner else { continue };
        let claimed = shard_of(&child);
        if claimed.is_some() && claimed != *shard {
            twice.push(format!(
                "{kind} {}/{} (on {}, its MyApp on {})",
                child.namespace.as_deref().unwrap_or_default(),
                child.name.as_deref().unwrap_or_default(),
                claimed.unwrap_or_default(),
                shard.as_deref().unwrap_or("no shard")
            ));
        }
    }
    if twice.is_empty() {
        return Check::ok(ID, "no child is claimed by another shard than its MyApp's");
    }
    Check::warn(
        ID,
        format!(
            "{} children carry another shard than their MyApp (normal for a moment during a move): {}",
            twice.len(),
            twice.join(", ")
        ),
        "if it lasts, the MyApp's shard is not reconciling it: see sharding.coverage and that replica's log",
        "sharding",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::report::Status;
    use k8s_openapi::{
        api::coordination::v1::LeaseSpec,
        apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
    };

    const NOW: i64 = 1_800_000_000;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn lease(name: &str, holder: &str, renewed: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(at(renewed))),
                lease_duration_seconds: Some(duration),
                ..LeaseSpec::default()
            }),
        }
    }

    fn app(name: &str, shard: Option<&str>, created: i64) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            creation_timestamp: Some(Time(at(created))),
            labels: shard.map(|s| BTreeMap::from([(SHARD_LABEL.to_owned(), s.to_owned())])),
            ..ObjectMeta::default()
        }
    }

    fn by_label(app: &ObjectMeta) -> Option<String> {
        app.labels.as_ref()?.get(SHARD_LABEL).cloned()
    }

    fn target() -> Target {
        Target {
            namespace: "myapp-system".into(),
            probe_namespace: "default".into(),
            lag_bound: std::time::Duration::from_secs(300),
            install: Default::default(),
            sharding: Some(By::Label),
        }
    }

    #[test]
    fn shards_are_live_while_their_lease_lasts_and_other_leases_are_not_shards() {
        let shards = Shards::from_leases(
            &[
                lease("myapp-operator-shard-a", "a", NOW - 5, 15),
                lease("myapp-operator-shard-b", "b", NOW - 100, 15),
                lease("myapp-operator", "a", NOW, 15),
                lease("other-shard-c", "c", NOW, 15),
            ],
            NOW,
        );
        assert_eq!(shards.live, BTreeSet::from(["a".to_owned()]));
        assert_eq!(
            shards.dead_since,
            BTreeMap::from([("b".to_owned(), NOW - 85)])
        );
        assert_eq!(shards.check("myapp-system").status, Status::Ok);
        let none = Shards::from_leases(&[], NOW);
        assert_eq!(none.check("myapp-system").status, Status::Fail);
    }

    #[test]
    fn a_myapp_fails_coverage_only_once_it_has_been_on_no_live_shard_past_the_bound() {
        let shards = Shards::from_leases(
            &[
                lease("myapp-operator-shard-a", "a", NOW - 5, 15),
                lease("myapp-operator-shard-b", "b", NOW - 100, 15),
            ],
            NOW,
        );
        let healthy = [
            app("on-a", Some("a"), NOW - 10_000),
            app("new", None, NOW - 10),
            app("just-lost", Some("b"), NOW - 10_000),
        ];
        let check = shards.coverage(&healthy, &target(), NOW, by_label, None);
        assert_eq!(check.status, Status::Ok, "{check:?}");
        let check = shards.coverage(
            &[
                app("old", None, NOW - 1_000),
                app("forgotten", Some("gone"), NOW - 1_000),
            ],
            &target(),
            NOW,
            by_label,
            None,
        );
        assert_eq!(check.status, Status::Fail);
        for part in [
            "default/old (on no shard",
            "default/forgotten (on gone, not live",
        ] {
            assert!(check.message.contains(part), "{part:?}: {}", check.message);
        }
        let late = Shards::from_leases(
            &[lease("myapp-operator-shard-b", "b", NOW - 1_000, 15)],
            NOW,
        );
        let check = late.coverage(
            &[app("stuck", Some("b"), NOW - 10_000)],
            &target(),
            NOW,
            by_label,
            None,
        );
        assert_eq!(check.status, Status::Fail, "{check:?}");
        // By namespace, a MyApp on no shard counts from the record's last change: a hand-over
        // under way (the record just written) is no failure, a stuck one is.
        let old = [app("old", None, NOW - 10_000)];
        let handing_over = shards.coverage(&old, &target(), NOW, by_label, Some(NOW - 5));
        assert_eq!(handing_over.status, Status::Ok, "{handing_over:?}");
        let stuck = shards.coverage(&old, &target(), NOW, by_label, Some(NOW - 1_000));
        assert_eq!(stuck.status, Status::Fail, "{stuck:?}");
        assert!(stuck.message.contains("for 1000 s"), "{}", stuck.message);
    }

    #[test]
    fn sharding_is_on_by_the_variable_or_the_flag_and_the_flag_wins() {
        let on = |container: Value| container_shards(&container);
        assert_eq!(on(serde_json::json!({"name": "operator"})), None);
        assert_eq!(
            on(serde_json::json!({"env": [{"name": "MYAPP_SHARDING", "value": "true"}]})),
            Some(By::Label)
        );
        assert_eq!(
            on(serde_json::json!({"env": [{"name": "MYAPP_SHARDING", "value": "false"}]})),
            None
        );
        assert_eq!(
            on(serde_json::json!({"args": ["run", "--sharding"]})),
            Some(By::Label)
        );
        assert_eq!(
            on(serde_json::json!({
                "args": ["run", "--sharding=false"],
                "env": [{"name": "MYAPP_SHARDING", "value": "true"}],
            })),
            None
        );
        // How: by --shard-by (either spelling) over MYAPP_SHARD_BY.
        let by = |args: &[&str], env: &str| {
            on(serde_json::json!({
                "args": args,
                "env": [
                    {"name": "MYAPP_SHARDING", "value": "true"},
                    {"name": "MYAPP_SHARD_BY", "value": env},
                ],
            }))
        };
        assert_eq!(by(&["run"], "namespace"), Some(By::Namespace));
        assert_eq!(
            by(&["run", "--shard-by", "label"], "namespace"),
            Some(By::Label)
        );
        assert_eq!(
            by(&["run", "--shard-by=namespace"], "label"),
            Some(By::Namespace)
        );
    }

    #[test]
    fn by_namespace_a_myapp_is_on_the_shard_whose_entry_holds_its_namespace_in_its_term() {
        let mut with_term = lease("myapp-operator-shard-a", "a", NOW - 5, 15);
        with_term.spec.as_mut().unwrap().acquire_time = Some(MicroTime(at(NOW - 50)));
        let mut back = lease("myapp-operator-shard-c", "c", NOW - 5, 15);
        back.spec.as_mut().unwrap().acquire_time = Some(MicroTime(at(NOW - 2)));
        let shards = Shards::from_leases(
            &[
                with_term,
                back,
                lease("myapp-operator-shard-b", "b", NOW - 100, 15),
            ],
            NOW,
        );
        let term = |second: i64| at(second).to_string();
        let half = u64::MAX / 2;
        let entry = |term: String, range| ranges::Entry {
            term,
            ranges: vec![range],
        };
        let assignment = ranges::Assignment {
            generation: 4,
            shards: BTreeMap::from([
                ("a".to_owned(), entry(term(NOW - 50), (0, half))),
                (
                    "b".to_owned(),
                    entry(term(NOW - 900), (half, half + half / 2)),
                ),
                (
                    "c".to_owned(),
                    entry(term(NOW - 900), (half + half / 2, u64::MAX)),
                ),
            ]),
        };
        let in_namespace = |namespace: &str| {
            let meta = ObjectMeta {
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            };
            let hash = ranges::namespace_hash(namespace);
            (shards.serving(&assignment, &meta), hash)
        };
        // FNV-1a puts names alike close together: these fall in a's, b's and c's ranges.
        for namespace in ["web", "shop", "a", "prod", "dev", "team-0"] {
            let (on, hash) = in_namespace(namespace);
            let want = if hash < half {
                Some("a".to_owned())
            } else if hash < half + half / 2 {
                // b is dead: its MyApps are on a shard that is not live.
                Some("b".to_owned())
            } else {
                // c is live in a newer term than its entry's: it serves nothing.
                None
            };
            assert_eq!(on, want, "{namespace} ({hash:#x})");
        }
        assert_eq!(shards.disjoint(&assignment, "r").status, Status::Ok);
        let mut twice = assignment.clone();
        twice.shards.get_mut("a").unwrap().ranges = vec![(0, half + 1)];
        twice.shards.get_mut("c").unwrap().term = term(NOW - 2);
        twice.shards.get_mut("c").unwrap().ranges = vec![(half, u64::MAX)];
        let check = shards.disjoint(&twice, "r");
        assert_eq!(check.status, Status::Fail, "{check:?}");
        assert!(check.message.contains("a and c"), "{}", check.message);
    }
}
