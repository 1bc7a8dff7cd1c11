//! Where ledger records live.

use std::convert::Infallible;

use super::SignedRecord;
use crate::ids::Hash32;

/// Storage for one node's ledger: its own chain, and receipts others signed
/// about its contributions. `append` returns only once the record is
/// durable: the caller may then announce it.
pub trait LedgerStore {
    /// Storage failure.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Appends a record of our own chain, durably.
    fn append(&mut self, record: &SignedRecord) -> Result<(), Self::Error>;
    /// Our chain, in sequence order.
    fn records(&self) -> Result<Vec<SignedRecord>, Self::Error>;
    /// The newest record of our chain.
    fn last(&self) -> Result<Option<SignedRecord>, Self::Error>;
    /// Keeps a receipt another node signed (deduplicated by hash).
    fn keep_receipt(&mut self, record: &SignedRecord) -> Result<(), Self::Error>;
    /// Receipts kept from others.
    fn receipts(&self) -> Result<Vec<SignedRecord>, Self::Error>;
}

/// An in-memory ledger for the simulator and tests.
#[derive(Debug, Default, Clone)]
pub struct MemoryLedger {
    own: Vec<SignedRecord>,
    receipts: std::collections::BTreeMap<Hash32, SignedRecord>,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LedgerStore for MemoryLedger {
    type Error = Infallible;

    fn append(&mut self, record: &SignedRecord) -> Result<(), Infallible> {
        self.own.push(record.clone());
        Ok(())
    }

    fn records(&self) -> Result<Vec<SignedRecord>, Infallible> {
        Ok(self.own.clone())
    }

    fn last(&self) -> Result<Option<SignedRecord>, Infallible> {
        Ok(self.own.last().cloned())
    }

    fn keep_receipt(&mut self, record: &SignedRecord) -> Result<(), Infallible> {
        self.receipts.insert(record.hash(), record.clone());
        Ok(())
    }

    fn receipts(&self) -> Result<Vec<SignedRecord>, Infallible> {
        Ok(self.receipts.values().cloned().collect())
    }
}
