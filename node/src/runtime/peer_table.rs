//! What the status page and `ragtag status` show beyond the engine's
//! counters: the held-out loss over time, each peer's standing, and the
//! traffic rate. Bounded: a fixed number of evaluations and peers.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::Instant,
};

use libp2p::PeerId;
use ragtag_protocol::{engine::Engine, time::Micros};

use crate::{identity, status::PeerStatus};

/// Evaluations kept for the chart.
const EVAL_HISTORY: usize = 512;
/// Peers tracked at most (the rest are not shown).
const MAX_PEERS: usize = 1024;

/// The bookkeeping.
#[derive(Debug)]
pub(crate) struct PeerTable {
    evals: VecDeque<(f64, f32)>,
    applied: BTreeMap<PeerId, u64>,
    /// Sum of the staleness of each peer's applied updates.
    staleness: BTreeMap<PeerId, u64>,
    rejected: BTreeMap<PeerId, u64>,
    kinds: BTreeMap<PeerId, &'static str>,
    last_bytes: (u64, u64, Instant),
    rates: (f64, f64),
}

impl Default for PeerTable {
    fn default() -> Self {
        Self {
            evals: VecDeque::new(),
            applied: BTreeMap::new(),
            staleness: BTreeMap::new(),
            rejected: BTreeMap::new(),
            kinds: BTreeMap::new(),
            last_bytes: (0, 0, Instant::now()),
            rates: (0.0, 0.0),
        }
    }
}

fn bump(map: &mut BTreeMap<PeerId, u64>, peer: PeerId) {
    if map.len() < MAX_PEERS || map.contains_key(&peer) {
        *map.entry(peer).or_insert(0) += 1;
    }
}

impl PeerTable {
    /// A held-out evaluation at `t` seconds since start.
    pub(crate) fn eval(&mut self, t: f64, loss: f32) {
        if self.evals.len() == EVAL_HISTORY {
            self.evals.pop_front();
        }
        self.evals.push_back((t, loss));
    }

    /// An update of `peer`'s was applied, `staleness` late.
    pub(crate) fn applied(&mut self, peer: PeerId, staleness: u64) {
        bump(&mut self.applied, peer);
        // Only peers within the table's bound.
        if self.applied.contains_key(&peer) {
            let sum = self.staleness.entry(peer).or_insert(0);
            *sum = sum.saturating_add(staleness);
        }
    }

    /// How the network reaches each connected peer now. A peer that left
    /// keeps the kind of its last connection (its row says it is not
    /// connected).
    pub(crate) fn connection_kinds(&mut self, kinds: &[(PeerId, &'static str)]) {
        for &(peer, kind) in kinds {
            if self.kinds.len() < MAX_PEERS || self.kinds.contains_key(&peer) {
                self.kinds.insert(peer, kind);
            }
        }
    }

    /// How the network reaches `peer` now, or reached it last ("unknown"
    /// before the first refresh that saw it connected).
    pub(crate) fn connection_kind(&self, peer: &PeerId) -> &'static str {
        self.kinds.get(peer).copied().unwrap_or("unknown")
    }

    /// An input from `peer` was rejected.
    pub(crate) fn rejected(&mut self, peer: PeerId) {
        bump(&mut self.rejected, peer);
    }

    /// Bytes sent and received so far; returns the rates since the last call.
    pub(crate) fn traffic(&mut self, out: u64, inn: u64) -> (f64, f64) {
        let (o, i, at) = self.last_bytes;
        let dt = at.elapsed().as_secs_f64();
        if dt >= 0.5 {
            self.rates = (out.saturating_sub(o) as f64 / dt, inn.saturating_sub(i) as f64 / dt);
            self.last_bytes = (out, inn, Instant::now());
        }
        self.rates
    }

    /// The evaluations, oldest first.
    pub(crate) fn evals(&self) -> Vec<(f64, f32)> {
        self.evals.iter().copied().collect()
    }

    /// One row per peer connected, heard from, or whose updates we applied
    /// (a peer that left stays in the table with what it contributed),
    /// connected ones first.
    pub(crate) fn rows(
        &self,
        engine: &Engine,
        now: Micros,
        connected: &BTreeSet<PeerId>,
        scores: &BTreeMap<String, f64>,
    ) -> Vec<PeerStatus> {
        let members: BTreeMap<PeerId, _> =
            engine.peers().filter_map(|(id, info)| identity::peer_id(id).map(|p| (p, info))).collect();
        let peers: BTreeSet<PeerId> =
            connected.iter().chain(members.keys()).chain(self.applied.keys()).copied().take(MAX_PEERS).collect();
        let mut rows: Vec<PeerStatus> = peers
            .into_iter()
            .map(|p| {
                let id = p.to_string();
                let info = members.get(&p);
                PeerStatus {
                    score: scores.get(&id).copied(),
                    peer_id: id,
                    connected: connected.contains(&p),
                    speed: info.map(|i| i.speed),
                    last_seen_s: info.map(|i| now.saturating_sub(i.last_seen).as_secs_f64()),
                    applied: self.applied.get(&p).copied().unwrap_or(0),
                    mean_staleness: match (self.staleness.get(&p), self.applied.get(&p)) {
                        (Some(sum), Some(&n)) if n > 0 => Some(*sum as f64 / n as f64),
                        _ => None,
                    },
                    connection: self.kinds.get(&p).map(|k| k.to_string()),
                    rejected: self.rejected.get(&p).copied().unwrap_or(0),
                }
            })
            .collect();
        rows.sort_by_key(|r| !r.connected);
        rows
    }
}
