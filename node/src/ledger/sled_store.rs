//! sled storage behind the protocol's `LedgerStore` trait.
//!
//! Records live in [`BlockLog`]s: sealed blocks of records plus a short
//! tail. A record counts as written only after `flush`: appends are grouped
//! and flushed once per group, before any of them is announced.

use std::{
    collections::{BTreeMap, VecDeque},
    path::Path,
};

use ragtag_protocol::{
    identity::Signed,
    ids::Hash32,
    ledger::{LedgerStore, RecordBody, SignedRecord},
};

use super::{
    block_log::{BlockLog, BlockLogError, Entry},
    sled_open,
};

/// Ledger storage errors.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// sled failed.
    #[error("ledger storage: {0}")]
    Sled(#[from] sled::Error),
    /// A stored block does not decode.
    #[error(transparent)]
    Block(#[from] BlockLogError),
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
    /// A record asked for by sequence number is not stored.
    #[error("no ledger record {0}")]
    Missing(u64),
}

/// A ledger in a sled database: our chain, and the receipts we kept, each a
/// [`BlockLog`] whose sealed blocks live in a file beside the database, so
/// that sled holds a fixed set of keys as the ledger grows.
#[derive(Debug)]
pub struct SledLedger {
    db: sled::Db,
    chain: BlockLog,
    kept: BlockLog,
    /// Hashes of the receipts kept most recently, oldest first: a receipt
    /// delivered twice is kept once (reads deduplicate the rest).
    recent: VecDeque<Hash32>,
}

/// sled's page cache bound. The ledger is appended and rarely read back;
/// with one key per record sled held 45.2 MiB resident after 60,000 pairs
/// of records with a 32 MiB bound and 19.8 MiB with this one
/// (`--example ledger_memory`, before blocks).
const CACHE_BYTES: u64 = 1 << 20;

/// Receipt hashes remembered for deduplication on write.
const RECENT_RECEIPTS: usize = 1024;

fn encode(r: &SignedRecord) -> Vec<u8> {
    postcard::to_allocvec(r).expect("encoding to a Vec cannot fail")
}

fn decode(bytes: &[u8], seq: u64) -> Result<SignedRecord, LedgerError> {
    postcard::from_bytes::<Signed<RecordBody>>(bytes).map_err(|_| LedgerError::Corrupt(seq))
}

fn seq_of(key: &[u8]) -> u64 {
    u64::from_be_bytes(key.try_into().unwrap_or([0; 8]))
}

impl SledLedger {
    /// Opens (or creates) the ledger in `dir`, moving a ledger written with
    /// one key per record (before blocks) into blocks.
    pub fn open(dir: &Path) -> Result<Self, LedgerError> {
        // sled caches up to 1 GiB by default; a volunteer's node runs for
        // days, and its ledger is read back rarely.
        let db = sled_open::open(&sled::Config::new().path(dir).cache_capacity(CACHE_BYTES).flush_every_ms(None))?;
        let chain = BlockLog::open(db.open_tree("chain")?, &dir.join("chain.blocks"))?;
        let kept = BlockLog::open(db.open_tree("kept")?, &dir.join("kept.blocks"))?;
        let mut ledger = Self { db, chain, kept, recent: VecDeque::new() };
        ledger.migrate_per_record_trees()?;
        Ok(ledger)
    }

    fn migrate_per_record_trees(&mut self) -> Result<(), LedgerError> {
        // Each tree moves only into an empty log: a move cut short by a
        // crash is redone from the start, never appended twice.
        let names = self.db.tree_names();
        let has = |name: &str| names.iter().any(|n| n.as_ref() == name.as_bytes());
        if !has("own") && !has("receipts") {
            return Ok(());
        }
        if has("own") && self.chain.last()?.is_none() {
            let own = self.db.open_tree("own")?;
            let entries: Result<Vec<Entry>, sled::Error> =
                own.iter().map(|kv| kv.map(|(k, v)| Entry { seq: seq_of(&k), bytes: v.to_vec() })).collect();
            self.chain.append(entries?)?;
        }
        if has("receipts") && self.kept.last()?.is_none() {
            let receipts = self.db.open_tree("receipts")?;
            for (i, kv) in receipts.iter().enumerate() {
                let (_, v) = kv?;
                self.keep_receipt(&decode(&v, i as u64)?)?;
            }
        }
        self.db.flush()?;
        for name in ["own", "receipts"] {
            self.db.drop_tree(name)?;
        }
        Ok(())
    }

    /// Appends records without flushing; call [`SledLedger::flush`] before
    /// treating them as written.
    pub fn append_unflushed(&self, records: &[SignedRecord]) -> Result<(), LedgerError> {
        let mut last = self.chain.last()?.map(|e| e.seq);
        let mut entries = Vec::with_capacity(records.len());
        for r in records {
            let seq = r.decode_unverified().map_err(|_| LedgerError::Corrupt(last.map_or(0, |l| l + 1)))?.seq;
            if last.map_or(seq != 0, |l| seq != l + 1) {
                return Err(LedgerError::Sequence { last, got: seq });
            }
            entries.push(Entry { seq, bytes: encode(r) });
            last = Some(seq);
        }
        self.chain.append(entries)?;
        Ok(())
    }

    /// Makes every append so far durable.
    pub fn flush(&self) -> Result<(), LedgerError> {
        self.db.flush()?;
        Ok(())
    }

    /// Raw access for tamper tests and `export`: (sequence, bytes).
    pub fn raw_records(&self) -> Result<Vec<(u64, Vec<u8>)>, LedgerError> {
        Ok(self.chain.entries()?.into_iter().map(|e| (e.seq, e.bytes)).collect())
    }

    /// Replaces a stored record's bytes (tests of tampering only).
    pub fn overwrite_raw(&self, seq: u64, bytes: &[u8]) -> Result<(), LedgerError> {
        self.chain.replace(seq, Some(bytes))?.then_some(()).ok_or(LedgerError::Missing(seq))
    }

    /// Removes a stored record (tests of tampering only).
    pub fn remove_raw(&self, seq: u64) -> Result<(), LedgerError> {
        self.chain.replace(seq, None)?.then_some(()).ok_or(LedgerError::Missing(seq))
    }
}

impl LedgerStore for SledLedger {
    type Error = LedgerError;

    fn append(&mut self, record: &SignedRecord) -> Result<(), LedgerError> {
        self.append_unflushed(std::slice::from_ref(record))?;
        self.flush()
    }

    fn records(&self) -> Result<Vec<SignedRecord>, LedgerError> {
        self.chain.entries()?.iter().map(|e| decode(&e.bytes, e.seq)).collect()
    }

    fn last(&self) -> Result<Option<SignedRecord>, LedgerError> {
        self.chain.last()?.map(|e| decode(&e.bytes, e.seq)).transpose()
    }

    fn keep_receipt(&mut self, record: &SignedRecord) -> Result<(), LedgerError> {
        let hash = record.hash();
        if self.recent.contains(&hash) {
            return Ok(());
        }
        if self.recent.len() >= RECENT_RECEIPTS {
            self.recent.pop_front();
        }
        self.recent.push_back(hash);
        let seq = self.kept.last()?.map_or(0, |e| e.seq + 1);
        self.kept.append([Entry { seq, bytes: encode(record) }])?;
        Ok(())
    }

    fn receipts(&self) -> Result<Vec<SignedRecord>, LedgerError> {
        let mut unique = BTreeMap::new();
        for e in self.kept.entries()? {
            let r = decode(&e.bytes, e.seq)?;
            unique.entry(r.hash()).or_insert(r);
        }
        Ok(unique.into_values().collect())
    }
}
