//! Why a node could not start or keep running.

use std::net::SocketAddr;

use ragtag_protocol::ledger::ChainError;

use super::startup;
use crate::{
    ledger::LedgerError,
    net::NetError,
    trainer_thread::{self, TrainerError},
};

/// Why a node could not start or keep running: `ragtag run` prints it and
/// exits. The network's and the trainer's errors are shown as their own
/// messages, which already name their causes, so they are not repeated as
/// sources.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The network could not be started.
    #[error("{0}")]
    Net(NetError),
    /// The metrics and status endpoint could not be served.
    #[error("serving metrics on {addr}")]
    Metrics {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The ledger database could not be opened.
    #[error("opening the ledger")]
    OpenLedger(#[source] LedgerError),
    /// Our chain could not be read from the ledger.
    #[error(transparent)]
    ReadLedger(LedgerError),
    /// Our chain's last record cannot be continued.
    #[error(transparent)]
    Chain(ChainError),
    /// The task starting the trainer panicked or was cancelled.
    #[error(transparent)]
    TrainerTask(#[from] tokio::task::JoinError),
    /// The trainer could not start.
    #[error("{0}")]
    Trainer(TrainerError),
    /// The engine could not be made ready.
    #[error(transparent)]
    Startup(#[from] startup::StartupError),
    /// The trainer did not take its checkpoint to restore.
    #[error(transparent)]
    Restore(trainer_thread::SendError),
    /// A signal handler could not be installed.
    #[error(transparent)]
    Signal(std::io::Error),
}
