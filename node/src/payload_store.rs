//! Recent updates this node can serve: signed announcements and payloads.
//! A peer only asks for an update while it is fresh enough to apply, so the
//! store keeps the newest few rounds of each source (beyond the staleness
//! horizon nobody wants them) and bounds the total count and bytes too: its
//! memory stays flat however long the run (oldest evicted first).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use ragtag_protocol::{
    identity::Signed,
    ids::{Hash32, UpdateId},
    wire::UpdateAnnouncement,
};

/// A stored update.
#[derive(Debug, Clone)]
pub struct StoredUpdate {
    /// The signed announcement.
    pub announcement: Signed<UpdateAnnouncement>,
    /// The payload.
    pub payload: Arc<Vec<u8>>,
    /// The payload's blake3, as its announcement names it (the validator
    /// checked it on the way in; the engine computed our own): served with
    /// every chunk, so it is kept rather than hashed again per request.
    pub payload_hash: Hash32,
}

/// The bounded store.
#[derive(Debug)]
pub struct PayloadStore {
    items: BTreeMap<UpdateId, StoredUpdate>,
    order: VecDeque<UpdateId>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
    max_per_source: usize,
}

impl PayloadStore {
    /// A store of at most `max_items` updates, `max_bytes` of payload and
    /// the newest `max_per_source` rounds of each source.
    pub fn new(max_items: usize, max_bytes: usize, max_per_source: usize) -> Self {
        Self {
            items: BTreeMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            max_items: max_items.max(1),
            max_bytes,
            max_per_source: max_per_source.max(1),
        }
    }

    /// Rounds of one source worth keeping for a staleness horizon of
    /// `tau_max` ticks (a node publishes at most one round per tick), with
    /// a margin for fetches in flight; bounded for unbounded horizons.
    pub fn rounds_for_horizon(tau_max: u32) -> usize {
        (2 * tau_max as usize).saturating_add(4).clamp(8, 64)
    }

    /// Keeps an update (no-op if already held, or older than every round
    /// kept of a source that is at its bound).
    pub fn insert(&mut self, id: UpdateId, update: StoredUpdate) {
        if self.items.contains_key(&id) {
            return;
        }
        // Ids order by source, then round: a source's rounds are one range.
        let src = id.src;
        let mut held =
            self.items.range(UpdateId { src, round: 0 }..=UpdateId { src, round: u64::MAX }).map(|(k, _)| *k);
        if held.clone().count() >= self.max_per_source
            && let Some(oldest) = held.next()
        {
            if id.round < oldest.round {
                return;
            }
            self.forget(&oldest);
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

    /// Removes an update evicted by its source's bound.
    fn forget(&mut self, id: &UpdateId) {
        if let Some(u) = self.items.remove(id) {
            self.bytes -= u.payload.len();
        }
        self.order.retain(|o| o != id);
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
        (
            id,
            StoredUpdate {
                announcement: Signed::sign(&a, k),
                payload: Arc::new(vec![0; len]),
                payload_hash: a.payload_hash,
            },
        )
    }

    #[test]
    fn evicts_oldest_beyond_limits() {
        let k = Keypair::deterministic(1, 0);
        let mut s = PayloadStore::new(3, 250, 8);
        for r in 0..3 {
            let (id, u) = update(&k, r, 100);
            s.insert(id, u);
        }
        assert_eq!(s.len(), 2, "bytes bound");
        assert!(s.get(&UpdateId { src: k.node_id(), round: 0 }).is_none());
        assert!(s.get(&UpdateId { src: k.node_id(), round: 2 }).is_some());
        assert_eq!(s.bytes(), 200);
    }

    /// However long a run goes on, each source keeps only its newest rounds:
    /// the store (and the node's memory) stays flat.
    #[test]
    fn each_source_keeps_only_its_newest_rounds() {
        let keys: Vec<_> = (0..4).map(|i| Keypair::deterministic(i, 0)).collect();
        let mut s = PayloadStore::new(4096, 1 << 30, 5);
        for round in 0..1000 {
            for k in &keys {
                let (id, u) = update(k, round, 10);
                s.insert(id, u);
            }
        }
        assert_eq!(s.len(), 4 * 5);
        assert_eq!(s.bytes(), 4 * 5 * 10);
        assert_eq!(s.order.len(), s.len());
        for k in &keys {
            assert!(s.get(&UpdateId { src: k.node_id(), round: 999 }).is_some());
            assert!(s.get(&UpdateId { src: k.node_id(), round: 995 }).is_some());
            assert!(s.get(&UpdateId { src: k.node_id(), round: 994 }).is_none());
        }
        // A late, older round of a full source is not worth keeping.
        let (id, u) = update(&keys[0], 3, 10);
        s.insert(id, u);
        assert!(s.get(&id).is_none());
        // Rounds arriving out of order still leave the newest ones.
        let (id, u) = update(&keys[0], 997, 10);
        s.insert(id, u);
        assert_eq!(s.len(), 4 * 5);
    }

    #[test]
    fn the_horizon_bound_covers_the_staleness_window() {
        assert_eq!(PayloadStore::rounds_for_horizon(10), 24);
        assert_eq!(PayloadStore::rounds_for_horizon(0), 8);
        assert_eq!(PayloadStore::rounds_for_horizon(u32::MAX), 64);
    }
}
