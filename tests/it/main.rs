//! The operator's integration tests, in one test binary (one link instead of one per file).

mod admission;
mod crd;
mod dev;
mod e2e;
mod install;
mod layout;
mod manifests;
mod rbac;
mod rollout;
mod run;
mod support;
