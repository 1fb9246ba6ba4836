//! `request.object` and `request.oldObject` read member by member, in the envelope's one pass
//! over the body.
//!
//! Each top-level member is kept as its key and the raw text of its value, borrowed from the
//! body. The rule's type is then read from those members, and the members it does not know
//! (managed fields, the last-applied annotation's `metadata`, on a mutating route everything
//! but the spec) are skipped without being scanned again; the mutating route's patch finds the
//! members it needs the same way. Read as one raw value, then as the rule's type, then again to
//! prune it for the patch, an object had its every byte scanned three times: the mutating
//! route cost 1.75 times a `serde_json::Value` parse of the whole review.

use std::{borrow::Cow, fmt, marker::PhantomData, slice};

use serde::{
    Deserialize, Deserializer,
    de::{
        self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Unexpected, Visitor,
        value::{BorrowedStrDeserializer, StrDeserializer},
    },
    forward_to_deserialize_any,
};
use serde_json::value::RawValue;

/// The most top-level members an object is read with. A Kubernetes object has a handful
/// (`apiVersion`, `kind`, `metadata`, `spec`, `status`...); each kept member costs 40 bytes, so
/// without a limit a body of a million tiny members would cost seven times its size.
pub const MAX_MEMBERS: usize = 64;

/// One member: its key and the raw JSON text of its value.
pub(super) type Member<'a> = (Cow<'a, str>, &'a RawValue);

/// An object as the envelope's parse leaves it (JSON `null` is `None` around it).
#[derive(Debug)]
pub(super) enum Object<'a> {
    /// A JSON object: its members in order.
    Members(Vec<Member<'a>>),
    /// A JSON object with this many members, more than [`MAX_MEMBERS`]: not kept.
    TooMany(usize),
    /// Another JSON value; what it was, as serde says it (`integer `5``, `sequence`).
    Other(String),
}

impl<'a> Object<'a> {
    /// A deserializer that reads the object as a rule's type.
    pub(super) fn deserializer(&self) -> ObjectDeserializer<'_, 'a> {
        ObjectDeserializer(self)
    }
}

/// The last member called `key`, as a JSON object's reader keeps the last of duplicate keys.
pub(super) fn member<'a>(members: &[Member<'a>], key: &str) -> Option<&'a RawValue> {
    members
        .iter()
        .rev()
        .find(|(name, _)| name == key)
        .map(|(_, value)| *value)
}

impl<'de: 'a, 'a> Deserialize<'de> for Object<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<'a>(PhantomData<Object<'a>>);

impl<'a> ObjectVisitor<'a> {
    fn not_an_object<E>(what: Unexpected<'_>) -> Result<Object<'a>, E> {
        Ok(Object::Other(what.to_string()))
    }
}

impl<'de: 'a, 'a> Visitor<'de> for ObjectVisitor<'a> {
    type Value = Object<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        let mut count = 0_usize;
        while let Some(Key(key)) = map.next_key()? {
            count += 1;
            if count > MAX_MEMBERS {
                // Scanned, for the body must be well-formed, and counted for the message.
                map.next_value::<IgnoredAny>()?;
            } else {
                members.push((key, map.next_value()?));
            }
        }
        Ok(if count > MAX_MEMBERS {
            Object::TooMany(count)
        } else {
            Object::Members(members)
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Self::not_an_object(Unexpected::Seq)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Self::not_an_object(Unexpected::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Self::not_an_object(Unexpected::Signed(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Self::not_an_object(Unexpected::Unsigned(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Self::not_an_object(Unexpected::Float(v))
    }

    /// Not echoed: it may be megabytes long.
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Self::not_an_object(Unexpected::Other("string"))
    }
}

/// A member's key, borrowed from the body unless it holds escapes.
pub(super) struct Key<'a>(pub(super) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor<'a>(PhantomData<Key<'a>>);
        impl<'de: 'a, 'a> Visitor<'de> for KeyVisitor<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor(PhantomData))
    }
}

/// Reads an [`Object`] as a rule's type: a map of its members.
pub(super) struct ObjectDeserializer<'o, 'de>(&'o Object<'de>);

impl<'de> Deserializer<'de> for ObjectDeserializer<'_, 'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Object::Members(members) => visitor.visit_map(Members {
                members: members.iter(),
                value: None,
            }),
            Object::TooMany(count) => Err(de::Error::custom(format_args!(
                "an object with {count} top-level fields; at most {MAX_MEMBERS} are read"
            ))),
            Object::Other(what) => Err(de::Error::invalid_type(Unexpected::Other(what), &visitor)),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

struct Members<'o, 'de> {
    members: slice::Iter<'o, Member<'de>>,
    value: Option<&'de RawValue>,
}

impl<'de> MapAccess<'de> for Members<'_, 'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.members.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        match key {
            Cow::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)),
            Cow::Owned(key) => seed.deserialize(StrDeserializer::new(key)),
        }
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a member's value was read before its key"))?;
        seed.deserialize(MemberValue(value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.members.len())
    }
}

/// A member's value: read by serde_json from its raw text, except that a value the type
/// ignores is not scanned again (the envelope's parse checked it is well-formed).
struct MemberValue<'de>(&'de RawValue);

macro_rules! to_raw_value {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?;)*) => {$(
        fn $method<V: Visitor<'de>>(
            self,
            $($($arg: $ty,)*)?
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.$method($($($arg,)*)? visitor)
        }
    )*};
}

impl<'de> Deserializer<'de> for MemberValue<'de> {
    type Error = serde_json::Error;

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    to_raw_value! {
        deserialize_any; deserialize_bool; deserialize_i8; deserialize_i16; deserialize_i32;
        deserialize_i64; deserialize_i128; deserialize_u8; deserialize_u16; deserialize_u32;
        deserialize_u64; deserialize_u128; deserialize_f32; deserialize_f64; deserialize_char;
        deserialize_str; deserialize_string; deserialize_bytes; deserialize_byte_buf;
        deserialize_option; deserialize_unit; deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str); deserialize_seq;
        deserialize_tuple(len: usize); deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_map;
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::Value;

    use super::*;

    fn read<T: de::DeserializeOwned>(json: &str) -> Result<T, String> {
        let object: Object<'_> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        T::deserialize(object.deserializer()).map_err(|e| e.to_string())
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Spec {
        size: Option<u32>,
        tags: BTreeMap<String, String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Widget {
        spec: Spec,
    }

    #[test]
    fn a_type_reads_its_members_and_skips_the_rest() {
        let json = r#"{"metadata": {"managedFields": [1, {"a": "\"x\""}]}, "spec":
            {"size": 3, "tags": {"a\"b": "c"}}, "status": null}"#;
        let widget: Widget = read(json).unwrap();
        assert_eq!(widget.spec.size, Some(3));
        assert_eq!(widget.spec.tags["a\"b"], "c");
        // The same as serde_json reading the whole text, for a type that keeps everything.
        let value: Value = read(json).unwrap();
        assert_eq!(value, serde_json::from_str::<Value>(json).unwrap());
    }

    #[test]
    fn escaped_keys_are_read_as_their_text() {
        let widget: Widget = read(r#"{"sp\u0065c": {"size": 1, "tags": {}}}"#).unwrap();
        assert_eq!(widget.spec.size, Some(1));
    }

    #[test]
    fn errors_say_what_serde_would() {
        let error = read::<Widget>(r#"{"spec": {"size": "big", "tags": {}}}"#).unwrap_err();
        assert!(error.starts_with("invalid type: string \"big\""), "{error}");
        assert_eq!(
            read::<Widget>("5").unwrap_err(),
            "invalid type: integer `5`, expected struct Widget"
        );
        assert_eq!(
            read::<Widget>("[1, 2]").unwrap_err(),
            "invalid type: sequence, expected struct Widget"
        );
        assert_eq!(
            read::<Widget>(r#"{"spec": {"tags": {}}, "spec": {"tags": {}}}"#).unwrap_err(),
            "duplicate field `spec`"
        );
        // Malformed JSON in a skipped member still fails the parse.
        assert!(read::<Widget>(r#"{"metadata": {"a": tru}, "spec": {"tags": {}}}"#).is_err());
    }

    #[test]
    fn members_past_the_limit_are_counted_not_kept() {
        let members: Vec<String> = (0..=MAX_MEMBERS)
            .map(|i| format!("\"m{i}\": {i}"))
            .collect();
        let json = format!("{{{}}}", members.join(", "));
        let object: Object<'_> = serde_json::from_str(&json).unwrap();
        assert!(matches!(object, Object::TooMany(n) if n == MAX_MEMBERS + 1));
        assert_eq!(
            read::<Value>(&json).unwrap_err(),
            format!("an object with 65 top-level fields; at most {MAX_MEMBERS} are read")
        );
        let json = format!("{{{}}}", members[..MAX_MEMBERS].join(", "));
        assert_eq!(read::<Value>(&json).unwrap().as_object().unwrap().len(), 64);
    }

    #[test]
    fn the_last_of_duplicate_members_is_found() {
        let object: Object<'_> = serde_json::from_str(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        let Object::Members(members) = &object else {
            panic!("{object:?}")
        };
        assert_eq!(member(members, "a").map(RawValue::get), Some("3"));
        assert!(member(members, "c").is_none());
    }
}
