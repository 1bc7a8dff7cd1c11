//! Reassembling an object (a payload, a replica state) from the chunks a
//! peer serves: every chunk must agree on the total and the hash, come in
//! order, stay under a limit set before the first byte is kept, and the
//! whole must hash to what the chunks claimed.

use crate::{ids::Hash32, wire::Chunk};

/// Why a chunked transfer was abandoned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A chunk disagrees with the first on size or hash, or is out of order.
    #[error("inconsistent chunks")]
    Inconsistent,
    /// The object is larger than the limit (or than it said).
    #[error("object of {total} bytes over the limit of {limit}")]
    TooLarge {
        /// Bytes claimed (or reached).
        total: u64,
        /// The limit.
        limit: u64,
    },
    /// An empty chunk before the end: the transfer would never finish.
    #[error("empty chunk before the end")]
    Stalled,
    /// The reassembled bytes do not hash to the claimed hash.
    #[error("object does not match its hash")]
    HashMismatch,
}

/// The most room an object's first chunk reserves for the whole: a peer
/// claiming a huge object cannot make us reserve more than this before it
/// has sent that much.
const UPFRONT_RESERVE_CAP: u64 = 64 << 20;

/// An object being reassembled.
#[derive(Debug)]
pub struct Reassembly {
    limit: u64,
    buf: Vec<u8>,
    expected: Option<(u64, Hash32)>,
}

impl Reassembly {
    /// A transfer of at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self { limit, buf: Vec::new(), expected: None }
    }

    /// Where the next chunk must start.
    pub fn offset(&self) -> u64 {
        self.buf.len() as u64
    }

    /// The hash every chunk claimed (zero before the first).
    pub fn hash(&self) -> Hash32 {
        self.expected.map_or(Hash32::default(), |(_, h)| h)
    }

    /// Takes the next chunk; returns the whole object and its hash once
    /// complete.
    pub fn push(&mut self, chunk: Chunk) -> Result<Option<(Vec<u8>, Hash32)>, ChunkError> {
        let (total, hash) = *self.expected.get_or_insert((chunk.total_len, chunk.hash));
        if chunk.total_len != total || chunk.hash != hash || chunk.offset != self.offset() {
            return Err(ChunkError::Inconsistent);
        }
        let reached = self.offset().saturating_add(chunk.bytes.len() as u64);
        if total > self.limit || reached > total {
            return Err(ChunkError::TooLarge { total: total.max(reached), limit: self.limit.min(total) });
        }
        if chunk.bytes.is_empty() && reached < total {
            return Err(ChunkError::Stalled);
        }
        // Room for the whole object at once (what it claimed, already
        // checked against the limit): growing by doubling would copy it
        // again at every doubling. Up to a cap until that much has come,
        // then the whole.
        let room = if self.offset() >= UPFRONT_RESERVE_CAP { total } else { total.min(UPFRONT_RESERVE_CAP) } as usize;
        if self.buf.capacity() < room {
            self.buf.reserve_exact(room - self.buf.len());
        }
        self.buf.extend_from_slice(&chunk.bytes);
        if reached < total {
            return Ok(None);
        }
        if Hash32::of(&self.buf) != hash {
            return Err(ChunkError::HashMismatch);
        }
        Ok(Some((std::mem::take(&mut self.buf), hash)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn chunks(object: &[u8], size: usize) -> Vec<Chunk> {
        let hash = Hash32::of(object);
        let mut out: Vec<Chunk> = object
            .chunks(size.max(1))
            .enumerate()
            .map(|(i, c)| Chunk { total_len: object.len() as u64, offset: (i * size) as u64, hash, bytes: c.to_vec() })
            .collect();
        if object.is_empty() {
            out.push(Chunk { total_len: 0, offset: 0, hash, bytes: Vec::new() });
        }
        out
    }

    fn reassemble(limit: u64, chunks: Vec<Chunk>) -> Result<Option<(Vec<u8>, Hash32)>, ChunkError> {
        let mut r = Reassembly::new(limit);
        for c in chunks {
            if let Some(done) = r.push(c)? {
                return Ok(Some(done));
            }
        }
        Ok(None)
    }

    #[test]
    fn each_fault_has_its_reason() {
        let object: Vec<u8> = (0..100u8).collect();
        let good = chunks(&object, 30);
        assert_eq!(reassemble(1000, good.clone()).unwrap().unwrap().0, object);
        assert_eq!(reassemble(99, good.clone()), Err(ChunkError::TooLarge { total: 100, limit: 99 }));
        let mut swapped = good.clone();
        swapped.swap(1, 2);
        assert_eq!(reassemble(1000, swapped), Err(ChunkError::Inconsistent));
        let mut lying = good.clone();
        lying[3].bytes[0] ^= 1;
        assert_eq!(reassemble(1000, lying), Err(ChunkError::HashMismatch));
        let mut empty = good.clone();
        empty[1].bytes.clear();
        assert_eq!(reassemble(1000, empty), Err(ChunkError::Stalled));
        let mut long = good;
        long[3].bytes.extend([0; 20]);
        assert!(matches!(reassemble(1000, long), Err(ChunkError::TooLarge { .. })));
    }

    proptest! {
        /// Any object in any chunk size comes back whole; any sequence of
        /// arbitrary chunks ends in an error, a wait, or an object that
        /// hashes to what the first chunk claimed, never over the limit.
        #[test]
        fn reassembly_is_exact_and_bounded(
            object in proptest::collection::vec(any::<u8>(), 0..500),
            size in 1usize..64,
            junk in proptest::collection::vec((0u64..600, 0u64..600, proptest::collection::vec(any::<u8>(), 0..80)), 0..10),
        ) {
            let done = reassemble(500, chunks(&object, size)).unwrap().unwrap();
            prop_assert_eq!(done.0, object.clone());
            let hash = Hash32::of(&object);
            let junk: Vec<Chunk> = junk.into_iter().map(|(total_len, offset, bytes)| Chunk { total_len, offset, hash, bytes }).collect();
            if let Ok(Some((bytes, h))) = reassemble(300, junk) {
                prop_assert!(bytes.len() <= 300);
                prop_assert_eq!(Hash32::of(&bytes), h);
            }
        }
    }
}
