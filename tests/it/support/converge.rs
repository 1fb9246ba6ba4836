//! Waiting for the operator to converge, shared by the operator's integration tests.

use kube::Api;
use myapp_operator::crd::{MyApp, Phase};

pub use kube_sandbox::testing::eventually;

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
