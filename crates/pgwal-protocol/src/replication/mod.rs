//! CopyData payloads of the streaming replication protocol.
//!
//! After `START_REPLICATION` the server sends [`XLogData`] and
//! [`PrimaryKeepalive`] messages (and [`SenderFlush`] to clients that asked
//! for it), and the client sends
//! [`StandbyStatusUpdate`] and [`HotStandbyFeedback`]. Use
//! [`BackendReplicationMessage::decode`] on the body of each CopyData message
//! received from the server.

mod backend;
mod hot_standby_feedback;
mod keepalive;
mod sender_flush;
mod standby_status_update;
mod xlog_data;

pub use backend::BackendReplicationMessage;
pub use hot_standby_feedback::HotStandbyFeedback;
pub use keepalive::PrimaryKeepalive;
pub use sender_flush::SenderFlush;
pub use standby_status_update::StandbyStatusUpdate;
pub use xlog_data::XLogData;
