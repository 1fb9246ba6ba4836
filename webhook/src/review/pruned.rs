//! The request object cut down to what the rule's type has, for the patch walk.
//!
//! The walk never looks anywhere else, and a value tree costs ten times its JSON: skipping the
//! rest (managed fields, the last-applied annotation, unknown fields of any size or depth)
//! saves most of the parsing and the memory. Each kept member is read in one pass, keeping
//! what the shape asks for as it goes.

use std::fmt;

use serde::{
    Deserialize, Deserializer,
    de::{
        DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
        value::{MapAccessDeserializer, SeqAccessDeserializer},
    },
};
use serde_json::{Map, Number, Value};

use super::object::{self, Key, Member};

/// The object's members as a JSON value holding only what `wanted` (the typed value,
/// serialised) has: in objects the members `wanted` has, recursively; in arrays every element,
/// each cut down by its typed counterpart. A value whose type differs from its counterpart's
/// is kept whole (the walk refuses it).
pub(super) fn pruned(
    members: &[Member<'_>],
    wanted: &Map<String, Value>,
) -> Result<Value, serde_json::Error> {
    let mut partial = Map::new();
    for (key, shape) in wanted {
        if let Some(raw) = object::member(members, key) {
            let mut json = serde_json::Deserializer::from_str(raw.get());
            partial.insert(key.clone(), Shaped(shape).deserialize(&mut json)?);
        }
    }
    Ok(Value::Object(partial))
}

/// Reads a JSON value keeping what `shape` has (see [`pruned`]).
struct Shaped<'s>(&'s Value);

impl<'de> DeserializeSeed<'de> for Shaped<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.0 {
            Value::Object(_) | Value::Array(_) => deserializer.deserialize_any(self),
            _ => Value::deserialize(deserializer),
        }
    }
}

impl<'de> Visitor<'de> for Shaped<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Value::Object(wanted) = self.0 else {
            return Value::deserialize(MapAccessDeserializer::new(map));
        };
        let mut partial = Map::new();
        while let Some(Key(key)) = map.next_key()? {
            match wanted.get_key_value(&*key) {
                // A key twice: the last is kept, as a JSON object's reader keeps it.
                Some((name, shape)) => {
                    let value = map.next_value_seed(Shaped(shape))?;
                    partial.insert(name.clone(), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(partial))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let Value::Array(items) = self.0 else {
            return Value::deserialize(SeqAccessDeserializer::new(seq));
        };
        let mut elements = Vec::new();
        loop {
            let element = match items.get(elements.len()) {
                Some(shape) => seq.next_element_seed(Shaped(shape))?,
                None => seq.next_element::<Value>()?,
            };
            match element {
                Some(element) => elements.push(element),
                None => return Ok(Value::Array(elements)),
            }
        }
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::review::object::Object;

    fn pruned_as(json: &str, shape: Value) -> Value {
        let Ok(Object::Members(members)) = serde_json::from_str::<Object<'_>>(json) else {
            panic!("not an object: {json}")
        };
        let Value::Object(wanted) = shape else {
            panic!("not an object: {shape}")
        };
        pruned(&members, &wanted).unwrap()
    }

    #[test]
    fn only_what_the_shape_has_is_kept() {
        let json = r#"{"metadata": {"managedFields": [{"f": {}}]}, "spec": {"port": 80,
            "env": [{"name": "A", "value": "1", "extra": [1]}, {"name": "B"}, {"name": "C"}],
            "future": {"x": 1}}}"#;
        let shape = json!({"spec": {"port": 0, "env": [{"name": "", "value": ""}, {"name": ""}]}});
        assert_eq!(
            pruned_as(json, shape),
            json!({"spec": {"port": 80,
                "env": [{"name": "A", "value": "1"}, {"name": "B"}, {"name": "C"}]}})
        );
    }

    #[test]
    fn a_value_of_another_type_than_its_shape_is_kept_whole() {
        let json = r#"{"spec": {"env": {"a": [1, {"b": null}]}, "port": [1.5, true, "x"]}}"#;
        let shape = json!({"spec": {"env": [{"name": ""}], "port": {"x": 1}}});
        assert_eq!(
            pruned_as(json, shape),
            json!({"spec": {"env": {"a": [1, {"b": null}]}, "port": [1.5, true, "x"]}})
        );
    }

    #[test]
    fn the_last_of_a_key_twice_is_kept() {
        let json = r#"{"spec": {"port": 1, "port": 2}, "spec": {"port": 3, "port": 4}}"#;
        assert_eq!(
            pruned_as(json, json!({"spec": {"port": 0}})),
            json!({"spec": {"port": 4}})
        );
    }
}
