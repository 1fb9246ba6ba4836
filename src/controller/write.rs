//! Each write of a reconcile: through the write gate, with a resourceVersion precondition,
//! counted when the API server accepts it.

use std::{borrow::Cow, sync::Arc, time::Duration};

use kube::{
    Client, Resource,
    api::{Patch, PatchParams},
    runtime::reflector::ObjectRef,
};
use tracing::debug;

use crate::{
    cache::CachedMyApp,
    crd::{MyApp, MyAppStatus},
    fence::Gate,
    metrics::Metrics,
    recent::RecentWrites,
    shard::{DRAIN_LABEL, SHARD_LABEL, sharder},
};

/// What became of one planned write.
#[derive(Debug)]
pub(super) enum Landed {
    /// Not planned, or held off.
    Skipped,
    /// The server accepted it and gave it this resourceVersion.
    Written(Option<String>),
    /// The server refused it with 409 (its precondition failed), or an earlier refusal of it
    /// still stands: the cache has not seen the version that made it stale.
    Refused,
    /// The MyApp was deleted while the write was on its way: a status write found no object
    /// (its children go with it, by their owner references).
    Gone,
}

/// The resourceVersion a write must find on the server, and the cached version it was planned
/// from.
///
/// A forced apply that carries `metadata.resourceVersion` is refused with 409 unless the object
/// is at that version: a write planned from a state that changed since (another writer's, or a
/// new leader's while this replica was paused) never lands. The version is the cache's, or the
/// one the server gave our last write when the cache has not seen that write yet. A write that
/// creates has nothing to compare with and carries none.
#[derive(Clone, Debug, Default)]
pub(super) struct Precondition {
    /// What the write must find (none: it creates).
    pub(super) expect: Option<String>,
    /// The version the cache held when the write was planned.
    pub(super) cached: Option<String>,
}

impl Precondition {
    pub(super) fn of<V>(cached: Option<&str>, unseen: Option<&(V, Option<String>)>) -> Self {
        let ours = unseen.and_then(|(_, written)| written.clone());
        Self {
            expect: ours.or_else(|| cached.map(str::to_owned)),
            cached: cached.map(str::to_owned),
        }
    }

    /// Writes the expected version into a patch's `metadata`.
    pub(super) fn stamp(&self, metadata: &mut serde_json::Value) {
        if let Some(version) = &self.expect {
            metadata["resourceVersion"] = version.clone().into();
        }
    }

    /// Writes the expected version into an object to apply.
    pub(super) fn set_on<K: Resource>(&self, object: &mut K) {
        object.meta_mut().resource_version = self.expect.clone();
    }
}

/// The apply patch of the status subresource: the status, and the version the write expects
/// (see [`Precondition`]), serialized as it is sent.
#[derive(Debug, serde::Serialize)]
pub(super) struct StatusPatch<'a> {
    #[serde(rename = "apiVersion")]
    api_version: Cow<'static, str>,
    kind: Cow<'static, str>,
    metadata: PatchMeta<'a>,
    status: &'a MyAppStatus,
}

#[derive(Debug, serde::Serialize)]
struct PatchMeta<'a> {
    #[serde(rename = "resourceVersion", skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
}

impl<'a> StatusPatch<'a> {
    pub(super) fn new(status: &'a MyAppStatus, at: &'a Precondition) -> Self {
        Self {
            api_version: MyApp::api_version(&()),
            kind: MyApp::kind(&()),
            metadata: PatchMeta {
                resource_version: at.expect.as_deref(),
            },
            status,
        }
    }
}

/// Refused writes by MyApp and target: see [`Writer::apply`].
type Refused = RecentWrites<(ObjectRef<CachedMyApp>, &'static str), ()>;

/// How long a refused write waits for the cache to move past the version it was planned
/// from before it is sent again anyway: a watch event takes milliseconds, and a 409 that no
/// newer version explains must not stall the MyApp for long.
const REFUSAL_TTL: Duration = Duration::from_secs(5);

/// Makes the reconciles' writes: each through the write gate, with its precondition, counted.
pub(super) struct Writer {
    client: Client,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    /// Writes refused with 409 until the cache moves past the version they were planned from.
    refused: Refused,
}

impl Writer {
    /// Writes with `client` while `gate` is open, counting into `metrics`.
    pub(super) fn new(client: Client, gate: Arc<Gate>, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            gate,
            metrics,
            refused: RecentWrites::new(REFUSAL_TTL),
        }
    }

    /// The gate every write passes.
    pub(super) fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Applies `patch` (whose metadata carries the precondition `at`) to the `K` named as `app`,
    /// or to its `subresource`: a write to `target` (a [`crate::metrics::WRITE_TARGETS`] name).
    /// A 409 is remembered against the cached version, and the same write is not sent again
    /// until the cache has moved past it (or the memory expires): never a read.
    pub(super) async fn apply<K, P>(
        &self,
        app: &ObjectRef<CachedMyApp>,
        target: &'static str,
        at: &Precondition,
        params: &PatchParams,
        subresource: Option<&str>,
        patch: &P,
    ) -> Result<Landed, kube::Error>
    where
        K: Resource<DynamicType = ()>,
        P: serde::Serialize + std::fmt::Debug,
    {
        let key = (app.clone(), target);
        let cached = at.cached.as_deref();
        if at.expect.is_some() && self.refused.unseen(&key, cached).is_some() {
            return Ok(Landed::Refused);
        }
        let (name, namespace) = (&app.name, app.namespace.as_deref().unwrap_or_default());
        let written = apply_read_version::<K, _>(
            &self.client,
            &self.gate,
            params,
            namespace,
            name,
            subresource,
            patch,
        )
        .await;
        match written {
            Ok(version) => {
                self.metrics.wrote(target);
                Ok(Landed::Written(version))
            }
            Err(error) if subresource.is_some() && deleted_meanwhile(&error, name) => {
                debug!(%name, %namespace, write = target, "MyApp deleted while reconciling, not written");
                Ok(Landed::Gone)
            }
            Err(kube::Error::Api(status)) if status.code == 409 && at.expect.is_some() => {
                self.metrics.conflicted(target);
                debug!(%name, %namespace, write = target, expected = ?at.expect, "Write refused: planned from a stale version");
                self.refused.record(key, at.cached.clone(), None, ());
                Ok(Landed::Refused)
            }
            Err(error) => Err(error),
        }
    }
}

impl Writer {
    /// Lets go of a MyApp the sharder drains: removes its shard and drain labels in one merge
    /// patch that expects `version` (the cached one), so that a MyApp changed meanwhile is
    /// reconciled at its new version before it leaves. Once it lands the MyApp leaves this
    /// shard's watch, and the sharder hands it to another.
    pub(super) async fn let_go(
        &self,
        app: &ObjectRef<CachedMyApp>,
        version: Option<&str>,
    ) -> Result<(), kube::Error> {
        let namespace = app.namespace.as_deref().unwrap_or_default();
        let labels = serde_json::json!({ SHARD_LABEL: null, DRAIN_LABEL: null });
        sharder::relabel(
            &self.client,
            &self.gate,
            namespace,
            &app.name,
            version,
            labels,
        )
        .await?;
        self.metrics.wrote("shard_release");
        Ok(())
    }
}

/// Whether a write failed because the object `name` was deleted while the reconcile ran: a 404
/// about that object. Not any 404: a CRD installed without the status subresource answers 404
/// too, without naming the object, and that must be reported, not taken for a delete.
fn deleted_meanwhile(error: &kube::Error, name: &str) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.is_not_found() && status.details.as_ref().is_some_and(|d| d.name == name))
}

/// What the operator reads of a write's answer: the resourceVersion the server gave it. The
/// answer is the whole object, managedFields and all; read as the cache's type of a child (or
/// as a whole MyApp, for a status write), every field that type keeps was parsed and allocated
/// on every write for this one.
#[derive(serde::Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(serde::Deserialize)]
struct WrittenMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

/// Server-side applies `patch` with `params` to the `K` named `name` in `namespace`, or to its
/// `subresource`, as `Api::patch` and `Api::patch_subresource` do, once `gate` lets it through;
/// returns the resourceVersion of the result and reads nothing else of it (see [`Written`]).
/// A write the gate refuses fails with [`Fenced`] inside `kube::Error::Service`.
async fn apply_read_version<K, P>(
    client: &Client,
    gate: &Gate,
    params: &PatchParams,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
    patch: &P,
) -> Result<Option<String>, kube::Error>
where
    K: Resource<DynamicType = ()>,
    P: serde::Serialize + std::fmt::Debug,
{
    let patch = Patch::Apply(patch);
    let request = kube::core::Request::new(K::url_path(&(), Some(namespace)));
    let (request, verb) = match subresource {
        Some(sub) => (
            request.patch_subresource(sub, name, params, &patch),
            "patch_subresource",
        ),
        None => (request.patch(name, params, &patch), "patch"),
    };
    let request = gate.pass(request.map_err(kube::Error::BuildRequest)?, verb)?;
    let written: Written = client.request(request).await?;
    Ok(written.metadata.resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn only_a_404_naming_the_myapp_means_it_was_deleted_meanwhile() {
        let not_found = |details: serde_json::Value| {
            let status = kube::core::Status::failure("not found", "NotFound").with_code(404);
            kube::Error::Api(Box::new(
                status.with_details(serde_json::from_value(details).unwrap()),
            ))
        };
        let gone = not_found(json!({"name": "web", "group": "example.com", "kind": "myapps"}));
        assert!(deleted_meanwhile(&gone, "web"));
        assert!(!deleted_meanwhile(&gone, "api"), "another object's 404");
        // What an API server answers for a path it does not serve (no status subresource).
        let no_route = kube::Error::Api(Box::new(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404),
        ));
        assert!(!deleted_meanwhile(&no_route, "web"));
        let forbidden = kube::Error::Api(Box::new(
            kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
        ));
        assert!(!deleted_meanwhile(&forbidden, "web"));
    }

    #[test]
    fn a_write_answer_is_read_for_its_resource_version_alone() {
        let answer = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "shop", "resourceVersion": "42", "generation": 3,
                "managedFields": [{"manager": "myapp-operator", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"replicas": 3},
            "status": {"observedGeneration": 2},
        });
        let written: Written = serde_json::from_value(answer).unwrap();
        assert_eq!(written.metadata.resource_version.as_deref(), Some("42"));
        let unversioned: Written = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert_eq!(unversioned.metadata.resource_version, None);
    }

    #[test]
    fn a_write_expects_our_unseen_writes_version_else_the_cached_one_and_a_create_none() {
        let unseen = ((), Some("12".to_owned()));
        let ours = Precondition::of(Some("9"), Some(&unseen));
        assert_eq!(ours.expect.as_deref(), Some("12"));
        assert_eq!(ours.cached.as_deref(), Some("9"));
        let cached = Precondition::of::<()>(Some("9"), None);
        assert_eq!(cached.expect.as_deref(), Some("9"));
        let create = Precondition::of::<()>(None, None);
        assert_eq!(create.expect, None);
        let mut metadata = json!({"name": "web"});
        create.stamp(&mut metadata);
        assert_eq!(
            metadata,
            json!({"name": "web"}),
            "a create carries no version"
        );
        cached.stamp(&mut metadata);
        assert_eq!(metadata, json!({"name": "web", "resourceVersion": "9"}));
    }

    #[test]
    fn a_status_patch_carries_the_expected_version_and_the_status_alone() {
        let status = MyAppStatus {
            available_replicas: Some(2),
            ..MyAppStatus::default()
        };
        let expected = |version: Option<Value>| {
            let mut metadata = serde_json::Map::new();
            if let Some(version) = version {
                metadata.insert("resourceVersion".into(), version);
            }
            json!({"apiVersion": "example.com/v1", "kind": "MyApp", "metadata": metadata,
                "status": serde_json::to_value(&status).unwrap()})
        };
        let cached = Precondition::of::<()>(Some("9"), None);
        let patch = serde_json::to_value(StatusPatch::new(&status, &cached)).unwrap();
        assert_eq!(patch, expected(Some(json!("9"))));
        let create = Precondition::of::<()>(None, None);
        let patch = serde_json::to_value(StatusPatch::new(&status, &create)).unwrap();
        assert_eq!(patch, expected(None), "no version expected, none sent");
    }
}
