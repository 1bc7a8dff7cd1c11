//! Decoded sums shared between the engines of one process. The simulator
//! runs a thousand replicas, each of which fetched the same sum's bytes:
//! decoded once per replica, the member records of every kept tick were
//! most of its memory (late sums are put back into their tick, so each
//! replica keeps a few ticks of sums). Equal bytes decode to equal sums, so
//! the replicas can hold one allocation. A node runs one engine and needs
//! none of this.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
};

use crate::{
    aggregate::{Aggregate, AggregateError},
    codec::CodecKind,
    ids::Hash32,
};

/// What a decoded sum is known by: the hash of its bytes (computed by the
/// engine that asks, never taken from a peer) and how it was decoded.
type Key = (Hash32, CodecKind, usize);

/// A table of decoded sums, by the hash of their bytes, shared by the
/// engines given a clone of it. It holds no sum alive: an entry goes when
/// every engine has let its sum go. Engines that share it apply exactly
/// what they would apply without it.
#[derive(Clone, Debug, Default)]
pub struct SharedSums {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    sums: HashMap<Key, Weak<Aggregate>>,
    /// Entries after the last sweep of released sums: the next sweep comes
    /// when the table has doubled, so sweeping costs O(1) per insert.
    swept_len: usize,
}

impl SharedSums {
    /// The sum `bytes` decode to, `hash` being their hash (the caller's
    /// own). Decoded here if no engine holds it; a decoding error is not
    /// kept, so every engine that fetched the bytes reports its own.
    pub(super) fn decode(
        &self,
        hash: Hash32,
        bytes: &[u8],
        codec: CodecKind,
        n: usize,
    ) -> Result<Arc<Aggregate>, AggregateError> {
        let key = (hash, codec, n);
        let mut table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(sum) = table.sums.get(&key).and_then(Weak::upgrade) {
            return Ok(sum);
        }
        let sum = Arc::new(Aggregate::decode(bytes, codec, n)?);
        table.sums.insert(key, Arc::downgrade(&sum));
        if table.sums.len() > 2 * table.swept_len.max(64) {
            table.sums.retain(|_, s| s.strong_count() > 0);
            table.swept_len = table.sums.len();
        }
        Ok(sum)
    }

    /// Sums decoded and still held by some engine.
    #[cfg(test)]
    pub(in crate::engine) fn live(&self) -> usize {
        let table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        table.sums.values().filter(|s| s.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregate::AggregateMember,
        codec::{self, Payload},
        ids::{NodeId, UpdateId},
    };

    fn sum_bytes(loss: f32) -> Vec<u8> {
        let member = AggregateMember {
            id: UpdateId { src: NodeId([7; 32]), round: 3 },
            base_tick: 1,
            publish_tick: 1,
            samples: 64,
            staleness: 0,
            loss,
            weight: 1.0,
            payload_hash: Hash32([1; 32]),
        };
        let values = [0.5f32, -0.25, 1.0, 0.0];
        let mut payload = Vec::new();
        codec::encode(CodecKind::F32, &values, &mut payload);
        let parsed = Payload::parse(CodecKind::F32, 4, &payload).expect("own encoding");
        Aggregate::build(vec![(member, parsed)], CodecKind::F32, 4).encode()
    }

    #[test]
    fn equal_bytes_share_one_sum_until_every_holder_lets_it_go() {
        let shared = SharedSums::default();
        let bytes = sum_bytes(1.5);
        let hash = Hash32::of(&bytes);
        let a = shared.decode(hash, &bytes, CodecKind::F32, 4).expect("decodes");
        let b = shared.clone().decode(hash, &bytes, CodecKind::F32, 4).expect("decodes");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*a, Aggregate::decode(&bytes, CodecKind::F32, 4).expect("decodes"));
        // Another decoding of the same bytes is another entry.
        assert!(shared.decode(hash, &bytes, CodecKind::F32, 5).is_err());
        assert_eq!(shared.live(), 1);
        drop((a, b));
        assert_eq!(shared.live(), 0);
        let other = sum_bytes(2.5);
        let c = shared.decode(Hash32::of(&other), &other, CodecKind::F32, 4).expect("decodes");
        assert_eq!(c.members[0].loss, 2.5);
    }

    #[test]
    fn released_sums_are_swept_as_the_table_grows() {
        let shared = SharedSums::default();
        for i in 0..1000 {
            let bytes = sum_bytes(i as f32);
            let sum = shared.decode(Hash32::of(&bytes), &bytes, CodecKind::F32, 4).expect("decodes");
            drop(sum);
        }
        let len = shared.table.lock().expect("not poisoned").sums.len();
        assert!(len <= 129, "{len} entries kept for released sums");
    }
}
