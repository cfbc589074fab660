//! The librdkafka client context of every Kafka client pgwal makes (the
//! transactional producer, the admin client, the progress readers).
//!
//! librdkafka reports a broker it cannot talk to only as events: the call
//! that needed the broker (`init_transactions`, creating a topic) just
//! times out. The context keeps those events, so that a failure can say
//! *why* (a certificate that does not verify, a wrong password, a plaintext
//! client at a TLS port) instead of "operation timed out", and so that a
//! refusal ends the wait at once rather than after the timeout.
//!
//! It also forwards librdkafka's log lines to `tracing` (target
//! `librdkafka`), where the CLI's `PGWAL_LOG` filter applies to them.

use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

/// What the brokers said when a connection failed, shared by the clients
/// of one producer.
#[derive(Debug, Default)]
struct BrokerErrors {
    /// The last refusal: TLS or SASL failed (the client reached a broker,
    /// which would not have it).
    refused: Option<String>,
    /// The last other connection error ("all brokers down", which only
    /// sums the others up, when there was no other: librdkafka does not
    /// always say why a connection closed).
    unreachable: Option<String>,
    /// The first record a broker would not take because of its topic
    /// (unknown, or not authorized): the topic and the reason. Whether
    /// that lasts is checked against the cluster's metadata when the
    /// commit fails.
    undeliverable: Option<(String, String)>,
}

/// The context: cheap to clone, clones share what they recorded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Context {
    errors: Arc<Mutex<BrokerErrors>>,
}

impl Context {
    /// The last refusal (TLS or authentication), if any.
    pub(crate) fn refused(&self) -> Option<String> {
        self.errors.lock().expect("not poisoned").refused.clone()
    }

    /// The last connection error of any kind, refusals first.
    pub(crate) fn last_connection_error(&self) -> Option<String> {
        let e = self.errors.lock().expect("not poisoned");
        e.refused.clone().or_else(|| e.unreachable.clone())
    }

    /// Takes the first topic a record could not be delivered to, if any,
    /// with the reason.
    pub(crate) fn take_undeliverable(&self) -> Option<(String, String)> {
        self.errors
            .lock()
            .expect("not poisoned")
            .undeliverable
            .take()
    }

    /// Completes when a broker refused a connection (polled: librdkafka's
    /// callbacks run on its own threads).
    pub(crate) async fn refusal(&self) -> String {
        loop {
            if let Some(r) = self.refused() {
                return r;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Whether a delivery failed because of its topic: unknown to the
/// cluster (not there, and not created for pgwal), or not authorized.
pub(crate) fn topic_refused(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    )
}

/// Whether an error event is a refusal: the broker answered, and TLS or
/// SASL authentication failed. A TLS alert from the broker (e.g. "bad
/// certificate": it wants a client certificate) comes as a transport
/// error naming OpenSSL's "SSL routines"; a broker that just went away
/// never sends one.
fn is_refusal(code: Option<RDKafkaErrorCode>, reason: &str) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::SaslAuthenticationFailed
        )
    ) || reason.contains("SSL routines")
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        // a broker connection that failed: some failures (a plaintext
        // client at a TLS port) are only logged, not raised as errors
        if fac == "FAIL" && (level as i32) <= RDKafkaLogLevel::Warning as i32 {
            let mut e = self.errors.lock().expect("not poisoned");
            if e.unreachable.is_none() || message.contains("security.protocol") {
                e.unreachable = Some(message.to_owned());
            }
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "{fac}: {message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "{fac}: {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "{fac}: {message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "{fac}: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        // a progress reader reached the end of its partition: no error
        if code == Some(RDKafkaErrorCode::PartitionEOF) {
            return;
        }
        let mut e = self.errors.lock().expect("not poisoned");
        if is_refusal(code, reason) {
            e.refused = Some(reason.to_owned());
        } else if code != Some(RDKafkaErrorCode::AllBrokersDown) || e.unreachable.is_none() {
            e.unreachable = Some(reason.to_owned());
        }
        drop(e);
        tracing::warn!(target: "librdkafka", "{error}: {reason}");
    }
}

impl ProducerContext for Context {
    type DeliveryOpaque = ();

    // a failed delivery fails the Kafka transaction's commit, which is
    // where the sink sees it; a topic's failure is kept, so that the
    // commit's error can name it
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        use rdkafka::Message;
        if let Err((e, m)) = r {
            if topic_refused(e.rdkafka_error_code()) {
                let mut errors = self.errors.lock().expect("not poisoned");
                errors
                    .undeliverable
                    .get_or_insert_with(|| (m.topic().to_owned(), e.to_string()));
            }
        }
    }
}

impl ConsumerContext for Context {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_kept_apart_from_other_connection_errors() {
        let c = Context::default();
        assert_eq!(c.last_connection_error(), None);
        c.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused",
        );
        c.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert_eq!(c.refused(), None);
        assert!(c
            .last_connection_error()
            .unwrap()
            .contains("Connection refused"));
        let only_down = Context::default();
        only_down.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert_eq!(
            only_down.last_connection_error().as_deref(),
            Some("1/1 brokers are down")
        );
        let clone = c.clone();
        clone.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "SSL handshake failed: certificate verify failed",
        );
        assert!(c.refused().unwrap().contains("certificate verify failed"));
        assert!(c
            .last_connection_error()
            .unwrap()
            .contains("certificate verify failed"));
    }
}
