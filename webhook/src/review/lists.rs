//! Lists whose reading costs what the rule allows, not what the request holds: a rule that
//! allows at most `MAX` items never needs more than `MAX` of them in memory.
//!
//! A body at the size limit holds some 230,000 small list entries. Read into a `Vec`, they would
//! take many times the body's size and most of the review's time before the rule could even say
//! "too many", and a few such reviews at once would multiply that. [`Bounded`] keeps the first
//! `MAX` entries and only counts the rest, so the denial can still say how many there were;
//! [`at_most`] refuses the list at entry `MAX + 1`, which stops the parse there.

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny, SeqAccess, Visitor},
};

/// A list read keeping at most `MAX` items, with the length it had in the request.
///
/// Items past `MAX` are still scanned as JSON (the body must be well-formed) but neither typed
/// nor kept: no allocation, no per-item work. For validating rules, which deny a list over its
/// limit as a whole ([`crate::Violation::too_many`] with [`len`](Self::len)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounded<T, const MAX: usize> {
    kept: Vec<T>,
    len: usize,
}

impl<T, const MAX: usize> Bounded<T, MAX> {
    /// How many items the list had in the request.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list was empty (or absent).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the list had more than `MAX` items (then only the first `MAX` were kept).
    pub fn is_over(&self) -> bool {
        self.len > MAX
    }

    /// The whole list, or `None` when it had more than `MAX` items.
    pub fn whole(&self) -> Option<&[T]> {
        (!self.is_over()).then_some(&self.kept)
    }

    /// The items kept: the whole list, or its first `MAX` items.
    pub fn kept(&self) -> &[T] {
        &self.kept
    }
}

impl<T, const MAX: usize> Default for Bounded<T, MAX> {
    fn default() -> Self {
        Self {
            kept: Vec::new(),
            len: 0,
        }
    }
}

impl<T, const MAX: usize> From<Vec<T>> for Bounded<T, MAX> {
    /// Bounds a list already in memory, as reading it would have.
    fn from(mut items: Vec<T>) -> Self {
        let len = items.len();
        items.truncate(MAX);
        Self { kept: items, len }
    }
}

impl<'de, T: Deserialize<'de>, const MAX: usize> Deserialize<'de> for Bounded<T, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counting<T, const MAX: usize>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>, const MAX: usize> Visitor<'de> for Counting<T, MAX> {
            type Value = Bounded<T, MAX>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // The size hint is the sender's word: never reserve more than MAX for it.
                let mut kept = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX));
                while kept.len() < MAX {
                    match seq.next_element()? {
                        Some(item) => kept.push(item),
                        None => {
                            let len = kept.len();
                            return Ok(Bounded { kept, len });
                        }
                    }
                }
                let mut len = MAX;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    len += 1;
                }
                Ok(Bounded { kept, len })
            }
        }

        deserializer.deserialize_seq(Counting::<T, MAX>(PhantomData))
    }
}

/// Reads a list of at most `max` items, failing at item `max + 1` (which ends the parse there,
/// before that item is typed).
/// For `#[serde(deserialize_with)]` in a mutating rule's type: a list over its limit cannot be
/// patched meaningfully, so the object is admitted unchanged and the validating side denies it.
pub fn at_most<'de, D, T>(deserializer: D, max: usize) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Limited<T> {
        max: usize,
        item: PhantomData<T>,
    }

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Limited<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a sequence of at most {} items", self.max)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
            while items.len() < self.max {
                match seq.next_element()? {
                    Some(item) => items.push(item),
                    None => return Ok(items),
                }
            }
            if seq.next_element::<IgnoredAny>()?.is_some() {
                return Err(de::Error::invalid_length(self.max + 1, &self));
            }
            Ok(items)
        }
    }

    deserializer.deserialize_seq(Limited::<T> {
        max,
        item: PhantomData,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        static TYPED: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts how many items were typed (so held), not just scanned.
    #[derive(Debug)]
    struct Item;

    impl<'de> Deserialize<'de> for Item {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            IgnoredAny::deserialize(deserializer)?;
            TYPED.with(|typed| typed.set(typed.get() + 1));
            Ok(Item)
        }
    }

    fn list(len: usize) -> String {
        format!("[{}]", vec![r#"{"name":"A"}"#; len].join(","))
    }

    #[test]
    fn a_list_over_the_limit_keeps_max_items_and_counts_the_rest_without_typing_them() {
        TYPED.with(|typed| typed.set(0));
        let read: Bounded<Item, 64> = serde_json::from_str(&list(100_000)).unwrap();
        assert_eq!(read.len(), 100_000);
        assert!(read.is_over());
        assert_eq!(read.kept().len(), 64);
        assert!(read.whole().is_none());
        assert_eq!(TYPED.with(Cell::get), 64, "only the kept items are typed");
    }

    #[test]
    fn a_list_within_the_limit_is_read_whole() {
        let read: Bounded<u8, 3> = serde_json::from_str("[1,2,3]").unwrap();
        assert_eq!((read.len(), read.whole()), (3, Some(&[1, 2, 3][..])));
        let empty: Bounded<u8, 3> = serde_json::from_str("[]").unwrap();
        assert!(empty.is_empty() && !empty.is_over());
        assert_eq!(Bounded::<u8, 2>::from(vec![1, 2, 3]).kept(), [1, 2]);
    }

    #[test]
    fn items_past_the_limit_must_still_be_json_and_kept_ones_must_type() {
        assert!(serde_json::from_str::<Bounded<u8, 1>>("[1, 2, nope]").is_err());
        assert!(serde_json::from_str::<Bounded<u8, 2>>(r#"[1, "x"]"#).is_err());
        // Past the limit any JSON counts: the list is denied as a whole anyway.
        let read: Bounded<u8, 1> = serde_json::from_str(r#"[1, "x", {}]"#).unwrap();
        assert_eq!(read.len(), 3);
    }

    #[test]
    fn at_most_fails_at_the_first_item_over_the_limit_without_typing_it() {
        #[derive(Debug, Deserialize)]
        struct Spec {
            #[serde(deserialize_with = "two")]
            items: Vec<Item>,
        }
        fn two<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Item>, D::Error> {
            at_most(d, 2)
        }
        TYPED.with(|typed| typed.set(0));
        let error = serde_json::from_str::<Spec>(&format!(r#"{{"items":{}}}"#, list(50_000)))
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid length 3"), "{error}");
        assert_eq!(
            TYPED.with(Cell::get),
            2,
            "the parse stops at the third item"
        );
        let spec: Spec = serde_json::from_str(&format!(r#"{{"items":{}}}"#, list(2))).unwrap();
        assert_eq!(spec.items.len(), 2);
    }
}
