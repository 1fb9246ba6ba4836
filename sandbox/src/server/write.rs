//! The write pipeline every writing verb shares, in the API server's order: identity checks,
//! defaulting, mutating webhooks, naming, validation, validating webhooks; and what a committed
//! write sets off.

use std::net::Ipv4Addr;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use super::context::{Ctx, FieldValidation};
use crate::admission::{
    AdmissionAttributes, GroupVersionKind, GroupVersionResource, Operation, Rejection, Validating,
};
use crate::registry::ResourceType;
use crate::rollout;
use crate::schema::FieldError;
use crate::status::ApiError;
use crate::store::{State as StoreState, meta_mut, meta_str, now};

/// Sets identity fields and rejects a body that names another resource or namespace.
pub(super) fn check_identity(ctx: &Ctx, obj: &mut Value) -> Result<(), ApiError> {
    let api_version = ctx.rt.api_version();
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        _ => {}
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != ctx.rt.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                ctx.rt.kind
            )));
        }
        _ => {}
    }
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(ctx.rt.kind);
    let meta = meta_mut(obj);
    if ctx.rt.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != ctx.ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ctx.ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    if let Some(url_name) = &ctx.path.name {
        match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != url_name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({url_name})"
                )));
            }
            _ => {
                meta.insert("name".into(), json!(url_name));
            }
        }
    }
    Ok(())
}

/// Defaulting as the API server does it when it decodes an object: built-in defaults, and for
/// custom resources pruning (reported per `fieldValidation` when `report_unknown`) and schema
/// defaults.
fn decode_defaults(
    ctx: &mut Ctx,
    obj: &mut Value,
    old: Option<&Value>,
    first_pass: bool,
) -> Result<(), ApiError> {
    if ctx.rt.crd.is_none() {
        // The decoded Go struct is what the defaulters, the field manager and the store see:
        // an `omitempty` field at its zero value is gone, and a defaulter that fills in an
        // empty string (Go's unset) fills in one left out here.
        crate::encoding::omit_empty(obj);
    }
    let is_service = ctx.rt.group.is_empty() && ctx.rt.plural == "services";
    // Services are defaulted once: a second pass would reserve the allocated IP again.
    if ctx.path.sub.is_none() && (first_pass || !is_service) {
        let mut state = ctx.inner.store.lock();
        state.defaulter.apply(obj, old)?;
    }
    let Some(schema) = ctx.rt.schema.clone() else {
        return Ok(());
    };
    let dropped = schema.prune(obj);
    if first_pass && !dropped.is_empty() {
        let unknown: Vec<String> = dropped
            .iter()
            .map(|p| format!("unknown field \"{p}\""))
            .collect();
        match ctx.field_validation {
            FieldValidation::Strict => {
                let error = format!("strict decoding error: {}", unknown.join(", "));
                // POST and PUT decode the body (`transformDecodeError` in
                // `endpoints/handlers/rest.go`); a patch reports the patched object's errors
                // bare (`jsonPatcher` in `handlers/patch.go`).
                return Err(ApiError::bad_request(if ctx.patch {
                    error
                } else {
                    let (kind, version) = (&ctx.rt.kind, &ctx.rt.version);
                    format!(
                        "{kind} in version \"{version}\" cannot be handled as a {kind}: {error}"
                    )
                }));
            }
            FieldValidation::Warn => ctx.warnings.extend(unknown),
            FieldValidation::Ignore => {}
        }
    }
    schema.apply_defaults(obj);
    Ok(())
}

/// The object checks of the resource: object metadata (every kind), CRD registrability,
/// custom-resource schema and CEL rules. Metadata errors come first and do not stop the other
/// checks, as `ValidateObjectMetaAccessor` heads every strategy's list.
fn validate_object(ctx: &Ctx, obj: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = meta_str(obj, "name").unwrap_or("").to_string();
    let mut errors = super::meta::object_meta_errors(obj);
    if ctx.rt.group == "apiextensions.k8s.io" && ctx.rt.plural == "customresourcedefinitions" {
        check_crd(ctx, obj, &name, errors)?;
        return Ok(());
    }
    if let Some(policy_errors) =
        crate::admission::prepare_policy_object(&ctx.rt.group, &ctx.rt.plural, obj, old)
    {
        errors.extend(policy_errors);
    }
    if let Some(schema) = ctx.rt.schema.clone() {
        errors.extend(if ctx.path.sub.as_deref() == Some("status") {
            schema.validate_status(obj, old)
        } else {
            schema.validate(obj, old)
        });
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid(&ctx.rt, &name, errors));
    }
    Ok(())
}

/// Everything between the request and the store, in the API server's order: defaulting,
/// mutating webhooks, defaulting/pruning again, validation, validating webhooks. Returns the
/// object to store; a rejection carries the warnings gathered so far.
pub(super) async fn admit(
    ctx: &mut Ctx,
    operation: Operation,
    mut obj: Value,
    old: Option<&Value>,
) -> Result<Value, ApiError> {
    decode_defaults(ctx, &mut obj, old, true)?;
    // The field manager runs before admission (`UpdateNoErrors` in the create and update
    // handlers, the apply patcher): webhooks see the new managedFields, and what a mutating
    // webhook changes is owned by no one.
    match (operation, old) {
        (Operation::Create, _) => {
            default_namespace_label(ctx, &mut obj);
            ctx.writer().created(&mut obj, ctx.apply_config.as_ref());
        }
        (_, Some(old)) if ctx.apply_config.is_none() => ctx.writer().updated(old, &mut obj),
        _ => {}
    }
    let (mutating, validating) = webhook_configurations(ctx);
    // Built only for a webhook to call: they hold copies of the object and the old one.
    let mut attributes = (!mutating.is_empty() || !validating.is_empty())
        .then(|| admission_attributes(ctx, operation, Some(obj.clone()), old.cloned()));
    if let Some(attributes) = attributes.as_ref().filter(|_| !mutating.is_empty()) {
        let mutated = ctx
            .inner
            .admission
            .mutate(&mutating, attributes)
            .await
            .map_err(|r| rejected(ctx, r))?;
        ctx.warnings.extend(mutated.warnings);
        if let Some(mutated) = mutated.object
            && mutated != obj
        {
            obj = mutated;
            check_identity(ctx, &mut obj)?;
            decode_defaults(ctx, &mut obj, old, false)?;
        }
    }
    if operation == Operation::Create {
        assign_name(ctx, &mut obj).map_err(|e| e.with_earlier_warnings(&ctx.warnings))?;
        fill_system_fields(ctx, &mut obj);
    }
    validate_object(ctx, &mut obj, old).map_err(|e| e.with_earlier_warnings(&ctx.warnings))?;
    if let Some(attributes) = attributes.as_mut().filter(|_| !validating.is_empty()) {
        // A generated name reaches the validating webhooks (`AdmissionToValidateObjectFunc`).
        if attributes.name.is_empty() {
            attributes.name = meta_str(&obj, "name").unwrap_or("").to_owned();
        }
        attributes.object = Some(obj.clone());
        let validated = ctx
            .inner
            .admission
            .validate(&validating, attributes)
            .await
            .map_err(|r| rejected(ctx, r))?;
        ctx.warnings.extend(validated.warnings);
    }
    Ok(obj)
}

/// A named Namespace gets its `kubernetes.io/metadata.name` label when decoded, so its creator
/// owns it (`SetDefaults_Namespace` in `pkg/apis/core/v1/defaults.go`); a generated name gets it
/// when stored.
fn default_namespace_label(ctx: &Ctx, obj: &mut Value) {
    if !(ctx.rt.group.is_empty() && ctx.rt.plural == "namespaces") {
        return;
    }
    let Some(name) = meta_str(obj, "name")
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
    else {
        return;
    };
    let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
}

/// What the registry store sets on a new object after mutating admission and before validation
/// and validating admission: `uid` and `creationTimestamp` (`FillObjectMetaSystemFields`, at the
/// start of `Store.create` in `apiserver/pkg/registry/generic/registry/store.go`), and
/// `generation` 1 for kinds that keep one and no `status` for kinds with a status subresource
/// (their strategy's `PrepareForCreate`), so a status a mutating webhook adds is dropped too.
fn fill_system_fields(ctx: &Ctx, obj: &mut Value) {
    let meta = meta_mut(obj);
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    if ctx.rt.generation {
        meta.insert("generation".into(), json!(1));
    }
    if ctx.rt.status_subresource
        && !(ctx.rt.kind == "Namespace" && ctx.rt.group.is_empty())
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
}

/// Admission of a `/scale` write, as kube-apiserver does it: the chain sees `autoscaling/v1`
/// `Scale` objects (the requested view and the stored one) with subresource `scale`, never the
/// whole object; the webhooks of the main resource are not called. Mutating webhooks may change
/// the requested Scale; `apply` then turns the Scale into the new object, which is validated
/// against the schema before the validating webhooks see the Scale. Returns the new object.
pub(super) async fn admit_scale(
    ctx: &mut Ctx,
    mut scale: Value,
    old_scale: &Value,
    old: &Value,
    apply: impl Fn(&Value) -> Result<Value, ApiError>,
) -> Result<Value, ApiError> {
    let (mutating, validating) = webhook_configurations(ctx);
    let mut attributes = admission_attributes(
        ctx,
        Operation::Update,
        Some(scale.clone()),
        Some(old_scale.clone()),
    );
    attributes.kind = GroupVersionKind::new("autoscaling", "v1", "Scale");
    if !mutating.is_empty() {
        let mutated = ctx
            .inner
            .admission
            .mutate(&mutating, &attributes)
            .await
            .map_err(|r| rejected(ctx, r))?;
        ctx.warnings.extend(mutated.warnings);
        if let Some(mutated) = mutated.object {
            scale = mutated;
        }
    }
    let mut new = apply(&scale)?;
    validate_object(ctx, &mut new, Some(old))
        .map_err(|e| e.with_earlier_warnings(&ctx.warnings))?;
    if !validating.is_empty() {
        attributes.object = Some(scale);
        let validated = ctx
            .inner
            .admission
            .validate(&validating, &attributes)
            .await
            .map_err(|r| rejected(ctx, r))?;
        ctx.warnings.extend(validated.warnings);
    }
    Ok(new)
}

pub(super) fn rejected(ctx: &Ctx, rejection: Rejection) -> ApiError {
    ApiError::from(rejection).with_earlier_warnings(&ctx.warnings)
}

pub(super) fn webhook_configurations(ctx: &Ctx) -> (Vec<MutatingWebhookConfiguration>, Validating) {
    let state = ctx.inner.store.lock();
    let read = |plural: &str| -> Vec<Value> {
        state
            .list(
                &(
                    "admissionregistration.k8s.io".to_string(),
                    plural.to_string(),
                ),
                None,
            )
            .into_iter()
            .cloned()
            .collect()
    };
    let mutating = decode(read("mutatingwebhookconfigurations"));
    let validating = Validating {
        webhooks: decode(read("validatingwebhookconfigurations")),
        policies: decode(read("validatingadmissionpolicies")),
        bindings: decode(read("validatingadmissionpolicybindings")),
    };
    (mutating, validating)
}

/// The stored objects that decode as `T` (one that does not is left out, as an informer would).
fn decode<T: serde::de::DeserializeOwned>(values: Vec<Value>) -> Vec<T> {
    values
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

pub(super) fn admission_attributes(
    ctx: &Ctx,
    operation: Operation,
    object: Option<Value>,
    old_object: Option<Value>,
) -> AdmissionAttributes {
    let rt = &ctx.rt;
    let mut attributes = AdmissionAttributes::new(
        operation,
        GroupVersionKind::new(&rt.group, &rt.version, &rt.kind),
        GroupVersionResource::new(&rt.group, &rt.version, &rt.plural),
    );
    attributes.sub_resource = ctx.path.sub.clone();
    attributes.name = object
        .as_ref()
        .or(old_object.as_ref())
        .and_then(|o| meta_str(o, "name"))
        .unwrap_or("")
        .to_string();
    let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
    attributes.namespace = if rt.namespaced {
        Some(ctx.ns.clone())
    } else if is_namespace {
        Some(attributes.name.clone())
    } else {
        None
    };
    if rt.namespaced {
        let state = ctx.inner.store.lock();
        let ns = state.get(&(String::new(), "namespaces".to_string()), "", &ctx.ns);
        attributes.namespace_labels = ns
            .and_then(|n| n.pointer("/metadata/labels"))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        attributes.namespace_object = ns.cloned();
    }
    attributes.object = object;
    attributes.old_object = old_object;
    attributes.dry_run = ctx.dry_run;
    // The requester, as the real server sends it (the admin when authentication is off).
    attributes.user_info = ctx.attrs.user.to_api();
    attributes.options = Some(write_options(ctx, operation));
    attributes
}

/// The options a write's review carries: what the query asked, unfilled by defaults. A PATCH is
/// reviewed with `UpdateOptions`, or `CreateOptions` when it creates (`patchToUpdateOptions`,
/// `patchToCreateOptions` in `apiserver/pkg/endpoints/handlers/patch.go`): never
/// `PatchOptions`, so `force` does not reach webhooks. DELETE replaces these with its own.
fn write_options(ctx: &Ctx, operation: Operation) -> Value {
    let kind = match operation {
        Operation::Create => "CreateOptions",
        Operation::Delete => "DeleteOptions",
        _ => "UpdateOptions",
    };
    let mut options = json!({"apiVersion": "meta.k8s.io/v1", "kind": kind});
    if ctx.dry_run {
        options["dryRun"] = json!(["All"]);
    }
    for field in ["fieldManager", "fieldValidation"] {
        if let Some(value) = ctx.query.get(field).filter(|v| !v.is_empty()) {
            options[field] = json!(value);
        }
    }
    options
}

/// The cluster IP a write of a Service holds that `old` did not: what [`release_unstored`]
/// frees if the write is not stored. Taken before the commit, which consumes the object.
pub(super) fn allocated_ip(ctx: &Ctx, new: &Value, old: Option<&Value>) -> Option<Ipv4Addr> {
    if !(ctx.rt.group.is_empty() && ctx.rt.plural == "services") {
        return None;
    }
    let ip = crate::defaults::service_cluster_ip(new);
    ip.filter(|_| ip != old.and_then(crate::defaults::service_cluster_ip))
}

/// Frees a cluster IP allocated for a Service that was not stored after all.
pub(super) fn release_unstored(ctx: &Ctx, allocated: Option<Ipv4Addr>) {
    if let Some(ip) = allocated {
        ctx.inner.store.lock().defaulter.cluster_ips.release(ip);
    }
}

/// A CRD's own checks after its metadata's (`meta_errors`), then whether it can be registered.
fn check_crd(
    ctx: &Ctx,
    obj: &mut Value,
    name: &str,
    mut errors: Vec<FieldError>,
) -> Result<(), ApiError> {
    let crd: CustomResourceDefinition = serde_json::from_value(obj.clone()).map_err(|e| {
        ApiError::bad_request(format!("the CustomResourceDefinition cannot be read: {e}"))
    })?;
    errors.extend(crate::crd::validate(obj));
    if !errors.is_empty() {
        return Err(ApiError::invalid(&ctx.rt, name, errors));
    }
    let mut registry = ctx.inner.store.lock().registry.clone();
    registry
        .register_crd(&crd)
        .map_err(|e| ApiError::invalid(&ctx.rt, name, vec![e.into()]))?;
    Ok(())
}

/// What the API server sets on a CRD once its names are accepted.
pub(super) fn crd_status(obj: &Value) -> Value {
    let ts = now();
    let condition = |t: &str, reason: &str, message: &str| json!({"type": t, "status": "True", "reason": reason, "message": message, "lastTransitionTime": ts});
    json!({
        "acceptedNames": obj.pointer("/spec/names").cloned().unwrap_or_else(|| json!({})),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": obj.pointer("/spec/versions").and_then(Value::as_array)
            .map(|vs| vs.iter().filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>())
            .unwrap_or_default(),
    })
}

/// Side effects of a committed write on other parts of the server.
pub(super) fn after_write(ctx: &Ctx, state: &mut StoreState, stored: &Value) {
    if ctx.rt.group == "apiextensions.k8s.io"
        && ctx.rt.plural == "customresourcedefinitions"
        && let Ok(crd) = serde_json::from_value::<CustomResourceDefinition>(stored.clone())
    {
        match state.registry.register_crd(&crd) {
            Ok(()) => state.recheck_unresolved_owners(),
            Err(e) => tracing::warn!(error = %e.0, "CRD registration failed after validation"),
        }
    }
}

pub(super) fn after_commit(ctx: &Ctx, stored: &Value) {
    if ctx.rt.group == "apps" && ctx.rt.plural == "deployments" {
        rollout::deployment_written(&ctx.inner.rollout, &ctx.inner.store, stored);
    }
    let owned = stored
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| !refs.is_empty());
    if owned {
        // The garbage collector, like the real one, runs after the write: an object written
        // with owners that are all gone (created while its owner was being deleted) goes.
        let (inner, res) = (ctx.inner.clone(), ctx.rt.storage());
        let ns = meta_str(stored, "namespace").unwrap_or("").to_string();
        let name = meta_str(stored, "name").unwrap_or("").to_string();
        let uid = meta_str(stored, "uid").unwrap_or("").to_string();
        tokio::spawn(async move {
            inner
                .store
                .lock()
                .collect_if_orphaned(&res, &ns, &name, &uid);
        });
    }
}

/// Generates a name from `generateName` when there is none, then checks it.
pub(super) fn assign_name(ctx: &Ctx, obj: &mut Value) -> Result<(), ApiError> {
    let meta = meta_mut(obj);
    let has_name = meta
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !has_name {
        let prefix = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..5].to_string();
        meta.insert("name".into(), json!(format!("{prefix}{suffix}")));
    }
    let name = meta_str(obj, "name").unwrap_or("").to_string();
    if let Some(message) = invalid_name(&ctx.rt, &name) {
        return Err(ApiError::invalid(
            &ctx.rt,
            &name,
            vec![FieldError::new(
                "metadata.name",
                "FieldValueInvalid",
                message,
            )],
        ));
    }
    Ok(())
}

/// The API server's name check: an RFC 1123 label for namespaces and services, an RFC 1123
/// subdomain for everything else.
fn invalid_name(rt: &ResourceType, name: &str) -> Option<String> {
    let label_only = rt.group.is_empty() && matches!(rt.plural.as_str(), "namespaces" | "services");
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| alnum(c) || c == '-')
            && l.starts_with(alnum)
            && l.ends_with(alnum)
    };
    if label_only {
        if name.len() <= 63 && valid_label(name) {
            return None;
        }
        return Some(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        ));
    }
    if name.len() <= 253 && name.split('.').all(valid_label) {
        return None;
    }
    Some(format!(
        "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_servers_rules() {
        let registry = crate::registry::Registry::builtin();
        let cm = registry.get("", "v1", "configmaps").unwrap();
        let svc = registry.get("", "v1", "services").unwrap();
        assert_eq!(invalid_name(&cm, "a.b-c"), None);
        assert!(invalid_name(&cm, "Upper").is_some());
        assert!(invalid_name(&cm, "-lead").is_some());
        assert!(invalid_name(&svc, "a.b").is_some());
        assert_eq!(invalid_name(&svc, "web-1"), None);
    }
}
