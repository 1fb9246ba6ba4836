//! Waiting for the operator to converge, shared by the operator's integration tests.
#![allow(dead_code)]

use std::{future::Future, time::Duration};

use kube::Api;
use myapp_operator::crd::{MyApp, Phase};

/// Upper bound for convergence: generous, since CI machines are slow; never a timing assertion.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// Polls `check` until it returns `Some`, or panics with `what` after [`CONVERGE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not happen within {CONVERGE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the MyApp reports `phase` for its current generation.
pub async fn converged(apps: &Api<MyApp>, name: &str, phase: Phase) -> MyApp {
    eventually(
        &format!("{name} reports {phase:?} for its current generation"),
        || async {
            let app = apps.get(name).await.ok()?;
            let status = app.status.as_ref()?;
            (status.phase == Some(phase) && status.observed_generation == app.metadata.generation)
                .then_some(app)
        },
    )
    .await
}
