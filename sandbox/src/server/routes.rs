//! Routing: the URL and query parsed, the request log, non-resource paths, and the dispatch of a
//! resource request to its verb.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::access::{self, watching};
use super::context::{
    Ctx, FieldValidation, Inner, ResPath, json_response, media_type, not_found_path, parse_body,
};
use super::{create, delete, get, list, patch, protobuf, review, scale, update, watch};
use crate::faults::RequestRecord;
use crate::rbac::Attributes;
use crate::status::ApiError;
use crate::{discovery, openapi_v2};

/// The API server accepts request bodies up to 3 MiB.
const MAX_BODY: usize = 3 * 1024 * 1024;

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new().fallback(handle).with_state(inner)
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
    OpenApiV2,
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
        ["openapi", "v2"] => return Route::OpenApiV2,
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
        user: None,
        token_id: None,
        status: 0,
    };
    // Authentication, impersonation and authorization come before the handler reads the
    // body, as kube-apiserver's filter chain runs them.
    let identity = access::identify(&inner, &parts.headers);
    if let Ok(identity) = &identity
        && inner.tokens.enabled()
    {
        record.user = Some(identity.user.username.clone());
        record.token_id = identity.token_id.clone();
    }
    let response = match identity {
        Err(e) => e.into_response(),
        Ok(identity) => {
            let out = match route {
                Route::Resource(path) => {
                    record.resource = Some(path.plural.clone());
                    record.subresource = path.sub.clone();
                    record.namespace = path.namespace.clone();
                    record.name = path.name.clone();
                    let attrs =
                        access::resource_attributes(identity.user, &parts.method, &path, &query);
                    record.verb = attrs.verb.clone();
                    match access::authorize(&inner, &attrs) {
                        Err(e) => Err(e),
                        Ok(()) => match axum::body::to_bytes(body, MAX_BODY).await {
                            Err(_) => Err(too_large()),
                            Ok(bytes) => {
                                let request = RequestParts {
                                    method: &parts.method,
                                    headers: &parts.headers,
                                    query: &query,
                                };
                                resource(&inner, request, path, attrs, bytes).await
                            }
                        },
                    }
                }
                other => {
                    let attrs = Attributes::non_resource(
                        identity.user,
                        &parts.method.as_str().to_lowercase(),
                        parts.uri.path(),
                    );
                    access::authorize(&inner, &attrs)
                        .and_then(|()| non_resource(&inner, &parts.method, &parts.headers, other))
                }
            };
            out.unwrap_or_else(IntoResponse::into_response)
        }
    };
    record.status = response.status().as_u16();
    tracing::debug!(verb = %record.verb, path = %record.path, status = record.status, "Request");
    inner.faults.record(record);
    response
}

fn too_large() -> ApiError {
    ApiError::new(
        413,
        "RequestEntityTooLarge",
        "the request body is too large (limit 3 MiB)",
    )
}

/// What the verb handlers read of the HTTP request besides its path and body.
struct RequestParts<'a> {
    method: &'a Method,
    headers: &'a HeaderMap,
    query: &'a HashMap<String, String>,
}

fn non_resource(
    inner: &Arc<Inner>,
    method: &Method,
    headers: &HeaderMap,
    route: Route,
) -> Result<Response, ApiError> {
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
        Route::OpenApiV2 => {
            let document = openapi_v2::document(&registry);
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
            // kubectl asks for protobuf only; anyone else gets JSON, as kube-apiserver serves both.
            if accept.is_some_and(|a| {
                a.contains(openapi_v2::PROTOBUF_ASKED) || a.contains(openapi_v2::PROTOBUF)
            }) {
                let body = openapi_v2::protobuf(&document);
                return Ok(([(header::CONTENT_TYPE, openapi_v2::PROTOBUF)], body).into_response());
            }
            document
        }
        Route::Resource(_) | Route::Unknown => return Err(not_found_path()),
    };
    Ok(json_response(StatusCode::OK, &value, &[]))
}

async fn resource(
    inner: &Arc<Inner>,
    request: RequestParts<'_>,
    path: ResPath,
    attrs: Attributes,
    body: Bytes,
) -> Result<Response, ApiError> {
    let RequestParts {
        method,
        headers,
        query,
    } = request;
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
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
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
        attrs,
        field_manager: match query.get("fieldManager") {
            Some(manager) => manager.clone(),
            None => crate::managed::manager_from_user_agent(user_agent),
        },
        user_agent: user_agent.to_owned(),
        apply_config: None,
    };
    if review::is_review(&ctx.rt) {
        return review::review(&ctx, method, headers, &body);
    }
    let is_write = !matches!(*method, Method::GET | Method::HEAD);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // kubectl's typed clientset (create namespace, create configmap, ...) sends protobuf and
    // does not fall back: the kinds it creates so are decoded, the rest refused.
    let body = if is_write && !body.is_empty() && content_type.contains("protobuf") {
        let object = match ctx.rt.group.is_empty() {
            true => protobuf::decode_object(&ctx.rt.kind, &body).map_err(ApiError::bad_request)?,
            false => None,
        };
        let object = object.ok_or_else(|| {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the sandbox API server does not decode {content_type} for {}; send JSON (kubectl apply -f works)",
                    ctx.rt.qualified()
                ),
            )
        })?;
        Bytes::from(object.to_string())
    } else {
        body
    };
    // A stalled client's write is held before anything else can refuse it, a queued fault
    // included: that fault is for whoever writes after the release.
    let slot = match is_write {
        true => inner.faults.stall_write(&ctx.user_agent).await?,
        false => None,
    };
    let field_manager = query.get("fieldManager").map(String::as_str);
    if is_write && let Some(err) = inner.faults.take_write_fault(field_manager) {
        return Err(err);
    }
    let answer = dispatch(&mut ctx, method, headers, &body).await;
    // Counted once committed: a refused write or a dry run gives its slot back (on drop).
    let code = match &answer {
        Ok(response) => response.status().as_u16(),
        Err(e) => e.code,
    };
    if let Some(slot) = slot
        && code < 400
        && !ctx.dry_run
    {
        slot.accept();
    }
    answer
}

/// Runs the verb a resource request names.
async fn dispatch(
    ctx: &mut Ctx,
    method: &Method,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let query = &ctx.query;
    let has_name = ctx.path.name.is_some();
    if ctx.path.sub.as_deref() == Some("scale") {
        return scale::scale_request(ctx, method, headers, body).await;
    }
    match (method.clone(), has_name) {
        (Method::GET, false) => {
            if watching(query) {
                watch::watch(ctx)
            } else {
                list::list(ctx)
            }
        }
        (Method::GET, true) => get::get(ctx),
        (Method::POST, false) => {
            let obj = parse_body(body)?;
            // etcd3's store refuses it (`ErrResourceVersionSetOnCreate`), a plain error the
            // handler answers as 500 with no reason; a dry run never reaches the store.
            if !ctx.dry_run
                && obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|rv| !rv.is_empty())
            {
                return Err(ApiError::new(
                    500,
                    "",
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            let created = create::create(ctx, obj).await?;
            Ok(ctx.respond(StatusCode::CREATED, &created))
        }
        (Method::PUT, true) => {
            let obj = parse_body(body)?;
            let (code, updated) = update::update(ctx, obj).await?;
            Ok(ctx.respond(code, &updated))
        }
        (Method::PATCH, true) => {
            let content_type = media_type(headers);
            let (code, patched) = patch::patch_object(ctx, &content_type, body).await?;
            Ok(ctx.respond(code, &patched))
        }
        (Method::DELETE, true) => delete::delete_request(ctx, body).await,
        (Method::DELETE, false) => delete::delete_collection(ctx).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        ))),
    }
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
    fn query_values_are_percent_decoded() {
        let q = parse_query(Some("labelSelector=app%3Dweb%2Ctier%21%3Dx&watch=true"));
        assert_eq!(q["labelSelector"], "app=web,tier!=x");
        assert_eq!(q["watch"], "true");
    }
}
