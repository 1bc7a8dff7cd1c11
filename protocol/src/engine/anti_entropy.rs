//! Anti-entropy: the repair path after partitions, losses and restarts.
//! Peers exchange digests (what they applied or gave up, and a sketch of
//! their anchor); each fetches what it misses; when both have seen the same
//! set of updates but their anchors still differ by more than a threshold,
//! one fetches the other's anchor and averages, within the bounds of
//! [`super::trust`].

use std::sync::Arc;

use super::{
    Engine, EngineEvent, MAX_ANTI_ENTROPY_FETCHES, Output,
    snapshot::ReplicaState,
    trust::{self, MAX_ANCHOR_DISTANCE_ROUNDS, MAX_ANCHOR_STEP_ROUNDS, StateRefusal},
};
use crate::{
    ids::{NodeId, UpdateId},
    version::{AppliedSet, VersionVector},
    wire::{MAX_SKETCH_VALUES, ReplicaDigest},
};

/// Most outer rounds one average may move our count forward.
const MAX_OUTER_ROUNDS_AHEAD: u64 = 16;

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
    (a.len() == b.len()).then(|| trust::distance(a, b) / trust::norm(a).max(1e-12))
}

/// A far anchor waiting for a second peer to vouch for it.
#[derive(Debug)]
pub(super) struct FarCandidate {
    peer: NodeId,
    anchor: Vec<f32>,
    /// Our round when it arrived.
    round: u64,
}

/// Our rounds a far anchor waits for a voucher.
const VOUCH_ROUNDS: u64 = 2;

/// How far past [`MAX_ANCHOR_DISTANCE_ROUNDS`] a digest's sketch must put a
/// peer's anchor for us to refuse it unfetched: the sketch is 1,024 of the
/// anchor's values, so its distance is an estimate (within 3% of the whole
/// anchor's in the NAT lab's logs), and the whole anchor decides.
const FAR_BY_SKETCH_MARGIN: f32 = 1.1;

/// Our rounds between two whole fetches of the far anchor of a peer nobody
/// could vouch for: the sketch's fixed positions may line up with a
/// layer's rows and misjudge the distance, so the whole anchor is checked
/// now and then rather than never.
const FAR_RECHECK_ROUNDS: u64 = 16;

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
            inner_lr: self.inner_lr.clone(),
            roster: self.roster.clone(),
            sum_guard: self.sum_guard.clone(),
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
        let rounds = self.movement.median().map(|m| distance * trust::norm(&self.anchor) / m);
        self.event(EngineEvent::ConsensusDistance { peer: from, distance, rounds });
        let same_set = missing.is_empty() && mine.missing_from(&digest.applied).is_empty();
        if same_set {
            // Only replicas over the same updates compare meaningfully.
            self.repairing = distance > self.cfg.anti_entropy.distance_threshold;
        }
        // Beyond the threshold the replicas average (far ones, a healed
        // partition, with a voucher); within it, near ones are made one
        // (`take_whole`), so that midpoints do not leave them apart for good.
        let near = rounds.is_some_and(|r| r <= MAX_ANCHOR_STEP_ROUNDS);
        let wanted = distance > self.cfg.anti_entropy.distance_threshold || (near && distance > 0.0);
        if same_set && wanted && self.anchor_fetch.is_none() {
            // Refused before fetching: a state we would not use is not
            // worth its bytes.
            if let Err(reason) = self.may_average_with(&from) {
                self.event(EngineEvent::AnchorRefused { peer: from, reason });
                return;
            }
            // A far anchor is kept only to be vouched for; with nobody to
            // vouch, it would be fetched and refused at every digest (two
            // nodes that trained apart before they met: 3.6 MB each in
            // 80 s, the replicas 47% apart). So it is fetched whole once
            // every few rounds, and refused from the sketch in between.
            if let Some(r) = rounds.filter(|r| r.is_nan() || *r > MAX_ANCHOR_DISTANCE_ROUNDS * FAR_BY_SKETCH_MARGIN)
                && !self.could_vouch_for(&from)
            {
                let round = self.round;
                if self.far_checked.is_some_and(|(p, at)| p == from && round < at + FAR_RECHECK_ROUNDS) {
                    self.event(EngineEvent::AnchorRefused { peer: from, reason: StateRefusal::TooFar { rounds: r } });
                    return;
                }
                self.far_checked = Some((from, round));
            }
            self.anchor_fetch = Some(AnchorFetch { peer: from, seen: mine, peer_version: digest.version });
            self.emit(Output::FetchAnchor { from });
        }
    }

    /// Whether `peer` may be averaged with now: it has contributed enough
    /// recent updates we applied, and we have not averaged yet this round.
    fn may_average_with(&self, peer: &NodeId) -> Result<(), StateRefusal> {
        if self.applied.recent_count(peer) < trust::CONTRIBUTOR_MIN_UPDATES {
            return Err(StateRefusal::NotContributor);
        }
        if self.last_average_round == Some(self.round) {
            return Err(StateRefusal::TooSoon);
        }
        Ok(())
    }

    /// Whether a far anchor of `peer`'s could be vouched for: a far anchor
    /// of another peer's waits for a voucher, or another contributor could
    /// serve one.
    fn could_vouch_for(&self, peer: &NodeId) -> bool {
        let waiting =
            self.far_candidate.as_ref().is_some_and(|c| c.peer != *peer && self.round <= c.round + VOUCH_ROUNDS);
        waiting
            || self
                .applied
                .recent_counts()
                .any(|(id, n)| id != peer && *id != self.me && n >= trust::CONTRIBUTOR_MIN_UPDATES)
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
        // The digest that asked for this anchor is a round trip old: if
        // either side applied anything since, averaging would keep half of
        // those updates on one replica. Only average the sets the digests
        // matched on; the next digest retries.
        let Some(fetch) = self.anchor_fetch.take_if(|f| f.peer == from) else {
            return;
        };
        // Every part of it may reach our replica (the schedule too): the
        // joiner's checks, with a reason.
        if let Err(e) = state.verify(&self.cfg, self.anchor.len()) {
            self.event(EngineEvent::AnchorRefused { peer: from, reason: StateRefusal::Invalid(e) });
            return;
        }
        let mine = self.seen();
        let unchanged = mine.missing_from(&fetch.seen).is_empty() && fetch.seen.missing_from(&mine).is_empty();
        let same_replica = state.version == fetch.peer_version && state.applied.missing_from(&fetch.seen).is_empty();
        if !unchanged || !same_replica {
            self.event(EngineEvent::AnchorAverageSkipped { peer: from });
            return;
        }
        if let Err(reason) = self.may_average_with(&from) {
            self.event(EngineEvent::AnchorRefused { peer: from, reason });
            return;
        }
        let Some(scale) = self.movement.median() else {
            self.event(EngineEvent::AnchorRefused { peer: from, reason: StateRefusal::NoBaseline });
            return;
        };
        let rounds = trust::distance(&self.anchor, &state.anchor) / scale;
        if rounds.is_nan() || rounds > MAX_ANCHOR_DISTANCE_ROUNDS {
            self.on_far_anchor(from, state, rounds);
            return;
        }
        self.blend(from, &state, Some(MAX_ANCHOR_STEP_ROUNDS * scale));
    }

    /// A far anchor is what a poisoner offers, and also what the other side
    /// of a healed partition holds. The difference: the other side is many
    /// peers with the same replica. So a far anchor is used only once a
    /// second contributor serves one that agrees with it; until then it is
    /// kept and another peer is asked for its digest.
    fn on_far_anchor(&mut self, from: NodeId, state: ReplicaState, rounds: f32) {
        let vouched = self
            .far_candidate
            .take_if(|c| c.peer != from && self.round <= c.round + VOUCH_ROUNDS)
            .filter(|c| trust::anchors_agree(&c.anchor, &state.anchor));
        if vouched.is_some() {
            self.blend(from, &state, None);
            return;
        }
        self.event(EngineEvent::AnchorRefused { peer: from, reason: StateRefusal::TooFar { rounds } });
        self.far_candidate = Some(FarCandidate { peer: from, anchor: state.anchor, round: self.round });
        let others: Vec<NodeId> = self
            .membership
            .peers()
            .map(|(id, _)| *id)
            .filter(|id| *id != from && self.applied.max_round(id).is_some())
            .collect();
        if !others.is_empty() {
            let peer = others[self.rng.below(others.len() as u64) as usize];
            let digest = self.digest();
            self.emit(Output::AntiEntropy { peer, digest });
        }
    }

    /// Averages our replica with `state`. Bounded (`Some`: one peer's
    /// word): the anchor moves at most `anchor_bound`, each outer vector at
    /// most half its own norm (the buffer: the momentum's and its own).
    /// Unbounded (`None`: vouched for by a second peer): the plain average.
    /// Within the distance threshold and the bounds, one of the two
    /// replicas whole instead (`take_whole`).
    fn blend(&mut self, from: NodeId, state: &ReplicaState, anchor_bound: Option<f32>) {
        let close = relative_distance(&self.anchor, &state.anchor)
            .is_some_and(|d| d <= self.cfg.anti_entropy.distance_threshold);
        if close && anchor_bound.is_some_and(|b| self.within_whole_bounds(state, b)) {
            if self.peer_replica_wins(from, state) {
                self.take_whole(state);
                self.averaged_with(from, state);
            } else {
                self.event(EngineEvent::ReplicaKept { peer: from });
            }
            return;
        }
        // The closed ticks cannot be recomputed past an average.
        self.aggregation.replay.clear();
        let anchor = Arc::make_mut(&mut self.anchor);
        trust::bounded_blend(anchor, &state.anchor, 0.5, anchor_bound);
        let outer_bound = |norm: f32| anchor_bound.map(|_| 0.5 * norm);
        // The outer momentum must agree too, or it pushes the anchors apart
        // again. So must the phase of the outer accumulation (which arrival
        // of the group of N comes next): after a partition the two sides
        // count differently and would step at different arrivals forever.
        // The lower node id's phase wins, so the whole swarm ends on one;
        // likewise its inner-rate schedule, which the momentum can follow.
        if state.outer.fits(self.cfg.outer.kind, anchor.len()) {
            let momentum = trust::norm(&self.outer.momentum);
            trust::bounded_blend(&mut self.outer.momentum, &state.outer.momentum, 0.5, outer_bound(momentum));
            let second = outer_bound(trust::norm(&self.outer.second_moment));
            trust::bounded_blend(&mut self.outer.second_moment, &state.outer.second_moment, 0.5, second);
            if from < self.me {
                let buffer = anchor_bound.map(|_| momentum + trust::norm(&self.outer.buffer));
                trust::bounded_blend(&mut self.outer.buffer, &state.outer.buffer, 1.0, buffer);
                self.outer.count = state.outer.count.min(self.cfg.membership.max_peers);
                self.inner_lr.adopt(&state.inner_lr, &self.cfg.inner_lr, anchor_bound.is_some());
            }
            // Bounded too: the count drives the warm-up and AdamW's bias
            // correction.
            let ahead = state.outer.outer_rounds.min(self.outer.outer_rounds + MAX_OUTER_ROUNDS_AHEAD);
            self.outer.outer_rounds = self.outer.outer_rounds.max(ahead);
        }
        self.averaged_with(from, state);
    }

    /// Whether a near replica can be taken whole: every part of it lies
    /// within the bounds a midpoint would move by (one peer's word moves us
    /// no further either way).
    fn within_whole_bounds(&self, state: &ReplicaState, anchor_bound: f32) -> bool {
        let (ours, theirs) = (&self.outer, &state.outer);
        let momentum = trust::norm(&ours.momentum);
        let within = |a: &[f32], b: &[f32], bound: f32| trust::distance(a, b) <= bound;
        let inner_lr_ok =
            self.inner_lr == state.inner_lr || self.inner_lr.clone().adopt(&state.inner_lr, &self.cfg.inner_lr, true);
        theirs.fits(self.cfg.outer.kind, self.anchor.len())
            && within(&self.anchor, &state.anchor, anchor_bound)
            && within(&ours.momentum, &theirs.momentum, 0.5 * momentum)
            && within(&ours.second_moment, &theirs.second_moment, 0.5 * trust::norm(&ours.second_moment))
            && within(&ours.buffer, &theirs.buffer, momentum + trust::norm(&ours.buffer))
            && theirs.count <= self.cfg.membership.max_peers
            && theirs.outer_rounds <= ours.outer_rounds + MAX_OUTER_ROUNDS_AHEAD
            && inner_lr_ok
    }

    /// Which of two replicas over the same updates, within the threshold,
    /// both keep: the one that applied updates the other only gave up (it
    /// missed their sum), else the lower id's. Both sides decide alike, so
    /// the pair ends as one.
    fn peer_replica_wins(&self, from: NodeId, state: &ReplicaState) -> bool {
        let theirs_only = !state.applied.missing_from(&self.applied).is_empty();
        let ours_only = !self.applied.missing_from(&state.applied).is_empty();
        match (theirs_only, ours_only) {
            (true, false) => true,
            (false, true) => false,
            _ => from < self.me,
        }
    }

    /// Takes a replica within the threshold whole (anchor, outer state,
    /// inner-rate schedule), where a midpoint would leave the two apart for
    /// good. Beyond it, midpoints: two replicas that missed different sums
    /// average out their errors, where one kept whole keeps its own.
    fn take_whole(&mut self, state: &ReplicaState) {
        // The closed ticks cannot be recomputed past it.
        self.aggregation.replay.clear();
        self.anchor = Arc::new(state.anchor.clone());
        self.outer = state.outer.clone();
        self.inner_lr = state.inner_lr.clone();
    }

    /// Books an average (or a replica taken whole) with `from`.
    fn averaged_with(&mut self, from: NodeId, state: &ReplicaState) {
        self.applied.union(&state.applied);
        self.version.merge_max(&state.version);
        self.far_candidate = None;
        self.last_average_round = Some(self.round);
        self.averaged_this_round = true;
        self.stats.anchors_averaged += 1;
        self.event(EngineEvent::AnchorsAveraged { peer: from });
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
        let both = set(&[(3, 0), (2, 0), (2, 1), (2, 2)]);
        let engine_after_digest = || {
            let cfg = EngineConfig::preset(Strategy::Gopals);
            let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![1.0; 8], 1.0, 3);
            e.applied = both.clone();
            e.movement.record(10.0);
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
            s.inner_lr.scale = 0.5;
            s.applied = applied;
            s
        };
        // Nothing moved: averaged.
        let mut e = engine_after_digest();
        e.on_peer_anchor(peer, state(both.clone()));
        assert_eq!(e.anchor(), &[2.0; 8]);
        assert_eq!(e.stats().anchors_averaged, 1);
        assert_eq!(e.outer.count, 5, "the lower id's accumulation phase wins");
        assert_eq!(e.inner_lr.scale, 0.5, "and its inner-rate schedule");
        // The peer applied one more update meanwhile: skipped.
        let mut e = engine_after_digest();
        e.on_peer_anchor(peer, state(set(&[(3, 0), (2, 0), (2, 1), (2, 2), (2, 3)])));
        assert_eq!(e.anchor(), &[1.0; 8]);
        assert_eq!(e.inner_lr.scale, 1.0);
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
        // A schedule below the manifest's floor (a forged state): refused
        // with its reason, nothing of it taken.
        let mut e = engine_after_digest();
        let mut forged = state(both.clone());
        forged.inner_lr.scale = 1e-3;
        e.on_peer_anchor(peer, forged);
        assert_eq!(e.anchor(), &[1.0; 8]);
        assert_eq!(e.inner_lr.scale, 1.0);
        let out: Vec<_> = std::iter::from_fn(|| e.poll_output()).collect();
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Event(EngineEvent::AnchorRefused {
                reason: StateRefusal::Invalid(crate::engine::snapshot::StateError::InnerLr),
                ..
            })
        )));
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
        e.applied = set(&[(3, 0), (2, 0), (2, 2), (2, 3)]);
        let digest = || ReplicaDigest {
            run_id: run,
            version: VersionVector::new(),
            applied: set(&[(3, 0), (2, 0), (2, 1), (2, 2), (2, 3)]),
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

    /// An engine whose replica moves 1 a round (when `movement` is set) and
    /// has applied three updates each of nodes 2 and 4 and two of node 5.
    fn engine_moving(movement: Option<f32>) -> Engine {
        let cfg = EngineConfig::preset(Strategy::Gopals);
        let mut e = Engine::new(cfg, NodeId([3; 32]), RunId(Hash32([7; 32])), Micros::ZERO, vec![1.0; 8], 1.0, 3);
        e.applied = set(&[(3, 0), (2, 0), (2, 1), (2, 2), (4, 0), (4, 1), (4, 2), (5, 0), (5, 1)]);
        if let Some(m) = movement {
            e.movement.record(m);
        }
        e
    }

    /// `peer` offers `anchor` through anti-entropy (a digest over our seen
    /// set whose sketch points at it, then the state); the outputs.
    fn offer(e: &mut Engine, peer: NodeId, anchor: Vec<f32>) -> Vec<Output> {
        let sketch = anchor_sketch(&anchor);
        let (run_id, applied) = (e.run_id, e.seen());
        e.on_peer_digest(peer, ReplicaDigest { run_id, version: VersionVector::new(), applied, sketch });
        let mut out: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
        if out.iter().any(|o| matches!(o, Output::FetchAnchor { .. })) {
            let mut state = e.replica_state();
            state.anchor = anchor;
            e.on_peer_anchor(peer, state);
            out.extend(std::iter::from_fn(|| e.poll_output()));
        }
        out
    }

    fn engine_offered(anchor: Vec<f32>, peer: NodeId, movement: Option<f32>) -> (Engine, Vec<Output>) {
        let mut e = engine_moving(movement);
        let out = offer(&mut e, peer, anchor);
        (e, out)
    }

    fn refusal(out: &[Output]) -> Option<StateRefusal> {
        out.iter().find_map(|o| match o {
            Output::Event(EngineEvent::AnchorRefused { reason, .. }) => Some(*reason),
            _ => None,
        })
    }

    /// The poisoning seen in the wild: a far-away anchor offered through
    /// anti-entropy moved honest replicas half way to it.
    #[test]
    fn a_far_anchor_is_refused_and_a_near_one_moves_us_a_bounded_step() {
        let peer = NodeId([2; 32]);
        // 100 away, our replica moves 1 a round, nobody vouches for it:
        // refused, untouched.
        let (e, out) = engine_offered(vec![1.0 + 100.0 / 8f32.sqrt(); 8], peer, Some(1.0));
        assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { rounds }) if (rounds - 100.0).abs() < 0.1));
        assert_eq!(e.anchor(), &[1.0; 8]);
        assert_eq!(e.stats().anchors_averaged, 0);
        // 1.5 away: averaged, but the move is bounded (half a round's
        // movement), not half the distance.
        let (e, out) = engine_offered(vec![1.0 + 1.5 / 8f32.sqrt(); 8], peer, Some(1.0));
        assert_eq!(refusal(&out), None);
        let moved = trust::distance(e.anchor(), &[1.0; 8]);
        assert!((moved - MAX_ANCHOR_STEP_ROUNDS).abs() < 1e-4, "moved {moved}");
        let rounds = out.iter().find_map(|o| match o {
            Output::Event(EngineEvent::ConsensusDistance { rounds, .. }) => *rounds,
            _ => None,
        });
        assert!(rounds.is_some_and(|r| (r - 1.5).abs() < 1e-3), "the distance in rounds of movement: {rounds:?}");
        // Before our replica has moved there is no scale: refused.
        let (e, out) = engine_offered(vec![1.5; 8], peer, None);
        assert_eq!(refusal(&out), Some(StateRefusal::NoBaseline));
        assert_eq!(e.anchor(), &[1.0; 8]);
        // A peer none of whose updates we applied is not asked at all, nor
        // one with fewer than CONTRIBUTOR_MIN_UPDATES of them (node 5: two).
        for stranger in [NodeId([9; 32]), NodeId([5; 32])] {
            let (e, out) = engine_offered(vec![1.5; 8], stranger, Some(1.0));
            assert_eq!(refusal(&out), Some(StateRefusal::NotContributor));
            assert!(!out.iter().any(|o| matches!(o, Output::FetchAnchor { .. })));
            assert_eq!(e.anchor(), &[1.0; 8]);
        }
    }

    /// The other side of a healed partition is far too, but it is many
    /// peers with one replica: a second contributor serving an anchor that
    /// agrees vouches for it, and the replicas average in full.
    #[test]
    fn a_far_anchor_is_used_once_a_second_contributor_vouches_for_it() {
        let far = vec![1.0 + 10.0 / 8f32.sqrt(); 8];
        let mut e = engine_moving(Some(1.0));
        assert!(matches!(refusal(&offer(&mut e, NodeId([2; 32]), far.clone())), Some(StateRefusal::TooFar { .. })));
        // The same peer again vouches for nothing.
        assert!(matches!(refusal(&offer(&mut e, NodeId([2; 32]), far.clone())), Some(StateRefusal::TooFar { .. })));
        // Another peer with another far anchor does not either.
        let elsewhere = vec![1.0 - 10.0 / 8f32.sqrt(); 8];
        assert!(refusal(&offer(&mut e, NodeId([4; 32]), elsewhere)).is_some());
        assert_eq!(e.anchor(), &[1.0; 8]);
        // Two contributors agreeing: averaged in full.
        offer(&mut e, NodeId([2; 32]), far.clone());
        assert_eq!(refusal(&offer(&mut e, NodeId([4; 32]), far.clone())), None);
        assert_eq!(e.stats().anchors_averaged, 1);
        assert!((trust::distance(e.anchor(), &[1.0; 8]) - 5.0).abs() < 1e-4, "half way: {:?}", e.anchor());
    }

    /// Two nodes that trained apart before they met: each fetched the
    /// other's far anchor at every digest and refused it, as nobody could
    /// vouch for it. Now it is fetched whole once every few rounds and
    /// refused from the digest's sketch in between, while a near one is
    /// fetched every time, and a far one too while a second contributor
    /// could vouch for it.
    #[test]
    fn a_far_anchor_nobody_could_vouch_for_is_fetched_only_now_and_then() {
        let peer = NodeId([2; 32]);
        let far = || vec![1.0 + 3.0 / 8f32.sqrt(); 8];
        let fetched = |out: &[Output]| out.iter().any(|o| matches!(o, Output::FetchAnchor { .. }));
        let two_nodes = || {
            let mut e = engine_moving(Some(1.0));
            e.applied = set(&[(3, 0), (3, 1), (3, 2), (2, 0), (2, 1), (2, 2)]);
            e
        };
        let mut e = two_nodes();
        let out = offer(&mut e, peer, far());
        assert!(fetched(&out), "the first time, the whole anchor is checked");
        assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { rounds }) if (rounds - 3.0).abs() < 0.1));
        for _ in 0..FAR_RECHECK_ROUNDS {
            let out = offer(&mut e, peer, far());
            assert!(!fetched(&out), "nobody could vouch for it: refused from the sketch");
            assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { rounds }) if (rounds - 3.0).abs() < 0.1));
            e.round += 1;
        }
        assert!(fetched(&offer(&mut e, peer, far())), "checked whole again");
        assert_eq!(e.anchor(), &[1.0; 8]);
        // Just past the limit, within the sketch's margin: the whole anchor
        // decides every time.
        let mut e = two_nodes();
        for _ in 0..2 {
            let out = offer(&mut e, peer, vec![1.0 + 2.1 / 8f32.sqrt(); 8]);
            assert!(fetched(&out));
            assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
        }
        let mut e = two_nodes();
        let out = offer(&mut e, peer, vec![1.0 + 1.5 / 8f32.sqrt(); 8]);
        assert!(fetched(&out) && refusal(&out).is_none(), "a near anchor is fetched and used");
        assert_eq!(e.stats().anchors_averaged, 1);
        // Node 4 has three updates in our replica: it could vouch, so the
        // far anchor is fetched at every digest.
        let mut e = engine_moving(Some(1.0));
        for _ in 0..2 {
            assert!(fetched(&offer(&mut e, peer, far())));
        }
        // A far anchor of another peer's waits for a voucher: the peer's
        // may vouch for it, so it is fetched.
        let mut e = two_nodes();
        e.far_checked = Some((peer, e.round));
        e.far_candidate = Some(FarCandidate { peer: NodeId([4; 32]), anchor: vec![4.0; 8], round: e.round });
        assert!(fetched(&offer(&mut e, peer, far())));
    }

    /// Unsolicited digests cannot buy a second average in the same round.
    #[test]
    fn one_average_per_round() {
        let peer = NodeId([2; 32]);
        let (mut e, _) = engine_offered(vec![1.5; 8], peer, Some(1.0));
        assert_eq!(e.stats().anchors_averaged, 1);
        let digest = ReplicaDigest {
            run_id: e.run_id,
            version: VersionVector::new(),
            applied: e.seen(),
            sketch: anchor_sketch(&[2.0; 8]),
        };
        e.on_peer_digest(peer, digest);
        let out: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
        assert_eq!(refusal(&out), Some(StateRefusal::TooSoon));
        assert!(!out.iter().any(|o| matches!(o, Output::FetchAnchor { .. })));
    }

    /// Two replicas over the same updates within the threshold end as one,
    /// however small the difference (midpoints leave them apart for good):
    /// both keep the one that applied updates the other only gave up, else
    /// the lower id's. Beyond it they average.
    #[test]
    fn near_replicas_over_the_same_updates_end_as_one() {
        for offset in [2e-3, 1e-5] {
            let near = vec![1.0 + offset / 8f32.sqrt(); 8];
            let (e, out) = engine_offered(near.clone(), NodeId([2; 32]), Some(1.0));
            assert_eq!(refusal(&out), None);
            assert_eq!(e.anchor(), &near[..], "a lower id's taken whole at {offset} rounds");
            assert_eq!(e.stats().anchors_averaged, 1);
            let (e, out) = engine_offered(near.clone(), NodeId([4; 32]), Some(1.0));
            assert!(out.iter().any(|o| matches!(o, Output::FetchAnchor { .. })));
            assert_eq!(e.anchor(), &[1.0; 8], "a higher id's is not");
            assert_eq!(e.stats().anchors_averaged, 0);
        }
        // The higher id applied an update we gave up (we missed its sum):
        // its replica is the one kept.
        let near = vec![1.0 + 2e-3 / 8f32.sqrt(); 8];
        let mut e = engine_moving(Some(1.0));
        let missed = UpdateId { src: NodeId([2; 32]), round: 3 };
        e.given_up.insert(missed);
        let (run_id, applied) = (e.run_id, e.seen());
        let sketch = anchor_sketch(&near);
        e.on_peer_digest(NodeId([4; 32]), ReplicaDigest { run_id, version: VersionVector::new(), applied, sketch });
        assert!(std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::FetchAnchor { .. })));
        let mut state = e.replica_state();
        state.anchor = near.clone();
        state.applied.insert(missed);
        e.on_peer_anchor(NodeId([4; 32]), state);
        assert_eq!(e.anchor(), &near[..]);
        // A momentum beyond half our own's norm is not taken whole: the
        // bounded midpoint instead.
        let mut e = engine_moving(Some(1.0));
        e.outer.momentum = vec![1.0; 8];
        let near = vec![1.0 + 2e-3; 8];
        let (run_id, applied) = (e.run_id, e.seen());
        let sketch = anchor_sketch(&near);
        e.on_peer_digest(NodeId([2; 32]), ReplicaDigest { run_id, version: VersionVector::new(), applied, sketch });
        assert!(std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::FetchAnchor { .. })));
        let mut state = e.replica_state();
        state.anchor = near;
        state.outer.momentum = vec![3.0; 8];
        e.on_peer_anchor(NodeId([2; 32]), state);
        assert_eq!(e.stats().anchors_averaged, 1);
        assert!(e.anchor().iter().all(|x| (x - 1.001).abs() < 1e-6), "the midpoint: {:?}", e.anchor());
        // Beyond the threshold, a lower id's near replica is averaged, not taken.
        let (e, _) = engine_offered(vec![1.0 + 0.3 / 8f32.sqrt(); 8], NodeId([2; 32]), Some(1.0));
        assert!(e.anchor().iter().all(|x| (x - (1.0 + 0.15 / 8f32.sqrt())).abs() < 1e-6), "{:?}", e.anchor());
    }
}
