//! Desired state as pure functions: the Deployment and Service a MyApp asks for, and whether an
//! observed child already holds what we would apply. Nothing here talks to the API; `plan.rs`
//! decides with it and `controller.rs` carries the decision out.

mod contains;

use std::{collections::BTreeMap, sync::OnceLock};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            Container, ContainerPort, EnvVar, PodSpec, PodTemplateSpec, Service, ServicePort,
            ServiceSpec,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::{crd::MyAppLike, shard::SHARD_LABEL};

/// The field manager of every write the operator makes (server-side apply).
pub const FIELD_MANAGER: &str = "myapp-operator";
/// `app.kubernetes.io/name` of every child: what kind of application this is.
pub const APP_NAME: &str = "myapp";
/// Annotation on each child: a digest of the configuration last applied to it. A removed field
/// (an env entry, `replicas`) leaves no trace in the observed object that a comparison could
/// see, so the digest is what tells that the applied configuration changed.
pub const APPLIED_DIGEST_ANNOTATION: &str = "example.com/applied-digest";
/// Annotation on the Deployment, `"true"` when the operator sets its `spec.replicas`: the
/// controller reads it to hand the count over when a MyApp stops setting it.
pub const REPLICAS_ANNOTATION: &str = "example.com/replicas-managed";
/// Annotation on the Deployment: the MyApp generation it was planned from. Every spec field
/// shapes the Deployment, so every generation rewrites it and the stamp costs no write of its
/// own. A replica whose MyApp cache lags behind a Deployment stamped with a newer generation
/// knows its view of the spec is stale, and writes nothing from it.
pub const GENERATION_ANNOTATION: &str = "example.com/planned-from-generation";
/// Name of the container (and of its port) in the Deployment's pod template.
pub const PORT_NAME: &str = "http";

/// Labels every child carries. The pod selector is a subset that depends only on the MyApp's
/// name, so it never changes for the life of the MyApp (a Deployment's selector is immutable).
pub fn labels(app: &impl MyAppLike) -> BTreeMap<String, String> {
    let mut labels = selector_labels(app);
    labels.insert("app.kubernetes.io/managed-by".into(), FIELD_MANAGER.into());
    labels
}

/// The pod selector of the app's Deployment and Service.
pub fn selector_labels(app: &impl MyAppLike) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), APP_NAME.into()),
        ("app.kubernetes.io/instance".into(), app.name_any()),
    ])
}

/// The selector in string form, as `status.selector` (and the scale subresource) report it.
pub fn selector_string(app: &impl MyAppLike) -> String {
    selector_labels(app)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A child's metadata. Beside the labels every child carries, it carries the shard that
/// reconciles its MyApp, if sharding is on, so that the shard's label-selected watches see it;
/// its pods do not (their template's labels are [`labels`]), so moving a MyApp between shards
/// restarts nothing.
fn child_meta(app: &impl MyAppLike, shard: Option<&str>) -> ObjectMeta {
    let mut labels = labels(app);
    if let Some(shard) = shard {
        labels.insert(SHARD_LABEL.into(), shard.into());
    }
    ObjectMeta {
        name: Some(app.name_any()),
        namespace: app.namespace(),
        labels: Some(labels),
        owner_references: app.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    }
}

/// A child as a MyApp asks for it, with its digest and, once asked for, its JSON form, which
/// [`Desired::is_applied_to`] compares: a reconcile converts each desired child at most once,
/// and one that finds no child to compare (a create) not at all.
#[derive(Clone, Debug)]
pub struct Desired<K> {
    object: K,
    /// `object` as JSON, digest annotation included, without `apiVersion` and `kind`.
    json: OnceLock<Value>,
    /// The digest of the object as built, also in its applied-digest annotation.
    digest: String,
}

impl<K> Desired<K> {
    /// The child.
    pub fn object(&self) -> &K {
        &self.object
    }

    /// The digest of the object as built: what read-your-writes remembers of an apply.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The child, to apply.
    pub fn into_object(self) -> K {
        self.object
    }
}

impl<K: serde::Serialize> Desired<K> {
    /// `object` as JSON (digest annotation included, `apiVersion` and `kind` not).
    pub fn json(&self) -> &Value {
        self.json.get_or_init(|| {
            let mut json = serde_json::to_value(&self.object).unwrap_or(Value::Null);
            without_kind(&mut json);
            json
        })
    }

    /// Whether `observed` already holds everything this would apply, so applying is a no-op.
    ///
    /// The observed object carries the API server's defaults and other managers' fields, so
    /// this compares only what the child sets: every field of it must be present and equal in
    /// `observed`; lists match when each desired item is contained in some observed item.
    /// Fields we stopped applying are caught by the digest annotation, which is part of it.
    pub fn is_applied_to<O: serde::Serialize>(&self, observed: &O) -> bool {
        // `json` is Null only if the child failed to serialize, and `contains` takes Null
        // as matching anything: that must not count as applied.
        let json = self.json();
        json.is_object() && contains::serialized_contains(observed, json)
    }
}

/// The Deployment a MyApp asks for, labelled for `shard` (the one reconciling it, when
/// sharding is on). `replicas` is set only when the spec sets it, so that an autoscaler or
/// `kubectl scale` owns the count otherwise.
pub fn deployment(app: &impl MyAppLike, shard: Option<&str>) -> Deployment {
    desired_deployment(app, shard).into_object()
}

/// [`deployment`] with its JSON form.
pub fn desired_deployment(app: &impl MyAppLike, shard: Option<&str>) -> Desired<Deployment> {
    let spec = app.spec();
    let env: Vec<EnvVar> = spec
        .env
        .iter()
        .map(|e| EnvVar {
            name: e.name.clone(),
            // The API server stores an empty value as none (`omitempty`): applied as "", the
            // stored child would never compare equal to it, and be applied again on every look.
            value: (!e.value.is_empty()).then(|| e.value.clone()),
            value_from: None,
        })
        .collect();
    let container = Container {
        name: app.name_any(),
        image: Some(spec.image.clone()),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: spec.port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        env: (!env.is_empty()).then_some(env),
        ..Container::default()
    };
    let mut metadata = child_meta(app, shard);
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    if spec.replicas.is_some() {
        annotations.insert(REPLICAS_ANNOTATION.into(), "true".into());
    }
    if let Some(generation) = app.meta().generation {
        annotations.insert(GENERATION_ANNOTATION.into(), generation.to_string());
    }
    with_digest(Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: spec.replicas,
            selector: LabelSelector {
                match_labels: Some(selector_labels(app)),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(app)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// The ClusterIP Service a MyApp asks for: the app's port, to the container's named port;
/// labelled for `shard` as [`deployment`] is.
pub fn service(app: &impl MyAppLike, shard: Option<&str>) -> Service {
    desired_service(app, shard).into_object()
}

/// [`service`] with its JSON form.
pub fn desired_service(app: &impl MyAppLike, shard: Option<&str>) -> Desired<Service> {
    with_digest(Service {
        metadata: child_meta(app, shard),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(app)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: app.spec().port,
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// Stamps the digest of the object's own content into its annotations.
fn with_digest<K: Resource + serde::Serialize>(mut object: K) -> Desired<K> {
    // Of the whole object as built, kind included: what every build has applied.
    let digest = digest(&object);
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(APPLIED_DIGEST_ANNOTATION.into(), digest.clone());
    Desired {
        object,
        json: OnceLock::new(),
        digest,
    }
}

/// FNV-1a over the canonical JSON text, keys sorted as serde_json's maps sort them: stable
/// across builds and Rust versions, unlike `DefaultHasher`, so an upgrade does not rewrite
/// every child. The children's types write their fields in that order themselves
/// (`tests::every_desired_child_serializes_with_its_keys_sorted` holds every child the builders
/// make to it), so a child is hashed as it serializes, with no `Value` built for it, and the
/// text is never held.
fn digest(value: &impl serde::Serialize) -> String {
    let mut hash = Fnv1a(0xcbf2_9ce4_8422_2325);
    // Writing into a hasher cannot fail, and the children's types always serialize.
    let _ = serde_json::to_writer(&mut hash, value);
    format!("{:016x}", hash.0)
}

/// FNV-1a as an `io::Write`.
struct Fnv1a(u64);

impl std::io::Write for Fnv1a {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The kind is the cache's type; cached objects do not repeat it.
fn without_kind(desired: &mut Value) {
    if let Some(fields) = desired.as_object_mut() {
        fields.remove("apiVersion");
        fields.remove("kind");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{CachedDeployment, CachedService, cached};
    use crate::crd::{EnvVar as AppEnv, MyApp};
    use crate::status::Rollout;
    use serde_json::json;

    #[test]
    fn the_digest_is_fnv_1a_of_the_compact_json_text() {
        // Children applied by earlier builds carry digests of this text: a change of
        // algorithm or text would rewrite every child once after an upgrade.
        let value =
            json!({"metadata": {"name": "web"}, "spec": {"ports": [8080, "http"], "on": true}});
        assert_eq!(
            value.to_string(),
            r#"{"metadata":{"name":"web"},"spec":{"on":true,"ports":[8080,"http"]}}"#
        );
        let mut reference: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in value.to_string().bytes() {
            reference ^= u64::from(byte);
            reference = reference.wrapping_mul(0x0100_0000_01b3);
        }
        assert_eq!(digest(&value), format!("{reference:016x}"));
        // FNV-1a of `{}`, computed apart (Python).
        assert_eq!(digest(&json!({})), "08f44b07b5901a25");
    }

    // === fixtures ===

    fn app() -> MyApp {
        MyApp::test("web")
            .in_namespace("shop")
            .replicas(Some(3))
            .stored()
            .generation(2)
    }

    fn with_env(mut app: MyApp, pairs: &[(&str, &str)]) -> MyApp {
        app.spec.env = pairs
            .iter()
            .map(|(n, v)| AppEnv {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect();
        app
    }

    /// The Deployment as a cluster returns it after an apply: defaults, server fields, status,
    /// and a field another manager added.
    fn as_observed(d: &Deployment) -> Deployment {
        let mut v = serde_json::to_value(d).unwrap();
        v["metadata"]["uid"] = json!("d-uid");
        v["metadata"]["resourceVersion"] = json!("42");
        v["metadata"]["generation"] = json!(1);
        v["metadata"]["managedFields"] = json!([{"manager": FIELD_MANAGER, "operation": "Apply"}]);
        v["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("1");
        v["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}});
        v["spec"]["revisionHistoryLimit"] = json!(10);
        v["spec"]["progressDeadlineSeconds"] = json!(600);
        let c = &mut v["spec"]["template"]["spec"]["containers"][0];
        c["imagePullPolicy"] = json!("IfNotPresent");
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["resources"] = json!({});
        v["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
        v["spec"]["template"]["spec"]["dnsPolicy"] = json!("ClusterFirst");
        v["status"] = json!({"observedGeneration": 1, "replicas": 3});
        serde_json::from_value(v).unwrap()
    }

    // === children ===

    #[test]
    fn deployment_is_owned_by_its_myapp_and_runs_its_spec() {
        let d = deployment(&with_env(app(), &[("LOG_LEVEL", "info")]), None);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["metadata"]["name"], "web");
        assert_eq!(v["metadata"]["namespace"], "shop");
        assert_eq!(
            v["metadata"]["ownerReferences"],
            json!([{"apiVersion": "example.com/v1", "kind": "MyApp", "name": "web",
                    "uid": app().metadata.uid, "controller": true}])
        );
        assert_eq!(
            v["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            FIELD_MANAGER
        );
        assert_eq!(v["spec"]["replicas"], 3);
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["name"], "web");
        assert_eq!(c["image"], "ghcr.io/example/web:1.4.2");
        assert_eq!(
            c["ports"],
            json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
        );
        assert_eq!(c["env"], json!([{"name": "LOG_LEVEL", "value": "info"}]));
    }

    #[test]
    fn children_carry_the_shard_they_are_built_for_and_their_pods_do_not() {
        let app = app();
        for (name, child, template) in [
            {
                let v = desired_deployment(&app, Some("pod-1")).json().clone();
                (
                    "deployment",
                    v["metadata"].clone(),
                    Some(v["spec"]["template"].clone()),
                )
            },
            (
                "service",
                desired_service(&app, Some("pod-1")).json()["metadata"].clone(),
                None,
            ),
        ] {
            assert_eq!(child["labels"][SHARD_LABEL], "pod-1", "{name}");
            if let Some(template) = template {
                assert_eq!(template["metadata"]["labels"].get(SHARD_LABEL), None);
            }
        }
        // Unsharded, and whatever labels the MyApp carries (a shard's, left from before).
        let labelled = app.clone().label(SHARD_LABEL, "pod-gone");
        let unsharded = desired_deployment(&labelled, None);
        assert_eq!(
            unsharded.json()["metadata"]["labels"].get(SHARD_LABEL),
            None
        );
        assert_eq!(unsharded.digest(), desired_deployment(&app, None).digest());
    }

    #[test]
    fn an_empty_env_value_is_applied_as_the_api_server_stores_it() {
        let app = with_env(app(), &[("EMPTY", ""), ("SET", "1")]);
        let desired = desired_deployment(&app, None);
        let c = &desired.json()["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            c["env"],
            json!([{"name": "EMPTY"}, {"name": "SET", "value": "1"}])
        );
        // As a real API server returns it: `value` omitted when empty.
        let mut stored = serde_json::to_value(as_observed(desired.object())).unwrap();
        stored["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "EMPTY"}, {"name": "SET", "value": "1"}]);
        let cached: CachedDeployment = cached(&stored);
        assert!(desired.is_applied_to(&cached), "found stale on every look");
    }

    #[test]
    fn deployment_leaves_replicas_to_others_when_the_spec_does() {
        let mut a = app();
        a.spec.replicas = None;
        let v = serde_json::to_value(deployment(&a, None)).unwrap();
        assert!(v["spec"].get("replicas").is_none(), "{v}");
    }

    #[test]
    fn selector_depends_only_on_the_name() {
        let before = deployment(&app(), None);
        let mut changed = with_env(app(), &[("A", "1")]);
        changed.spec.image = "nginx:2".into();
        changed.spec.port = 9000;
        changed.spec.replicas = None;
        let after = deployment(&changed, None);
        assert_eq!(before.spec.unwrap().selector, after.spec.unwrap().selector);
        assert_eq!(
            selector_string(&app()),
            "app.kubernetes.io/instance=web,app.kubernetes.io/name=myapp"
        );
    }

    #[test]
    fn service_exposes_the_port_to_the_named_container_port() {
        let v = serde_json::to_value(service(&app(), None)).unwrap();
        assert_eq!(v["spec"]["type"], "ClusterIP");
        assert_eq!(
            v["spec"]["selector"],
            json!({"app.kubernetes.io/instance": "web", "app.kubernetes.io/name": "myapp"})
        );
        assert_eq!(
            v["spec"]["ports"],
            json!([{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}])
        );
        assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
    }

    // === comparison ===

    #[test]
    fn the_desired_json_is_the_object_as_json_without_its_kind() {
        let unscaled = {
            let mut app = app();
            app.spec.replicas = None;
            app
        };
        let compared = |mut object: Value| {
            let fields = object.as_object_mut().unwrap();
            assert!(fields.remove("apiVersion").is_some() && fields.remove("kind").is_some());
            object
        };
        for app in [app(), with_env(app(), &[("A", "1"), ("B", "")]), unscaled] {
            let desired = desired_deployment(&app, None);
            let json = serde_json::to_value(desired.object()).unwrap();
            assert_eq!(*desired.json(), compared(json), "{:?}", app.spec);
            assert!(desired.is_applied_to(&as_observed(desired.object())));
            let desired = desired_service(&app, None);
            let json = serde_json::to_value(desired.object()).unwrap();
            assert_eq!(*desired.json(), compared(json), "{:?}", app.spec);
        }
        let other = desired_deployment(&with_env(app(), &[("A", "2")]), None);
        assert!(!other.is_applied_to(&as_observed(&deployment(&app(), None))));
    }

    proptest::proptest! {
        /// The digest hashes a child as its type serializes it; children applied by earlier
        /// builds carry digests of the sorted text (`a_childs_digest_is_the_one_earlier_builds_
        /// applied`), so every child the builders make must serialize sorted.
        #[test]
        fn every_desired_child_serializes_with_its_keys_sorted(
            name in "[a-z][a-z0-9-]{0,20}",
            replicas in proptest::option::of(0..5i32),
            generation in proptest::option::of(1..100i64),
            port in 1..65535i32,
            env in proptest::collection::vec(("[A-Za-z_][A-Za-z0-9_.-]{0,12}", "[ -~]{0,8}"), 0..4),
        ) {
            let mut app = MyApp::test(&name)
                .in_namespace("shop")
                .replicas(replicas)
                .port(port)
                .stored();
            if let Some(generation) = generation {
                app = app.generation(generation);
            }
            let pairs: Vec<(&str, &str)> =
                env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let app = with_env(app, &pairs);
            let deployment = serde_json::to_string(desired_deployment(&app, None).object()).unwrap();
            let sorted = serde_json::from_str::<Value>(&deployment).unwrap().to_string();
            proptest::prop_assert_eq!(deployment, sorted);
            let service = serde_json::to_string(desired_service(&app, None).object()).unwrap();
            let sorted = serde_json::from_str::<Value>(&service).unwrap().to_string();
            proptest::prop_assert_eq!(service, sorted);
        }
    }

    #[test]
    fn a_childs_digest_is_the_one_earlier_builds_applied() {
        // Children in clusters carry the digests earlier builds stamped, which are these: a
        // change here makes an upgrade rewrite every child once.
        let app: MyApp = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "MyApp",
            "metadata": {"name": "web", "namespace": "shop",
                "uid": "6f1c1d9e-3b7a-4c1e-9d2a-5f0e8b7c6a41"},
            "spec": {"replicas": 3, "image": "nginx:1.27", "port": 8080,
                "env": [{"name": "A", "value": "1"}]},
        }))
        .unwrap();
        let stamped = |meta: &ObjectMeta| {
            meta.annotations.as_ref().unwrap()[APPLIED_DIGEST_ANNOTATION].clone()
        };
        assert_eq!(
            stamped(&deployment(&app, None).metadata),
            "80f5556e6a9d0c4b"
        );
        assert_eq!(stamped(&service(&app, None).metadata), "d6653cf8623dea19");
    }

    #[test]
    fn an_observed_child_with_server_defaults_counts_as_applied() {
        let desired = desired_deployment(&with_env(app(), &[("A", "1")]), None);
        assert!(desired.is_applied_to(&as_observed(desired.object())));
    }

    #[test]
    fn cached_children_still_count_as_applied_and_keep_what_status_reads() {
        let mut app = with_env(app(), &[("A", "1")]);
        app.spec.replicas = Some(3);
        let desired = desired_deployment(&app, None);
        let mut observed = serde_json::to_value(as_observed(desired.object())).unwrap();
        observed["status"] = json!({
            "observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3,
            "availableReplicas": 2,
            "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                            "message": "Deployment does not have minimum availability.",
                            "lastUpdateTime": "2027-01-15T08:00:00Z",
                            "lastTransitionTime": "2027-01-15T08:00:00Z"}],
        });
        let slim: CachedDeployment = cached(&observed);
        assert!(
            desired.is_applied_to(&slim),
            "the cache dropped an applied field"
        );
        let rollout = Rollout::from_deployment(&slim);
        assert_eq!(
            (
                rollout.observed_generation,
                rollout.desired,
                rollout.updated,
                rollout.available
            ),
            (Some(1), 3, 3, 2)
        );
        assert_eq!(
            rollout.unavailable_since,
            Some("2027-01-15T08:00:00Z".parse().unwrap())
        );
        let text = serde_json::to_string(&slim).unwrap();
        for gone in [
            "strategy",
            "dnsPolicy",
            "imagePullPolicy",
            "managedFields",
            "revision",
            "message",
        ] {
            assert!(!text.contains(gone), "{gone} kept: {text}");
        }
        // Another manager's change to an applied field is still seen.
        observed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("edited/by:hand");
        assert!(!desired.is_applied_to(&cached::<_, CachedDeployment>(&observed)));

        let desired = desired_service(&app, None);
        let mut observed = serde_json::to_value(desired.object()).unwrap();
        observed["spec"]["clusterIP"] = json!("10.96.0.12");
        observed["spec"]["clusterIPs"] = json!(["10.96.0.12"]);
        observed["spec"]["sessionAffinity"] = json!("None");
        observed["status"] = json!({"loadBalancer": {}});
        let slim: CachedService = cached(&observed);
        assert!(
            desired.is_applied_to(&slim),
            "the cache dropped an applied field"
        );
        assert!(!serde_json::to_string(&slim).unwrap().contains("clusterIP"));
        observed["spec"]["ports"][0]["port"] = json!(9999);
        assert!(!desired.is_applied_to(&cached::<_, CachedService>(&observed)));
    }

    #[test]
    fn another_managers_extra_env_entry_does_not_cause_a_write() {
        let desired = desired_deployment(&with_env(app(), &[("A", "1")]), None);
        let mut observed = serde_json::to_value(as_observed(desired.object())).unwrap();
        observed["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "INJECTED", "value": "by a sidecar injector"}));
        assert!(
            desired.is_applied_to(&serde_json::from_value::<CachedDeployment>(observed).unwrap())
        );
    }

    #[test]
    fn a_changed_or_drifted_field_needs_an_apply() {
        let desired = desired_deployment(&app(), None);
        let mut observed = serde_json::to_value(as_observed(desired.object())).unwrap();
        observed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("edited/by:hand");
        assert!(
            !desired.is_applied_to(&serde_json::from_value::<CachedDeployment>(observed).unwrap())
        );
    }

    #[test]
    fn a_field_removed_from_the_spec_needs_an_apply() {
        let before = deployment(&with_env(app(), &[("A", "1"), ("B", "2")]), None);
        let after = desired_deployment(&with_env(app(), &[("A", "1")]), None);
        // Without the digest, `after` would be contained in what `before` left behind.
        assert!(!after.is_applied_to(&as_observed(&before)));
        let mut unscaled = app();
        unscaled.spec.replicas = None;
        assert!(
            !desired_deployment(&unscaled, None)
                .is_applied_to(&as_observed(&deployment(&app(), None)))
        );
    }
}
