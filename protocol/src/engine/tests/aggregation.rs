//! Aggregated dissemination: replicas apply quorum sums and stay
//! identical, each node receives a bounded number of payloads per round,
//! one forging aggregator changes nothing anyone applies, and the sums of
//! two colluding ones are refused by their norm; a replica whose sums come
//! late ends identical to the others.

use super::*;
use crate::aggregate::{AggregateAnnouncement, AggregationConfig};

const NODES: usize = 16;

fn aggregated(on: bool) -> EngineConfig {
    let mut cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    cfg.anti_entropy.every_rounds = 0;
    if on {
        cfg.aggregation = Some(AggregationConfig { groups: 4, aggregators: 3, quorum: 2, fanout: 2, min_tick_ms: 0 });
    }
    cfg
}

fn speeds() -> Vec<f64> {
    (0..NODES).map(|k| 1.0 + (k % 4) as f64).collect()
}

fn applied_by(h: &Harness, k: usize) -> usize {
    h.applied_log.iter().filter(|(n, _)| *n == k).count()
}

#[test]
fn aggregated_replicas_stay_identical_and_each_node_receives_a_few_sums_per_round() {
    let mut full = Harness::new(aggregated(false), &speeds(), 11);
    let mut agg = Harness::new(aggregated(true), &speeds(), 11);
    agg.engines[0].config().validate().unwrap();
    let end = Micros::from_secs_f64(300.0);
    full.run_until(end);
    agg.run_until(end);
    let opt = global_optimum(NODES);
    let start: f32 = opt.iter().map(|x| x * x).sum::<f32>().sqrt();
    for h in [&full, &agg] {
        // Every replica that applied the same updates holds the same anchor.
        let v0 = h.engines[0].version().clone();
        let same = h.engines.iter().filter(|e| e.version() == &v0).count();
        assert!(same >= NODES - 1, "{same} replicas agree with node 0");
        for e in h.engines.iter().filter(|e| e.version() == &v0) {
            assert_eq!(e.anchor(), h.engines[0].anchor());
        }
        assert!(h.distance_to(0, &opt) < 0.05 * start, "{} of {start}", h.distance_to(0, &opt));
    }
    // Nearly every update is applied through the sums: the last tick's
    // may still be open, and an early tick's may miss its group's quorum.
    let published = agg.announcements.len();
    let applied = applied_by(&agg, 5);
    assert!(applied * 100 >= published * 95, "applied {applied} of {published}");
    let missed = agg.dropped.iter().filter(|(_, r)| *r == RejectReason::MissedAggregate).count();
    assert!(missed * 100 <= published * NODES, "{missed} missed");
    // Full dissemination delivers every update to every node; aggregated,
    // a node receives one sum per group (4) and, as one of 12 aggregator
    // slots a tick among 16 nodes, 3 members a round on average.
    let rounds = agg.engines[5].stats().rounds;
    let per_round = agg.received[5] as f64 / rounds as f64;
    let full_per_round = full.received[5] as f64 / full.engines[5].stats().rounds as f64;
    assert!(per_round <= 4.0 + 3.0 + 1.0, "{per_round} per round");
    assert!(full_per_round >= (NODES - 2) as f64, "{full_per_round} per round");
}

#[test]
fn a_forging_aggregator_changes_nothing_that_is_applied() {
    let mut honest = Harness::new(aggregated(true), &speeds(), 12);
    let mut forged = Harness::new(aggregated(true), &speeds(), 12);
    forged.forgers = vec![3];
    let end = Micros::from_secs_f64(120.0);
    honest.run_until(end);
    forged.run_until(end);
    // The forger's sums never gathered a quorum: every node applied the
    // honest sums, and the run is bit-identical to the honest one.
    assert!(forged.aggregators.contains(&forged.engines[3].node_id()), "node 3 aggregated");
    for k in 0..NODES {
        assert_eq!(forged.engines[k].anchor(), honest.engines[k].anchor(), "node {k}");
    }
    // A sum signed by a node no view designates is refused with its reason.
    let e = &mut forged.engines[1];
    let now = end;
    let key = e.clock.as_ref().unwrap().tick(now);
    let designated = e.designated(key);
    let outsider = (0..NODES)
        .map(|k| Keypair::deterministic(12, k as u64).node_id())
        .find(|n| !designated[0].contains(n))
        .unwrap();
    let a = AggregateAnnouncement {
        run_id: e.run_id(),
        key,
        group: 0,
        aggregator: outsider,
        members: 1,
        body_len: 100,
        body_hash: Hash32([1; 32]),
    };
    // The verdict a shell asks for before gossip passes the hash on.
    assert_eq!(e.aggregate_announcement_verdict(now, &a), Some(RejectReason::NotAnAggregator));
    let signed_by_designated = AggregateAnnouncement { aggregator: designated[0][0], ..a.clone() };
    assert_eq!(e.aggregate_announcement_verdict(now, &signed_by_designated), None);
    let elsewhere = AggregateAnnouncement { run_id: RunId(Hash32([0xab; 32])), ..a.clone() };
    assert_eq!(e.aggregate_announcement_verdict(now, &elsewhere), Some(RejectReason::WrongRun));
    e.handle(now, Input::AggregateAnnouncement { announcement: a, from: outsider });
    let refused = std::iter::from_fn(|| e.poll_output()).any(|o| {
        matches!(o, Output::Event(EngineEvent::AggregateRefused { reason: RejectReason::NotAnAggregator, .. }))
    });
    assert!(refused);
    assert_eq!(e.stats().dropped.get(&RejectReason::NotAnAggregator), Some(&1));
}

#[test]
fn sums_forged_by_two_colluding_aggregators_are_refused_by_every_replica() {
    let mut honest = Harness::new(aggregated(true), &speeds(), 13);
    let mut forged = Harness::new(aggregated(true), &speeds(), 13);
    forged.forgers = vec![2, 9];
    forged.forge_scale = Some(1000.0);
    let end = Micros::from_secs_f64(300.0);
    honest.run_until(end);
    forged.run_until(end);
    // Both colluders were designated for one group in some ticks, and
    // signed the same forged sum there: a quorum.
    let quorums: std::collections::BTreeSet<_> = forged
        .forged
        .iter()
        .filter(|f| forged.forged.iter().filter(|g| g == f).count() >= 2)
        .map(|(k, g, _)| (*k, *g))
        .collect();
    assert!(quorums.len() >= 3, "{} forged quorums", quorums.len());
    // Every honest replica refused those sums by their norm, and no other
    // (the colluders' own engines hold the honest sums they built).
    for (k, e) in forged.engines.iter().enumerate().filter(|(k, _)| !forged.forgers.contains(k)) {
        let refused = e.stats().dropped.get(&RejectReason::NormTooLarge).copied().unwrap_or(0);
        assert!(refused >= quorums.len() as u64 - 1, "node {k} refused {refused} of {}", quorums.len());
        assert_eq!(honest.engines[k].stats().dropped.get(&RejectReason::NormTooLarge), None, "node {k}");
    }
    // The replicas agree, and converge as the honest run does (the
    // refused groups' updates are lost, nothing more).
    let v0 = forged.engines[0].version().clone();
    let same = forged.engines.iter().filter(|e| e.version() == &v0).count();
    assert!(same >= NODES - 3, "{same} replicas agree with node 0");
    for e in forged.engines.iter().filter(|e| e.version() == &v0) {
        assert_eq!(e.anchor(), forged.engines[0].anchor());
    }
    let opt = global_optimum(NODES);
    let start: f32 = opt.iter().map(|x| x * x).sum::<f32>().sqrt();
    let (d_forged, d_honest) = (forged.distance_to(0, &opt), honest.distance_to(0, &opt));
    assert!(d_forged < 0.05 * start && d_forged < 2.0 * d_honest.max(1e-3 * start), "{d_forged} against {d_honest}");
}

/// A tick derived from fast nodes' speeds is too short for a sum's two
/// hops between real processes: with aggregation it is at least the floor.
#[test]
fn aggregated_ticks_are_at_least_the_floor() {
    let fast = [200.0; 4];
    let period = |min_tick_ms: Option<u32>| {
        let mut cfg = aggregated(false);
        cfg.aggregation =
            min_tick_ms.map(|m| AggregationConfig { groups: 2, aggregators: 3, quorum: 2, fanout: 8, min_tick_ms: m });
        let mut h = Harness::new(cfg, &fast, 3);
        h.run_until(Micros::from_secs_f64(20.0));
        h.engines[0].tick_period().expect("tick mode").as_secs_f64()
    };
    let derived = period(None);
    assert!(derived < 0.5, "H / speed: {derived} s");
    assert_eq!(period(Some(0)), derived, "no floor: the derived period");
    assert_eq!(period(Some(1_000)), 1.0);
    assert_eq!(period(Some(crate::aggregate::DEFAULT_MIN_TICK_MS)), 1.0);
}

/// A shell takes a sum offered only by our parent in its group's tree, and
/// asks for it only within the ticks whose sums are still taken; a body
/// naming the last tick there is refused, not a panic.
#[test]
fn a_sum_parent_is_named_only_for_ticks_whose_sums_are_taken() {
    let mut h = Harness::new(aggregated(true), &speeds(), 5);
    let end = Micros::from_secs_f64(60.0);
    h.run_until(end);
    let tick = h.engines[0].tick_at(end).expect("tick mode");
    let with_parent = (0..NODES).filter(|&k| (0..4).any(|g| h.engines[k].sum_parent(tick, g).is_some())).count();
    assert!(with_parent > 0, "nobody has a parent in tick {tick}");
    for e in &mut h.engines {
        assert_eq!(e.sum_parent(u64::MAX, 0), None);
        assert_eq!(e.sum_parent(0, 0), None, "tick 0 closed long ago");
    }
    let from = h.engines[1].node_id();
    let e = &mut h.engines[0];
    let anchor = e.anchor().to_vec();
    let bytes = Arc::new(vec![1u8; 64]);
    e.handle(end, Input::AggregateBody { key: u64::MAX, group: 0, from, bytes });
    while e.poll_output().is_some() {}
    assert_eq!(e.anchor(), &anchor[..]);
}

/// A tick's roles are kept for the staleness window, for every group: they
/// hold the aggregators they name, not the whole ranking of the live set
/// (collected in place, it kept the ranking's allocation: 1.5 GB of the
/// 1,000-node simulation).
#[test]
fn a_ticks_roles_hold_only_the_aggregators_they_name() {
    let mut h = Harness::new(aggregated(true), &speeds(), 5);
    let end = Micros::from_secs_f64(20.0);
    h.run_until(end);
    let tick = h.engines[0].tick_at(end).expect("tick mode");
    for e in &mut h.engines {
        let designated = e.designated(tick);
        assert_eq!(designated.len(), 4);
        for group in designated.iter() {
            assert_eq!(group.len(), 3);
            assert!(group.capacity() <= 3, "{} slots kept for 3 aggregators", group.capacity());
        }
    }
}

#[test]
fn before_the_roster_names_anyone_a_ticks_roles_follow_the_live_set() {
    // A node alone works out a tick's roles (it publishes its own update
    // at the tick's start); two peers join in that tick and sum it with
    // a quorum of their own. The lone node's roles must name them once it
    // hears them, or it refuses their sums and stays a sum apart.
    let mut cfg = aggregated(true);
    cfg.aggregation = Some(AggregationConfig::with_groups(2));
    let mut h = Harness::new(cfg, &[20.0], 3);
    h.run_until(Micros::from_secs_f64(5.0));
    let e = &mut h.engines[0];
    let (me, run, now) = (e.me, e.run_id(), h.now);
    let key = e.tick_at(now).expect("tick mode");
    assert!(e.roster.eligible(key).next().is_none(), "a lone node has no roster");
    let alone = e.designated(key);
    assert!(alone.iter().all(|g| g.as_slice() == [me]), "{alone:?}");
    let peers: Vec<NodeId> = (1..3).map(|k| Keypair::deterministic(3, k).node_id()).collect();
    for (seq, src) in peers.iter().enumerate() {
        let hb = Heartbeat {
            run_id: run,
            src: *src,
            seq: seq as u64,
            speed: 20.0,
            round: 0,
            first_round: 0,
            applied_total: 0,
            leaving: false,
            clock: None,
        };
        e.handle(now, Input::Heartbeat(hb));
    }
    let mut all: Vec<NodeId> = peers.iter().copied().chain([me]).collect();
    all.sort_unstable();
    for group in e.designated(key).iter() {
        let mut group = group.clone();
        group.sort_unstable();
        assert_eq!(group, all, "tick {key}'s aggregators once two peers are live");
    }
    // A peer gone from the view is gone from the roles.
    e.membership.remove(&peers[0]);
    assert!(e.designated(key).iter().all(|g| !g.contains(&peers[0])), "a departed peer keeps its role");
    // Once the roster names nodes for the tick, the roles are the roster's.
    e.roster.record(peers[1], key - crate::engine::roster::SETTLE_TICKS);
    assert!(e.designated(key).iter().all(|g| g.as_slice() == [peers[1]]), "{:?}", e.designated(key));
}

#[test]
fn a_lone_aggregated_node_closes_its_ticks_by_the_clock_and_joiners_of_its_state_stay_in_step() {
    // A node alone never sees a quorum sum. Its ticks still close: its
    // state says how far it is, so a joiner can tell a state taken long
    // ago from a current one, and it forgets what no sum can bring.
    let mut cfg = aggregated(false);
    cfg.aggregation = Some(AggregationConfig::with_groups(2));
    cfg.h = 20;
    let mut h = Harness::new(cfg, &[20.0], 3);
    h.run_until(Micros::from_secs_f64(3.0));
    let early = h.engines[0].replica_state();
    h.run_until(Micros::from_secs_f64(10.0));
    // A node serves its state once its last tick is closed.
    for _ in 0..4 {
        match h.engines[0].state_ready_at(h.now) {
            Some(at) => h.run_until(at),
            None => break,
        }
    }
    assert_eq!(h.engines[0].state_ready_at(h.now), None, "the lone node would never serve its state");
    let now = h.now;
    let tick = h.engines[0].clock.as_ref().unwrap().tick(now);
    let state = h.engines[0].replica_state();
    assert_eq!(h.engines[0].version().total(), 0, "nothing applied without a quorum");
    assert!(state.last_closed_key.is_some_and(|c| c + 2 >= tick), "closed {:?} at tick {tick}", state.last_closed_key);
    assert!(state.current_at(&cfg, now), "the lone node's own state is current");
    assert!(!early.current_at(&cfg, now), "a state from tick {:?} is not current at {tick}", early.last_closed_key);
    let keep = u64::from(cfg.staleness.tau_max) + 3;
    let kept = h.engines[0].aggregation.ticks_kept() as u64;
    assert!(kept <= keep, "{kept} ticks kept at tick {tick}");
    // Two joiners of the current state apply the same sums as the node.
    let run = h.engines[0].run_id();
    for k in 1..3u64 {
        let me = Keypair::deterministic(3, k).node_id();
        h.engines.push(Engine::join(cfg, me, run, Micros::ZERO, state.clone(), 20.0, 3 + k));
        h.speeds.push(20.0);
        h.timer_gen.push(0);
        h.received.push(0);
        h.push(now, Ev::Input(k as usize, Box::new(Input::Start)));
    }
    for s in 11..40 {
        h.run_until(Micros::from_secs_f64(s as f64));
        for k in 1..3 {
            if h.engines[k].version() == h.engines[0].version() {
                assert_eq!(h.engines[k].anchor(), h.engines[0].anchor(), "node {k} at {s} s");
            }
        }
    }
    assert!(h.engines[0].version().total() >= 30, "{} applied", h.engines[0].version().total());
}

/// Node 5's sums arrive more than a tick late for 200 s. It puts each back
/// into its tick and recomputes the ticks since, so once it holds the same
/// updates as the others its anchor and outer state are theirs, bit for
/// bit; with no ticks kept it applies them a tick later (another normaliser
/// and momentum step) and, with anti-entropy off, stays apart.
#[test]
fn a_replica_whose_sums_come_late_ends_identical_to_the_others() {
    let slow = 5;
    let run = |window: usize| {
        let mut h = Harness::new(aggregated(true), &speeds(), 11);
        for e in &mut h.engines {
            e.aggregation.replay.set_window(window);
        }
        h.run_until(Micros::from_secs_f64(20.0));
        let period = h.engines[0].tick_period().expect("tick mode").as_secs_f64();
        let late = Micros::from_secs_f64(1.3 * period);
        h.slow_sums = Some((slow, late, Micros::from_secs_f64(200.0)));
        h.run_until(Micros::from_secs_f64(300.0));
        let same: Vec<usize> =
            (0..NODES).filter(|k| *k != slow && h.engines[*k].version() == h.engines[slow].version()).collect();
        assert!(!same.is_empty(), "some replica holds the slow node's updates");
        let identical = |k: usize| {
            let (a, b) = (&h.engines[k], &h.engines[slow]);
            a.anchor() == b.anchor() && a.outer == b.outer && a.outer_rounds() == b.outer_rounds()
        };
        (h.replayed[slow], same.iter().all(|k| identical(*k)), same.iter().any(|k| identical(*k)))
    };
    let (replayed, all_identical, _) = run(crate::engine::aggregation::REPLAY_TICKS_FOR_TESTS);
    assert!(replayed > 50, "{replayed} sums put back");
    assert!(all_identical, "the slow replica differs from one holding the same updates");
    let (replayed, _, any_identical) = run(0);
    assert_eq!(replayed, 0);
    assert!(!any_identical, "without ticks kept the slow replica should differ");
}

#[test]
fn replicas_that_share_decoded_sums_apply_what_they_would_alone() {
    let run = |shared: Option<&SharedSums>| {
        let mut h = Harness::new(aggregated(true), &speeds(), 11);
        if let Some(shared) = shared {
            for e in &mut h.engines {
                e.share_decoded_sums(shared.clone());
            }
        }
        h.run_until(Micros::from_secs_f64(60.0));
        h
    };
    let alone = run(None);
    let shared = SharedSums::default();
    let together = run(Some(&shared));
    for (a, b) in alone.engines.iter().zip(&together.engines) {
        assert_eq!(a.anchor(), b.anchor());
        assert_eq!(a.outer, b.outer);
        assert_eq!(a.version(), b.version());
    }
    assert_eq!(alone.applied_log, together.applied_log);
    // The replicas hold one allocation per sum between them.
    let kept: usize = together.engines.iter().map(|e| e.aggregation.replay.kept_sums()).sum();
    let live = shared.live();
    assert!(live > 0 && 4 * live < kept, "{live} sums decoded for {kept} kept by the replicas");
}
