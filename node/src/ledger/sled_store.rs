//! sled storage behind the protocol's `LedgerStore` trait.
//!
//! Keys are big-endian sequence numbers (sled sorts raw bytes). A record
//! counts as written only after `flush`: appends are grouped and flushed
//! once per group, before any of them is announced.

use std::path::Path;

use ragtag_protocol::{
    identity::Signed,
    ledger::{LedgerStore, RecordBody, SignedRecord},
};

/// Ledger storage errors.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// sled failed.
    #[error("ledger storage: {0}")]
    Sled(#[from] sled::Error),
    /// A stored record does not decode.
    #[error("ledger record {0} is corrupt")]
    Corrupt(u64),
    /// An append out of sequence.
    #[error("append of record {got} after record {last:?}")]
    Sequence {
        /// The last stored sequence number.
        last: Option<u64>,
        /// The one appended.
        got: u64,
    },
}

/// A ledger in a sled database.
#[derive(Debug, Clone)]
pub struct SledLedger {
    db: sled::Db,
    own: sled::Tree,
    receipts: sled::Tree,
}

/// sled's page cache bound. The ledger is appended and rarely read back;
/// after 60,000 ledger-sized pairs sled held 19.8 MiB resident with this
/// bound against 45.2 MiB with 32 MiB (`--example ledger_memory`).
const CACHE_BYTES: u64 = 1 << 20;

fn encode(r: &SignedRecord) -> Vec<u8> {
    postcard::to_allocvec(r).expect("encoding to a Vec cannot fail")
}

fn decode(bytes: &[u8], seq: u64) -> Result<SignedRecord, LedgerError> {
    postcard::from_bytes::<Signed<RecordBody>>(bytes).map_err(|_| LedgerError::Corrupt(seq))
}

impl SledLedger {
    /// Opens (or creates) the ledger in `dir`.
    pub fn open(dir: &Path) -> Result<Self, LedgerError> {
        // sled caches up to 1 GiB by default; a volunteer's node runs for
        // days, and its ledger is read back rarely.
        let db = sled::Config::new().path(dir).cache_capacity(CACHE_BYTES).flush_every_ms(None).open()?;
        let own = db.open_tree("own")?;
        let receipts = db.open_tree("receipts")?;
        Ok(Self { db, own, receipts })
    }

    /// Appends records without flushing; call [`SledLedger::flush`] before
    /// treating them as written.
    pub fn append_unflushed(&self, records: &[SignedRecord]) -> Result<(), LedgerError> {
        let mut last = self.own.last()?.map(|(k, _)| u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0; 8])));
        let mut batch = sled::Batch::default();
        for r in records {
            let seq = r.decode_unverified().map_err(|_| LedgerError::Corrupt(last.map_or(0, |l| l + 1)))?.seq;
            if last.map_or(seq != 0, |l| seq != l + 1) {
                return Err(LedgerError::Sequence { last, got: seq });
            }
            batch.insert(&seq.to_be_bytes(), encode(r));
            last = Some(seq);
        }
        self.own.apply_batch(batch)?;
        Ok(())
    }

    /// Makes every append so far durable.
    pub fn flush(&self) -> Result<(), LedgerError> {
        self.db.flush()?;
        Ok(())
    }

    /// Raw access for tamper tests and `export`: (sequence, bytes).
    pub fn raw_records(&self) -> Result<Vec<(u64, Vec<u8>)>, LedgerError> {
        self.own
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                Ok((u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0; 8])), v.to_vec()))
            })
            .collect()
    }

    /// Replaces a stored record's bytes (tests of tampering only).
    pub fn overwrite_raw(&self, seq: u64, bytes: &[u8]) -> Result<(), LedgerError> {
        self.own.insert(seq.to_be_bytes(), bytes)?;
        Ok(())
    }

    /// Removes a stored record (tests of tampering only).
    pub fn remove_raw(&self, seq: u64) -> Result<(), LedgerError> {
        self.own.remove(seq.to_be_bytes())?;
        Ok(())
    }
}

impl LedgerStore for SledLedger {
    type Error = LedgerError;

    fn append(&mut self, record: &SignedRecord) -> Result<(), LedgerError> {
        self.append_unflushed(std::slice::from_ref(record))?;
        self.flush()
    }

    fn records(&self) -> Result<Vec<SignedRecord>, LedgerError> {
        self.raw_records()?.into_iter().map(|(seq, b)| decode(&b, seq)).collect()
    }

    fn last(&self) -> Result<Option<SignedRecord>, LedgerError> {
        match self.own.last()? {
            Some((k, v)) => Ok(Some(decode(&v, u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0; 8])))?)),
            None => Ok(None),
        }
    }

    fn keep_receipt(&mut self, record: &SignedRecord) -> Result<(), LedgerError> {
        self.receipts.insert(record.hash().0, encode(record))?;
        Ok(())
    }

    fn receipts(&self) -> Result<Vec<SignedRecord>, LedgerError> {
        self.receipts.iter().values().map(|v| decode(&v?, 0)).collect()
    }
}
