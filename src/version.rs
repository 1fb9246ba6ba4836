//! What this binary is, as `--version` and `myapp_build_info` report it (stamped by `build.rs`).

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit built, or `unknown` for a build from a tree without `.git` and without
/// `MYAPP_GIT_COMMIT` set.
pub const GIT_COMMIT: &str = env!("MYAPP_GIT_COMMIT");
/// The version of the compiler that built the binary.
pub const RUSTC: &str = env!("MYAPP_RUSTC_VERSION");
/// `--version`'s text after the program name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MYAPP_GIT_COMMIT"),
    ", rustc ",
    env!("MYAPP_RUSTC_VERSION"),
    ")"
);
