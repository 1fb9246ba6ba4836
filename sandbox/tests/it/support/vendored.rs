//! The upstream CRDs vendored under `tests/data/crds/` (provenance and licence beside them).

use std::path::PathBuf;

/// The text of `tests/data/crds/<path>`.
pub fn vendored_crd(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/crds")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}
