//! pgwal's exit status, by the class of what ended it, so that a
//! supervisor can tell a failure that a restart may cure from one that a
//! restart only repeats (systemd: `RestartPreventExitStatus=2 3 5`).
//!
//! | status | what ended pgwal | restart? |
//! |---|---|---|
//! | 0 | a clean stop: the stop position, Ctrl-C or SIGTERM | – |
//! | 1 | anything else (e.g. writing the output failed) | maybe |
//! | 2 | usage or configuration: the options or config file, the connection string, authentication (PostgreSQL or Kafka), a setting refused, or a Kafka topic that does not exist (and is not created on first use) or may not be written | no |
//! | 3 | the slot cannot be used as asked: missing, invalidated, two-phase (Kafka sink), ahead of what the consumer holds, or not the slot a state file belongs to; or the Kafka sink's progress record is unreadable, or names a position the server does not have | no |
//! | 4 | retries exhausted: PostgreSQL or Kafka stayed unusable longer than pgwal retries | yes |
//! | 5 | a change that cannot be written faithfully (e.g. an unchanged TOAST value in the Kafka sink), a snapshot chunk the sink cannot read (under `--kafka-bad-records fail`), or a transaction that takes longer to write than Kafka's transaction timeout | no |

use std::error::Error as StdError;
use std::process::ExitCode;

use pgwal_kafka::avro_converter::ConvertError;
use pgwal_kafka::registry::RegistryError;
use pgwal_kafka::snapshot::SnapshotError;
use pgwal_kafka::SinkError;

/// Usage or configuration (clap's status for usage errors too).
pub(crate) const CONFIG: u8 = 2;
/// The slot cannot be used as asked.
pub(crate) const SLOT: u8 = 3;
/// Retries exhausted.
pub(crate) const RETRIES: u8 = 4;
/// A change that cannot be written faithfully.
pub(crate) const UNWRITABLE: u8 = 5;

/// The exit status for `e`.
pub(crate) fn of(e: &(dyn StdError + 'static)) -> ExitCode {
    ExitCode::from(class(e))
}

fn class(e: &(dyn StdError + 'static)) -> u8 {
    if let Some(e) = e.downcast_ref::<pgwal::Error>() {
        return postgres(e);
    }
    if let Some(e) = e.downcast_ref::<SinkError>() {
        return match e {
            SinkError::Postgres(e) => postgres(e),
            SinkError::KafkaRefused(_)
            | SinkError::KafkaOptions { .. }
            | SinkError::TwoPhase
            | SinkError::SnapshotUnsupported { .. }
            | SinkError::TopicUnusable(_) => CONFIG,
            SinkError::Snapshot(SnapshotError::Postgres(e)) => postgres(e),
            // the cursor in Kafka names the table: a restart reads the same
            // rows again (`--kafka-bad-records skip` leaves the table out)
            SinkError::Snapshot(SnapshotError::BadResult { .. }) => UNWRITABLE,
            SinkError::Snapshot(_) => CONFIG,
            SinkError::Kafka { .. } | SinkError::KafkaNeverConnected { .. } => RETRIES,
            SinkError::Format(_)
            | SinkError::BadRecord { .. }
            | SinkError::TransactionTooLong { .. } => UNWRITABLE,
            SinkError::AvroNeedsConnectSchemas => CONFIG,
            SinkError::Avro(ConvertError::Registry(e)) => match e {
                RegistryError::Unreachable { .. } => RETRIES,
                RegistryError::Refused {
                    status: 401 | 403, ..
                }
                | RegistryError::Url { .. }
                | RegistryError::CaFile { .. } => CONFIG,
                _ => UNWRITABLE,
            },
            SinkError::Avro(_) => UNWRITABLE,
            SinkError::TwoPhaseSlot { .. }
            | SinkError::BadProgress(_)
            | SinkError::ServerLacksKafkaPosition { .. } => SLOT,
            _ => 1,
        };
    }
    if e.downcast_ref::<crate::config_file::ConfigFileError>()
        .is_some()
        || e.downcast_ref::<pgwal_kafka::RoutingError>().is_some()
        || e.downcast_ref::<pgwal_kafka::KeyColumnsError>().is_some()
    {
        return CONFIG;
    }
    1
}

fn postgres(e: &pgwal::Error) -> u8 {
    use pgwal::Error as E;
    match e {
        E::Config { .. }
        | E::PasswordMissing
        | E::UnsupportedAuthentication(_)
        | E::TlsRefused
        | E::Sasl(_)
        | E::ServerTooOld { .. }
        | E::NotPublished { .. } => CONFIG,
        E::SlotInvalidated { .. } | E::SlotAhead { .. } | E::StateMismatch { .. } => SLOT,
        E::RetriesExhausted { .. } | E::NoSuitableServer { .. } => RETRIES,
        // pgwal ends with a transient error only once it stopped retrying
        // (`receive --max-retries`, a stream's retry limit)
        e if e.is_transient() => RETRIES,
        E::Db(db) => match db.code.as_str() {
            // authentication, privileges, a database that does not exist,
            // a setting refused
            c if c.starts_with("28") => CONFIG,
            "42501" | "3D000" | "22023" | "42601" => CONFIG,
            // a slot or publication that does not exist; a slot in no
            // state to be used ("can no longer get changes", wal_level)
            "42704" | "55000" => SLOT,
            _ => 1,
        },
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let missing: Box<dyn StdError> = Box::new(pgwal::Error::PasswordMissing);
        assert_eq!(class(missing.as_ref()), CONFIG);
        let sink: Box<dyn StdError> = Box::new(SinkError::TwoPhase);
        assert_eq!(class(sink.as_ref()), CONFIG);
        let slot: Box<dyn StdError> = Box::new(SinkError::TwoPhaseSlot { slot: "s".into() });
        assert_eq!(class(slot.as_ref()), SLOT);
        let io: Box<dyn StdError> = Box::new(std::io::Error::other("pipe"));
        assert_eq!(class(io.as_ref()), 1);
        let refused: Box<dyn StdError> = Box::new(pgwal::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(class(refused.as_ref()), RETRIES);
        let chunk: Box<dyn StdError> = Box::new(SinkError::Snapshot(SnapshotError::BadResult {
            table: "public.t".into(),
            what: "a NULL in key columns id".into(),
        }));
        assert_eq!(class(chunk.as_ref()), UNWRITABLE);
    }
}
