//! What every verb shares: the state behind the router, the parsed request, and JSON answers.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::admission::AdmissionChain;
use crate::authn::Tokens;
use crate::faults::Faults;
use crate::rbac::Attributes;
use crate::registry::ResourceType;
use crate::rollout::Rollouts;
use crate::selector::{FieldSelector, LabelSelector};
use crate::shard::ShardSelector;
use crate::status::ApiError;
use crate::store::Store;
use crate::store::{Event, EventType};

/// What a sandbox and its clones share: the state behind every request.
pub(crate) struct Inner {
    pub(crate) store: Arc<Store>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) server_minor: u32,
    pub(crate) rollout: Arc<Rollouts>,
    pub(crate) admission: AdmissionChain,
    /// The address [`crate::Sandbox::serve`] bound and, over HTTPS, the CA (PEM) that signed
    /// its certificate, for its kubeconfig.
    pub(crate) served: Mutex<Option<(SocketAddr, Option<String>)>>,
    /// The bearer tokens it accepts (authentication off when none are configured).
    pub(crate) tokens: Tokens,
    /// Whether LIST and WATCH take KEP-5866's `shardSelector`.
    pub(crate) sharded_list_watch: bool,
}

/// A resource URL, parsed.
#[derive(Clone, Debug)]
pub(super) struct ResPath {
    pub(super) group: String,
    pub(super) version: String,
    pub(super) namespace: Option<String>,
    pub(super) plural: String,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

pub(super) fn json_response(code: StatusCode, value: &Value, warnings: &[String]) -> Response {
    // Straight into bytes: `Display` (`to_string`) passes every token through a
    // `fmt::Formatter`, a large part of a small answer's cost. A `Value` always serializes.
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&crate::admission::warning_header_value(w)) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

pub(super) fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// How `fieldValidation` treats unknown fields.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// One resource request.
pub(super) struct Ctx {
    pub(super) inner: Arc<Inner>,
    pub(super) rt: Arc<ResourceType>,
    pub(super) ns: String,
    pub(super) path: ResPath,
    pub(super) query: HashMap<String, String>,
    pub(super) meta_only: bool,
    /// Whether the client asked for a `Table` (kubectl get).
    pub(super) table: bool,
    pub(super) dry_run: bool,
    /// Whether the request is a PATCH: its strict decoding errors name no kind.
    pub(super) patch: bool,
    pub(super) field_validation: FieldValidation,
    pub(super) warnings: Vec<String>,
    /// Who asks and what, as authorized (admission's `userInfo`, the create check of an
    /// apply that creates).
    pub(super) attrs: Attributes,
    /// The field manager: `fieldManager`, else derived from the user agent.
    pub(super) field_manager: String,
    /// The `User-Agent` header ("" when there is none): whom fault injection aims at.
    pub(super) user_agent: String,
    /// A server-side apply's configuration: its writes record Apply ownership, not Update.
    pub(super) apply_config: Option<Value>,
}

impl Ctx {
    /// An object as served at this URL's version (optionally as PartialObjectMetadata).
    pub(super) fn present<'a>(&self, obj: &'a Value) -> Cow<'a, Value> {
        present(&self.rt, obj, self.meta_only)
    }

    pub(super) fn respond(&self, code: StatusCode, obj: &Value) -> Response {
        json_response(code, &self.present(obj), &self.warnings)
    }

    pub(super) fn name(&self) -> &str {
        self.path.name.as_deref().unwrap_or("")
    }

    /// This request as a writer of managedFields.
    pub(super) fn writer(&self) -> crate::managed::Writer<'_> {
        crate::managed::Writer {
            rt: &self.rt,
            subresource: self.path.sub.as_deref().unwrap_or(""),
            manager: &self.field_manager,
        }
    }
}

/// A stored object as the API server decodes it for a read (or as the base of a write): a
/// custom resource gets its schema's defaults. Borrowed when nothing is missing.
pub(super) fn decoded<'a>(rt: &ResourceType, obj: &'a Value) -> Cow<'a, Value> {
    match rt.schema.as_ref().and_then(|s| s.read_defaulted(obj)) {
        Some(defaulted) => Cow::Owned(defaulted),
        None => Cow::Borrowed(obj),
    }
}

/// An object as served by one version of its resource. Borrowed when the stored object is
/// already that (nearly every answer: one version per resource, Events aside), so an answer
/// is serialized from the store's copy rather than from a deep copy of it.
pub(super) fn present<'a>(rt: &ResourceType, obj: &'a Value, meta_only: bool) -> Cow<'a, Value> {
    let obj = decoded(rt, obj);
    if meta_only {
        return Cow::Owned(json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }));
    }
    let api_version = rt.api_version();
    // `events::convert` changes only an object whose apiVersion is not the served one.
    if obj.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str())
        && obj.get("kind").and_then(Value::as_str) == Some(rt.kind.as_str())
    {
        return obj;
    }
    let mut out = obj.into_owned();
    crate::events::convert(&mut out, &api_version);
    if let Some(m) = out.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(rt.kind));
    }
    Cow::Owned(out)
}

pub(super) fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if value.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(value)
}

/// The fields a custom resource's field selectors may name: `metadata.name`,
/// `metadata.namespace` and its CRD version's `selectableFields` (apiextensions'
/// `ConvertFieldLabel`). Of the built-in kinds only Events' tables are modelled
/// (`crate::events`): any field is accepted for the others.
fn selectable_fields(ctx: &Ctx) -> Vec<String> {
    let mut fields = vec!["metadata.name".to_owned(), "metadata.namespace".to_owned()];
    let Some(crd) = ctx.rt.crd.as_deref() else {
        return fields;
    };
    let state = ctx.inner.store.lock();
    let storage = (
        "apiextensions.k8s.io".to_owned(),
        "customresourcedefinitions".to_owned(),
    );
    let versions = state
        .get(&storage, "", crd)
        .and_then(|crd| crd.pointer("/spec/versions")?.as_array().cloned())
        .unwrap_or_default();
    let version = versions
        .iter()
        .find(|v| v["name"].as_str() == Some(ctx.rt.version.as_str()));
    for field in version
        .and_then(|v| v["selectableFields"].as_array())
        .into_iter()
        .flatten()
    {
        if let Some(path) = field["jsonPath"].as_str() {
            fields.push(path.trim_start_matches('.').to_owned());
        }
    }
    fields
}

/// Label and field selectors of a list, watch or deletecollection request.
pub(super) struct Selectors {
    labels: LabelSelector,
    fields: FieldSelector,
    /// KEP-5866's `shardSelector`, with its feature gate on.
    shard: Option<ShardSelector>,
    /// Events: the field selector names `ToSelectableFields`' fields, not JSON paths.
    event_fields: bool,
}

impl Selectors {
    pub(super) fn from_request(ctx: &Ctx) -> Result<Self, ApiError> {
        let query = &ctx.query;
        let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        let event_fields =
            ctx.rt.kind == "Event" && matches!(ctx.rt.group.as_str(), "" | "events.k8s.io");
        let fields = if event_fields {
            let api_version = ctx.rt.api_version();
            fields
                .convert_labels(|label| {
                    crate::events::field_label(&api_version, label).map(str::to_owned)
                })
                .map_err(ApiError::bad_request)?
        } else {
            fields
        };
        if ctx.rt.crd.is_some() {
            let supported = selectable_fields(ctx);
            if let Some(path) = fields.paths().find(|p| !supported.iter().any(|s| s == p)) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {path}"
                )));
            }
        }
        let shard = match query.get("shardSelector").map(String::as_str) {
            Some(text) if ctx.inner.sharded_list_watch && !text.is_empty() => {
                Some(ShardSelector::parse(text).map_err(ApiError::bad_request)?)
            }
            _ => None,
        };
        Ok(Selectors {
            labels,
            fields,
            shard,
            event_fields,
        })
    }

    /// Selectors of a watch or list of a kind other than Events, parsed from their query text.
    #[cfg(test)]
    pub(super) fn parse(labels: &str, fields: &str) -> Self {
        Selectors {
            labels: LabelSelector::parse(labels).expect("a valid label selector"),
            fields: FieldSelector::parse(fields).expect("a valid field selector"),
            shard: None,
            event_fields: false,
        }
    }

    fn fields_match(&self, obj: &Value) -> bool {
        if self.event_fields {
            self.fields
                .matches_fields(|field| crate::events::selectable_field(obj, field))
        } else {
            self.fields.matches(obj)
        }
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields_match(obj) && self.shard_matches(obj)
    }

    fn shard_matches(&self, obj: &Value) -> bool {
        self.shard.as_ref().is_none_or(|shard| shard.matches(obj))
    }

    /// Whether there is no label, field or shard selector.
    pub(super) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty() && self.shard.is_none()
    }

    /// The shard selector applied, for a list's `shardInfo`.
    pub(super) fn shard(&self) -> Option<&ShardSelector> {
        self.shard.as_ref()
    }

    /// The event type a watch with these selectors reports for a logged event, if any: an
    /// object entering the selection is ADDED, one leaving it DELETED.
    pub(super) fn event_type(&self, event: &Event) -> Option<&'static str> {
        transition(self.selected_before(event), self.selected_after(event))
    }

    /// Whether the object was in the selection before `event`. Only labels are kept of the
    /// object before a change: its fields are taken as they are after it.
    pub(super) fn selected_before(&self, event: &Event) -> bool {
        match (event.kind, &event.previous_labels) {
            (EventType::Added, _) => false,
            (EventType::Modified, Some(previous)) => {
                self.event_fields_match(event)
                    && self.labels.matches_labels(Some(previous))
                    && self.event_shard_matches(event)
            }
            _ => self.event_matches(event),
        }
    }

    /// Whether the object is in the selection after `event`.
    pub(super) fn selected_after(&self, event: &Event) -> bool {
        event.kind != EventType::Deleted && self.event_matches(event)
    }

    /// [`Selectors::matches`] of a logged event's object, read only as far as the selectors
    /// need: its labels are at hand, its other fields may have to be parsed.
    fn event_matches(&self, event: &Event) -> bool {
        event.with_labels(|labels| self.labels.matches_labels(labels))
            && self.event_fields_match(event)
            && self.event_shard_matches(event)
    }

    /// Whether a logged event's object is in the shard selected, if one is. Its uid and
    /// namespace never change: it is in the same shard before and after.
    fn event_shard_matches(&self, event: &Event) -> bool {
        self.shard.is_none() || self.shard_matches(&event.object())
    }

    fn event_fields_match(&self, event: &Event) -> bool {
        self.fields.is_empty() || self.fields_match(&event.object())
    }
}

/// The event a watch reports for an object that was (`before`) and is (`after`) in its
/// selection, or was not and is not.
pub(super) fn transition(before: bool, after: bool) -> Option<&'static str> {
    match (before, after) {
        (true, true) => Some("MODIFIED"),
        (false, true) => Some("ADDED"),
        (true, false) => Some("DELETED"),
        (false, false) => None,
    }
}

/// The stored object the URL names, in the form of the URL's API (writes work on that form).
/// Shared with the store when it is already that form (nearly every write: defaults and Event
/// conversion aside), so a write copies only what it changes, and never under the store lock.
pub(super) fn read_current(ctx: &Ctx) -> Option<Arc<Value>> {
    let stored = ctx
        .inner
        .store
        .lock()
        .get_shared(&ctx.rt.storage(), &ctx.ns, ctx.name())
        .cloned()?;
    let api_version = ctx.rt.api_version();
    let mut current = match decoded(&ctx.rt, &stored) {
        Cow::Borrowed(_) => None,
        Cow::Owned(defaulted) => Some(defaulted),
    };
    let form = current.as_ref().unwrap_or(&stored);
    if crate::events::converts(form, &api_version) {
        let mut converted = current.unwrap_or_else(|| Value::clone(&stored));
        crate::events::convert(&mut converted, &api_version);
        current = Some(converted);
    }
    Some(current.map_or(stored, Arc::new))
}

/// The request's media type: the Content-Type without parameters (`; charset=...`).
pub(super) fn media_type(headers: &HeaderMap) -> String {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    value.split(';').next().unwrap_or("").trim().to_string()
}
