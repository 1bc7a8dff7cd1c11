//! An append-only log of sequenced byte records in one sled tree, stored in
//! sealed blocks of [`BLOCK`] records plus a tail of at most `BLOCK - 1`.
//!
//! sled keeps state in memory for every page of a tree however small its
//! cache (a page holds up to 16 keys), and its cache keeps at least one page
//! in each of its 256 shards. With one key per record a node's resident
//! memory grew without bound, by about 65 bytes per pair of records from
//! 40,000 to 240,000 pairs; with blocks of 8 it levels off
//! (`--example ledger_memory`, figures in BENCHMARKS.md). The tail reuses
//! the same `BLOCK` keys for ever.

use serde::{Deserialize, Serialize};

/// Records per sealed block. Larger blocks mean fewer pages per record but
/// larger pages held in the cache's floor; 8 levelled off lowest of 1, 4, 8
/// and 16 after 240,000 pairs (`--example ledger_memory`).
pub(crate) const BLOCK: usize = 8;

const SEALED: u8 = 0;
const TAIL: u8 = 1;

/// One record and its sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// Its position in the log.
    pub(crate) seq: u64,
    /// Its bytes.
    pub(crate) bytes: Vec<u8>,
}

/// Why a stored block or tail entry cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BlockLogError {
    /// sled failed.
    #[error("ledger storage: {0}")]
    Sled(#[from] sled::Error),
    /// A stored value does not decode.
    #[error("ledger block {0:?} is corrupt")]
    Corrupt(Vec<u8>),
}

/// The log over one tree.
#[derive(Debug)]
pub(crate) struct BlockLog {
    tree: sled::Tree,
}

fn sealed_key(block: u64) -> [u8; 9] {
    let mut k = [SEALED; 9];
    k[1..].copy_from_slice(&block.to_be_bytes());
    k
}

fn tail_key(slot: usize) -> [u8; 3] {
    let s = (slot as u16).to_be_bytes();
    [TAIL, s[0], s[1]]
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("encoding to a Vec cannot fail")
}

/// A stored value: a sealed block of entries or one tail entry.
fn decode(key: &[u8], value: &[u8]) -> Result<Vec<Entry>, BlockLogError> {
    let corrupt = || BlockLogError::Corrupt(key.to_vec());
    match key.first() {
        Some(&SEALED) => postcard::from_bytes(value).map_err(|_| corrupt()),
        Some(&TAIL) => postcard::from_bytes(value).map(|e| vec![e]).map_err(|_| corrupt()),
        _ => Err(corrupt()),
    }
}

impl BlockLog {
    /// The log stored in `tree`.
    pub(crate) fn new(tree: sled::Tree) -> Self {
        Self { tree }
    }

    /// Appends entries in one atomic sled batch (durable after the
    /// database's next flush). Every `BLOCK`th append seals the tail into a
    /// block and frees the tail's keys.
    pub(crate) fn append(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), BlockLogError> {
        let mut tail = self.tail()?;
        let mut next_block = match self.tree.get_lt([TAIL])? {
            Some((k, _)) if k.len() == 9 => u64::from_be_bytes(k[1..].try_into().expect("9-byte key")) + 1,
            Some((k, _)) => return Err(BlockLogError::Corrupt(k.to_vec())),
            None => 0,
        };
        let mut batch = sled::Batch::default();
        for entry in entries {
            let slot = tail.last().map_or(0, |(s, _)| s + 1);
            batch.insert(&tail_key(slot), encode(&entry));
            tail.push((slot, entry));
            if slot + 1 >= BLOCK {
                let block: Vec<&Entry> = tail.iter().map(|(_, e)| e).collect();
                batch.insert(&sealed_key(next_block), encode(&block));
                for s in 0..BLOCK {
                    batch.remove(&tail_key(s));
                }
                tail.clear();
                next_block += 1;
            }
        }
        self.tree.apply_batch(batch)?;
        Ok(())
    }

    /// The tail: (slot, entry) in slot order.
    fn tail(&self) -> Result<Vec<(usize, Entry)>, BlockLogError> {
        self.tree
            .scan_prefix([TAIL])
            .map(|kv| {
                let (k, v) = kv?;
                let slot = match *k {
                    [TAIL, a, b] => u16::from_be_bytes([a, b]) as usize,
                    _ => return Err(BlockLogError::Corrupt(k.to_vec())),
                };
                let entry = postcard::from_bytes(&v).map_err(|_| BlockLogError::Corrupt(k.to_vec()))?;
                Ok((slot, entry))
            })
            .collect()
    }

    /// Every entry, in the order appended.
    pub(crate) fn entries(&self) -> Result<Vec<Entry>, BlockLogError> {
        let mut out = Vec::new();
        for kv in self.tree.iter() {
            let (k, v) = kv?;
            out.extend(decode(&k, &v)?);
        }
        Ok(out)
    }

    /// The newest entry.
    pub(crate) fn last(&self) -> Result<Option<Entry>, BlockLogError> {
        match self.tree.last()? {
            Some((k, v)) => Ok(decode(&k, &v)?.pop()),
            None => Ok(None),
        }
    }

    /// Replaces (or with `None` removes) the entry with sequence `seq`, in
    /// place; for tests of tampering. Returns whether it was found.
    pub(crate) fn replace(&self, seq: u64, bytes: Option<&[u8]>) -> Result<bool, BlockLogError> {
        for kv in self.tree.iter() {
            let (k, v) = kv?;
            let mut entries = decode(&k, &v)?;
            let Some(i) = entries.iter().position(|e| e.seq == seq) else { continue };
            match bytes {
                Some(b) => entries[i].bytes = b.to_vec(),
                None => {
                    entries.remove(i);
                }
            }
            match entries.first() {
                None => self.tree.remove(k)?,
                Some(_) if k.first() == Some(&SEALED) => self.tree.insert(k, encode(&entries))?,
                Some(e) => self.tree.insert(k, encode(e))?,
            };
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64) -> Entry {
        Entry { seq, bytes: seq.to_le_bytes().repeat(1 + seq as usize % 5) }
    }

    fn log() -> (tempfile::TempDir, BlockLog) {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        (dir, BlockLog::new(db.open_tree("t").unwrap()))
    }

    #[test]
    fn appends_in_groups_of_any_size_read_back_in_order() {
        let (_dir, log) = log();
        let mut seq = 0;
        for group in [1, 5, 7, 1, 8, 16, 3, 100, 7, 31] {
            log.append((seq..seq + group).map(entry)).unwrap();
            seq += group;
            let all = log.entries().unwrap();
            assert_eq!(all, (0..seq).map(entry).collect::<Vec<_>>());
            assert_eq!(log.last().unwrap(), Some(entry(seq - 1)));
        }
        // Sealed blocks plus a tail shorter than a block: few keys.
        let keys = log.tree.len();
        assert_eq!(keys, seq as usize / BLOCK + seq as usize % BLOCK, "{keys} keys for {seq} records");
    }

    #[test]
    fn replace_and_remove_reach_records_in_blocks_and_in_the_tail() {
        let (_dir, log) = log();
        log.append((0..20).map(entry)).unwrap();
        assert!(log.replace(3, Some(b"x")).unwrap());
        assert!(log.replace(18, Some(b"y")).unwrap());
        assert!(log.replace(10, None).unwrap());
        assert!(log.replace(19, None).unwrap());
        assert!(!log.replace(99, None).unwrap());
        let all = log.entries().unwrap();
        assert_eq!(all.len(), 18);
        assert_eq!(all[3].bytes, b"x");
        assert!(all.iter().any(|e| e.seq == 18 && e.bytes == b"y"));
        assert!(!all.iter().any(|e| e.seq == 10 || e.seq == 19));
        assert_eq!(log.last().unwrap().map(|e| e.seq), Some(18));
    }

    #[test]
    fn a_tail_with_a_hole_still_appends_without_overwriting() {
        let (_dir, log) = log();
        log.append((0..5).map(entry)).unwrap();
        log.replace(2, None).unwrap();
        log.append((5..40).map(entry)).unwrap();
        let seqs: Vec<u64> = log.entries().unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..40).filter(|&s| s != 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_corrupt_block_is_an_error_not_a_panic() {
        let (_dir, log) = log();
        log.append((0..20).map(entry)).unwrap();
        log.tree.insert(sealed_key(0), &[0xff; 3][..]).unwrap();
        assert!(matches!(log.entries(), Err(BlockLogError::Corrupt(_))));
    }
}
