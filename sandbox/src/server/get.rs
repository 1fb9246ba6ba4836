//! GET of one object, as JSON, PartialObjectMetadata or a one-row Table.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::context::{Ctx, decoded, json_response};
use crate::status::ApiError;

/// Answers a GET of the object the URL names (from the held snapshot for a client whose reads
/// are held).
pub(super) fn get(ctx: &Ctx) -> Result<Response, ApiError> {
    if let Some(hold) = ctx.inner.faults.read_hold(&ctx.user_agent) {
        let snapshot = &hold.snapshot;
        let obj = snapshot.get(&ctx.rt.storage(), &ctx.ns, ctx.name());
        return answer(ctx, obj, snapshot.rv);
    }
    let state = ctx.inner.store.lock();
    let obj = state.get(&ctx.rt.storage(), &ctx.ns, ctx.name());
    answer(ctx, obj, state.rv)
}

fn answer(ctx: &Ctx, obj: Option<&Value>, rv: u64) -> Result<Response, ApiError> {
    let obj = obj.ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
    if ctx.table {
        let obj = decoded(&ctx.rt, obj);
        let table = crate::table::table(&ctx.rt, &[&obj], rv);
        return Ok(json_response(StatusCode::OK, &table, &[]));
    }
    Ok(ctx.respond(StatusCode::OK, obj))
}
