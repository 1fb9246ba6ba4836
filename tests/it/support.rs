//! What several test modules share.

pub mod converge;
pub mod install;
pub mod operator;

/// The dev environment (sandbox, webhook, admission chain) on a temporary directory, which
/// lives as long as the returned guard.
pub async fn dev_environment() -> (myapp_operator::dev::Environment, tempfile::TempDir) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let options = myapp_operator::dev::Options::ephemeral(dir.path().to_owned());
    let env = myapp_operator::dev::Environment::start(options)
        .await
        .expect("environment starts");
    (env, dir)
}

/// One current-thread runtime for property tests, whose cases are plain closures.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}
