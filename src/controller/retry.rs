//! What a failed reconcile does next: exponential backoff with jitter per MyApp, one Warning
//! Event per failure streak, and nothing at all for a write the gate refused.

use std::{sync::Arc, time::Duration};

use kube::{
    Resource, ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};
use tracing::{debug, warn};

use super::{context::Context, events};
use crate::{Error, cache::CachedMyApp, fence};

/// Retries a failed object with exponential backoff and jitter, capped; other objects go on.
pub(super) fn error_policy(app: Arc<CachedMyApp>, error: &Error, ctx: Arc<Context>) -> Action {
    if fenced(error) {
        // Not a failure of the MyApp: the controller is stopping, the next leader takes over.
        debug!(name = %app.name_any(), %error, "Write fenced");
        return Action::await_change();
    }
    let attempt = ctx.failures.failed(ObjectRef::from_obj(app.as_ref()));
    let delay = backoff(attempt, ctx.config.backoff_base, ctx.config.backoff_cap);
    let name = app.name_any();
    let forbidden = status_forbidden(error);
    if forbidden {
        warn!(%name, %error, attempt, ?delay, fix = STATUS_FORBIDDEN_FIX, "Status write forbidden");
    } else {
        warn!(%name, %error, attempt, ?delay, "Reconcile failed, retrying");
    }
    if attempt == 1 {
        // One Event per failure streak, not per retry: Events are for people.
        let event = if forbidden {
            let note =
                format!("status not written, forbidden (403): {error}; {STATUS_FORBIDDEN_FIX}");
            events::warning("StatusWriteForbidden", note)
        } else {
            events::warning("ReconcileFailed", error.to_string())
        };
        ctx.publish_later(event, app.object_ref(&()));
    }
    Action::requeue(delay)
}

/// What grants the status write back when the API server refuses it for permission.
pub const STATUS_FORBIDDEN_FIX: &str = "grant patch on myapps/status (example.com) to the operator's ServiceAccount: kubectl apply -f deploy/base/rbac.yaml; myapp-operator check names what is missing";

/// Whether the API server refused a status write for permission (403).
fn status_forbidden(error: &Error) -> bool {
    matches!(error, Error::PatchStatus(kube::Error::Api(status)) if status.code == 403)
}

/// Whether `error` is a write the gate refused: this replica may no longer write.
fn fenced(error: &Error) -> bool {
    let (Error::ApplyDeployment(error)
    | Error::ApplyService(error)
    | Error::HandOffReplicas(error)
    | Error::PatchStatus(error)
    | Error::ReleaseShard(error)) = error
    else {
        return false;
    };
    fence::fenced(error)
}

/// `base * 2^(attempt-1)`, capped, then jittered by ±20 % so failing objects spread out.
pub(super) fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(30)));
    jitter(exp.min(cap), 0.2)
}

/// `d` moved by up to `spread` of itself, either way.
pub(super) fn jitter(d: Duration, spread: f64) -> Duration {
    d.mul_f64(1.0 + spread * (2.0 * fastrand::f64() - 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_attempt_and_stops_at_the_cap() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(10);
        for (attempt, nominal) in [
            (1, 100u64),
            (2, 200),
            (3, 400),
            (7, 6400),
            (8, 10_000),
            (40, 10_000),
        ] {
            let d = backoff(attempt, base, cap).as_millis() as u64;
            assert!(
                d >= nominal * 8 / 10 && d <= nominal * 12 / 10,
                "attempt {attempt}: {d} ms, nominal {nominal}"
            );
        }
    }

    #[test]
    fn only_a_status_write_refused_for_permission_is_told_as_such() {
        let refused = |code: u16| {
            Error::PatchStatus(kube::Error::Api(Box::new(
                kube::core::Status::failure("refused", "Refused").with_code(code),
            )))
        };
        assert!(status_forbidden(&refused(403)));
        assert!(!status_forbidden(&refused(500)));
        let other = Error::ApplyDeployment(kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Refused").with_code(403),
        )));
        assert!(!status_forbidden(&other), "only status writes");
    }

    #[test]
    fn every_write_the_gate_refused_is_told_as_fenced() {
        let refused = || kube::Error::Service(Box::new(crate::fence::Fenced));
        for error in [
            Error::ApplyDeployment(refused()),
            Error::ApplyService(refused()),
            Error::HandOffReplicas(refused()),
            Error::PatchStatus(refused()),
            Error::ReleaseShard(refused()),
        ] {
            assert!(fenced(&error), "{error}");
        }
        let reset = kube::Error::Service("connection reset".into());
        assert!(!fenced(&Error::ReleaseShard(reset)));
    }
}
