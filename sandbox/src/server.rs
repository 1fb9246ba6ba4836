//! The HTTP layer, one file per verb as kube-apiserver's `endpoints/handlers` has it.

mod access;
mod context;
mod create;
mod delete;
mod get;
mod list;
mod meta;
mod patch;
mod protobuf;
mod review;
mod routes;
mod scale;
mod update;
mod watch;
mod write;

pub(crate) use context::Inner;
pub(crate) use create::new_namespace;
pub(crate) use routes::router;
