//! GET of one object, as JSON, PartialObjectMetadata or a one-row Table.

use axum::http::StatusCode;
use axum::response::Response;

use super::context::{Ctx, json_response};
use crate::status::ApiError;

/// Answers a GET of the object the URL names.
pub(super) fn get(ctx: &Ctx) -> Result<Response, ApiError> {
    let state = ctx.inner.store.lock();
    let obj = state
        .get(&ctx.rt.storage(), &ctx.ns, ctx.name())
        .ok_or_else(|| ApiError::not_found(&ctx.rt, ctx.name()))?;
    if ctx.table {
        let table = crate::table::table(&ctx.rt, &[obj], state.rv);
        return Ok(json_response(StatusCode::OK, &table, &[]));
    }
    Ok(ctx.respond(StatusCode::OK, obj))
}
