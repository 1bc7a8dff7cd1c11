//! Anti-entropy: averaging, its trust bounds, vouching and far anchors.

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
        let digest =
            ReplicaDigest { run_id: run, version: VersionVector::new(), applied: both.clone(), sketch: vec![3.0; 8] };
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
    // The sources of those updates are live members.
    for peer in [2, 4, 5] {
        let info =
            crate::engine::membership::PeerInfo { speed: 1.0, last_seen: Micros::ZERO, first_round: 0, round: 0 };
        e.membership.heard(NodeId([peer; 32]), info);
    }
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
/// vouch for it. Now the side that keeps its replica (here the lower id;
/// the other takes it whole, next test) fetches the other's whole once
/// every few rounds and refuses it from the digest's sketch in between,
/// while a near one is fetched every time, and a far one too while a second
/// contributor could vouch for it.
#[test]
fn a_far_anchor_nobody_could_vouch_for_is_fetched_only_now_and_then() {
    // We are node 3; node 4's replica yields to ours.
    let peer = NodeId([4; 32]);
    let far = || vec![1.0 + 3.0 / 8f32.sqrt(); 8];
    let fetched = |out: &[Output]| out.iter().any(|o| matches!(o, Output::FetchAnchor { .. }));
    let two_nodes = || {
        let mut e = engine_moving(Some(1.0));
        e.applied = set(&[(3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2)]);
        e
    };
    let mut e = two_nodes();
    let out = offer(&mut e, peer, far());
    assert!(fetched(&out), "the first time, the whole anchor is checked");
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { rounds }) if (rounds - 3.0).abs() < 0.1));
    for _ in 0..FAR_RECHECK_ROUNDS {
        let out = offer(&mut e, peer, far());
        assert!(!fetched(&out), "nobody could vouch for it: refused from the sketch");
        assert!(matches!(refusal(&out), Some(StateRefusal::TooFarBySketch { rounds }) if (rounds - 3.0).abs() < 0.1));
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
    // Node 2 has three updates in our replica and is live: it could vouch,
    // so the far anchor is fetched at every digest.
    let mut e = engine_moving(Some(1.0));
    for _ in 0..2 {
        assert!(fetched(&offer(&mut e, peer, far())));
    }
    // Once it has left, its updates stay in our replica but it vouches no
    // more: refused from the sketch after the first check.
    e.membership.remove(&NodeId([2; 32]));
    assert!(fetched(&offer(&mut e, peer, far())), "the first check after it left");
    assert!(!fetched(&offer(&mut e, peer, far())), "a contributor that left cannot vouch");
    // A far anchor of another peer's waits for a voucher: the peer's
    // may vouch for it, so it is fetched.
    let mut e = two_nodes();
    e.far_checked = Some((peer, e.round));
    e.far_candidate = Some(FarCandidate { peer: NodeId([2; 32]), anchor: vec![4.0; 8], round: e.round });
    assert!(fetched(&offer(&mut e, peer, far())));
}

/// A pull the shell held back (the peer is reached through a relay only)
/// or that failed is reported unavailable: the next digest asks again,
/// of that peer or another, and a far anchor's whole check that never ran
/// does not turn the next digests into refusals by the sketch.
#[test]
fn an_anchor_that_will_not_come_is_asked_for_again_at_the_next_digest() {
    let peer = NodeId([4; 32]);
    let far = vec![1.0 + 3.0 / 8f32.sqrt(); 8];
    let mut e = engine_moving(Some(1.0));
    e.applied = set(&[(3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2)]);
    let digest = |e: &mut Engine| {
        let (run_id, applied) = (e.run_id, e.seen());
        let sketch = anchor_sketch(&far);
        e.on_peer_digest(peer, ReplicaDigest { run_id, version: VersionVector::new(), applied, sketch });
        std::iter::from_fn(|| e.poll_output()).collect::<Vec<_>>()
    };
    let fetched = |out: &[Output]| out.iter().any(|o| matches!(o, Output::FetchAnchor { .. }));
    assert!(fetched(&digest(&mut e)));
    // Unanswered, the fetch blocks the next one until the anti-entropy
    // period ends.
    assert!(!fetched(&digest(&mut e)), "one fetch at a time");
    e.on_anchor_unavailable(NodeId([9; 32]));
    assert!(!fetched(&digest(&mut e)), "another peer's report frees nothing");
    e.on_anchor_unavailable(peer);
    let out = digest(&mut e);
    assert!(fetched(&out), "asked again, not refused by the sketch: {:?}", refusal(&out));
    // Once the whole check ran, the sketch decides for a while, as before.
    let mut state = e.replica_state();
    state.anchor = far.clone();
    e.on_peer_anchor(peer, state);
    let checked: Vec<_> = std::iter::from_fn(|| e.poll_output()).collect();
    assert!(matches!(refusal(&checked), Some(StateRefusal::TooFar { .. })));
    let out = digest(&mut e);
    assert!(!fetched(&out));
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFarBySketch { .. })));
}

/// The other side of the pair above: the far replica of our sole fellow
/// contributor is taken whole (anchor and outer state) where both sides'
/// rule picks it. Only a young replica (under FOUNDER_OUTER_ROUNDS) yields:
/// to an established one first, else to the one that applied more of what
/// the other gave up (its own early work, dropped by the other as too
/// stale), else to the lower id's. So the two end as one. Not while a third
/// contributor could vouch (a poisoner among many), not a replica of ours
/// that trained with a third node or is established, not from a peer that
/// contributed too little, and never a state claiming more outer rounds
/// than any run reaches.
#[test]
fn the_far_replica_of_a_sole_fellow_contributor_is_taken_whole_by_one_side() {
    let peer = NodeId([2; 32]);
    let far = vec![1.0 + 3.0 / 8f32.sqrt(); 8];
    let two_nodes = || {
        let mut e = engine_moving(Some(1.0));
        e.applied = set(&[(3, 0), (3, 1), (3, 2), (2, 0), (2, 1), (2, 2)]);
        e
    };
    // The digest and then the state of a peer whose replica applied
    // `applied` over `outer_rounds`; the outputs.
    let serve = |e: &mut Engine, applied: AppliedSet, outer_rounds: u64| {
        let mut state = e.replica_state();
        state.anchor = far.clone();
        state.applied = applied;
        state.outer.outer_rounds = outer_rounds;
        let (run_id, seen) = (e.run_id, e.seen());
        let sketch = anchor_sketch(&far);
        e.on_peer_digest(peer, ReplicaDigest { run_id, version: state.version.clone(), applied: seen, sketch });
        let mut out: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
        assert!(out.iter().any(|o| matches!(o, Output::FetchAnchor { .. })), "checked whole");
        e.on_peer_anchor(peer, state);
        out.extend(std::iter::from_fn(|| e.poll_output()));
        out
    };
    let taken = |out: &[Output]| {
        out.iter().any(|o| {
            matches!(o, Output::Event(EngineEvent::FarReplicaTaken { peer: p, rounds })
                if *p == NodeId([2; 32]) && (rounds - 3.0).abs() < 0.1)
        })
    };
    let peer_gave_up_ours = || set(&[(3, 1), (3, 2), (2, 0), (2, 1), (2, 2)]);
    // The same updates applied, both young: the lower id's (the peer's).
    let mut e = two_nodes();
    let same = e.applied.clone();
    let out = serve(&mut e, same.clone(), 40);
    assert_eq!(refusal(&out), None);
    assert!(taken(&out));
    assert_eq!(e.anchor(), far.as_slice());
    assert_eq!(e.outer.outer_rounds, 40, "the outer state comes with it");
    assert_eq!(e.stats().anchors_averaged, 1);
    // The peer gave up one of our early updates that we applied: ours is
    // kept, and its replica is refused (it takes ours).
    let mut e = two_nodes();
    let out = serve(&mut e, peer_gave_up_ours(), 40);
    assert!(!taken(&out));
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
    assert_eq!(e.anchor(), &[1.0; 8]);
    // ... unless the peer's replica is established and ours young.
    let mut e = two_nodes();
    assert!(taken(&serve(&mut e, peer_gave_up_ours(), FOUNDER_OUTER_ROUNDS)));
    // We gave up two of its early ones, it one of ours: its is kept.
    let mut e = two_nodes();
    e.applied = set(&[(3, 0), (3, 1), (3, 2), (2, 2), (2, 3), (2, 4)]);
    e.given_up = set(&[(2, 0), (2, 1)]);
    assert!(taken(&serve(&mut e, set(&[(3, 1), (3, 2), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4)]), 40)));
    // Nor one that trained with a third node (node 5, live, one update of
    // its applied: too few to vouch), whatever the peer claims.
    let mut e = two_nodes();
    e.applied.insert(UpdateId { src: NodeId([5; 32]), round: 0 });
    let all = e.applied.clone();
    assert!(!taken(&serve(&mut e, all, FOUNDER_OUTER_ROUNDS)));
    assert_eq!(e.anchor(), &[1.0; 8]);
    // An established replica of ours is not replaced by one peer's word,
    // whatever it claims.
    let mut e = two_nodes();
    e.outer.outer_rounds = FOUNDER_OUTER_ROUNDS;
    let out = serve(&mut e, same.clone(), 10 * FOUNDER_OUTER_ROUNDS);
    assert!(!taken(&out));
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
    assert_eq!(e.anchor(), &[1.0; 8]);
    // A claim of more outer rounds than any run reaches (AdamW's bias
    // correction would turn it into NaN) is no state at all.
    let mut e = two_nodes();
    let out = serve(&mut e, same, u64::MAX);
    assert!(matches!(refusal(&out), Some(StateRefusal::Invalid(_))));
    assert_eq!(e.anchor(), &[1.0; 8]);
    // Node 4 contributed too and is live: it could vouch, so the far
    // anchor waits for a voucher as before.
    let (e, out) = engine_offered(far.clone(), peer, Some(1.0));
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
    assert_eq!(e.anchor(), &[1.0; 8]);
    // Two updates of the peer's: not a contributor yet.
    let mut e = two_nodes();
    e.applied = set(&[(3, 0), (3, 1), (3, 2), (2, 0), (2, 1)]);
    assert_eq!(refusal(&offer(&mut e, peer, far)), Some(StateRefusal::NotContributor));
    assert_eq!(e.anchor(), &[1.0; 8]);
}

/// Three founders that trained apart (the simulator: three nodes kept
/// apart for their first 15 s stayed 0.59 apart to the end): each could
/// vouch for the others' far anchors, and none agreed. A young replica now
/// takes the far replica the founders' rule picks (here the same updates:
/// the lower id's) once every other contributor's whole anchor was checked
/// far lately; while one of them may share our replica (not checked, read
/// near, checked too long ago, gone) the far anchor waits for a voucher,
/// as before, and an established replica is taken only from a sole fellow
/// contributor.
#[test]
fn founders_that_trained_apart_take_the_replica_every_founder_picks() {
    let (peer, third) = (NodeId([2; 32]), NodeId([4; 32]));
    let far = vec![1.0 + 3.0 / 8f32.sqrt(); 8];
    let elsewhere = vec![1.0 - 3.0 / 8f32.sqrt(); 8];
    let three = || {
        let mut e = engine_moving(Some(1.0));
        e.applied = set(&[(3, 0), (3, 1), (3, 2), (2, 0), (2, 1), (2, 2), (4, 0), (4, 1), (4, 2)]);
        e
    };
    let taken = |out: &[Output]| out.iter().any(|o| matches!(o, Output::Event(EngineEvent::FarReplicaTaken { .. })));
    let mut e = three();
    let out = offer(&mut e, peer, far.clone());
    assert!(!taken(&out), "node 4 was not read: it may share our replica");
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
    assert!(out.iter().any(|o| matches!(o, Output::AntiEntropy { peer: p, .. } if *p == third)), "node 4 is asked");
    // Node 4's replica lies far too, elsewhere: not vouched for, and not
    // taken (it loses to ours: the same updates, and our id is lower).
    let out = offer(&mut e, third, elsewhere.clone());
    assert!(!taken(&out));
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
    // Node 2's wins over ours: taken whole. What was read far from the
    // replica we gave up says nothing about this one.
    let out = offer(&mut e, peer, far.clone());
    assert!(taken(&out), "{out:?}");
    assert_eq!(e.anchor(), far.as_slice());
    assert!(e.far_peers.is_empty());
    // Node 4 read near us, read too long ago, or gone: node 2's waits.
    let read_far = |e: &mut Engine| {
        offer(e, third, elsewhere.clone());
        e.round += 1;
    };
    let mut e = three();
    read_far(&mut e);
    offer(&mut e, third, vec![1.0; 8]);
    assert!(!taken(&offer(&mut e, peer, far.clone())), "node 4 read near");
    let mut e = three();
    read_far(&mut e);
    e.round += FAR_EVIDENCE_ROUNDS;
    assert!(!taken(&offer(&mut e, peer, far.clone())), "read too long ago");
    let mut e = three();
    read_far(&mut e);
    e.membership.remove(&third);
    assert!(!taken(&offer(&mut e, peer, far.clone())), "node 4 left");
    // Every other contributor read far: a young peer's replica is taken,
    // an established one's is not (only from a sole fellow contributor).
    let mut e = three();
    read_far(&mut e);
    assert!(taken(&offer(&mut e, peer, far.clone())));
    let mut e = three();
    read_far(&mut e);
    let mut state = e.replica_state();
    state.anchor = far.clone();
    state.outer.outer_rounds = FOUNDER_OUTER_ROUNDS;
    let (run_id, applied) = (e.run_id, e.seen());
    e.on_peer_digest(
        peer,
        ReplicaDigest { run_id, version: state.version.clone(), applied, sketch: anchor_sketch(&far) },
    );
    e.on_peer_anchor(peer, state);
    let out: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
    assert!(!taken(&out), "an established peer's word, with a third founder about");
    assert!(matches!(refusal(&out), Some(StateRefusal::TooFar { .. })));
    assert_eq!(e.anchor(), &[1.0; 8]);
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
