//! Serde deserialization of rows into user types.

use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};

use crate::error::Error;
use crate::event::Row;
use std::ops::Bound;

use crate::types::{decode, Range, Value};

/// The error of row deserialization.
#[derive(Debug, thiserror::Error)]
#[error("cannot deserialize row: {0}")]
pub struct DeError(pub String);

impl de::Error for DeError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        DeError(msg.to_string())
    }
}

impl From<Error> for DeError {
    fn from(e: Error) -> Self {
        DeError(e.to_string())
    }
}

impl Row {
    /// Deserializes the row into `T` (a struct or map keyed by column name).
    ///
    /// Column values are decoded by type ([`types::decode`](crate::types::decode)):
    /// integers, floats, bools, text, `numeric` (as a string, or parsed when
    /// the target is a number), `bytea` (`Vec<u8>`), `json`/`jsonb` (any
    /// deserializable type), `uuid` (hyphenated string), timestamps
    /// (RFC 3339 string, UTC), dates (`YYYY-MM-DD`) and arrays (sequences).
    /// NULL fits `Option`; an unchanged TOAST value is an error.
    ///
    /// ```no_run
    /// # fn f(change: pgwal::Change) -> Result<(), pgwal::de::DeError> {
    /// #[derive(serde::Deserialize)]
    /// struct User { id: i64, email: Option<String>, tags: Vec<String> }
    /// let user: User = change.new.as_ref().unwrap().deserialize()?;
    /// # Ok(()) }
    /// ```
    pub fn deserialize<'de, T: serde::Deserialize<'de>>(&self) -> Result<T, DeError> {
        let mut cols = Vec::with_capacity(self.values().len());
        for (col, v) in self.iter() {
            let value = decode(col.type_oid, v)
                .map_err(|e| DeError(format!("column {}: {e}", col.name)))?;
            cols.push((col.name.clone(), value));
        }
        T::deserialize(RowDe {
            cols: cols.into_iter(),
            value: None,
        })
    }
}

struct RowDe {
    cols: std::vec::IntoIter<(String, Value)>,
    value: Option<Value>,
}

impl<'de> Deserializer<'de> for RowDe {
    type Error = DeError;
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_map(self)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de> MapAccess<'de> for RowDe {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.cols.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(k.into_deserializer()).map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, DeError> {
        let v = self
            .value
            .take()
            .ok_or_else(|| DeError("value without key".into()))?;
        seed.deserialize(ValueDe(v))
    }
}

struct ValueDe(Value);

/// A range as a map: `empty`, `lower`, `upper` (null when unbounded),
/// `lower_inclusive`, `upper_inclusive`.
fn range_map(r: Range) -> Fields {
    let (empty, lower, upper) = match r {
        Range::Bounds(l, u) => (false, l, u),
        Range::Empty => (true, Bound::Unbounded, Bound::Unbounded),
    };
    let split = |b: Bound<Value>| match b {
        Bound::Included(v) => (v, true),
        Bound::Excluded(v) => (v, false),
        Bound::Unbounded => (Value::Null, false),
    };
    let (lower, lower_inclusive) = split(lower);
    let (upper, upper_inclusive) = split(upper);
    Fields(
        vec![
            ("empty", Value::Bool(empty)),
            ("lower", lower),
            ("upper", upper),
            ("lower_inclusive", Value::Bool(lower_inclusive)),
            ("upper_inclusive", Value::Bool(upper_inclusive)),
        ]
        .into_iter(),
        None,
    )
}

struct Fields(std::vec::IntoIter<(&'static str, Value)>, Option<Value>);

impl<'de> MapAccess<'de> for Fields {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.0.next() {
            Some((k, v)) => {
                self.1 = Some(v);
                seed.deserialize(ValueDe(Value::Text(k.to_owned())))
                    .map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        seed.deserialize(ValueDe(self.1.take().unwrap_or(Value::Null)))
    }
}

struct Seq(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Seq {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.0.next() {
            Some(v) => seed.deserialize(ValueDe(v)).map(Some),
            None => Ok(None),
        }
    }
}

impl<'de> Deserializer<'de> for ValueDe {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Null => v.visit_none(),
            Value::UnchangedToast => Err(DeError(
                "unchanged TOAST value was not sent by the server".into(),
            )),
            Value::Bool(b) => v.visit_bool(b),
            Value::Int(i) => v.visit_i64(i),
            Value::Float(f) => v.visit_f64(f),
            Value::Numeric(s) | Value::Text(s) => v.visit_string(s),
            Value::Bytes(b) => v.visit_byte_buf(b),
            Value::Json(j) => j.deserialize_any(v).map_err(|e| DeError(e.to_string())),
            Value::Uuid(u) => v.visit_string(crate::types::uuid_text(&u)),
            Value::Timestamp(t) => v.visit_string(t.to_iso8601()),
            Value::Date(d) => v.visit_string(pgwal_protocol::format_pg_date(d.into())),
            Value::Array(a) => v.visit_seq(Seq(a.into_iter())),
            Value::Money(m) => v.visit_i64(m),
            Value::Range(r) => v.visit_map(range_map(*r)),
            Value::Multirange(rs) => v.visit_seq(Seq(rs
                .into_iter()
                .map(|r| Value::Range(Box::new(r)))
                .collect::<Vec<_>>()
                .into_iter())),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Null => v.visit_none(),
            other => v.visit_some(ValueDe(other)),
        }
    }

    fn deserialize_f64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Numeric(s) => v.visit_f64(
                s.parse()
                    .map_err(|_| DeError(format!("numeric {s} is not an f64")))?,
            ),
            other => ValueDe(other).deserialize_any(v),
        }
    }

    fn deserialize_f32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(v)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Numeric(s) => v.visit_i64(
                s.parse()
                    .map_err(|_| DeError(format!("numeric {s} is not an i64")))?,
            ),
            other => ValueDe(other).deserialize_any(v),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self.0 {
            // Vec<u8> asks for a sequence.
            Value::Bytes(b) => v.visit_seq(Seq(b
                .into_iter()
                .map(|x| Value::Int(x.into()))
                .collect::<Vec<_>>()
                .into_iter())),
            other => ValueDe(other).deserialize_any(v),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Text(s) => v.visit_enum(s.into_deserializer()),
            Value::Json(j) => j
                .deserialize_enum(name, variants, v)
                .map_err(|e| DeError(e.to_string())),
            _ => Err(DeError("enums deserialize from text".into())),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i128 u8 u16 u32 u64 u128 char str string
        bytes byte_buf unit unit_struct tuple
        tuple_struct map struct identifier ignored_any
    }
}
