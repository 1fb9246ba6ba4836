//! The API server's defaults for the built-in objects an operator's children are made of.
//!
//! A controller that compares the object it wants with the object it reads back must be tested
//! against what a cluster really returns, and a cluster returns objects with its defaults filled
//! in. These functions fill in the same defaults on plain JSON (`serde_json::Value`), so they work
//! on whatever the store holds, and they never overwrite a value that is set (a JSON `null`
//! counts as unset, as it does for the API server).
//!
//! - [`default_deployment`]: `apps/v1` Deployment (`replicas`, `strategy`, `revisionHistoryLimit`,
//!   `progressDeadlineSeconds`, and the pod template through [`default_pod_spec`]).
//! - [`default_pod_spec`] / [`default_container`]: the pod-level and container-level defaults.
//! - [`default_service`]: `v1` Service, with cluster IPs from a [`ClusterIpAllocator`] (an
//!   update keeps the IPs of the stored object).
//! - `admissionregistration.k8s.io/v1` webhook configurations, ValidatingAdmissionPolicies and
//!   their bindings (`defaults/admission.rs`).
//! - [`Defaulter`]: one entry point for the store's write path, dispatching on apiVersion/kind
//!   and owning the allocator.
//!
//! Not modelled: NodePort and health-check node port allocation, dual-stack families, the
//! `creationTimestamp: null` a real server prints in pod templates, and `status` (`{}` on a new
//! Deployment, `{loadBalancer: {}}` on a Service), which belongs to the store's status handling.

mod admission;
mod objects;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde_json::{Map, Value, json};

use objects::array_objects;

/// Why defaulting an object failed (only Services can fail: cluster IPs are a finite resource).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every address of the service range is taken.
    #[error("failed to allocate a cluster IP: the range {range} is full")]
    AllocateClusterIp {
        /// The range, as `a.b.c.d/n`.
        range: String,
    },
    /// The Service asks for a cluster IP that is not an IPv4 address.
    #[error("failed to reserve cluster IP {ip:?}: not a valid IPv4 address")]
    ParseClusterIp {
        /// The value the Service carried.
        ip: String,
    },
    /// The Service asks for a cluster IP that another Service holds or that is outside the range.
    #[error("failed to reserve cluster IP {ip}: {reason}")]
    ReserveClusterIp {
        /// The address asked for.
        ip: Ipv4Addr,
        /// Why it cannot be had.
        reason: &'static str,
    },
}

impl Error {
    /// The `Status` reason and HTTP code the API server answers this failure with.
    pub fn reason_and_code(&self) -> (&'static str, u16) {
        match self {
            // The real server reports a full range as an internal error and a bad or taken
            // address as an invalid field.
            Error::AllocateClusterIp { .. } => ("InternalError", 500),
            Error::ParseClusterIp { .. } | Error::ReserveClusterIp { .. } => ("Invalid", 422),
        }
    }
}

/// Sets `map[key] = value` unless the key holds a non-null value.
fn set_default(map: &mut Map<String, Value>, key: &str, value: Value) {
    match map.get(key) {
        Some(v) if !v.is_null() => {}
        _ => {
            map.insert(key.to_owned(), value);
        }
    }
}

/// The object at `map[key]`, created as `{}` when unset. `None` when it holds a non-object.
fn object_entry<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> Option<&'a mut Map<String, Value>> {
    set_default(map, key, json!({}));
    map.get_mut(key).and_then(Value::as_object_mut)
}

// === Deployments and pods ===

/// Fills in an `apps/v1` Deployment's defaults: `spec.replicas` 1, `spec.strategy` RollingUpdate
/// with 25%/25%, `revisionHistoryLimit` 10, `progressDeadlineSeconds` 600, and the pod template's
/// defaults ([`default_pod_spec`]).
pub fn default_deployment(deployment: &mut Value) {
    let Some(spec) = deployment
        .as_object_mut()
        .and_then(|d| object_entry(d, "spec"))
    else {
        return;
    };
    set_default(spec, "replicas", json!(1));
    set_default(spec, "revisionHistoryLimit", json!(10));
    set_default(spec, "progressDeadlineSeconds", json!(600));
    if let Some(strategy) = object_entry(spec, "strategy") {
        set_default(strategy, "type", json!("RollingUpdate"));
        // Only a rolling update has rolling parameters; Recreate keeps none.
        if strategy.get("type") == Some(&json!("RollingUpdate"))
            && let Some(rolling) = object_entry(strategy, "rollingUpdate")
        {
            set_default(rolling, "maxUnavailable", json!("25%"));
            set_default(rolling, "maxSurge", json!("25%"));
        }
    }
    if let Some(template) = spec.get_mut("template") {
        default_pod_template(template);
    }
}

/// Fills in a pod template's defaults (its `spec` through [`default_pod_spec`]).
pub fn default_pod_template(template: &mut Value) {
    if let Some(spec) = template
        .as_object_mut()
        .and_then(|t| object_entry(t, "spec"))
    {
        default_pod_spec(spec);
    }
}

/// Fills in a pod spec's defaults: `restartPolicy` Always, `dnsPolicy` ClusterFirst,
/// `schedulerName` default-scheduler, `securityContext` {}, `terminationGracePeriodSeconds` 30,
/// configMap/secret volume `defaultMode` 420, and every container's and init container's
/// defaults ([`default_container`]).
pub fn default_pod_spec(spec: &mut Map<String, Value>) {
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    for volume in array_objects(spec, "volumes") {
        for source in ["configMap", "secret"] {
            if let Some(source) = volume.get_mut(source).and_then(Value::as_object_mut) {
                set_default(source, "defaultMode", json!(420));
            }
        }
    }
    for key in ["initContainers", "containers"] {
        for container in array_objects(spec, key) {
            default_container(container);
        }
    }
}

/// Fills in a container's defaults: `imagePullPolicy` (Always for `:latest` or no tag, else
/// IfNotPresent), `terminationMessagePath` /dev/termination-log, `terminationMessagePolicy`
/// File, `resources` {}, port `protocol` TCP, probe timings and `httpGet.scheme`, and env
/// `fieldRef.apiVersion`.
pub fn default_container(container: &mut Map<String, Value>) {
    // As the API server: a reference without tag or digest means `:latest`.
    let pull = match container.get("image").and_then(Value::as_str) {
        Some(image) => match image_tag(image) {
            Some("latest") => "Always",
            None if !has_digest(image) => "Always",
            _ => "IfNotPresent",
        },
        None => "IfNotPresent",
    };
    set_default(container, "imagePullPolicy", json!(pull));
    set_default(
        container,
        "terminationMessagePath",
        json!("/dev/termination-log"),
    );
    set_default(container, "terminationMessagePolicy", json!("File"));
    // Not a default but what the API server's encoding always emits (a Go struct field that
    // omitempty cannot drop); typed clients read it back as `Some(ResourceRequirements {})`.
    set_default(container, "resources", json!({}));
    for port in array_objects(container, "ports") {
        set_default(port, "protocol", json!("TCP"));
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(probe) = container.get_mut(probe).and_then(Value::as_object_mut) {
            set_default(probe, "timeoutSeconds", json!(1));
            set_default(probe, "periodSeconds", json!(10));
            set_default(probe, "successThreshold", json!(1));
            set_default(probe, "failureThreshold", json!(3));
            if let Some(get) = probe.get_mut("httpGet").and_then(Value::as_object_mut) {
                set_default(get, "scheme", json!("HTTP"));
            }
        }
    }
    for env in array_objects(container, "env") {
        if let Some(field) = env
            .get_mut("valueFrom")
            .and_then(|v| v.get_mut("fieldRef"))
            .and_then(Value::as_object_mut)
        {
            set_default(field, "apiVersion", json!("v1"));
        }
    }
}

/// The tag of an image reference, if it names one (`registry:5000/app` has none: that colon
/// belongs to the registry host).
fn image_tag(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, tag)| tag)
}

/// Whether an image reference pins a digest (`app@sha256:...`).
fn has_digest(image: &str) -> bool {
    image.contains('@')
}

// === Services ===

/// Allocates Service cluster IPs from an IPv4 range, never handing out an address in use.
///
/// Addresses are handed out round-robin, so a released address is not reused at once (a client
/// that still caches it would otherwise reach the wrong Service).
#[derive(Clone, Debug)]
pub struct ClusterIpAllocator {
    base: u32,
    size: u32,
    prefix_len: u8,
    next: u32,
    in_use: BTreeSet<Ipv4Addr>,
}

impl Default for ClusterIpAllocator {
    /// kubeadm's default service CIDR, 10.96.0.0/12: the largest IPv4 range an API server
    /// accepts, about a million addresses. A /16 (65,534) ran out in the operator bench at
    /// 100,000 MyApps, and every further Service apply failed with a 500.
    fn default() -> Self {
        Self::new(Ipv4Addr::new(10, 96, 0, 0), 12)
    }
}

impl ClusterIpAllocator {
    /// An allocator over `network/prefix_len` (the prefix is clamped to 8..=30). The network and
    /// broadcast addresses are never handed out.
    pub fn new(network: Ipv4Addr, prefix_len: u8) -> Self {
        let prefix_len = prefix_len.clamp(8, 30);
        let size = 1u32 << (32 - u32::from(prefix_len));
        let base = u32::from(network) & !(size - 1);
        Self {
            base,
            size,
            prefix_len,
            next: 1,
            in_use: BTreeSet::new(),
        }
    }

    /// The range as `a.b.c.d/n`.
    pub fn range(&self) -> String {
        format!("{}/{}", Ipv4Addr::from(self.base), self.prefix_len)
    }

    /// Whether `ip` is a host address of the range.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let offset = u32::from(ip).wrapping_sub(self.base);
        offset > 0 && offset < self.size - 1
    }

    /// A free address, now marked in use.
    pub fn allocate(&mut self) -> Result<Ipv4Addr, Error> {
        let hosts = self.size - 2;
        for _ in 0..hosts {
            let ip = Ipv4Addr::from(self.base + self.next);
            self.next = if self.next >= hosts { 1 } else { self.next + 1 };
            if self.in_use.insert(ip) {
                return Ok(ip);
            }
        }
        Err(Error::AllocateClusterIp {
            range: self.range(),
        })
    }

    /// Marks an address chosen by the user in use; it must be in the range and free.
    pub fn reserve(&mut self, ip: Ipv4Addr) -> Result<(), Error> {
        if !self.contains(ip) {
            return Err(Error::ReserveClusterIp {
                ip,
                reason: "not in the service range",
            });
        }
        if !self.in_use.insert(ip) {
            return Err(Error::ReserveClusterIp {
                ip,
                reason: "already allocated",
            });
        }
        Ok(())
    }

    /// Frees an address (a deleted Service's); unknown addresses are ignored.
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.in_use.remove(&ip);
    }

    /// Whether `ip` is held by some Service.
    pub fn is_allocated(&self, ip: Ipv4Addr) -> bool {
        self.in_use.contains(&ip)
    }
}

/// The cluster IP a Service holds, if it holds one (not `None` for headless, not ExternalName).
pub fn service_cluster_ip(service: &Value) -> Option<Ipv4Addr> {
    service
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .and_then(|ip| ip.parse().ok())
}

/// Fills in a `v1` Service's defaults: `type` ClusterIP, `sessionAffinity` None, port `protocol`
/// TCP and `targetPort` = `port`, and (except for ExternalName) `clusterIP`/`clusterIPs`,
/// `ipFamilies` `["IPv4"]`, `ipFamilyPolicy` SingleStack, `internalTrafficPolicy` Cluster; NodePort
/// and LoadBalancer also get `externalTrafficPolicy` Cluster.
///
/// `old` is the stored Service on an update: its cluster IPs are kept when the new object leaves
/// them out. Otherwise a new address comes from `ips`, or a user-chosen one is reserved there.
/// On a type change to ExternalName, or when the update changes the address, the caller releases
/// the old address ([`ClusterIpAllocator::release`] with [`service_cluster_ip`] of `old`).
pub fn default_service(
    service: &mut Value,
    old: Option<&Value>,
    ips: &mut ClusterIpAllocator,
) -> Result<(), Error> {
    let Some(spec) = service
        .as_object_mut()
        .and_then(|s| object_entry(s, "spec"))
    else {
        return Ok(());
    };
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    for port in array_objects(spec, "ports") {
        set_default(port, "protocol", json!("TCP"));
        if let Some(number) = port.get("port").cloned() {
            set_default(port, "targetPort", number);
        }
    }
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_owned();
    if kind == "ExternalName" {
        return Ok(());
    }
    if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        set_default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if kind == "LoadBalancer" {
        set_default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    set_default(spec, "ipFamilies", json!(["IPv4"]));
    set_default(spec, "ipFamilyPolicy", json!("SingleStack"));

    let asked = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty())
        .or_else(|| {
            spec.get("clusterIPs")
                .and_then(|ips| ips.get(0))
                .and_then(Value::as_str)
        })
        .map(str::to_owned);
    let kept = old
        .and_then(|o| o.pointer("/spec/clusterIP"))
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty())
        .map(str::to_owned);
    let ip = match (asked, kept) {
        (Some(asked), _) if asked == "None" => asked,
        // The stored address stays the Service's own; it is not reserved a second time.
        (Some(asked), Some(kept)) if asked == kept => asked,
        (None, Some(kept)) => kept,
        (Some(asked), _) => {
            let parsed: Ipv4Addr = asked
                .parse()
                .map_err(|_| Error::ParseClusterIp { ip: asked.clone() })?;
            ips.reserve(parsed)?;
            asked
        }
        (None, None) => ips.allocate()?.to_string(),
    };
    spec.insert("clusterIP".to_owned(), json!(ip));
    spec.insert("clusterIPs".to_owned(), json!([ip]));
    Ok(())
}

// === One entry point ===

/// Applies the defaults of every kind this module knows, owning the cluster IP allocator.
#[derive(Clone, Debug, Default)]
pub struct Defaulter {
    /// The Service cluster IP range and the addresses in use.
    pub cluster_ips: ClusterIpAllocator,
}

impl Defaulter {
    /// A defaulter over the default service range ([`ClusterIpAllocator::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills in the defaults of `object` by its `apiVersion` and `kind` (Deployments, Services,
    /// Secrets' type, the pod templates of ReplicaSets, StatefulSets, DaemonSets and Jobs, and
    /// admission registration objects); other kinds are left as they are. `old` is the stored object on an update.
    pub fn apply(&mut self, object: &mut Value, old: Option<&Value>) -> Result<(), Error> {
        let api_version = object.get("apiVersion").and_then(Value::as_str);
        let kind = object.get("kind").and_then(Value::as_str);
        match (api_version, kind) {
            (Some("apps/v1"), Some("Deployment")) => default_deployment(object),
            (Some("v1"), Some("Service")) => {
                default_service(object, old, &mut self.cluster_ips)?;
                // A type change to ExternalName (or a new address) frees the stored one.
                if let Some(before) = old.and_then(service_cluster_ip)
                    && service_cluster_ip(object) != Some(before)
                {
                    self.cluster_ips.release(before);
                }
            }
            // `SetDefaults_Secret` (pkg/apis/core/v1/defaults.go): an empty type is Opaque.
            (Some("v1"), Some("Secret")) => {
                if let Some(secret) = object.as_object_mut()
                    && secret
                        .get("type")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                {
                    secret.insert("type".into(), Value::String("Opaque".into()));
                }
            }
            (Some("admissionregistration.k8s.io/v1"), Some(kind)) => match kind {
                "MutatingWebhookConfiguration" => {
                    admission::default_webhook_configuration(object, true);
                }
                "ValidatingWebhookConfiguration" => {
                    admission::default_webhook_configuration(object, false);
                }
                "ValidatingAdmissionPolicy" => admission::default_policy(object),
                "ValidatingAdmissionPolicyBinding" => admission::default_binding(object),
                _ => {}
            },
            (Some("apps/v1"), Some("ReplicaSet" | "StatefulSet" | "DaemonSet"))
            | (Some("batch/v1"), Some("Job")) => {
                if let Some(template) = object.pointer_mut("/spec/template") {
                    default_pod_template(template);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Frees what a deleted object held (a Service's cluster IP).
    pub fn release(&mut self, object: &Value) {
        if object.get("kind").and_then(Value::as_str) == Some("Service")
            && let Some(ip) = service_cluster_ip(object)
        {
            self.cluster_ips.release(ip);
        }
    }

    /// Marks what a stored object holds as taken (for a store loaded from elsewhere).
    pub fn restore(&mut self, object: &Value) -> Result<(), Error> {
        if object.get("kind").and_then(Value::as_str) == Some("Service")
            && let Some(ip) = service_cluster_ip(object)
        {
            self.cluster_ips.reserve(ip)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(container: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [container]}
                }
            }
        })
    }

    #[test]
    fn deployment_gets_the_api_server_defaults() {
        let mut d = deployment(
            json!({"name": "app", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}),
        );
        default_deployment(&mut d);
        let spec = &d["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(spec["progressDeadlineSeconds"], 600);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert_eq!(pod["dnsPolicy"], "ClusterFirst");
        assert_eq!(pod["schedulerName"], "default-scheduler");
        assert_eq!(pod["securityContext"], json!({}));
        assert_eq!(pod["terminationGracePeriodSeconds"], 30);
        let c = &pod["containers"][0];
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["resources"], json!({}));
        assert_eq!(c["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn deployment_defaults_never_overwrite_set_values() {
        let mut d = deployment(json!({
            "name": "app", "image": "nginx", "imagePullPolicy": "Never",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "ports": [{"containerPort": 53, "protocol": "UDP"}]
        }));
        d["spec"]["replicas"] = json!(0);
        d["spec"]["revisionHistoryLimit"] = json!(2);
        d["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}});
        d["spec"]["template"]["spec"]["dnsPolicy"] = json!("Default");
        d["spec"]["template"]["spec"]["securityContext"] = json!({"runAsNonRoot": true});
        default_deployment(&mut d);
        assert_eq!(d["spec"]["replicas"], 0);
        assert_eq!(d["spec"]["revisionHistoryLimit"], 2);
        assert_eq!(
            d["spec"]["strategy"]["rollingUpdate"],
            json!({"maxSurge": 1, "maxUnavailable": "25%"})
        );
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["dnsPolicy"], "Default");
        assert_eq!(pod["securityContext"], json!({"runAsNonRoot": true}));
        let c = &pod["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Never");
        assert_eq!(c["terminationMessagePolicy"], "FallbackToLogsOnError");
        assert_eq!(c["ports"][0]["protocol"], "UDP");
    }

    #[test]
    fn defaults_applied_twice_change_nothing_more() {
        let mut defaulter = Defaulter::new();
        let mut d =
            deployment(json!({"name": "app", "image": "nginx", "ports": [{"containerPort": 80}]}));
        defaulter.apply(&mut d, None).unwrap();
        let once = d.clone();
        defaulter.apply(&mut d, Some(&once)).unwrap();
        assert_eq!(d, once);

        let mut s = service();
        defaulter.apply(&mut s, None).unwrap();
        let once = s.clone();
        defaulter.apply(&mut s, Some(&once)).unwrap();
        assert_eq!(s, once);
        assert!(
            defaulter
                .cluster_ips
                .is_allocated(service_cluster_ip(&s).unwrap())
        );
    }

    #[test]
    fn recreate_strategy_gets_no_rolling_parameters() {
        let mut d = deployment(json!({"name": "app", "image": "nginx:1"}));
        d["spec"]["strategy"] = json!({"type": "Recreate"});
        default_deployment(&mut d);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn image_pull_policy_follows_the_tag() {
        for (image, policy) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("registry.local:5000/team/app", "Always"),
            ("registry.local:5000/team/app:v1", "IfNotPresent"),
            ("nginx:1.27", "IfNotPresent"),
            ("nginx@sha256:0123abcd", "IfNotPresent"),
            ("nginx:latest@sha256:0123abcd", "Always"),
        ] {
            let mut c = json!({"name": "c", "image": image});
            default_container(c.as_object_mut().unwrap());
            assert_eq!(c["imagePullPolicy"], policy, "image {image}");
        }
    }

    #[test]
    fn probes_env_and_volumes_get_their_defaults() {
        let mut spec = json!({
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            "containers": [{
                "name": "c", "image": "app:1",
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 5},
                "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
            }]
        });
        default_pod_spec(spec.as_object_mut().unwrap());
        assert_eq!(spec["volumes"][0]["configMap"]["defaultMode"], 420);
        let probe = &spec["containers"][0]["readinessProbe"];
        assert_eq!(probe["periodSeconds"], 5);
        assert_eq!(probe["timeoutSeconds"], 1);
        assert_eq!(probe["failureThreshold"], 3);
        assert_eq!(probe["httpGet"]["scheme"], "HTTP");
        assert_eq!(
            spec["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["apiVersion"],
            "v1"
        );
    }

    fn service() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}
        })
    }

    #[test]
    fn service_gets_a_cluster_ip_and_the_api_server_defaults() {
        let mut ips = ClusterIpAllocator::default();
        let mut s = service();
        default_service(&mut s, None, &mut ips).unwrap();
        let spec = &s["spec"];
        assert_eq!(spec["type"], "ClusterIP");
        assert_eq!(spec["sessionAffinity"], "None");
        assert_eq!(spec["internalTrafficPolicy"], "Cluster");
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        assert_eq!(spec["ports"][0]["protocol"], "TCP");
        assert_eq!(spec["ports"][0]["targetPort"], 80);
        let ip: Ipv4Addr = spec["clusterIP"].as_str().unwrap().parse().unwrap();
        assert!(ips.contains(ip) && ips.is_allocated(ip));
        assert_eq!(spec["clusterIPs"], json!([ip.to_string()]));
    }

    #[test]
    fn services_never_share_a_cluster_ip() {
        let mut ips = ClusterIpAllocator::new(Ipv4Addr::new(10, 0, 0, 0), 29);
        let mut seen = BTreeSet::new();
        for _ in 0..6 {
            let mut s = service();
            default_service(&mut s, None, &mut ips).unwrap();
            assert!(seen.insert(service_cluster_ip(&s).unwrap()));
        }
        let err = default_service(&mut service(), None, &mut ips).unwrap_err();
        assert!(matches!(err, Error::AllocateClusterIp { .. }), "{err}");
    }

    #[test]
    fn service_update_keeps_its_cluster_ip() {
        let mut ips = ClusterIpAllocator::default();
        let mut stored = service();
        default_service(&mut stored, None, &mut ips).unwrap();
        let mut updated = service();
        updated["spec"]["ports"][0]["port"] = json!(8080);
        default_service(&mut updated, Some(&stored), &mut ips).unwrap();
        assert_eq!(updated["spec"]["clusterIP"], stored["spec"]["clusterIP"]);
        assert_eq!(updated["spec"]["ports"][0]["targetPort"], 8080);
        // The same object written again with its address is no conflict with itself.
        let mut again = updated.clone();
        default_service(&mut again, Some(&updated), &mut ips).unwrap();
        assert_eq!(again, updated);
    }

    #[test]
    fn service_defaults_keep_set_values_and_reject_a_taken_ip() {
        let mut ips = ClusterIpAllocator::default();
        let mut s = service();
        s["spec"]["clusterIP"] = json!("10.96.7.7");
        s["spec"]["sessionAffinity"] = json!("ClientIP");
        s["spec"]["ports"][0]["targetPort"] = json!("http");
        default_service(&mut s, None, &mut ips).unwrap();
        assert_eq!(s["spec"]["clusterIP"], "10.96.7.7");
        assert_eq!(s["spec"]["sessionAffinity"], "ClientIP");
        assert_eq!(s["spec"]["ports"][0]["targetPort"], "http");

        let mut twin = service();
        twin["spec"]["clusterIP"] = json!("10.96.7.7");
        let err = default_service(&mut twin, None, &mut ips).unwrap_err();
        assert_eq!(err.reason_and_code(), ("Invalid", 422));
    }

    #[test]
    fn headless_and_external_name_services_get_no_address() {
        let mut ips = ClusterIpAllocator::default();
        let mut headless = service();
        headless["spec"]["clusterIP"] = json!("None");
        default_service(&mut headless, None, &mut ips).unwrap();
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));

        let mut external = service();
        external["spec"]["type"] = json!("ExternalName");
        external["spec"]["externalName"] = json!("example.com");
        default_service(&mut external, None, &mut ips).unwrap();
        assert!(external["spec"].get("clusterIP").is_none());
        assert!(external["spec"].get("ipFamilies").is_none());
    }

    #[test]
    fn defaulter_releases_a_deleted_services_address() {
        let mut defaulter = Defaulter::new();
        let mut s = service();
        defaulter.apply(&mut s, None).unwrap();
        let ip = service_cluster_ip(&s).unwrap();
        assert!(defaulter.cluster_ips.is_allocated(ip));
        defaulter.release(&s);
        assert!(!defaulter.cluster_ips.is_allocated(ip));

        let mut d = deployment(json!({"name": "app", "image": "nginx:1"}));
        defaulter.apply(&mut d, None).unwrap();
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
    }
}
