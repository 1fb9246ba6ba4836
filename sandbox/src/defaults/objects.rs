//! Walking the JSON objects the defaults fill in.

use serde_json::{Map, Value};

/// Each object of the array at `map[key]`, if there is such an array.
pub(super) fn array_objects<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    map.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}
