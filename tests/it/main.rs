//! The operator's integration tests, in one test binary (one link instead of one per file).

mod admission;
mod alerts;
mod binary;
mod bundle_memory;
mod chaos;
mod check;
mod crash;
mod crd;
mod dev;
mod e2e;
mod fields;
mod fuzz;
mod install;
mod layout;
mod manifests;
mod messages;
mod observe;
mod oracle;
mod pause;
mod phase;
mod rbac;
mod rollout;
mod run;
mod stale;
mod support;
mod user_roles;
