//! Which topic a table's changes go to.

/// A routing template: `{prefix}`, `{schema}` and `{table}` are replaced.
/// The default, `{prefix}.{schema}.{table}`, is Debezium's topic naming.
///
/// ```
/// let r = pgwal_kafka::Routing::new("app", "{prefix}.{schema}.{table}").unwrap();
/// assert_eq!(r.topic("public", "orders").unwrap(), "app.public.orders");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    prefix: String,
    template: String,
}

/// A topic name Kafka would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RoutingError {
    /// The template names a placeholder other than the three known ones.
    #[error("unknown placeholder {0:?} in the topic template (known: {{prefix}}, {{schema}}, {{table}})")]
    UnknownPlaceholder(String),
    /// A character Kafka does not allow in topic names.
    #[error("topic {topic:?}: Kafka allows only ASCII letters, digits, '.', '_' and '-' ({bad:?} is not)")]
    BadCharacter {
        /// The topic.
        topic: String,
        /// The character.
        bad: char,
    },
    /// Empty, `.`, `..`, or longer than Kafka's 249 characters.
    #[error(
        "topic {0:?} is not a valid Kafka topic name (empty, '.', '..' or over 249 characters)"
    )]
    BadName(String),
}

impl Routing {
    /// A template with its prefix; the template is checked here.
    pub fn new(prefix: &str, template: &str) -> Result<Routing, RoutingError> {
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| RoutingError::UnknownPlaceholder(rest[open..].to_owned()))?;
            let name = &rest[open + 1..open + close];
            if !matches!(name, "prefix" | "schema" | "table") {
                return Err(RoutingError::UnknownPlaceholder(name.to_owned()));
            }
            rest = &rest[open + close + 1..];
        }
        let r = Routing {
            prefix: prefix.to_owned(),
            template: template.to_owned(),
        };
        // the prefix and the template's own characters are checked once
        r.topic("s", "t")?;
        Ok(r)
    }

    /// The topic of `schema.table`.
    pub fn topic(&self, schema: &str, table: &str) -> Result<String, RoutingError> {
        let topic = self
            .template
            .replace("{prefix}", &self.prefix)
            .replace("{schema}", schema)
            .replace("{table}", table);
        if let Some(bad) = topic
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(RoutingError::BadCharacter { topic, bad });
        }
        if topic.is_empty() || topic == "." || topic == ".." || topic.len() > 249 {
            return Err(RoutingError::BadName(topic));
        }
        Ok(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        let r = Routing::new("cdc", "{prefix}-{table}").unwrap();
        assert_eq!(r.topic("s", "orders").unwrap(), "cdc-orders");
        assert!(matches!(
            Routing::new("p", "{prefix}.{db}"),
            Err(RoutingError::UnknownPlaceholder(n)) if n == "db"
        ));
        assert!(matches!(
            Routing::new("p q", "{prefix}.{table}"),
            Err(RoutingError::BadCharacter { bad: ' ', .. })
        ));
        let r = Routing::new("p", "{prefix}.{schema}.{table}").unwrap();
        assert!(matches!(
            r.topic("public", "naïve"),
            Err(RoutingError::BadCharacter { bad: 'ï', .. })
        ));
        assert!(matches!(
            r.topic("public", &"x".repeat(250)),
            Err(RoutingError::BadName(_))
        ));
        assert!(matches!(
            Routing::new("", "{prefix}"),
            Err(RoutingError::BadName(_))
        ));
    }
}
