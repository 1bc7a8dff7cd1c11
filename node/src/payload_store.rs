//! Recent updates this node can serve: signed announcements and payloads,
//! bounded in count and bytes (oldest evicted first).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use ragtag_protocol::{identity::Signed, ids::UpdateId, wire::UpdateAnnouncement};

/// A stored update.
#[derive(Debug, Clone)]
pub struct StoredUpdate {
    /// The signed announcement.
    pub announcement: Signed<UpdateAnnouncement>,
    /// The payload.
    pub payload: Arc<Vec<u8>>,
}

/// The bounded store.
#[derive(Debug)]
pub struct PayloadStore {
    items: BTreeMap<UpdateId, StoredUpdate>,
    order: VecDeque<UpdateId>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
}

impl PayloadStore {
    /// A store of at most `max_items` updates and `max_bytes` of payload.
    pub fn new(max_items: usize, max_bytes: usize) -> Self {
        Self { items: BTreeMap::new(), order: VecDeque::new(), bytes: 0, max_items: max_items.max(1), max_bytes }
    }

    /// Keeps an update (no-op if already held).
    pub fn insert(&mut self, id: UpdateId, update: StoredUpdate) {
        if self.items.contains_key(&id) {
            return;
        }
        self.bytes += update.payload.len();
        self.items.insert(id, update);
        self.order.push_back(id);
        while self.items.len() > self.max_items || (self.bytes > self.max_bytes && self.items.len() > 1) {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(u) = self.items.remove(&old) {
                self.bytes -= u.payload.len();
            }
        }
    }

    /// An update, if held.
    pub fn get(&self, id: &UpdateId) -> Option<&StoredUpdate> {
        self.items.get(id)
    }

    /// Updates held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use ragtag_protocol::{
        Keypair,
        codec::CodecKind,
        ids::{Hash32, RunId},
    };

    use super::*;

    fn update(k: &Keypair, round: u64, len: usize) -> (UpdateId, StoredUpdate) {
        let id = UpdateId { src: k.node_id(), round };
        let a = UpdateAnnouncement {
            run_id: RunId(Hash32::default()),
            id,
            base_total: 0,
            base: None,
            base_tick: 0,
            publish_tick: 0,
            sender_staleness: 0,
            steps: 1,
            samples: 1,
            speed: 1.0,
            loss: 1.0,
            codec: CodecKind::F32,
            num_values: 1,
            payload_len: len as u64,
            payload_hash: Hash32::default(),
        };
        (id, StoredUpdate { announcement: Signed::sign(&a, k), payload: Arc::new(vec![0; len]) })
    }

    #[test]
    fn evicts_oldest_beyond_limits() {
        let k = Keypair::deterministic(1, 0);
        let mut s = PayloadStore::new(3, 250);
        for r in 0..3 {
            let (id, u) = update(&k, r, 100);
            s.insert(id, u);
        }
        assert_eq!(s.len(), 2, "bytes bound");
        assert!(s.get(&UpdateId { src: k.node_id(), round: 0 }).is_none());
        assert!(s.get(&UpdateId { src: k.node_id(), round: 2 }).is_some());
        assert_eq!(s.bytes(), 200);
    }
}
