//! One reconcile carried out: gather what the caches and the memories of our writes say, let
//! [`plan`](crate::plan) decide, then make the planned writes through the write gate, each
//! with its precondition. This file branches only on what became of a write.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future;
use k8s_openapi::{api::apps::v1::Deployment, jiff::Timestamp};
use kube::{
    Resource, ResourceExt,
    api::PatchParams,
    runtime::{controller::Action, reflector::ObjectRef},
};
use serde_json::Value;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{
    context::{Child, Context},
    events,
    verified::Versions,
    write::{Landed, Precondition, StatusPatch},
};
use crate::{
    Error,
    cache::{CachedDeployment, CachedMyApp, CachedService, ReportedStatus},
    crd::{MyApp, MyAppStatus},
    fight,
    metrics::ReconcileResult,
    packed::{version_number, version_text},
    plan::{self, ChildApply, Observed},
    resources::FIELD_MANAGER,
};

/// The field manager that keeps `spec.replicas` of a Deployment when a MyApp stops setting it.
pub const REPLICAS_HANDOFF_MANAGER: &str = "myapp-operator-replicas-handoff";

/// Brings one MyApp's children and status in line with its spec.
pub(super) async fn reconcile(app: Arc<CachedMyApp>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    ctx.metrics
        .queue
        .started(app.namespace().as_deref(), &app.name_any());
    let _running = ctx.metrics.running();
    // Not `name`: a JSON log line's span object has its own `name` key (the span's).
    let span = info_span!(
        "reconcile",
        namespace = %app.namespace().unwrap_or_default(),
        app = %app.name_any(),
    );
    let deadline = ctx.config.reconcile_timeout;
    let result = tokio::time::timeout(deadline, reconcile_once(&app, &ctx).instrument(span))
        .await
        .unwrap_or(Err(Error::ReconcileDeadline(deadline)));
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => {
            ctx.metrics.reconciled(ReconcileResult::Error);
            return Err(error);
        }
    };
    ctx.metrics.reconciled(if outcome.recheck.is_some() {
        ReconcileResult::Requeue
    } else {
        ReconcileResult::Success
    });
    if outcome.writes == 0 {
        ctx.metrics.reconcile_noops.inc();
    }
    ctx.failures.succeeded(&ObjectRef::from_obj(app.as_ref()));
    // The resync (`resync.rs`) comes back to it; only a recheck the plan asked for is scheduled.
    Ok(outcome
        .recheck
        .map_or_else(Action::await_change, Action::requeue))
}

/// The sharder moves `app` to another shard: nothing more is written for it here. The
/// controller runs one reconcile of a MyApp at a time, so when this one runs nothing else of
/// ours is in flight for it, and once the labels are gone the next shard may take it.
async fn let_go(
    app: &CachedMyApp,
    key: &ObjectRef<CachedMyApp>,
    ctx: &Context,
) -> Result<Outcome, Error> {
    let version = app.meta().resource_version.as_deref();
    match ctx.writer.let_go(key, version).await {
        Ok(()) => {
            info!(name = %key.name, namespace = ?key.namespace, "Let go of the MyApp for another shard");
            Ok(Outcome {
                writes: 1,
                recheck: None,
            })
        }
        // Changed since cached: its watch event triggers a reconcile at the new version.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Outcome::default()),
        Err(error) => Err(Error::ReleaseShard(error)),
    }
}

/// One pass: gather what the caches know, let [`plan::plan`] decide, carry the plan out.
async fn reconcile_once(app: &CachedMyApp, ctx: &Context) -> Result<Outcome, Error> {
    let key = ObjectRef::from_obj(app);
    let namespace = key.namespace.as_deref();
    let namespace = namespace.ok_or_else(|| Error::MissingNamespace(key.name.clone()))?;
    if app.draining && ctx.config.shard.is_some() {
        return let_go(app, &key, ctx).await;
    }
    let listed = async {
        ctx.deployments_listed.wait().await;
        ctx.services_listed.wait().await;
    };
    tokio::select! {
        () = listed => {}
        () = ctx.stopping.cancelled() => return Ok(Outcome::default()),
    }
    let versions = Versions {
        app: app.meta().resource_version.as_deref().map(version_number),
        deployment: ctx.deployments.version(namespace, &key.name),
        service: ctx.services.version(namespace, &key.name),
        ..Versions::default()
    };
    if ctx.verified.settled(&key, versions) {
        // The plan at these versions found nothing to do, and would again (`verified`).
        return Ok(Outcome::default());
    }
    let deployment = ctx.deployments.get(namespace, &key.name);
    // A Service found holding at the version cached now is not read: the plan asks nothing
    // else of it (`verified`), and that version's text is all the memories of our writes ask.
    let holding = versions
        .service
        .filter(|_| ctx.verified.holds(&key, versions, Child::Service))
        .and_then(version_text);
    let service = ServiceSeen {
        read: match holding {
            Some(_) => None,
            None => ctx.services.get(namespace, &key.name),
        },
        holding,
    };
    // As read with the children themselves: a watch event may have come in between.
    let versions = Versions {
        deployment: version(deployment.as_ref()).map(version_number),
        service: match service.holding {
            Some(_) => versions.service,
            None => version(service.read.as_ref()).map(version_number),
        },
        deployment_shape: deployment
            .as_ref()
            .and_then(|d| ctx.verified.shape(&d.applied_part())),
        ..versions
    };
    let seen = Seen::gather(ctx, app, &key, versions, deployment.as_ref(), &service);
    if ctx
        .apps
        .get(&key)
        .is_some_and(|cached| cached.meta().resource_version != app.meta().resource_version)
    {
        // The controller handed over the MyApp before a watch event replaced it in the cache,
        // and that event may have ended the memory of our last status write (`Seen::gather`
        // just read it): planned from this copy, the status write would carry a precondition
        // the server no longer holds. The event updates the cache before it ends the memory,
        // so a cache still at this copy's version means the memory was read intact.
        return Ok(Outcome {
            writes: 0,
            recheck: Some(Duration::ZERO),
        });
    }
    let plan = plan::plan(app, &seen.observed, Timestamp::now());
    // The children that hold what the MyApp asks: (found by this plan, found before).
    let holding = [
        (
            Child::Deployment,
            plan.deployment_found_holding,
            seen.observed.deployment_holds,
        ),
        (
            Child::Service,
            plan.service_found_holding,
            seen.observed.service_holds,
        ),
    ];
    for &(child, found_now, _) in &holding {
        if found_now {
            ctx.verified.note(&key, versions, child);
        }
    }
    if plan.settles && plan.status.is_none() {
        ctx.verified.settle(&key, versions);
    }
    if plan.rollout_observed {
        ctx.awaiting_rollout.end(&key);
    }
    if let Some(wait) = plan.held_off {
        debug!(name = %key.name, %namespace, ?wait, "Holding off a child's write");
    }

    let mut outcome = Outcome {
        writes: 0,
        recheck: plan.recheck,
    };
    // The two children do not depend on each other: both applies are in flight at once.
    let (deployment, service) = future::join(
        apply_deployment(
            ctx,
            app,
            &key,
            plan.hand_off,
            plan.deployment,
            seen.deployment,
        ),
        apply_child::<CachedService, _>(ctx, &key, Child::Service, plan.service, seen.service),
    )
    .await;
    for landed in deployment?.iter().chain([&service?]) {
        outcome.count(landed, ctx.config.backoff_base);
    }
    let Some(status) = plan.status else {
        return Ok(outcome);
    };
    let landed = write_status(ctx, app, &key, status, seen.status).await?;
    outcome.count(&landed, ctx.config.backoff_base);
    if let Landed::Written(written) = &landed {
        // A status write changes the MyApp's version but not what it asks of its children,
        // and it landed on the version planned from (its precondition): what held, holds at
        // the new version too, and a plan that settles once it lands is settled there. Its
        // watch event triggers no reconcile that would find that.
        let versions = Versions {
            app: written.as_deref().map(version_number),
            ..versions
        };
        for &(child, found_now, found_before) in &holding {
            if found_now || found_before {
                ctx.verified.note(&key, versions, child);
            }
        }
        if plan.settles {
            ctx.verified.settle(&key, versions);
        }
    }
    if let (Landed::Written(_), Some(event)) = (&landed, plan.event) {
        // Not awaited: the reconcile is done once the status is written, and the next one
        // need not wait for this Event's round trip.
        ctx.publish_later(events::phase_changed(event), app.object_ref(&()));
    }
    Ok(outcome)
}

/// A MyApp's Service as a reconcile has it: read from the cache, or found holding what the
/// MyApp asks at the version cached (its text here) and left unread.
struct ServiceSeen {
    read: Option<CachedService>,
    holding: Option<String>,
}

/// What the caches and the memories of our writes say of one MyApp, and the version each of
/// its writes must find on the server.
struct Seen<'a> {
    observed: Observed<'a>,
    deployment: Precondition,
    service: Precondition,
    status: Precondition,
}

impl<'a> Seen<'a> {
    fn gather(
        ctx: &'a Context,
        app: &CachedMyApp,
        key: &ObjectRef<CachedMyApp>,
        versions: Versions,
        deployment: Option<&'a CachedDeployment>,
        service: &'a ServiceSeen,
    ) -> Self {
        let service_holding = service.holding.is_some();
        let (service, service_version) = match service.holding.as_deref() {
            Some(held) => (None, Some(held)),
            None => (service.read.as_ref(), version(service.read.as_ref())),
        };
        // Asked first, always: a lookup that finds the cache caught up ends the entry.
        let unseen_deployment = ctx
            .applied
            .unseen_at(&(key.clone(), Child::Deployment), version(deployment));
        let unseen_service = ctx
            .applied
            .unseen_at(&(key.clone(), Child::Service), service_version);
        let app_version = app.resource_version();
        let unseen_status = ctx.reported.unseen_at(key, app_version.as_deref());
        let (generation, now) = (app.metadata.generation, Instant::now());
        Seen {
            deployment: Precondition::of(version(deployment), unseen_deployment.as_ref()),
            service: Precondition::of(service_version, unseen_service.as_ref()),
            status: Precondition::of(app_version.as_deref(), unseen_status.as_ref()),
            observed: Observed {
                shard: ctx.config.shard.as_deref(),
                deployment,
                service,
                unseen_deployment: unseen_deployment.map(|(digest, _)| digest),
                unseen_service: unseen_service.map(|(digest, _)| digest),
                unseen_status: unseen_status.map(|(status, _)| status),
                awaiting_rollout: ctx.awaiting_rollout.elapsed(key),
                fight_hold_off: ctx.fights.holding_off(key, generation, now),
                would_fight: ctx.fights.would_fight(key, generation, now),
                deployment_deleted: ctx.deleted.elapsed(&(key.clone(), Child::Deployment)),
                service_deleted: ctx.deleted.elapsed(&(key.clone(), Child::Service)),
                deployment_holds: ctx.verified.holds(key, versions, Child::Deployment),
                // Held as when it was left unread, whatever the memory says now.
                service_holds: service_holding || ctx.verified.holds(key, versions, Child::Service),
            },
        }
    }
}

/// The replicas hand-off, then the Deployment: its field managers read first when the rewrite
/// makes a fight, and the fight told once the rewrite landed.
async fn apply_deployment(
    ctx: &Context,
    app: &CachedMyApp,
    key: &ObjectRef<CachedMyApp>,
    hand_off: Option<Value>,
    apply: Option<ChildApply<Deployment>>,
    mut at: Precondition,
) -> Result<[Landed; 2], Error> {
    let Some(mut apply) = apply else {
        return Ok([Landed::Skipped, Landed::Skipped]);
    };
    let handed = match hand_off {
        Some(mut patch) => {
            at.stamp(&mut patch["metadata"]);
            let manager = PatchParams::apply(REPLICAS_HANDOFF_MANAGER).force();
            let handed = ctx
                .writer
                .apply::<CachedDeployment, _>(key, "replicas_handoff", &at, &manager, None, &patch)
                .await
                .map_err(Error::HandOffReplicas)?;
            let Landed::Written(version) = &handed else {
                return Ok([handed, Landed::Skipped]);
            };
            at.expect = version.clone();
            handed
        }
        None => Landed::Skipped,
    };
    let namespace = key.namespace.as_deref().unwrap_or_default();
    let rivals = match apply.look_up_rivals.take() {
        // Before the forced apply takes the fields back: who owns them now.
        Some(desired) => {
            let ours = [FIELD_MANAGER, REPLICAS_HANDOFF_MANAGER];
            fight::rivals(&ctx.client, namespace, &key.name, &desired, &ours).await
        }
        None => Vec::new(),
    };
    let rewrites = apply.rewrites.take();
    let applied =
        apply_child::<CachedDeployment, _>(ctx, key, Child::Deployment, Some(apply), at).await?;
    if let Landed::Written(_) = applied {
        ctx.awaiting_rollout.start(key.clone());
        if let Some(fields) = rewrites {
            rewrote(ctx, app, &fields, &rivals).await;
        }
    }
    Ok([handed, applied])
}

/// Counts a rewrite of an existing Deployment, and tells the fight when it makes one.
async fn rewrote(ctx: &Context, app: &CachedMyApp, fields: &[String], rivals: &[fight::Rival]) {
    let (key, generation) = (ObjectRef::from_obj(app), app.metadata.generation);
    let Some(fight) = ctx.fights.rewrote(&key, generation, Instant::now()) else {
        return;
    };
    ctx.metrics.fights.inc();
    let fields = fields.join(", ");
    let managers: Vec<&str> = rivals.iter().map(|r| r.manager.as_str()).collect();
    let namespace = key.namespace.as_deref().unwrap_or_default();
    warn!(name = %key.name, %namespace, writes = fight.writes, hold_off = ?fight.hold_off, %fields, ?managers, "Fight over Deployment");
    let note = fight::note(&fight, generation, &fields, rivals);
    let event = events::warning("FightDetected", note);
    ctx.publish(&event, &app.object_ref(&())).await;
}

/// Applies one child under our field manager (forced: the spec wins) and remembers the write
/// until the child's cache has seen it (read-your-writes).
async fn apply_child<C, K>(
    ctx: &Context,
    key: &ObjectRef<CachedMyApp>,
    child: Child,
    apply: Option<ChildApply<K>>,
    at: Precondition,
) -> Result<Landed, Error>
where
    C: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
    K: Resource + std::fmt::Debug + serde::Serialize,
{
    let Some(ChildApply {
        mut object, digest, ..
    }) = apply
    else {
        return Ok(Landed::Skipped);
    };
    at.set_on(&mut object);
    let ours = PatchParams::apply(FIELD_MANAGER).force();
    let landed = ctx
        .writer
        .apply::<C, _>(key, child.target(), &at, &ours, None, &object)
        .await
        .map_err(|error| child.apply_failed(error))?;
    let Landed::Written(written) = &landed else {
        return Ok(landed);
    };
    let namespace = key.namespace.as_deref().unwrap_or_default();
    info!(name = %key.name, %namespace, "Applied {}", child.kind());
    let memory = (key.clone(), child);
    ctx.applied
        .record(memory, at.cached.clone(), written.as_deref(), digest);
    if at.expect.is_none() && !ctx.still_there(key) {
        ctx.orphaned(key, child);
    }
    Ok(landed)
}

/// Writes the status, and remembers it until the MyApp cache shows it.
async fn write_status(
    ctx: &Context,
    app: &CachedMyApp,
    key: &ObjectRef<CachedMyApp>,
    status: MyAppStatus,
    at: Precondition,
) -> Result<Landed, Error> {
    let patch = StatusPatch::new(&status, &at);
    let ours = PatchParams::apply(FIELD_MANAGER).force();
    let landed = ctx
        .writer
        .apply::<MyApp, _>(key, "status", &at, &ours, Some("status"), &patch)
        .await
        .map_err(Error::PatchStatus)?;
    if let Landed::Written(written) = &landed {
        let version = app.resource_version();
        ctx.reported.record(
            key.clone(),
            version,
            written.as_deref(),
            ReportedStatus::of(&status),
        );
    }
    Ok(landed)
}

/// What one reconcile did.
#[derive(Debug, Default)]
struct Outcome {
    /// Writes the server accepted.
    writes: u32,
    /// Look again this soon (instead of the resync period).
    recheck: Option<Duration>,
}

impl Outcome {
    /// Counts what became of one write: a refused one looks again after `retry` (its watch
    /// event usually triggers the reconcile sooner); after a MyApp's deletion there is nothing
    /// left to look at.
    fn count(&mut self, landed: &Landed, retry: Duration) {
        match landed {
            Landed::Skipped => {}
            Landed::Written(_) => self.writes += 1,
            Landed::Refused => {
                self.recheck = Some(self.recheck.map_or(retry, |r| r.min(retry)));
            }
            Landed::Gone => self.recheck = None,
        }
    }
}

fn version<K: Resource>(cached: Option<&K>) -> Option<&str> {
    cached.and_then(|o| o.meta().resource_version.as_deref())
}
