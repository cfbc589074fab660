//! Test hooks of the physical receiver: points between receiving, writing
//! and fsyncing WAL where a caller may park it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use pgwal_protocol::Lsn;
use tokio::sync::watch;

/// A point in the physical receiver's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// WAL up to the given position was received into memory (and, with
    /// `AckMode::Receive`, already acknowledged); it is about to be written.
    BeforeWrite,
    /// WAL up to the given position was written (`pwrite`); it is about to
    /// be fsynced.
    BeforeFlush,
}

/// Called by the physical receiver at each [`Stage`]; the receiver does not
/// go on until the returned future completes (it neither reads the socket
/// nor sends status updates meanwhile).
pub trait StageHook: Send + Sync + 'static {
    /// The receiver reached `stage` with WAL up to `lsn`.
    fn reached(&self, stage: Stage, lsn: Lsn) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// A [`StageHook`] with one gate per stage: a closed gate parks the receiver
/// when it reaches that stage (optionally: with WAL past a given position)
/// until the gate is opened. All gates start open.
///
/// ```
/// use pgwal::{Gate, Stage};
///
/// let gate = Gate::new();
/// gate.close(Stage::BeforeWrite);
/// assert_eq!(gate.parked(), None); // nobody reached it yet
/// gate.open(Stage::BeforeWrite);
/// ```
#[derive(Debug)]
pub struct Gate {
    /// `None`: open; `Some(x)`: parks when the position reached is past `x`.
    write: watch::Sender<Option<Lsn>>,
    flush: watch::Sender<Option<Lsn>>,
    parked: Mutex<Option<(Stage, Lsn)>>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            write: watch::Sender::new(None),
            flush: watch::Sender::new(None),
            parked: Mutex::new(None),
        }
    }
}

impl Gate {
    /// All gates open; share it with `PhysicalConfig::hook`.
    pub fn new() -> std::sync::Arc<Gate> {
        std::sync::Arc::new(Gate::default())
    }

    fn sender(&self, stage: Stage) -> &watch::Sender<Option<Lsn>> {
        match stage {
            Stage::BeforeWrite => &self.write,
            Stage::BeforeFlush => &self.flush,
        }
    }

    /// Parks the receiver the next times it reaches `stage`.
    pub fn close(&self, stage: Stage) {
        self.sender(stage).send_replace(Some(Lsn::INVALID));
    }

    /// Parks the receiver when it reaches `stage` with WAL past `lsn` (so a
    /// test can wait for the batch holding a given record).
    pub fn close_after(&self, stage: Stage, lsn: Lsn) {
        self.sender(stage).send_replace(Some(lsn));
    }

    /// Lets a parked receiver go on, and no longer parks it at `stage`.
    pub fn open(&self, stage: Stage) {
        self.sender(stage).send_replace(None);
    }

    /// Where the receiver is parked now, with the position it reached.
    pub fn parked(&self) -> Option<(Stage, Lsn)> {
        *self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a gate in state `g` parks a receiver that reached `lsn`.
fn parks(g: Option<Lsn>, lsn: Lsn) -> bool {
    matches!(g, Some(after) if lsn > after)
}

impl StageHook for Gate {
    fn reached(&self, stage: Stage, lsn: Lsn) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let mut rx = self.sender(stage).subscribe();
            if !parks(*rx.borrow_and_update(), lsn) {
                return;
            }
            *self.parked.lock().unwrap_or_else(|e| e.into_inner()) = Some((stage, lsn));
            let _ = rx.wait_for(|g| !parks(*g, lsn)).await;
            *self.parked.lock().unwrap_or_else(|e| e.into_inner()) = None;
        })
    }
}
