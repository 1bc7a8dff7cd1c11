//! The node's contribution ledger in sled: our own signed, hash-chained
//! records, and the receipts others signed about our contributions.

mod block_file;
mod block_log;
mod report;
mod sled_open;
mod sled_store;

pub use block_file::FrameError;
pub use block_log::BlockLogError;
pub use report::{ExportFormat, VerifyReport, export, summary, verify};
pub use sled_store::{LedgerError, SledLedger};
