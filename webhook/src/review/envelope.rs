//! Pieces of the answer that need nothing else of the review path: the warnings' bounds, the
//! bounds of user input echoed in messages, and the uid read on its own from an envelope that
//! does not parse.

use std::borrow::Cow;

use serde::Deserialize;
use tracing::warn;

/// Warnings longer than this are cut: kubectl prints them one per line.
pub const MAX_WARNING_CHARS: usize = 120;

/// At most this many warnings are returned; the rest are logged and dropped.
pub const MAX_WARNINGS: usize = 8;

/// User input echoed in a message is cut to this many characters. Every legal object name
/// (253) and most image references fit; a denial echoing a 5 MiB name would be a 5 MiB answer
/// and log line.
pub const MAX_ECHO_CHARS: usize = 256;

/// Messages built around text we do not control (serde's, a panic's) are cut to this many
/// characters: serde quotes a wrongly typed string value whole.
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// `value` as messages show user input: quoted as `{:?}` does, and when longer than
/// [`MAX_ECHO_CHARS`] characters cut with an ellipsis and followed by its length,
/// `"abc…" (1048576 bytes)`.
pub fn quoted(value: &str) -> String {
    match value.char_indices().nth(MAX_ECHO_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!(
            "{:?} ({} bytes)",
            format!("{}…", &value[..cut]),
            value.len()
        ),
    }
}

/// `message` cut to `max` characters with an ellipsis and its length.
pub(super) fn shorten(message: String, max: usize) -> String {
    match message.char_indices().nth(max) {
        None => message,
        Some((cut, _)) => format!(
            "{}… (message of {} bytes cut)",
            &message[..cut],
            message.len()
        ),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_input_is_quoted_and_cut_with_an_ellipsis_and_its_length() {
        assert_eq!(quoted("web"), "\"web\"");
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        let fits = "é".repeat(MAX_ECHO_CHARS);
        assert_eq!(quoted(&fits), format!("{fits:?}"));
        let long = format!("{fits}x");
        assert_eq!(
            quoted(&long),
            format!("\"{fits}…\" ({} bytes)", 2 * MAX_ECHO_CHARS + 1)
        );
        let huge = quoted(&"n".repeat(1 << 20));
        assert!(huge.ends_with("…\" (1048576 bytes)"), "{huge}");
        assert!(huge.len() < MAX_ECHO_CHARS + 40);
    }

    #[test]
    fn long_messages_are_cut_and_say_how_long_they_were() {
        assert_eq!(shorten("short".to_owned(), 5), "short");
        let cut = shorten("m".repeat(5000), MAX_MESSAGE_CHARS);
        assert!(cut.ends_with("… (message of 5000 bytes cut)"), "{cut}");
        assert!(cut.len() < MAX_MESSAGE_CHARS + 40);
    }
}
