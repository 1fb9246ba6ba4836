//! What several test modules share.

pub mod converge;
pub mod install;
pub mod operator;

/// One current-thread runtime for property tests, whose cases are plain closures.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}
