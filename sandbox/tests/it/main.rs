//! kube-sandbox's integration tests, in one test binary: the real kube client, kubectl and
//! webhooks against the sandbox.

mod admission;
mod faults;
mod kube_client;
mod kubectl;
mod support;
mod webhooks;
