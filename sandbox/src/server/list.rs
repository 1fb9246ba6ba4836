//! LIST: one page of a collection, with selectors and `limit`/`continue` paging.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::context::{Ctx, Selectors, decoded, json_response};
use crate::status::ApiError;

pub(super) fn list(ctx: &Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::from_request(ctx)?;
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
    let ns = ctx.path.namespace.as_deref();
    let after = from.as_ref().map(|f| &f.after);
    if let Some(hold) = ctx.inner.faults.read_hold(&ctx.user_agent) {
        // A lagging server has one version to offer, whatever was asked.
        let snapshot = &hold.snapshot;
        let objects = snapshot.list_after(&ctx.rt.storage(), ns, after);
        return Ok(answer(ctx, &selectors, limit, snapshot.rv, objects));
    }
    let mut state = ctx.inner.store.lock();
    if ctx.rt.kind == "Event" {
        // Expired Events are gone even when nothing has been written since.
        state.expire_events();
    }
    let state = state;
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
    let objects = state.list_after(&ctx.rt.storage(), ns, after);
    let list = answer(ctx, &selectors, limit, list_rv, objects);
    drop(state);
    Ok(list)
}

/// One page of `objects` (those after the continue key), as a list at version `list_rv`.
fn answer<'a>(
    ctx: &Ctx,
    selectors: &Selectors,
    limit: Option<usize>,
    list_rv: u64,
    objects: impl Iterator<Item = (&'a (String, String), &'a Value)>,
) -> Response {
    let mut matching = objects.filter(|(_, o)| selectors.matches(o));
    let mut page: Vec<&Value> = Vec::new();
    let mut last = None;
    for (key, object) in matching.by_ref() {
        page.push(object);
        last = Some(key);
        if limit.is_some_and(|limit| page.len() == limit) {
            break;
        }
    }
    // How many are left after this page, counted only without selectors, as etcd3's store
    // does (`GetList`: it counts the remaining keys, which a selector would not filter).
    let remaining = match last {
        Some(_) if limit.is_some() && selectors.is_empty() => matching.by_ref().count(),
        Some(_) if limit.is_some() => usize::from(matching.next().is_some()),
        _ => 0,
    };
    drop(matching);
    let next = match last {
        Some(after) if remaining > 0 => Some(
            ListContinue {
                rv: list_rv,
                after: after.clone(),
            }
            .encode(),
        ),
        _ => None,
    };
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if let Some(shard) = selectors.shard() {
        metadata["shardInfo"] = json!({"selector": shard.text()});
    }
    if let Some(next) = next {
        metadata["continue"] = json!(next);
        if selectors.is_empty() {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if ctx.table {
        let page: Vec<_> = page.into_iter().map(|o| decoded(&ctx.rt, o)).collect();
        let page: Vec<&Value> = page.iter().map(|o| &**o).collect();
        let mut table = crate::table::table(&ctx.rt, &page, list_rv);
        table["metadata"] = metadata;
        return json_response(StatusCode::OK, &table, &[]);
    }
    let items: Vec<Value> = page
        .into_iter()
        .map(|o| ctx.present(o).into_owned())
        .collect();
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
    json_response(StatusCode::OK, &list, &[])
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
