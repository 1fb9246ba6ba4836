//! Whether an observed object holds everything a desired one sets, read as the observed object
//! serializes: no `serde_json::Value` is built for it.
//!
//! [`contains`] is the rule, over two `Value`s. [`serialized_contains`] answers the same for any
//! `Serialize` observed object by walking its serialization against the desired `Value`, field
//! by field; a shape it does not walk (enum variants with data, tuples, bytes, 128-bit
//! integers, map keys that are not strings) falls back to converting the observed object.

use serde::{
    Serialize,
    ser::{self, Impossible},
};
use serde_json::{Map, Value};

/// Whether `observed` holds `desired`: every field of `desired` is present and equal in
/// `observed` (a null desired field matches anything, or nothing); lists match when each
/// desired item is contained in some observed item.
pub(super) fn contains(observed: &Value, desired: &Value) -> bool {
    match (observed, desired) {
        (_, Value::Null) => true,
        (Value::Object(o), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| o.get(k).is_some_and(|ov| contains(ov, dv)) || dv.is_null()),
        (Value::Array(o), Value::Array(d)) => {
            d.iter().all(|dv| o.iter().any(|ov| contains(ov, dv)))
        }
        (o, d) => o == d,
    }
}

/// [`contains`] of `observed` as `serde_json::to_value` would give it; false if it does not
/// serialize.
pub(super) fn serialized_contains<T: Serialize + ?Sized>(observed: &T, desired: &Value) -> bool {
    match observed.serialize(Walk(desired)) {
        Ok(held) => held,
        Err(Unwalked::Shape) => {
            serde_json::to_value(observed).is_ok_and(|observed| contains(&observed, desired))
        }
        Err(Unwalked::Failed) => false,
    }
}

/// Why a walk gave no answer.
#[derive(Debug)]
enum Unwalked {
    /// A shape the walk does not follow: convert instead.
    Shape,
    /// The object failed to serialize.
    Failed,
}

impl std::fmt::Display for Unwalked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Shape => "a shape the walk does not follow",
            Self::Failed => "the object failed to serialize",
        })
    }
}

impl std::error::Error for Unwalked {}

impl ser::Error for Unwalked {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Self::Failed
    }
}

/// Serializes an observed value into whether it holds the desired one.
#[derive(Clone, Copy)]
struct Walk<'d>(&'d Value);

impl<'d> Walk<'d> {
    /// A scalar: held when equal, as `Value`s compare.
    fn scalar(self, observed: impl Into<Value>) -> Result<bool, Unwalked> {
        Ok(self.0.is_null() || *self.0 == observed.into())
    }
}

/// Walks `observed` against `desired`.
fn walk<T: Serialize + ?Sized>(observed: &T, desired: &Value) -> Result<bool, Unwalked> {
    observed.serialize(Walk(desired))
}

impl<'d> ser::Serializer for Walk<'d> {
    type Ok = bool;
    type Error = Unwalked;
    type SerializeSeq = Items<'d>;
    type SerializeTuple = Impossible<bool, Unwalked>;
    type SerializeTupleStruct = Impossible<bool, Unwalked>;
    type SerializeTupleVariant = Impossible<bool, Unwalked>;
    type SerializeMap = Fields<'d>;
    type SerializeStruct = Fields<'d>;
    type SerializeStructVariant = Impossible<bool, Unwalked>;

    fn serialize_bool(self, v: bool) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_i8(self, v: i8) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_i16(self, v: i16) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_i32(self, v: i32) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_i64(self, v: i64) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_u8(self, v: u8) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_u16(self, v: u16) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_u32(self, v: u32) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_u64(self, v: u64) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_i128(self, _: i128) -> Result<bool, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_u128(self, _: u128) -> Result<bool, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_f32(self, v: f32) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_f64(self, v: f64) -> Result<bool, Unwalked> {
        self.scalar(v)
    }
    fn serialize_char(self, v: char) -> Result<bool, Unwalked> {
        let mut buffer = [0; 4];
        self.serialize_str(v.encode_utf8(&mut buffer))
    }
    fn serialize_str(self, v: &str) -> Result<bool, Unwalked> {
        Ok(match self.0 {
            Value::Null => true,
            Value::String(desired) => desired == v,
            _ => false,
        })
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<bool, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_none(self) -> Result<bool, Unwalked> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<bool, Unwalked> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<bool, Unwalked> {
        self.scalar(Value::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<bool, Unwalked> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<bool, Unwalked> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<bool, Unwalked> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<bool, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Items<'d>, Unwalked> {
        Items::new(self.0)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Fields<'d>, Unwalked> {
        Ok(Fields::new(self.0))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Fields<'d>, Unwalked> {
        Ok(Fields::new(self.0))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Unwalked> {
        Err(Unwalked::Shape)
    }
}

/// An observed object, field by field, against what is desired of it.
enum Fields<'d> {
    /// Nothing is desired of it (null): held.
    Anything,
    /// Something other than an object is desired: not held.
    NotAnObject,
    /// The desired object's fields, and how many non-null ones the observed fields held so
    /// far; `None` once one did not.
    Of {
        desired: &'d Map<String, Value>,
        held: Option<usize>,
        /// The desired field the key just given names (map entries come key, then value).
        pending: Option<&'d Value>,
    },
}

impl<'d> Fields<'d> {
    fn new(desired: &'d Value) -> Self {
        match desired {
            Value::Null => Self::Anything,
            Value::Object(desired) => Self::Of {
                desired,
                held: Some(0),
                pending: None,
            },
            _ => Self::NotAnObject,
        }
    }

    /// One observed field, whose desired counterpart (if any) is `desired`.
    fn field<T: Serialize + ?Sized>(
        &mut self,
        desired: Option<&'d Value>,
        observed: &T,
    ) -> Result<(), Unwalked> {
        let Self::Of { held, .. } = self else {
            return Ok(());
        };
        let (Some(count), Some(desired)) = (*held, desired) else {
            return Ok(());
        };
        // A null desired field is held whether or not the observed object has it.
        if !desired.is_null() {
            *held = walk(observed, desired)?.then_some(count + 1);
        }
        Ok(())
    }

    fn finish(self) -> bool {
        match self {
            Self::Anything => true,
            Self::NotAnObject => false,
            Self::Of { desired, held, .. } => {
                held == Some(desired.values().filter(|v| !v.is_null()).count())
            }
        }
    }
}

impl<'d> ser::SerializeStruct for Fields<'d> {
    type Ok = bool;
    type Error = Unwalked;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Unwalked> {
        let desired = match self {
            Self::Of { desired, .. } => desired.get(key),
            _ => None,
        };
        self.field(desired, value)
    }

    fn end(self) -> Result<bool, Unwalked> {
        Ok(self.finish())
    }
}

impl<'d> ser::SerializeMap for Fields<'d> {
    type Ok = bool;
    type Error = Unwalked;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Unwalked> {
        if let Self::Of {
            desired, pending, ..
        } = self
        {
            *pending = key.serialize(Key(desired))?;
        }
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unwalked> {
        let desired = match self {
            Self::Of { pending, .. } => pending.take(),
            _ => None,
        };
        self.field(desired, value)
    }

    fn end(self) -> Result<bool, Unwalked> {
        Ok(self.finish())
    }
}

/// An observed list, item by item: each desired item must be held by some observed item.
enum Items<'d> {
    Anything,
    NotAList,
    /// The desired items, and which of them an observed item held so far (bit `i` for item
    /// `i`).
    Of {
        desired: &'d [Value],
        held: u64,
    },
}

impl<'d> Items<'d> {
    fn new(desired: &'d Value) -> Result<Self, Unwalked> {
        Ok(match desired {
            Value::Null => Self::Anything,
            // More desired items than the mask has bits: convert instead.
            Value::Array(desired) if desired.len() > 64 => return Err(Unwalked::Shape),
            Value::Array(desired) => Self::Of { desired, held: 0 },
            _ => Self::NotAList,
        })
    }
}

impl<'d> ser::SerializeSeq for Items<'d> {
    type Ok = bool;
    type Error = Unwalked;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unwalked> {
        if let Self::Of { desired, held } = self {
            for (i, desired) in desired.iter().enumerate() {
                if *held & (1 << i) == 0 && walk(value, desired)? {
                    *held |= 1 << i;
                }
            }
        }
        Ok(())
    }

    fn end(self) -> Result<bool, Unwalked> {
        Ok(match self {
            Self::Anything => true,
            Self::NotAList => false,
            Self::Of { desired, held } => held.count_ones() as usize == desired.len(),
        })
    }
}

/// Serializes a map key into the desired field it names, as serde_json writes keys: strings
/// as they are; other keys make the walk convert instead.
struct Key<'d>(&'d Map<String, Value>);

impl<'d> ser::Serializer for Key<'d> {
    type Ok = Option<&'d Value>;
    type Error = Unwalked;
    type SerializeSeq = Impossible<Self::Ok, Unwalked>;
    type SerializeTuple = Impossible<Self::Ok, Unwalked>;
    type SerializeTupleStruct = Impossible<Self::Ok, Unwalked>;
    type SerializeTupleVariant = Impossible<Self::Ok, Unwalked>;
    type SerializeMap = Impossible<Self::Ok, Unwalked>;
    type SerializeStruct = Impossible<Self::Ok, Unwalked>;
    type SerializeStructVariant = Impossible<Self::Ok, Unwalked>;

    fn serialize_str(self, v: &str) -> Result<Self::Ok, Unwalked> {
        Ok(self.0.get(v))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Self::Ok, Unwalked> {
        value.serialize(self)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Self::Ok, Unwalked> {
        self.serialize_str(variant)
    }
    fn serialize_bool(self, _: bool) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_i8(self, _: i8) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_i16(self, _: i16) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_i32(self, _: i32) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_i64(self, _: i64) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_u8(self, _: u8) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_u16(self, _: u16) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_u32(self, _: u32) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_u64(self, _: u64) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_i128(self, _: i128) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_u128(self, _: u128) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_f32(self, _: f32) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_f64(self, _: f64) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_char(self, _: char) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_none(self) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_unit(self) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, Unwalked> {
        Err(Unwalked::Shape)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Unwalked> {
        Err(Unwalked::Shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// JSON values, small enough to nest, with few distinct keys and scalars so that two of
    /// them often share fields and items.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-2i64..3).prop_map(Value::from),
            Just(json!(1.5)),
            Just(json!(u64::MAX)),
            prop::sample::select(vec!["a", "b", ""]).prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(String::from),
                    inner,
                    0..4
                )
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
            ]
        })
    }

    /// `desired` made of `observed`: some of its fields and items, so that it is often held.
    fn part_of(observed: &Value, seed: u64) -> Value {
        let keep = |i: usize| (seed >> (i % 61)) & 1 == 1;
        match observed {
            Value::Object(fields) => Value::Object(
                fields
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i))
                    .map(|(i, (k, v))| (k.clone(), part_of(v, seed.rotate_left(i as u32 + 1))))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i + 7))
                    .map(|(i, v)| part_of(v, seed.rotate_left(i as u32 + 3)))
                    .rev()
                    .collect(),
            ),
            scalar => scalar.clone(),
        }
    }

    proptest! {
        #[test]
        fn walking_agrees_with_comparing_values(observed in value(), desired in value()) {
            prop_assert_eq!(
                serialized_contains(&observed, &desired),
                contains(&observed, &desired)
            );
        }

        #[test]
        fn walking_agrees_with_comparing_values_on_parts(observed in value(), seed in any::<u64>()) {
            let desired = part_of(&observed, seed);
            prop_assert!(contains(&observed, &desired));
            prop_assert!(serialized_contains(&observed, &desired));
        }
    }

    #[test]
    fn a_typed_object_is_walked_as_its_json() {
        let observed = k8s_openapi::api::core::v1::ServicePort {
            name: Some("http".into()),
            port: 8080,
            target_port: Some(
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into()),
            ),
            ..Default::default()
        };
        let held = json!({"name": "http", "port": 8080, "targetPort": "http"});
        assert!(serialized_contains(&observed, &held));
        for not_held in [
            json!({"port": 8081}),
            json!({"protocol": "TCP"}),
            json!({"targetPort": 8080}),
            json!({"name": {"http": null}}),
            json!([]),
        ] {
            assert!(!serialized_contains(&observed, &not_held), "{not_held}");
        }
        assert!(serialized_contains(&observed, &json!({"protocol": null})));
    }

    #[test]
    fn shapes_the_walk_does_not_follow_are_converted() {
        #[derive(Serialize)]
        enum Shape {
            Pair(i32, i32),
        }
        let observed = json!({"a": [1, 2]});
        assert_eq!(
            Shape::Pair(1, 2)
                .serialize(Walk(&observed["a"]))
                .unwrap_err()
                .to_string(),
            Unwalked::Shape.to_string()
        );
        assert!(serialized_contains(
            &Shape::Pair(1, 2),
            &json!({"Pair": [2]})
        ));
        assert!(!serialized_contains(
            &Shape::Pair(1, 2),
            &json!({"Pair": [3]})
        ));
        assert!(serialized_contains(&7i128, &json!(7)));
        assert!(!serialized_contains(&7u128, &json!(8)));
        let many: Vec<i32> = (0..70).collect();
        assert!(serialized_contains(
            &many,
            &json!((0..65).collect::<Vec<_>>())
        ));
    }
}
