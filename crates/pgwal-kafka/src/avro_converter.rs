//! Records in Avro, their schemas in a schema registry: what Kafka
//! Connect's `AvroConverter` makes of Debezium's records.
//!
//! The sink encodes each change as Debezium's envelope with its Kafka
//! Connect schema (`{"schema": ..., "payload": ...}`, see
//! [`crate::format`]), which follows the table's columns as its Relation
//! messages change them (also inside a streamed transaction, whose records
//! are kept in that form until its commit). Just before a record goes to
//! Kafka, [`AvroConverter::convert`] turns its key and value into Avro
//! ([`crate::format::avro`]), registers their schemas (once per shape and
//! subject: [`crate::registry`]) and frames the datums with the schemas'
//! ids, as Confluent's serializers do, so that any Confluent-compatible
//! deserializer reads them.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::format::avro::{framed, AvroError, AvroSchema};
use crate::format::Record;
use crate::registry::{RegistryConfig, RegistryError, SchemaRegistry};

/// A record the converter could not write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// Its key or value has no Avro form.
    #[error("topic {topic}: the record's {} has no Avro form: {source}", if *.key { "key" } else { "value" })]
    Avro {
        /// The topic.
        topic: String,
        /// The key (or the value).
        key: bool,
        /// Why.
        source: AvroError,
    },
    /// The registry did not take its schema.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// A Connect schema's Avro form, with its registered text.
#[derive(Debug)]
struct Mapped {
    avro: AvroSchema,
    text: Arc<str>,
}

/// Made Avro schemas by their Connect schema's text; cleared when it holds
/// more than this many (tables × shapes).
const CACHE_LIMIT: usize = 4096;

/// Converts Connect JSON records into registry-framed Avro.
#[derive(Debug)]
pub struct AvroConverter {
    registry: SchemaRegistry,
    mapped: HashMap<Box<str>, Arc<Mapped>>,
    /// The last schema written to each topic's keys and values, with its
    /// id: the common case costs no subject lookup.
    last: [HashMap<String, (Arc<Mapped>, u32)>; 2],
}

impl AvroConverter {
    /// A converter registering at `config`'s registry.
    pub fn new(config: RegistryConfig) -> Result<AvroConverter, RegistryError> {
        Ok(AvroConverter {
            registry: SchemaRegistry::new(config)?,
            mapped: HashMap::new(),
            last: [HashMap::new(), HashMap::new()],
        })
    }

    /// `r` with its key and value (Connect JSON with their schemas) in
    /// Avro; a missing key or value (a tombstone) stays missing.
    pub async fn convert(&mut self, r: &Record) -> Result<Record, ConvertError> {
        let key = match &r.key {
            Some(k) => Some(self.one(&r.topic, true, k).await?),
            None => None,
        };
        let value = match &r.value {
            Some(v) => Some(self.one(&r.topic, false, v).await?),
            None => None,
        };
        Ok(Record {
            topic: r.topic.clone(),
            key,
            value,
        })
    }

    async fn one(&mut self, topic: &str, key: bool, json: &[u8]) -> Result<Vec<u8>, ConvertError> {
        let bad = |source: AvroError| ConvertError::Avro {
            topic: topic.to_owned(),
            key,
            source,
        };
        let parts: HashMap<&str, &RawValue> = serde_json::from_slice(json)
            .map_err(|e| bad(AvroError::NotConnectJson(e.to_string())))?;
        let (Some(schema), Some(payload)) = (parts.get("schema"), parts.get("payload")) else {
            return Err(bad(AvroError::NotConnectJson(
                "no \"schema\" and \"payload\"".into(),
            )));
        };
        let mapped = match self.mapped.get(schema.get()) {
            Some(m) => m.clone(),
            None => {
                let connect: Value = serde_json::from_str(schema.get())
                    .map_err(|e| bad(AvroError::NotConnectJson(e.to_string())))?;
                let avro = AvroSchema::from_connect(&connect).map_err(bad)?;
                let text: Arc<str> = Arc::from(avro.text.as_str());
                let m = Arc::new(Mapped { avro, text });
                if self.mapped.len() >= CACHE_LIMIT {
                    self.mapped.clear();
                }
                self.mapped.insert(schema.get().into(), m.clone());
                m
            }
        };
        let payload: Value = serde_json::from_str(payload.get())
            .map_err(|e| bad(AvroError::NotConnectJson(e.to_string())))?;
        let datum = mapped.avro.datum(&payload).map_err(bad)?;
        let last = &mut self.last[usize::from(key)];
        let id = match last.get(topic) {
            Some((m, id)) if Arc::ptr_eq(m, &mapped) => *id,
            _ => {
                let subject =
                    self.registry
                        .config()
                        .subject_strategy
                        .subject(topic, key, &mapped.avro.name);
                let id = self.registry.id(&subject, &mapped.text).await?;
                last.insert(topic.to_owned(), (mapped.clone(), id));
                id
            }
        };
        Ok(framed(id, &datum))
    }
}
