//! An append-only log of sequenced byte records: sealed blocks of [`BLOCK`]
//! records in a [`BlockFile`], and a tail of at most `BLOCK - 1` records in
//! one sled tree, beside the file's committed length.
//!
//! sled keeps state in memory for every page of a tree however small its
//! cache (a page holds up to 16 keys), and its cache keeps recently written
//! pages in memory until 64 more accesses reach the same one of its 256
//! shards. With one key per record a node's resident memory grew without
//! bound; with sealed blocks as sled values it grew by about 7.5 MiB over
//! the first 10,000 pairs of records before it levelled off, most of a soak
//! node's growth in its first half hour (`--example ledger_memory`, figures
//! in BENCHMARKS.md). Sealed blocks in a file of their own leave sled a
//! fixed set of keys: the tail reuses the same `BLOCK` keys for ever.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::block_file::{BlockFile, FrameError, frame, frames};

/// Records per sealed block: one file write (and sync) per block.
pub(crate) const BLOCK: usize = 8;

/// Blocks stored as sled values, before the block file; moved into it on
/// open.
const SEALED: u8 = 0;
const TAIL: u8 = 1;
/// The block file's committed length and where its last block starts.
const META: [u8; 1] = [2];

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
    /// The block file failed.
    #[error("ledger block file: {0}")]
    File(#[from] std::io::Error),
    /// A stored value does not decode.
    #[error("ledger block {0:?} is corrupt")]
    Corrupt(Vec<u8>),
    /// The block file's framing is broken.
    #[error("ledger block file is corrupt: {0}")]
    Frame(#[from] FrameError),
}

/// The committed part of the block file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    /// Bytes committed.
    len: u64,
    /// Where the last committed block starts.
    last_at: u64,
}

/// The log over one tree and one block file.
#[derive(Debug)]
pub(crate) struct BlockLog {
    tree: sled::Tree,
    file: BlockFile,
}

fn tail_key(slot: usize) -> [u8; 3] {
    let s = (slot as u16).to_be_bytes();
    [TAIL, s[0], s[1]]
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("encoding to a Vec cannot fail")
}

fn decode_block(at: u64, body: &[u8]) -> Result<Vec<Entry>, BlockLogError> {
    postcard::from_bytes(body).map_err(|_| BlockLogError::Corrupt(at.to_be_bytes().to_vec()))
}

impl BlockLog {
    /// The log stored in `tree` and the block file at `path`; moves blocks
    /// that an older version stored in `tree` into the file.
    pub(crate) fn open(tree: sled::Tree, path: &Path) -> Result<Self, BlockLogError> {
        let log = Self { tree, file: BlockFile::open(path)? };
        log.move_sealed_values()?;
        Ok(log)
    }

    fn move_sealed_values(&self) -> Result<(), BlockLogError> {
        let mut blocks = Vec::new();
        let mut keys = Vec::new();
        for kv in self.tree.scan_prefix([SEALED]) {
            let (k, v) = kv?;
            postcard::from_bytes::<Vec<Entry>>(&v).map_err(|_| BlockLogError::Corrupt(k.to_vec()))?;
            blocks.push(v);
            keys.push(k);
        }
        if blocks.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k);
        }
        self.write_blocks(self.meta()?, blocks.iter().map(|b| &b[..]), batch)?;
        self.tree.flush()?;
        Ok(())
    }

    fn meta(&self) -> Result<Meta, BlockLogError> {
        match self.tree.get(META)? {
            Some(v) => postcard::from_bytes(&v).map_err(|_| BlockLogError::Corrupt(META.to_vec())),
            None => Ok(Meta::default()),
        }
    }

    /// Appends encoded blocks to the file after `meta`, then applies `batch`
    /// with the new committed length: a crash in between leaves the old
    /// length, and the bytes written are cut off by the next write.
    fn write_blocks<'a>(
        &self,
        meta: Meta,
        blocks: impl IntoIterator<Item = &'a [u8]>,
        mut batch: sled::Batch,
    ) -> Result<(), BlockLogError> {
        let mut bytes = Vec::new();
        let mut last_at = meta.last_at;
        for b in blocks {
            last_at = meta.len + bytes.len() as u64;
            frame(&mut bytes, b);
        }
        if !bytes.is_empty() {
            self.file.write_at(meta.len, &bytes)?;
            batch.insert(&META, encode(&Meta { len: meta.len + bytes.len() as u64, last_at }));
        }
        self.tree.apply_batch(batch)?;
        Ok(())
    }

    /// Appends entries (durable after the database's next flush). Every
    /// `BLOCK`th append seals the tail into a block in the file and frees
    /// the tail's keys, in one atomic sled batch.
    pub(crate) fn append(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), BlockLogError> {
        let mut tail = self.tail()?;
        let mut batch = sled::Batch::default();
        let mut sealed = Vec::new();
        for entry in entries {
            let slot = tail.last().map_or(0, |(s, _)| s + 1);
            batch.insert(&tail_key(slot), encode(&entry));
            tail.push((slot, entry));
            if slot + 1 >= BLOCK {
                let block: Vec<&Entry> = tail.iter().map(|(_, e)| e).collect();
                sealed.push(encode(&block));
                for s in 0..BLOCK {
                    batch.remove(&tail_key(s));
                }
                tail.clear();
            }
        }
        self.write_blocks(self.meta()?, sealed.iter().map(|b| &b[..]), batch)
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

    /// The sealed blocks, in order.
    fn blocks(&self) -> Result<Vec<Vec<Entry>>, BlockLogError> {
        let bytes = self.file.read(0, self.meta()?.len)?;
        frames(&bytes, 0)?.into_iter().map(|(at, body)| decode_block(at, body)).collect()
    }

    /// Every entry, in the order appended.
    pub(crate) fn entries(&self) -> Result<Vec<Entry>, BlockLogError> {
        let mut out: Vec<Entry> = self.blocks()?.into_iter().flatten().collect();
        out.extend(self.tail()?.into_iter().map(|(_, e)| e));
        Ok(out)
    }

    /// The newest entry.
    pub(crate) fn last(&self) -> Result<Option<Entry>, BlockLogError> {
        if let Some((_, e)) = self.tail()?.pop() {
            return Ok(Some(e));
        }
        let meta = self.meta()?;
        let bytes = self.file.read(meta.last_at, meta.len)?;
        match frames(&bytes, meta.last_at)?.first() {
            Some(&(at, body)) => Ok(decode_block(at, body)?.pop()),
            None => Ok(None),
        }
    }

    /// Replaces (or with `None` removes) the entry with sequence `seq`, in
    /// place; for tests of tampering. Returns whether it was found.
    pub(crate) fn replace(&self, seq: u64, bytes: Option<&[u8]>) -> Result<bool, BlockLogError> {
        if let Some((slot, _)) = self.tail()?.into_iter().find(|(_, e)| e.seq == seq) {
            match bytes {
                Some(b) => self.tree.insert(tail_key(slot), encode(&Entry { seq, bytes: b.to_vec() }))?,
                None => self.tree.remove(tail_key(slot))?,
            };
            return Ok(true);
        }
        let mut blocks = self.blocks()?;
        let found = blocks.iter_mut().find_map(|b| b.iter().position(|e| e.seq == seq).map(|i| (b, i)));
        let Some((block, i)) = found else { return Ok(false) };
        match bytes {
            Some(b) => block[i].bytes = b.to_vec(),
            None => {
                block.remove(i);
            }
        }
        // The whole file is written again from its start.
        let encoded: Vec<Vec<u8>> = blocks.iter().filter(|b| !b.is_empty()).map(encode).collect();
        let mut batch = sled::Batch::default();
        batch.insert(&META, encode(&Meta::default()));
        self.write_blocks(Meta::default(), encoded.iter().map(|b| &b[..]), batch)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed_key(block: u64) -> [u8; 9] {
        let mut k = [SEALED; 9];
        k[1..].copy_from_slice(&block.to_be_bytes());
        k
    }

    fn entry(seq: u64) -> Entry {
        Entry { seq, bytes: seq.to_le_bytes().repeat(1 + seq as usize % 5) }
    }

    fn log() -> (tempfile::TempDir, BlockLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        (dir, log)
    }

    fn open(dir: &Path) -> BlockLog {
        let db = crate::ledger::sled_open::open(&sled::Config::new().path(dir)).unwrap();
        BlockLog::open(db.open_tree("t").unwrap(), &dir.join("t.blocks")).unwrap()
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
        // sled holds the tail and the file's length, no sealed block.
        let keys = log.tree.len();
        assert_eq!(keys, seq as usize % BLOCK + 1, "{keys} keys for {seq} records");
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
        let (dir, log) = log();
        log.append((0..24).map(entry)).unwrap();
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(dir.path().join("t.blocks")).unwrap();
        file.write_all_at(&[0xff; 3], 4).unwrap();
        assert!(matches!(log.entries(), Err(BlockLogError::Corrupt(_))));
        file.write_all_at(&[0xff; 4], 0).unwrap();
        assert!(matches!(log.entries(), Err(BlockLogError::Frame(_))));
        // A committed length the file never got: an error, not an
        // allocation of that size.
        log.tree.insert(META, encode(&Meta { len: u64::MAX / 2, last_at: 0 })).unwrap();
        assert!(matches!(log.entries(), Err(BlockLogError::File(_))));
        log.tree.insert(META, encode(&Meta { len: 1 << 40, last_at: 1 << 39 })).unwrap();
        assert!(matches!(log.last(), Err(BlockLogError::File(_))));
    }

    #[test]
    fn bytes_written_but_not_committed_are_never_read() {
        let (dir, log) = log();
        log.append((0..10).map(entry)).unwrap();
        // A crash after a block reached the file but before sled took its
        // length: the sled batch is lost, the bytes are not.
        let meta = log.meta().unwrap();
        let file = BlockFile::open(&dir.path().join("t.blocks")).unwrap();
        let mut stray = Vec::new();
        frame(&mut stray, &encode(&(100..108).map(entry).collect::<Vec<_>>()));
        file.write_at(meta.len, &stray).unwrap();
        assert_eq!(log.entries().unwrap(), (0..10).map(entry).collect::<Vec<_>>());
        log.append((10..30).map(entry)).unwrap();
        assert_eq!(log.entries().unwrap(), (0..30).map(entry).collect::<Vec<_>>());
        assert_eq!(log.last().unwrap(), Some(entry(29)));
    }

    #[test]
    fn blocks_stored_in_sled_by_an_older_version_move_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let tree = db.open_tree("t").unwrap();
            for b in 0..3u64 {
                let block: Vec<Entry> = (b * 8..b * 8 + 8).map(entry).collect();
                tree.insert(sealed_key(b), encode(&block)).unwrap();
            }
            tree.insert(tail_key(0), encode(&entry(24))).unwrap();
            db.flush().unwrap();
        }
        // Moved once: opening again finds them in the file.
        for _ in 0..2 {
            let log = open(dir.path());
            assert_eq!(log.entries().unwrap(), (0..25).map(entry).collect::<Vec<_>>());
            assert_eq!(log.tree.scan_prefix([SEALED]).count(), 0);
        }
        let log = open(dir.path());
        log.append((25..33).map(entry)).unwrap();
        assert_eq!(log.entries().unwrap(), (0..33).map(entry).collect::<Vec<_>>());
    }
}
