//! kube-sandbox's integration tests, in one test binary: the real kube client, kubectl and
//! webhooks against the sandbox.

mod admission;
mod apply_order;
mod builtins;
mod bundles;
mod cel_rules;
mod crd_validation;
mod create;
mod events;
mod explain;
mod faults;
mod formats;
mod gateway;
mod gateway_cel;
mod identity;
mod kube_client;
mod kubectl;
mod kubectl_auth;
mod lists;
mod managed_fields;
mod object_limits;
mod omitempty;
mod pods;
mod printers;
mod rbac;
mod retention;
mod reviews;
mod strict;
mod support;
mod validating_policies;
mod webhooks;
