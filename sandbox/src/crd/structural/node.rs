//! What every check reads of a schema node: the level it sits at, and its properties.

use serde_json::Value;

/// The schema's own level, which decides the wording of a missing `type`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Root,
    Field,
    Item,
}

/// The `properties` of a schema node, in the schema's order.
pub(super) fn properties(s: &Value) -> impl Iterator<Item = (&String, &Value)> {
    s.get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}
