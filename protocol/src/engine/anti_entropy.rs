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

/// Outer rounds below which a replica no fellow contributor shares may
/// still be replaced whole by a far peer's: about a minute of ticks, so
/// nodes that met within it merge (the NAT lab's met 7-14 s in), and no
/// single peer can replace a replica that trained longer.
const FOUNDER_OUTER_ROUNDS: u64 = 64;

/// Our rounds a whole-anchor check that put a peer's anchor far from ours
/// counts as evidence that the peer does not share our replica.
const FAR_EVIDENCE_ROUNDS: u64 = 32;

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
    /// This fetch is the far anchor's whole-state check (`far_checked`),
    /// and what `far_checked` held before it.
    far_check: Option<Option<(NodeId, u64)>>,
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
        // The sketch only estimates, and a peer writes its own: it can end
        // the evidence that the peer lies far (a clear near reading), never
        // give it.
        if rounds.is_some_and(|r| r * FAR_BY_SKETCH_MARGIN <= MAX_ANCHOR_DISTANCE_ROUNDS) {
            self.far_peers.remove(&from);
        }
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
            // (Between two that trained apart, the whole anchor's check
            // decides which replica both keep; see `on_far_anchor`.)
            let mut far_check = None;
            if let Some(r) = rounds.filter(|r| r.is_nan() || *r > MAX_ANCHOR_DISTANCE_ROUNDS * FAR_BY_SKETCH_MARGIN)
                && !self.could_vouch_for(&from)
            {
                let round = self.round;
                if self.far_checked.is_some_and(|(p, at)| p == from && round < at + FAR_RECHECK_ROUNDS) {
                    let reason = StateRefusal::TooFarBySketch { rounds: r };
                    self.event(EngineEvent::AnchorRefused { peer: from, reason });
                    return;
                }
                far_check = Some(self.far_checked.replace((from, round)));
            }
            self.anchor_fetch = Some(AnchorFetch { peer: from, seen: mine, peer_version: digest.version, far_check });
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
    /// of another peer's waits for a voucher, or another live contributor
    /// could serve one (one that left keeps its updates in our applied set,
    /// but will not vouch again).
    fn could_vouch_for(&self, peer: &NodeId) -> bool {
        let waiting =
            self.far_candidate.as_ref().is_some_and(|c| c.peer != *peer && self.round <= c.round + VOUCH_ROUNDS);
        waiting
            || self.applied.recent_counts().any(|(id, n)| {
                id != peer && *id != self.me && n >= trust::CONTRIBUTOR_MIN_UPDATES && self.membership.is_live(id)
            })
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

    /// The anchor asked of `from` will not come: another may be asked for
    /// at once, and a far anchor's check that never ran is not counted
    /// (else a pull the shell held back would refuse the peer's anchor by
    /// its sketch for [`FAR_RECHECK_ROUNDS`]).
    pub(super) fn on_anchor_unavailable(&mut self, from: NodeId) {
        if let Some(fetch) = self.anchor_fetch.take_if(|f| f.peer == from)
            && let Some(before) = fetch.far_check
        {
            self.far_checked = before;
        }
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
        self.note_distance(from, rounds);
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
    /// kept and another peer is asked for its digest. Where nobody shares
    /// our replica (founders that trained apart), a young replica may take
    /// a far one whole ([`Self::yields_to_far_founder`]).
    fn on_far_anchor(&mut self, from: NodeId, state: ReplicaState, rounds: f32) {
        let vouched = self
            .far_candidate
            .take_if(|c| c.peer != from && self.round <= c.round + VOUCH_ROUNDS)
            .filter(|c| trust::anchors_agree(&c.anchor, &state.anchor));
        if vouched.is_some() {
            self.blend(from, &state, None);
            return;
        }
        if self.yields_to_far_founder(from, &state) {
            self.take_whole(&state);
            self.averaged_with(from, &state);
            self.event(EngineEvent::FarReplicaTaken { peer: from, rounds });
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
        self.late_updates.clear();
        if anchor_bound.is_none() {
            // Moved half way to a far replica: the old readings are void.
            self.far_peers.clear();
        }
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

    /// Nodes that trained apart before they met (all started alone, say
    /// behind NATs only a relay crossed) hold far replicas nobody can vouch
    /// for, and each refused the others' for good: the run kept two models
    /// (NAT lab, BENCHMARKS.md), or three (three founders kept apart for
    /// the first 15 s in the simulator). So a young replica (fewer than
    /// [`FOUNDER_OUTER_ROUNDS`]) that no fellow contributor shares takes a
    /// far peer's whole, as a joiner whose one peer serves a state takes
    /// that: a young one's by [`Self::peer_replica_wins`], which young
    /// founders decide alike; an established one's only where that peer is
    /// our sole fellow contributor (young founders meeting an established
    /// one and others stay apart, as before).
    ///
    /// One peer's word must not replace a replica others share (a poisoner
    /// could claim whatever wins): every other node whose updates we
    /// applied must be live and its whole anchor checked far from ours
    /// within [`FAR_EVIDENCE_ROUNDS`] (since our anchor last moved to
    /// another replica). A replica that trained long, or with others near
    /// it (what is left of a swarm meeting a newcomer), keeps to the
    /// vouching rule. Where two sides' rules disagree, neither takes.
    fn yields_to_far_founder(&self, from: NodeId, state: &ReplicaState) -> bool {
        let round = self.round;
        let seen_far =
            |id: &NodeId| self.far_peers.get(id).is_some_and(|at| round < at.saturating_add(FAR_EVIDENCE_ROUNDS));
        let others: Vec<&NodeId> =
            self.applied.recent_counts().map(|(id, _)| id).filter(|id| **id != self.me && **id != from).collect();
        if !others.iter().all(|id| self.membership.is_live(id) && seen_far(id)) {
            return false;
        }
        let young = |outer_rounds: u64| outer_rounds < FOUNDER_OUTER_ROUNDS;
        match (young(self.outer.outer_rounds), young(state.outer.outer_rounds)) {
            (false, _) => false,
            (true, false) => others.is_empty(),
            (true, true) => self.peer_replica_wins(from, state),
        }
    }

    /// Books how far a contributor's whole anchor lies from ours, in rounds
    /// of our movement. Entries older than [`FAR_EVIDENCE_ROUNDS`] go, so
    /// the map holds only contributors checked lately.
    fn note_distance(&mut self, peer: NodeId, rounds: f32) {
        let round = self.round;
        self.far_peers.retain(|_, at| round < at.saturating_add(FAR_EVIDENCE_ROUNDS));
        if rounds.is_nan() || rounds > MAX_ANCHOR_DISTANCE_ROUNDS {
            self.far_peers.insert(peer, round);
        } else {
            self.far_peers.remove(&peer);
        }
    }

    /// Which of two replicas over the same updates both keep: the one that
    /// applied more of the updates the other only gave up (it missed their
    /// sum; or, between two that trained apart, it kept its own early work
    /// the other dropped as too stale), else the lower id's. Both sides
    /// decide alike, so the pair ends as one. Among more than two it is
    /// not always an order (the sets compare within each source's last
    /// rounds, so the window moves with the pair); where it cycles, the
    /// replicas, near after a take, average instead.
    fn peer_replica_wins(&self, from: NodeId, state: &ReplicaState) -> bool {
        let theirs_only = state.applied.missing_from(&self.applied).len();
        let ours_only = self.applied.missing_from(&state.applied).len();
        theirs_only.cmp(&ours_only).then_with(|| self.me.cmp(&from)).is_gt()
    }

    /// Takes a replica within the threshold whole (anchor, outer state,
    /// inner-rate schedule), where a midpoint would leave the two apart for
    /// good. Beyond it, midpoints: two replicas that missed different sums
    /// average out their errors, where one kept whole keeps its own.
    fn take_whole(&mut self, state: &ReplicaState) {
        // What was far from our replica says nothing about this one.
        self.far_peers.clear();
        // The closed ticks cannot be recomputed past it.
        self.aggregation.replay.clear();
        self.late_updates.clear();
        self.anchor = Arc::new(state.anchor.clone());
        self.outer = state.outer.clone();
        // No more arrivals in the buffer than a group has (a near replica
        // is within it already; a far one is taken on the peer's word).
        self.outer.count = self.outer.count.min(self.cfg.membership.max_peers);
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
mod tests;
