//! Pieces of the answer that need nothing else of the review path: the warnings' bounds and
//! the uid read on its own from an envelope that does not parse.

use std::borrow::Cow;

use serde::Deserialize;
use tracing::warn;

/// Warnings longer than this are cut: kubectl prints them one per line.
pub const MAX_WARNING_CHARS: usize = 120;

/// At most this many warnings are returned; the rest are logged and dropped.
pub const MAX_WARNINGS: usize = 8;

/// The warnings cut to [`MAX_WARNINGS`] of at most [`MAX_WARNING_CHARS`] characters each.
pub(super) fn bounded(mut warnings: Vec<String>) -> Vec<String> {
    if warnings.len() > MAX_WARNINGS {
        warn!(
            dropped = warnings.len() - MAX_WARNINGS,
            "Dropped admission warnings over the limit"
        );
        warnings.truncate(MAX_WARNINGS);
    }
    for warning in &mut warnings {
        if let Some((cut, _)) = warning.char_indices().nth(MAX_WARNING_CHARS) {
            warning.truncate(cut);
        }
    }
    warnings
}

/// The envelope's `request.uid` when the envelope as a whole does not parse (a field of the
/// wrong type elsewhere): read on its own, every other field skipped. Empty when unreadable.
pub(super) fn readable_uid(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct UidOnly<'a> {
        #[serde(borrow)]
        request: Option<UidIn<'a>>,
    }
    #[derive(Deserialize)]
    struct UidIn<'a> {
        #[serde(borrow)]
        uid: Option<Cow<'a, str>>,
    }
    serde_json::from_slice::<UidOnly<'_>>(body)
        .ok()
        .and_then(|r| r.request?.uid)
        .map(Cow::into_owned)
        .unwrap_or_default()
}
