//! Anti-entropy: the repair path after partitions, losses and restarts.
//! Peers exchange digests (what they applied or gave up, and a sketch of
//! their anchor); each fetches what it misses; when both have seen the same
//! set of updates but their anchors still differ by more than a threshold,
//! one fetches the other's anchor and averages.

use std::sync::Arc;

use super::{Engine, EngineEvent, MAX_ANTI_ENTROPY_FETCHES, Output, snapshot::ReplicaState};
use crate::{
    ids::{NodeId, UpdateId},
    version::{AppliedSet, VersionVector},
    wire::{MAX_SKETCH_VALUES, ReplicaDigest},
};

/// Values in an anchor sketch.
const SKETCH_VALUES: usize = 1024;

/// Anchor values at `SKETCH_VALUES` evenly strided positions: the same
/// positions on every replica, so sketches compare coordinate by coordinate.
pub fn anchor_sketch(anchor: &[f32]) -> Vec<f32> {
    let n = anchor.len();
    let m = SKETCH_VALUES.min(n);
    (0..m).map(|i| anchor[i * n / m]).collect()
}

/// `||a - b|| / ||a||`, or `None` when the sketches do not match in length.
pub fn relative_distance(a: &[f32], b: &[f32]) -> Option<f32> {
    if a.len() != b.len() {
        return None;
    }
    let (mut d, mut na) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        d += ((x - y) as f64).powi(2);
        na += (*x as f64).powi(2);
    }
    Some((d.sqrt() / na.sqrt().max(1e-12)) as f32)
}

/// An anchor asked for after matching digests: what it must still match
/// when it arrives.
#[derive(Debug)]
pub(super) struct AnchorFetch {
    peer: NodeId,
    /// The seen set both digests matched on.
    seen: AppliedSet,
    /// The version the peer's digest reported: a replica state with another
    /// version is not the replica the digest described (a cached snapshot
    /// taken before the peer applied more, or after).
    peer_version: VersionVector,
}

impl Engine {
    /// Everything this replica has seen: applied, or given up as too stale.
    fn seen(&self) -> AppliedSet {
        let mut s = self.applied.clone();
        s.union(&self.given_up);
        s
    }

    /// This replica's digest.
    pub fn digest(&self) -> ReplicaDigest {
        ReplicaDigest {
            run_id: self.run_id,
            version: self.version.clone(),
            applied: self.seen(),
            sketch: anchor_sketch(&self.anchor),
        }
    }

    /// The shared replica state, for a joiner or an anti-entropy peer.
    pub fn replica_state(&self) -> ReplicaState {
        ReplicaState {
            anchor: self.anchor.as_ref().clone(),
            outer: self.outer.clone(),
            version: self.version.clone(),
            applied: self.applied.clone(),
            clock: self.clock.clone(),
            round: self.round,
            last_closed_key: self.last_closed_key,
            pending: self.pending.clone(),
        }
    }

    pub(super) fn start_anti_entropy(&mut self) {
        // An anchor fetch unanswered for a whole anti-entropy period failed.
        self.anchor_fetch = None;
        let peers: Vec<NodeId> = self.membership.peers().map(|(id, _)| *id).collect();
        if peers.is_empty() {
            return;
        }
        let peer = peers[self.rng.below(peers.len() as u64) as usize];
        let digest = self.digest();
        self.emit(Output::AntiEntropy { peer, digest });
    }

    pub(super) fn on_peer_digest(&mut self, from: NodeId, digest: ReplicaDigest) {
        if digest.run_id != self.run_id || digest.sketch.len() > MAX_SKETCH_VALUES {
            return;
        }
        let mine = self.seen();
        let missing: Vec<_> = digest
            .applied
            .missing_from(&mine)
            .into_iter()
            .filter(|id| !self.awaiting.contains_key(id) && !self.pending_ids.contains(id))
            .collect();
        for id in missing.iter().take(MAX_ANTI_ENTROPY_FETCHES) {
            self.emit(Output::FetchAnnouncement { id: *id, from });
        }
        let Some(distance) = relative_distance(&anchor_sketch(&self.anchor), &digest.sketch) else {
            return;
        };
        self.event(EngineEvent::ConsensusDistance { peer: from, distance });
        let same_set = missing.is_empty() && mine.missing_from(&digest.applied).is_empty();
        if same_set {
            // Only replicas over the same updates compare meaningfully.
            self.repairing = distance > self.cfg.anti_entropy.distance_threshold;
        }
        if same_set && distance > self.cfg.anti_entropy.distance_threshold && self.anchor_fetch.is_none() {
            self.anchor_fetch = Some(AnchorFetch { peer: from, seen: mine, peer_version: digest.version });
            self.emit(Output::FetchAnchor { from });
        }
    }

    /// An update a peer has seen but can no longer serve. Left missing, it
    /// would keep the seen sets apart for good, so the replicas would never
    /// average again and drift apart: that is what happened once gossip lost
    /// in a partition was older than the rounds peers' stores keep.
    /// Given up, its effect reaches this replica through averaging instead.
    /// Only behind what we already have of its source: a peer cannot make
    /// us refuse updates still to come by naming them.
    pub(super) fn on_announcement_gone(&mut self, id: UpdateId) {
        if self.applied.contains(&id) || self.given_up.contains(&id) || self.is_known(&id) {
            return;
        }
        let newest = [&self.applied, &self.given_up].into_iter().filter_map(|s| s.max_round(&id.src)).max();
        if newest.is_none_or(|r| r <= id.round) {
            return;
        }
        self.given_up.insert(id);
        self.event(EngineEvent::FetchAbandoned { id });
    }

    pub(super) fn on_peer_anchor(&mut self, from: NodeId, state: ReplicaState) {
        if state.anchor.len() != self.anchor.len() || state.anchor.iter().any(|v| !v.is_finite()) {
            return;
        }
        // The digest that asked for this anchor is a round trip old: if
        // either side applied anything since, averaging would keep half of
        // those updates on one replica. Only average the sets the digests
        // matched on; the next digest retries.
        let Some(fetch) = self.anchor_fetch.take_if(|f| f.peer == from) else {
            return;
        };
        let mine = self.seen();
        let unchanged = mine.missing_from(&fetch.seen).is_empty() && fetch.seen.missing_from(&mine).is_empty();
        let same_replica = state.version == fetch.peer_version && state.applied.missing_from(&fetch.seen).is_empty();
        if !unchanged || !same_replica {
            self.event(EngineEvent::AnchorAverageSkipped { peer: from });
            return;
        }
        let anchor = Arc::make_mut(&mut self.anchor);
        average_into(anchor, &state.anchor);
        // The outer momentum must agree too, or it pushes the anchors apart
        // again. So must the phase of the outer accumulation (which arrival
        // of the group of N comes next): after a partition the two sides
        // count differently and would step at different arrivals forever.
        // The lower node id's phase wins, so the whole swarm ends on one.
        if state.outer.fits(self.cfg.outer.kind, anchor.len()) {
            average_into(&mut self.outer.momentum, &state.outer.momentum);
            average_into(&mut self.outer.second_moment, &state.outer.second_moment);
            if from < self.me {
                self.outer.buffer.clone_from(&state.outer.buffer);
                self.outer.count = state.outer.count;
            }
            self.outer.outer_rounds = self.outer.outer_rounds.max(state.outer.outer_rounds);
        }
        self.applied.union(&state.applied);
        self.version.merge_max(&state.version);
        self.stats.anchors_averaged += 1;
        self.event(EngineEvent::AnchorsAveraged { peer: from });
    }
}

fn average_into(mine: &mut [f32], theirs: &[f32]) {
    for (x, y) in mine.iter_mut().zip(theirs) {
        *x = 0.5 * (*x + y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::config::{EngineConfig, Strategy},
        ids::{Hash32, RunId, UpdateId},
        time::Micros,
        version::VersionVector,
    };

    #[test]
    fn sketch_positions_are_fixed_and_distance_is_relative() {
        let a: Vec<f32> = (0..5000).map(|i| i as f32).collect();
        let s = anchor_sketch(&a);
        assert_eq!(s.len(), SKETCH_VALUES);
        assert_eq!(s[1], a[5000 / 1024]);
        let b: Vec<f32> = a.iter().map(|x| x * 1.01).collect();
        let d = relative_distance(&s, &anchor_sketch(&b)).unwrap();
        assert!((d - 0.01).abs() < 1e-4, "{d}");
        assert_eq!(relative_distance(&s, &s), Some(0.0));
        assert_eq!(relative_distance(&s, &s[1..]), None);
    }

    fn set(ids: &[(u8, u64)]) -> AppliedSet {
        let mut s = AppliedSet::new();
        for &(src, round) in ids {
            s.insert(UpdateId { src: NodeId([src; 32]), round });
        }
        s
    }

    /// An anchor is averaged only if neither side applied anything between
    /// the matching digests and its arrival; otherwise half of those
    /// updates would be lost on one replica.
    #[test]
    fn anchors_average_only_over_the_sets_the_digests_matched() {
        let run = RunId(Hash32([7; 32]));
        let (me, peer) = (NodeId([3; 32]), NodeId([2; 32]));
        let both = set(&[(3, 0), (2, 0)]);
        let engine_after_digest = || {
            let cfg = EngineConfig::preset(Strategy::Gopals);
            let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![1.0; 8], 1.0, 3);
            e.applied = both.clone();
            let digest = ReplicaDigest {
                run_id: run,
                version: VersionVector::new(),
                applied: both.clone(),
                sketch: vec![3.0; 8],
            };
            e.on_peer_digest(peer, digest);
            assert!(std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::FetchAnchor { .. })));
            e
        };
        let state = |applied: AppliedSet| {
            let mut s = engine_after_digest().replica_state();
            s.anchor = vec![3.0; 8];
            s.outer.count = 5;
            s.applied = applied;
            s
        };
        // Nothing moved: averaged.
        let mut e = engine_after_digest();
        e.on_peer_anchor(peer, state(both.clone()));
        assert_eq!(e.anchor(), &[2.0; 8]);
        assert_eq!(e.stats().anchors_averaged, 1);
        assert_eq!(e.outer.count, 5, "the lower id's accumulation phase wins");
        // The peer applied one more update meanwhile: skipped.
        let mut e = engine_after_digest();
        e.on_peer_anchor(peer, state(set(&[(3, 0), (2, 0), (2, 1)])));
        assert_eq!(e.anchor(), &[1.0; 8]);
        // The peer served another replica than its digest described (a
        // cached snapshot, from another version): skipped.
        let mut e = engine_after_digest();
        let mut stale = state(set(&[(3, 0)]));
        stale.version.increment(NodeId([2; 32]));
        e.on_peer_anchor(peer, stale);
        assert_eq!(e.anchor(), &[1.0; 8]);
        assert_eq!(e.stats().anchors_averaged, 0);
        // We applied one more meanwhile: skipped.
        let mut e = engine_after_digest();
        e.applied.insert(UpdateId { src: me, round: 1 });
        e.on_peer_anchor(peer, state(both.clone()));
        assert_eq!(e.anchor(), &[1.0; 8]);
        // An anchor nobody asked for: ignored.
        let mut e = engine_after_digest();
        e.on_peer_anchor(NodeId([9; 32]), state(both.clone()));
        assert_eq!(e.stats().anchors_averaged, 0);
    }

    /// A hole no peer can fill any more (its holders evicted it) kept the
    /// seen sets apart for good: the replicas never averaged again.
    #[test]
    fn an_update_nobody_can_serve_is_given_up_and_averaging_resumes() {
        let run = RunId(Hash32([7; 32]));
        let (me, peer) = (NodeId([3; 32]), NodeId([2; 32]));
        let cfg = EngineConfig::preset(Strategy::Gopals);
        let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![1.0; 8], 1.0, 3);
        e.applied = set(&[(3, 0), (2, 0), (2, 2)]);
        let digest = || ReplicaDigest {
            run_id: run,
            version: VersionVector::new(),
            applied: set(&[(3, 0), (2, 0), (2, 1), (2, 2)]),
            sketch: vec![3.0; 8],
        };
        let outputs = |e: &mut Engine| std::iter::from_fn(|| e.poll_output()).collect::<Vec<_>>();
        let hole = UpdateId { src: peer, round: 1 };
        e.on_peer_digest(peer, digest());
        let out = outputs(&mut e);
        assert!(out.iter().any(|o| matches!(o, Output::FetchAnnouncement { id, .. } if *id == hole)));
        assert!(!out.iter().any(|o| matches!(o, Output::FetchAnchor { .. })), "the sets differ");
        // Claims about updates still to come, or from unknown sources, are not believed.
        for id in [UpdateId { src: peer, round: 5 }, UpdateId { src: NodeId([9; 32]), round: 0 }] {
            e.handle(Micros::ZERO, crate::engine::Input::AnnouncementGone(id));
            assert!(!e.given_up.contains(&id));
        }
        e.handle(Micros::ZERO, crate::engine::Input::AnnouncementGone(hole));
        assert!(e.given_up.contains(&hole));
        outputs(&mut e);
        e.on_peer_digest(peer, digest());
        assert!(outputs(&mut e).iter().any(|o| matches!(o, Output::FetchAnchor { .. })), "the sets match again");
    }
}
