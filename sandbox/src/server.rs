//! The HTTP layer: routing, the resource verbs and the write pipeline.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::authentication::v1::UserInfo;

use crate::Inner;
use crate::admission::{
    AdmissionAttributes, GroupVersionKind, GroupVersionResource, Operation, Rejection,
};
use crate::discovery;
use crate::faults::RequestRecord;
use crate::patch;
use crate::registry::ResourceType;
use crate::rollout;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Event, EventType, State as StoreState, finalizers, meta_mut, meta_str, now};
use crate::watch;

/// The API server accepts request bodies up to 3 MiB.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// How often a write retries when the object changed between its read and its commit.
const WRITE_RETRIES: usize = 5;

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new().fallback(handle).with_state(inner)
}

/// A namespace object as the API server creates it.
pub(crate) fn new_namespace(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": now(),
            "labels": {"kubernetes.io/metadata.name": name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// A resource URL, parsed.
#[derive(Clone, Debug)]
pub(crate) struct ResPath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub sub: Option<String>,
}

enum Route {
    Version,
    Health,
    Api,
    Apis,
    ApiGroup(String),
    ResourceList(String, String),
    OpenApiRoot,
    OpenApiGv(String),
    Resource(ResPath),
    Unknown,
}

fn parse_route(path: &str) -> Route {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest) = match s.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["api"] => return Route::Api,
        ["apis"] => return Route::Apis,
        ["apis", g] => return Route::ApiGroup(g.to_string()),
        ["openapi", "v3"] => return Route::OpenApiRoot,
        ["openapi", "v3", rest @ ..] => return Route::OpenApiGv(rest.join("/")),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::Unknown,
    };
    let res = |namespace: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>| {
        Route::Resource(ResPath {
            group: group.to_string(),
            version: version.to_string(),
            namespace: namespace.map(String::from),
            plural: plural.to_string(),
            name: name.map(String::from),
            sub: sub.map(String::from),
        })
    };
    match rest {
        [] => Route::ResourceList(group.to_string(), version.to_string()),
        // `namespaces/{name}/status` is the namespace's own subresource, not a namespaced list.
        ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
            res(None, "namespaces", Some(name), Some(sub))
        }
        ["namespaces", ns, plural] => res(Some(ns), plural, None, None),
        ["namespaces", ns, plural, name] => res(Some(ns), plural, Some(name), None),
        ["namespaces", ns, plural, name, sub] => res(Some(ns), plural, Some(name), Some(sub)),
        [plural] => res(None, plural, None, None),
        [plural, name] => res(None, plural, Some(name), None),
        [plural, name, sub] => res(None, plural, Some(name), Some(sub)),
        _ => Route::Unknown,
    }
}

fn percent_decode(s: &str) -> String {
    decode(s, false)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k, true), decode(v, true))
        })
        .collect()
}

fn json_response(code: StatusCode, value: &Value, warnings: &[String]) -> Response {
    let mut resp = (code, value.to_string()).into_response();
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

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let query = parse_query(parts.uri.query());
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // In flight from arrival, an injected delay included; a watch is a stream, not a request.
    let _in_flight =
        (!watching(&query)).then(|| inner.faults.enter(user_agent.as_deref().unwrap_or("")));
    let delay = inner.faults.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let route = parse_route(parts.uri.path());
    let mut record = RequestRecord {
        verb: parts.method.as_str().to_lowercase(),
        path: parts.uri.path().to_string(),
        resource: None,
        subresource: None,
        namespace: None,
        name: None,
        field_manager: query.get("fieldManager").cloned(),
        user_agent,
        status: 0,
    };
    let response = match axum::body::to_bytes(body, MAX_BODY).await {
        Err(_) => ApiError::new(
            413,
            "RequestEntityTooLarge",
            "the request body is too large (limit 3 MiB)",
        )
        .into_response(),
        Ok(bytes) => {
            let out = match route {
                Route::Resource(path) => {
                    record.resource = Some(path.plural.clone());
                    record.subresource = path.sub.clone();
                    record.namespace = path.namespace.clone();
                    record.name = path.name.clone();
                    record.verb = verb(&parts.method, &path, &query).to_string();
                    resource(&inner, &parts.method, &parts.headers, path, &query, bytes).await
                }
                other => non_resource(&inner, &parts.method, other),
            };
            out.unwrap_or_else(IntoResponse::into_response)
        }
    };
    record.status = response.status().as_u16();
    tracing::debug!(verb = %record.verb, path = %record.path, status = record.status, "Request");
    inner.faults.record(record);
    response
}

/// Whether a GET asks for a watch stream rather than a list.
fn watching(query: &HashMap<String, String>) -> bool {
    query.get("watch").is_some_and(|w| w == "true" || w == "1")
}

fn verb(method: &Method, path: &ResPath, query: &HashMap<String, String>) -> &'static str {
    match (method.as_str(), path.name.is_some()) {
        ("GET", false) if watching(query) => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        _ => "unknown",
    }
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn non_resource(inner: &Arc<Inner>, method: &Method, route: Route) -> Result<Response, ApiError> {
    if method != Method::GET {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        )));
    }
    let registry = inner.store.lock().registry.clone();
    let value = match route {
        Route::Version => discovery::version(inner.server_minor),
        Route::Health => return Ok((StatusCode::OK, "ok").into_response()),
        Route::Api => discovery::api_versions(),
        Route::Apis => discovery::api_group_list(&registry),
        Route::ApiGroup(g) => discovery::api_group_doc(&registry, &g).ok_or_else(not_found_path)?,
        Route::ResourceList(g, v) => {
            discovery::resource_list(&registry, &g, &v).ok_or_else(not_found_path)?
        }
        Route::OpenApiRoot => discovery::openapi_root(&registry, inner.store.lock().rv),
        Route::OpenApiGv(p) => discovery::openapi_gv(&registry, &p).ok_or_else(not_found_path)?,
        Route::Resource(_) | Route::Unknown => return Err(not_found_path()),
    };
    Ok(json_response(StatusCode::OK, &value, &[]))
}

/// How `fieldValidation` treats unknown fields.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// One resource request.
pub(crate) struct Ctx {
    pub inner: Arc<Inner>,
    pub rt: Arc<ResourceType>,
    pub ns: String,
    pub path: ResPath,
    pub query: HashMap<String, String>,
    pub meta_only: bool,
    /// Whether the client asked for a `Table` (kubectl get).
    pub table: bool,
    dry_run: bool,
    /// Whether the request is a PATCH (for the admission options kind).
    patch: bool,
    field_validation: FieldValidation,
    warnings: Vec<String>,
}

impl Ctx {
    /// An object as served at this URL's version (optionally as PartialObjectMetadata).
    pub fn present(&self, obj: &Value) -> Value {
        present(&self.rt, obj, self.meta_only)
    }

    fn respond(&self, code: StatusCode, obj: &Value) -> Response {
        json_response(code, &self.present(obj), &self.warnings)
    }

    fn name(&self) -> &str {
        self.path.name.as_deref().unwrap_or("")
    }
}

/// An object as served by one version of its resource.
pub(crate) fn present(rt: &ResourceType, obj: &Value, meta_only: bool) -> Value {
    if meta_only {
        return json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        });
    }
    let mut out = obj.clone();
    if let Some(m) = out.as_object_mut() {
        m.insert("apiVersion".into(), json!(rt.api_version()));
        m.insert("kind".into(), json!(rt.kind));
    }
    out
}

async fn resource(
    inner: &Arc<Inner>,
    method: &Method,
    headers: &HeaderMap,
    path: ResPath,
    query: &HashMap<String, String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let rt = inner
        .store
        .lock()
        .registry
        .get(&path.group, &path.version, &path.plural)
        .ok_or_else(not_found_path)?;
    if path.namespace.is_some() && !rt.namespaced {
        return Err(not_found_path());
    }
    if rt.namespaced && path.namespace.is_none() && path.name.is_some() {
        return Err(not_found_path());
    }
    match path.sub.as_deref() {
        None => {}
        Some("status") if rt.status_subresource => {}
        Some("scale") if rt.scale.is_some() => {}
        Some(_) => return Err(not_found_path()),
    }
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let field_validation = match query.get("fieldValidation").map(String::as_str) {
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some("Warn") | None | Some("") => FieldValidation::Warn,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            )));
        }
    };
    let mut ctx = Ctx {
        inner: inner.clone(),
        ns: path.namespace.clone().unwrap_or_default(),
        rt,
        path,
        query: query.clone(),
        meta_only: accept.contains("as=PartialObjectMetadata"),
        table: accept.contains("as=Table"),
        dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
        patch: *method == Method::PATCH,
        field_validation,
        warnings: Vec::new(),
    };
    let is_write = !matches!(*method, Method::GET | Method::HEAD);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if is_write && !body.is_empty() && content_type.contains("protobuf") {
        // kubectl's typed clientset (create namespace, create configmap, ...) sends protobuf
        // and does not fall back; the sandbox models JSON only.
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the sandbox API server does not decode {content_type}; send JSON (kubectl apply -f works)"
            ),
        ));
    }
    if is_write && let Some(err) = inner.faults.take_write_fault() {
        return Err(err);
    }
    let has_name = ctx.path.name.is_some();
    if ctx.path.sub.as_deref() == Some("scale") {
        return scale_request(&mut ctx, method, headers, &body).await;
    }
    match (method.clone(), has_name) {
        (Method::GET, false) => {
            if watching(query) {
                watch::watch(&ctx)
            } else {
                list(&ctx)
            }
        }
        (Method::GET, true) => {
            let state = inner.store.lock();
            let obj = state
                .get(&ctx.rt.storage(), &ctx.ns, ctx.name())
                .ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
            if ctx.table {
                let table = crate::table::table(&ctx.rt, &[obj], state.rv);
                return Ok(json_response(StatusCode::OK, &table, &[]));
            }
            Ok(ctx.respond(StatusCode::OK, obj))
        }
        (Method::POST, false) => {
            let obj = parse_body(&body)?;
            let created = create(&mut ctx, obj).await?;
            Ok(ctx.respond(StatusCode::CREATED, &created))
        }
        (Method::PUT, true) => {
            let obj = parse_body(&body)?;
            let (code, updated) = update(&mut ctx, obj).await?;
            Ok(ctx.respond(code, &updated))
        }
        (Method::PATCH, true) => {
            let content_type = media_type(headers);
            let (code, patched) = patch_object(&mut ctx, &content_type, &body).await?;
            Ok(ctx.respond(code, &patched))
        }
        (Method::DELETE, true) => {
            let options = if body.is_empty() {
                json!({})
            } else {
                parse_body(&body)?
            };
            let deleted = delete(&mut ctx, &options).await?;
            let still_there = ctx
                .inner
                .store
                .lock()
                .get(&ctx.rt.storage(), &ctx.ns, ctx.name())
                .is_some();
            if still_there || ctx.dry_run {
                return Ok(ctx.respond(StatusCode::OK, &deleted));
            }
            // Gone at once: the API server answers a Success Status (kube: Either::Right).
            let status = json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": ctx.name(),
                    "group": ctx.rt.group,
                    "kind": ctx.rt.plural,
                    "uid": meta_str(&deleted, "uid"),
                },
            });
            Ok(json_response(StatusCode::OK, &status, &ctx.warnings))
        }
        (Method::DELETE, false) => delete_collection(&mut ctx).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        ))),
    }
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
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

/// Label and field selectors of a list, watch or deletecollection request.
pub(crate) struct Selectors {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selectors {
    pub(crate) fn from_query(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        Ok(Selectors { labels, fields })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The event type a watch with these selectors reports for a logged event, if any: an
    /// object entering the selection is ADDED, one leaving it DELETED.
    pub(crate) fn event_type(&self, event: &Event) -> Option<&'static str> {
        let now = self.matches(&event.object);
        match (event.kind, &event.previous_labels) {
            (EventType::Modified, Some(previous)) => {
                let before = self.fields.matches(&event.object)
                    && self.labels.matches_labels(Some(previous));
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
            (kind, _) => now.then_some(kind.as_str()),
        }
    }
}

fn list(ctx: &Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::from_query(&ctx.query)?;
    let limit = match ctx.query.get("limit").map(String::as_str) {
        None | Some("") => None,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if n > 0 => Some(n as usize),
            // As on a real server: zero or a negative limit means no limit.
            Ok(_) => None,
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "limit: Invalid value: \"{text}\": must be an integer"
                )));
            }
        },
    };
    let from = match ctx.query.get("continue").map(String::as_str) {
        None | Some("") => None,
        Some(token) => Some(ListContinue::decode(token)?),
    };
    let state = ctx.inner.store.lock();
    // Every page reports the version of the first, so a watch from it replays whatever
    // changed while the pages were read.
    let list_rv = match &from {
        Some(from) => {
            state.replays_from(from.rv).map_err(|_| {
                ApiError::new(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list \
                     result. You can start a new list without the continue parameter.",
                )
            })?;
            from.rv
        }
        None => state.rv,
    };
    let ns = ctx.path.namespace.as_deref();
    let mut matching = state
        .list_after(&ctx.rt.storage(), ns, from.as_ref().map(|f| &f.after))
        .filter(|(_, o)| selectors.matches(o));
    let mut page: Vec<&Value> = Vec::new();
    let mut last = None;
    for (key, object) in matching.by_ref() {
        page.push(object);
        last = Some(key);
        if limit.is_some_and(|limit| page.len() == limit) {
            break;
        }
    }
    let next = match last {
        Some(after) if limit.is_some() && matching.next().is_some() => Some(
            ListContinue {
                rv: list_rv,
                after: after.clone(),
            }
            .encode(),
        ),
        _ => None,
    };
    drop(matching);
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if let Some(next) = next {
        metadata["continue"] = json!(next);
    }
    if ctx.table {
        let mut table = crate::table::table(&ctx.rt, &page, list_rv);
        table["metadata"] = metadata;
        return Ok(json_response(StatusCode::OK, &table, &[]));
    }
    let items: Vec<Value> = page.into_iter().map(|o| ctx.present(o)).collect();
    let (api_version, kind) = if ctx.meta_only {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (ctx.rt.api_version(), format!("{}List", ctx.rt.kind))
    };
    let list = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": metadata,
        "items": items,
    });
    drop(state);
    Ok(json_response(StatusCode::OK, &list, &[]))
}

/// Where the next page of a list starts: after the object `after` ((namespace, name)), in a
/// list that began at version `rv`. Opaque to clients (base64 of JSON, as on a real server).
#[derive(serde::Serialize, serde::Deserialize)]
struct ListContinue {
    rv: u64,
    after: (String, String),
}

impl ListContinue {
    fn encode(&self) -> String {
        use base64::Engine;
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    fn decode(token: &str) -> Result<Self, ApiError> {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "continue key is not valid: {token:?} was not returned by this server; \
                     start the list again without it"
                ))
            })
    }
}

// === the write pipeline ===

/// Sets identity fields and rejects a body that names another resource or namespace.
fn check_identity(ctx: &Ctx, obj: &mut Value) -> Result<(), ApiError> {
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
    let is_service = ctx.rt.group.is_empty() && ctx.rt.plural == "services";
    // Services are defaulted once: a second pass would reserve the allocated IP again.
    if ctx.path.sub.is_none() && (first_pass || !is_service) {
        let mut state = ctx.inner.store.lock();
        state.defaulter.apply(obj, old).map_err(|e| {
            let (reason, code) = e.reason_and_code();
            ApiError::new(code, reason, e.to_string())
        })?;
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
                return Err(ApiError::bad_request(format!(
                    "strict decoding error: {}",
                    unknown.join(", ")
                )));
            }
            FieldValidation::Warn => ctx.warnings.extend(unknown),
            FieldValidation::Ignore => {}
        }
    }
    schema.apply_defaults(obj);
    Ok(())
}

/// The object checks of the resource: CRD registrability, custom-resource schema and CEL rules.
fn validate_object(ctx: &Ctx, obj: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = meta_str(obj, "name").unwrap_or("").to_string();
    if ctx.rt.group == "apiextensions.k8s.io" && ctx.rt.plural == "customresourcedefinitions" {
        check_crd(ctx, obj, &name)?;
    }
    let Some(schema) = ctx.rt.schema.clone() else {
        return Ok(());
    };
    let errors = schema.validate(obj, old);
    if !errors.is_empty() {
        let causes = errors
            .into_iter()
            .map(|e| (e.field, e.reason, e.message))
            .collect();
        return Err(ApiError::invalid(&ctx.rt, &name, causes));
    }
    Ok(())
}

/// Everything between the request and the store, in the API server's order: defaulting,
/// mutating webhooks, defaulting/pruning again, validation, validating webhooks. Returns the
/// object to store; a rejection carries the warnings gathered so far.
async fn admit(
    ctx: &mut Ctx,
    operation: Operation,
    mut obj: Value,
    old: Option<&Value>,
) -> Result<Value, ApiError> {
    decode_defaults(ctx, &mut obj, old, true)?;
    let (mutating, validating) = webhook_configurations(ctx);
    let mut attributes = admission_attributes(ctx, operation, Some(obj.clone()), old.cloned());
    if !mutating.is_empty() {
        let mutated = ctx
            .inner
            .admission
            .mutate(&mutating, &attributes)
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
        assign_name(ctx, &mut obj).map_err(|mut e| {
            e.warnings = ctx.warnings.clone();
            e
        })?;
    }
    validate_object(ctx, &mut obj, old).map_err(|mut e| {
        e.warnings = ctx.warnings.clone();
        e
    })?;
    if !validating.is_empty() {
        attributes.object = Some(obj.clone());
        let validated = ctx
            .inner
            .admission
            .validate(&validating, &attributes)
            .await
            .map_err(|r| rejected(ctx, r))?;
        ctx.warnings.extend(validated.warnings);
    }
    Ok(obj)
}

/// DELETE through the webhooks (object null, oldObject the stored object).
async fn admit_delete(ctx: &mut Ctx, current: &Value, options: &Value) -> Result<(), ApiError> {
    let (mutating, validating) = webhook_configurations(ctx);
    if mutating.is_empty() && validating.is_empty() {
        return Ok(());
    }
    let mut attributes = admission_attributes(ctx, Operation::Delete, None, Some(current.clone()));
    let mut opts = options.clone();
    if let Some(m) = opts.as_object_mut() {
        m.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
        m.insert("kind".into(), json!("DeleteOptions"));
    }
    attributes.options = Some(opts);
    let admitted = ctx
        .inner
        .admission
        .admit(&mutating, &validating, &attributes)
        .await
        .map_err(|r| rejected(ctx, r))?;
    ctx.warnings.extend(admitted.warnings);
    Ok(())
}

fn rejected(ctx: &Ctx, rejection: Rejection) -> ApiError {
    let mut err = ApiError::from_status(&rejection.status());
    err.warnings = ctx.warnings.clone();
    err.warnings.extend(rejection.warnings);
    err
}

fn webhook_configurations(
    ctx: &Ctx,
) -> (
    Vec<MutatingWebhookConfiguration>,
    Vec<ValidatingWebhookConfiguration>,
) {
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
    let mutating = read("mutatingwebhookconfigurations")
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    let validating = read("validatingwebhookconfigurations")
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    (mutating, validating)
}

fn admission_attributes(
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
    }
    attributes.object = object;
    attributes.old_object = old_object;
    attributes.dry_run = ctx.dry_run;
    attributes.user_info = UserInfo {
        username: Some("sandbox-admin".into()),
        groups: Some(vec!["system:masters".into(), "system:authenticated".into()]),
        ..UserInfo::default()
    };
    let options_kind = match operation {
        Operation::Create => "CreateOptions",
        Operation::Delete => "DeleteOptions",
        _ if ctx.patch => "PatchOptions",
        _ => "UpdateOptions",
    };
    let mut options = json!({"apiVersion": "meta.k8s.io/v1", "kind": options_kind});
    if let Some(manager) = ctx.query.get("fieldManager") {
        options["fieldManager"] = json!(manager);
    }
    if ctx.dry_run {
        options["dryRun"] = json!(["All"]);
    }
    attributes.options = Some(options);
    attributes
}

/// Frees a cluster IP allocated for a Service that was not stored after all.
fn release_unstored(ctx: &Ctx, new: &Value, old: Option<&Value>) {
    if !(ctx.rt.group.is_empty() && ctx.rt.plural == "services") {
        return;
    }
    let ip = crate::defaults::service_cluster_ip(new);
    if ip.is_some() && ip != old.and_then(crate::defaults::service_cluster_ip) {
        ctx.inner.store.lock().defaulter.release(new);
    }
}

fn check_crd(ctx: &Ctx, obj: &mut Value, name: &str) -> Result<(), ApiError> {
    let crd: CustomResourceDefinition = serde_json::from_value(obj.clone()).map_err(|e| {
        ApiError::bad_request(format!("the CustomResourceDefinition cannot be read: {e}"))
    })?;
    let mut registry = ctx.inner.store.lock().registry.clone();
    registry.register_crd(&crd).map_err(|e| {
        ApiError::invalid(
            &ctx.rt,
            name,
            vec![(String::new(), "FieldValueInvalid".into(), e.0)],
        )
    })?;
    Ok(())
}

/// What the API server sets on a CRD once its names are accepted.
fn crd_status(obj: &Value) -> Value {
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
fn after_write(ctx: &Ctx, state: &mut StoreState, stored: &Value) {
    if ctx.rt.group == "apiextensions.k8s.io"
        && ctx.rt.plural == "customresourcedefinitions"
        && let Ok(crd) = serde_json::from_value::<CustomResourceDefinition>(stored.clone())
        && let Err(e) = state.registry.register_crd(&crd)
    {
        tracing::warn!(error = %e.0, "CRD registration failed after validation");
    }
}

fn after_commit(ctx: &Ctx, stored: &Value) {
    if ctx.rt.group == "apps" && ctx.rt.plural == "deployments" {
        rollout::deployment_written(&ctx.inner, stored);
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

async fn create(ctx: &mut Ctx, mut obj: Value) -> Result<Value, ApiError> {
    if ctx.path.sub.is_some() {
        return Err(ApiError::method_not_allowed(
            "create is not allowed on a subresource",
        ));
    }
    check_identity(ctx, &mut obj)?;
    let meta = meta_mut(&mut obj);
    for server_owned in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
        "selfLink",
    ] {
        meta.remove(server_owned);
    }
    let named = |field: &str| {
        meta.get(field)
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
    };
    // With only generateName, the name is made after the mutating webhooks, which see it empty
    // (as the real server's reviews do).
    if !named("name") && !named("generateName") {
        return Err(ApiError::invalid(
            &ctx.rt,
            "",
            vec![(
                "metadata.name".into(),
                "FieldValueRequired".into(),
                "Required value: name or generateName is required".into(),
            )],
        ));
    }
    if ctx.rt.status_subresource
        && !(ctx.rt.kind == "Namespace" && ctx.rt.group.is_empty())
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    let obj = admit(ctx, Operation::Create, obj, None).await?;
    let result = commit_create(ctx, obj.clone());
    if result.is_err() || ctx.dry_run {
        release_unstored(ctx, &obj, None);
    }
    result
}

/// Generates a name from `generateName` when there is none, then checks it.
fn assign_name(ctx: &Ctx, obj: &mut Value) -> Result<(), ApiError> {
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
            vec![("metadata.name".into(), "FieldValueInvalid".into(), message)],
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

fn commit_create(ctx: &mut Ctx, mut obj: Value) -> Result<Value, ApiError> {
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let mut state = ctx.inner.store.lock();
    if ctx.rt.namespaced {
        let ns_res = (String::new(), "namespaces".to_string());
        match state.get(&ns_res, "", &ctx.ns) {
            None => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("namespaces \"{}\" not found", ctx.ns),
                ));
            }
            Some(n) if meta_str(n, "deletionTimestamp").is_some() => {
                return Err(ApiError::forbidden(format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                    ctx.rt.qualified(),
                    ctx.ns
                )));
            }
            Some(_) => {}
        }
    }
    if state.get(&ctx.rt.storage(), &ctx.ns, &name).is_some() {
        return Err(ApiError::already_exists(&ctx.rt, &name));
    }
    let meta = meta_mut(&mut obj);
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    if ctx.rt.generation {
        meta.insert("generation".into(), json!(1));
    }
    if ctx.rt.kind == "Namespace" && ctx.rt.group.is_empty() {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
        obj["status"] = json!({"phase": "Active"});
    }
    if ctx.rt.group == "apiextensions.k8s.io" && ctx.rt.plural == "customresourcedefinitions" {
        obj["status"] = crd_status(&obj);
    }
    if ctx.dry_run {
        return Ok(obj);
    }
    let stored = state.put(&ctx.rt, obj, EventType::Added);
    after_write(ctx, &mut state, &stored);
    drop(state);
    after_commit(ctx, &stored);
    Ok(stored)
}

/// Builds the object a write of `incoming` over `old` stores: server-owned fields from `old`,
/// and only `.status` (status writes) or everything but `.status` (main-resource writes of a
/// kind with a status subresource).
fn merge_server_fields(ctx: &Ctx, old: &Value, incoming: Value) -> Value {
    if ctx.path.sub.as_deref() == Some("status") {
        let mut new = old.clone();
        match incoming.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        return new;
    }
    let mut new = incoming;
    {
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let meta = meta_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "name",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            match old_meta.get(field) {
                Some(v) => {
                    meta.insert(field.into(), v.clone());
                }
                None => {
                    meta.remove(field);
                }
            }
        }
        meta.remove("managedFields");
    }
    if ctx.rt.status_subresource {
        match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    new
}

fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

/// Outcome of trying to store an update.
enum Commit {
    Done(StatusCode, Value),
    /// The object changed since it was read; read again.
    Stale,
}

fn commit_update(ctx: &mut Ctx, old: &Value, mut new: Value) -> Result<Commit, ApiError> {
    let name = ctx.name().to_string();
    let mut state = ctx.inner.store.lock();
    let Some(current) = state.get(&ctx.rt.storage(), &ctx.ns, &name) else {
        return Err(ApiError::not_found(&ctx.rt, &name));
    };
    if current.pointer("/metadata/resourceVersion") != old.pointer("/metadata/resourceVersion") {
        return Ok(Commit::Stale);
    }
    if meta_str(old, "deletionTimestamp").is_some() {
        let before = finalizers(old);
        if finalizers(&new).iter().any(|f| !before.contains(f)) {
            return Err(ApiError::invalid(
                &ctx.rt,
                &name,
                vec![(
                    "metadata.finalizers".into(),
                    "FieldValueForbidden".into(),
                    "Forbidden: no new finalizers can be added if the object is being deleted"
                        .into(),
                )],
            ));
        }
    }
    if ctx.rt.generation && spec_changed(old, &new) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
    }
    if ctx.rt.group == "apiextensions.k8s.io" && ctx.rt.plural == "customresourcedefinitions" {
        new["status"] = crd_status(&new);
        if let Some(conditions) = old.pointer("/status/conditions") {
            new["status"]["conditions"] = conditions.clone();
        }
    }
    if new == *old {
        return Ok(Commit::Done(StatusCode::OK, old.clone()));
    }
    if ctx.dry_run {
        return Ok(Commit::Done(StatusCode::OK, new));
    }
    let deleting = meta_str(&new, "deletionTimestamp").is_some() && finalizers(&new).is_empty();
    let stored = state.put(&ctx.rt, new, EventType::Modified);
    if deleting {
        // The last finalizer went: the object goes, and watchers see it as DELETED.
        let removed = state
            .remove(&ctx.rt.storage(), &ctx.ns, &name, false)
            .unwrap_or(stored);
        return Ok(Commit::Done(StatusCode::OK, removed));
    }
    after_write(ctx, &mut state, &stored);
    drop(state);
    after_commit(ctx, &stored);
    Ok(Commit::Done(StatusCode::OK, stored))
}

/// [`commit_update`], freeing a Service cluster IP that did not end up stored.
fn commit_checked(ctx: &mut Ctx, old: &Value, new: Value) -> Result<Commit, ApiError> {
    let outcome = commit_update(ctx, old, new.clone());
    if !matches!(outcome, Ok(Commit::Done(..))) || ctx.dry_run {
        release_unstored(ctx, &new, Some(old));
    }
    outcome
}

fn read_current(ctx: &Ctx) -> Option<Value> {
    ctx.inner
        .store
        .lock()
        .get(&ctx.rt.storage(), &ctx.ns, ctx.name())
        .cloned()
}

async fn update(ctx: &mut Ctx, mut body: Value) -> Result<(StatusCode, Value), ApiError> {
    check_identity(ctx, &mut body)?;
    let precondition = meta_str(&body, "resourceVersion")
        .filter(|rv| !rv.is_empty())
        .map(String::from);
    for _ in 0..WRITE_RETRIES {
        let old = read_current(ctx).ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
        if let Some(rv) = &precondition
            && meta_str(&old, "resourceVersion") != Some(rv.as_str())
        {
            return Err(ApiError::conflict(&ctx.rt, ctx.name()));
        }
        let new = merge_server_fields(ctx, &old, body.clone());
        let new = admit(ctx, Operation::Update, new, Some(&old)).await?;
        match commit_checked(ctx, &old, new)? {
            Commit::Done(code, v) => return Ok((code, v)),
            Commit::Stale if precondition.is_some() => {
                return Err(ApiError::conflict(&ctx.rt, ctx.name()));
            }
            Commit::Stale => continue,
        }
    }
    Err(ApiError::conflict(&ctx.rt, ctx.name()))
}

/// GET, PUT and PATCH of `/scale`: the Scale view of the object; writes set its replicas
/// through the ordinary update path (generation, admission, schema validation).
async fn scale_request(
    ctx: &mut Ctx,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let Some(paths) = crate::scale::paths(&ctx.rt).cloned() else {
        return Err(not_found_path());
    };
    let write = match *method {
        Method::GET => None,
        Method::PUT => Some((None, parse_body(body)?)),
        Method::PATCH => {
            let content_type = media_type(headers);
            let kind = match content_type.as_str() {
                "application/json-patch+json" => PatchKind::Json,
                "application/merge-patch+json" | "application/apply-patch+yaml" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let doc = parse_patch_body(kind, body)?;
            Some((Some(kind), doc))
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )));
        }
    };
    for _ in 0..WRITE_RETRIES {
        let old = read_current(ctx).ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
        let current = crate::scale::to_scale(&paths, &old);
        let Some((kind, doc)) = &write else {
            return Ok(json_response(StatusCode::OK, &current, &[]));
        };
        let requested = match kind {
            None => doc.clone(),
            Some(PatchKind::Json) => patch::json_patch(&current, doc).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?,
            Some(PatchKind::Strategic) => {
                let mut s = current.clone();
                patch::strategic_merge_patch(&mut s, doc);
                s
            }
            Some(_) => {
                let mut s = current.clone();
                patch::merge_patch(&mut s, doc);
                s
            }
        };
        if let Some(rv) = meta_str(&requested, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(&ctx.rt, ctx.name()));
        }
        let Some(replicas) = requested.pointer("/spec/replicas").and_then(Value::as_i64) else {
            return Err(ApiError::invalid(
                &ctx.rt,
                ctx.name(),
                vec![(
                    "spec.replicas".into(),
                    "FieldValueRequired".into(),
                    "Required value: an integer is required".into(),
                )],
            ));
        };
        if replicas < 0 {
            return Err(ApiError::invalid(
                &ctx.rt,
                ctx.name(),
                vec![(
                    "spec.replicas".into(),
                    "FieldValueInvalid".into(),
                    format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                )],
            ));
        }
        let mut new = old.clone();
        crate::scale::set_replicas(&paths, &mut new, replicas);
        let new = admit(ctx, Operation::Update, new, Some(&old)).await?;
        match commit_checked(ctx, &old, new)? {
            Commit::Done(_, stored) => {
                let scale = crate::scale::to_scale(&paths, &stored);
                return Ok(json_response(StatusCode::OK, &scale, &ctx.warnings));
            }
            Commit::Stale => continue,
        }
    }
    Err(ApiError::conflict(&ctx.rt, ctx.name()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

fn parse_patch_body(kind: PatchKind, body: &[u8]) -> Result<Value, ApiError> {
    let parsed = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(json_err) if kind == PatchKind::Apply => {
            let text = std::str::from_utf8(body)
                .map_err(|e| ApiError::bad_request(format!("the apply patch is not UTF-8: {e}")))?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| {
                ApiError::bad_request(format!("error decoding YAML: {e} (as JSON: {json_err})"))
            })?
        }
        Err(e) => {
            return Err(ApiError::bad_request(format!(
                "the patch is not valid JSON: {e}"
            )));
        }
    };
    match kind {
        PatchKind::Json if !parsed.is_array() => Err(ApiError::bad_request(
            "json patch must be an array of operations",
        )),
        PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply if !parsed.is_object() => {
            Err(ApiError::bad_request("the patch must be a JSON object"))
        }
        _ => Ok(parsed),
    }
}

async fn patch_object(
    ctx: &mut Ctx,
    content_type: &str,
    body: &[u8],
) -> Result<(StatusCode, Value), ApiError> {
    let kind = match content_type {
        "application/json-patch+json" => PatchKind::Json,
        "application/merge-patch+json" => PatchKind::Merge,
        // kubectl sends strategic merge patches for built-in kinds; custom resources refuse
        // them, as on a real server.
        "application/strategic-merge-patch+json" if ctx.rt.crd.is_none() => PatchKind::Strategic,
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => PatchKind::Apply,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    let patch_doc = parse_patch_body(kind, body)?;
    let manager = ctx.query.get("fieldManager").cloned().unwrap_or_default();
    if kind == PatchKind::Apply && manager.is_empty() {
        return Err(ApiError::invalid(
            &ctx.rt,
            "",
            vec![(
                "fieldManager".into(),
                "FieldValueRequired".into(),
                "Required value: is required for apply patch".into(),
            )],
        ));
    }
    let sub = ctx.path.sub.clone().unwrap_or_default();
    for _ in 0..WRITE_RETRIES {
        let Some(old) = read_current(ctx) else {
            if kind == PatchKind::Apply && ctx.path.sub.is_none() {
                let created = match create(ctx, patch_doc.clone()).await {
                    // Created by another writer since it was read: apply to that object, as
                    // the API server's storage retries an update that loses a create race.
                    Err(e) if e.reason == "AlreadyExists" => continue,
                    created => created?,
                };
                remember_apply(ctx, &sub, &manager, &patch_doc);
                return Ok((StatusCode::CREATED, created));
            }
            return Err(ApiError::not_found(&ctx.rt, ctx.name()));
        };
        let mut patched = match kind {
            PatchKind::Merge => {
                let mut doc = old.clone();
                patch::merge_patch(&mut doc, &patch_doc);
                doc
            }
            PatchKind::Strategic => {
                let mut doc = old.clone();
                patch::strategic_merge_patch(&mut doc, &patch_doc);
                doc
            }
            PatchKind::Json => patch::json_patch(&old, &patch_doc).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?,
            PatchKind::Apply => {
                let mut config = patch_doc.clone();
                check_identity(ctx, &mut config)?;
                let state = ctx.inner.store.lock();
                let configs =
                    state
                        .applied
                        .get(&(ctx.rt.storage(), ctx.ns.clone(), ctx.name().to_string()));
                let previous = configs
                    .and_then(|c| c.get(&(sub.clone(), manager.clone())))
                    .cloned();
                let mut others: Vec<(String, Value)> = configs
                    .into_iter()
                    .flatten()
                    .filter(|((s, m), _)| *s == sub && *m != manager)
                    .map(|((_, m), v)| (m.clone(), v.clone()))
                    .collect();
                drop(state);
                others.sort_by(|a, b| a.0.cmp(&b.0));
                if ctx.query.get("force").map(String::as_str) != Some("true") {
                    check_apply_conflicts(ctx, &old, &patch_doc, &others)?;
                }
                let others_ref: Vec<&Value> = others.iter().map(|(_, v)| v).collect();
                patch::apply(&old, previous.as_ref(), &others_ref, &patch_doc)
            }
        };
        let requested_rv = meta_str(&patched, "resourceVersion").map(String::from);
        if requested_rv.is_some() && requested_rv.as_deref() != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(&ctx.rt, ctx.name()));
        }
        check_identity(ctx, &mut patched)?;
        let new = merge_server_fields(ctx, &old, patched);
        let new = admit(ctx, Operation::Update, new, Some(&old)).await?;
        match commit_checked(ctx, &old, new)? {
            Commit::Done(code, v) => {
                if kind == PatchKind::Apply {
                    remember_apply(ctx, &sub, &manager, &patch_doc);
                }
                return Ok((code, v));
            }
            Commit::Stale => continue,
        }
    }
    Err(ApiError::conflict(&ctx.rt, ctx.name()))
}

/// Server-side apply without `force`: 409 when the configuration changes a field another
/// manager applies with a different value.
fn check_apply_conflicts(
    ctx: &Ctx,
    current: &Value,
    config: &Value,
    others: &[(String, Value)],
) -> Result<(), ApiError> {
    let mut conflicts: Vec<(String, String)> = Vec::new();
    for (manager, applied) in others {
        for path in patch::apply_conflicts(current, config, applied) {
            conflicts.push((manager.clone(), path));
        }
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    let api_version = ctx.rt.api_version();
    let message = if let [(manager, path)] = conflicts.as_slice() {
        format!(
            "Apply failed with 1 conflict: conflict with \"{manager}\" using {api_version}: {path}"
        )
    } else {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, p)| format!("- conflict with \"{m}\" using {api_version}: {p}"))
            .collect();
        format!(
            "Apply failed with {} conflicts:\n{}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut err = ApiError::new(409, "Conflict", message);
    err.details = Some(Box::new(json!({
        "name": ctx.name(),
        "group": ctx.rt.group,
        "kind": ctx.rt.plural,
        "causes": conflicts.iter().map(|(m, p)| json!({
            "reason": "FieldManagerConflict",
            "message": format!("conflict with \"{m}\" using {api_version}"),
            "field": p,
        })).collect::<Vec<_>>(),
    })));
    Err(err)
}

fn remember_apply(ctx: &Ctx, sub: &str, manager: &str, config: &Value) {
    if ctx.dry_run {
        return;
    }
    let mut state = ctx.inner.store.lock();
    if state.get(&ctx.rt.storage(), &ctx.ns, ctx.name()).is_none() {
        return;
    }
    state
        .applied
        .entry((ctx.rt.storage(), ctx.ns.clone(), ctx.name().to_string()))
        .or_default()
        .insert((sub.to_string(), manager.to_string()), config.clone());
}

async fn delete(ctx: &mut Ctx, options: &Value) -> Result<Value, ApiError> {
    if ctx.path.sub.is_some() {
        return Err(ApiError::method_not_allowed(
            "delete is not allowed on a subresource",
        ));
    }
    let orphan = options.get("propagationPolicy").and_then(Value::as_str) == Some("Orphan")
        || options.get("orphanDependents").and_then(Value::as_bool) == Some(true)
        || ctx
            .query
            .get("propagationPolicy")
            .is_some_and(|p| p == "Orphan");
    let dry_run = ctx.dry_run
        || options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    let name = ctx.name().to_string();
    let stored = read_current(ctx).ok_or_else(|| ApiError::not_found(&ctx.rt, &name))?;
    admit_delete(ctx, &stored, options).await?;
    let mut state = ctx.inner.store.lock();
    let current = state
        .get(&ctx.rt.storage(), &ctx.ns, &name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&ctx.rt, &name))?;
    if let Some(uid) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
        && meta_str(&current, "uid") != Some(uid)
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                ctx.rt.qualified(),
                meta_str(&current, "uid").unwrap_or("")
            ),
        ));
    }
    if let Some(rv) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && meta_str(&current, "resourceVersion") != Some(rv)
    {
        return Err(ApiError::conflict(&ctx.rt, &name));
    }
    if dry_run {
        return Ok(current);
    }
    state
        .delete(&ctx.rt.storage(), &ctx.ns, &name, orphan)
        .ok_or_else(|| ApiError::not_found(&ctx.rt, &name))
}

async fn delete_collection(ctx: &mut Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::from_query(&ctx.query)?;
    let mut state = ctx.inner.store.lock();
    let targets: Vec<(String, String)> = state
        .list(&ctx.rt.storage(), ctx.path.namespace.as_deref())
        .into_iter()
        .filter(|o| selectors.matches(o))
        .map(|o| {
            (
                meta_str(o, "namespace").unwrap_or("").to_string(),
                meta_str(o, "name").unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut items = Vec::new();
    for (ns, name) in targets {
        let deleted = if ctx.dry_run {
            state.get(&ctx.rt.storage(), &ns, &name).cloned()
        } else {
            state.delete(&ctx.rt.storage(), &ns, &name, false)
        };
        if let Some(obj) = deleted {
            items.push(ctx.present(&obj));
        }
    }
    let list = json!({
        "apiVersion": ctx.rt.api_version(),
        "kind": format!("{}List", ctx.rt.kind),
        "metadata": {"resourceVersion": state.rv.to_string()},
        "items": items,
    });
    Ok(json_response(StatusCode::OK, &list, &ctx.warnings))
}

/// The request's media type: the Content-Type without parameters (`; charset=...`).
fn media_type(headers: &HeaderMap) -> String {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    value.split(';').next().unwrap_or("").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_status_is_a_subresource_not_a_namespaced_list() {
        let Route::Resource(p) = parse_route("/api/v1/namespaces/foo/status") else {
            panic!("not a resource route");
        };
        assert_eq!(
            (p.plural.as_str(), p.name.as_deref(), p.sub.as_deref()),
            ("namespaces", Some("foo"), Some("status"))
        );
        let Route::Resource(p) = parse_route("/apis/example.com/v1/namespaces/ns/myapps/a/status")
        else {
            panic!("not a resource route");
        };
        assert_eq!(p.namespace.as_deref(), Some("ns"));
        assert_eq!(p.sub.as_deref(), Some("status"));
    }

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

    #[test]
    fn query_values_are_percent_decoded() {
        let q = parse_query(Some("labelSelector=app%3Dweb%2Ctier%21%3Dx&watch=true"));
        assert_eq!(q["labelSelector"], "app=web,tier!=x");
        assert_eq!(q["watch"], "true");
    }
}
