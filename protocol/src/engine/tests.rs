//! Engine tests driven by a tiny discrete-event loop over a toy problem:
//! node k minimises `0.5 * sum_i (x_i - c_ki)^2`, where the node optima
//! `c_k` are a shared optimum plus a small node-specific offset (like iid
//! data shards), with plain SGD inner steps. (With strongly different
//! optima, any scheme where fast nodes take more steps converges to a
//! speed-weighted optimum instead: objective inconsistency.)

use std::collections::BTreeMap;

use proptest::prelude::{ProptestConfig, prop_assert, proptest};

use super::*;
use crate::{codec::CodecKind, identity::Keypair, ids::Hash32};

mod aggregation;
mod forged_ticks;
mod harness;
mod idle;
mod inner_lr;
mod late_updates;
mod lead;
mod overlap;
mod partial_step;
mod tick_mode;

use harness::{Ev, Harness};

const DIM: usize = 16;

fn target(node: usize, i: usize) -> f32 {
    let shared = (i * 3 % 11) as f32 / 5.0 - 1.0;
    let offset = ((node * 7 + i) % 5) as f32 / 100.0 - 0.02;
    shared + offset
}

fn global_optimum(nodes: usize) -> Vec<f32> {
    (0..DIM).map(|i| (0..nodes).map(|k| target(k, i)).sum::<f32>() / nodes as f32).collect()
}

/// Samples a toy step stands for: a partial step counts its share of them.
const TOY_BATCH: f32 = 32.0;

fn toy_phase(node: usize, phase: &LocalPhase, lr: f32) -> LocalResult {
    let mut x = phase.anchor.as_ref().clone();
    if phase.mode == LocalMode::Gradient {
        let g = (0..DIM).map(|i| x[i] - target(node, i)).collect();
        return LocalResult {
            round: phase.round,
            params: g,
            steps: 1,
            partial: 0.0,
            samples: 1,
            loss: 0.0,
            flops: 0.0,
        };
    }
    // A partial step moves by its share of a whole one.
    let shares = std::iter::repeat_n(1.0, phase.steps as usize).chain((phase.partial > 0.0).then_some(phase.partial));
    for share in shares {
        for (i, xi) in x.iter_mut().enumerate() {
            *xi -= share * lr * phase.lr_scale * (*xi - target(node, i));
        }
    }
    let loss = (0..DIM).map(|i| 0.5 * (x[i] - target(node, i)).powi(2)).sum();
    LocalResult {
        round: phase.round,
        params: x,
        steps: phase.steps,
        partial: phase.partial,
        samples: ((phase.steps as f32 + phase.partial) * TOY_BATCH).round() as u64,
        loss,
        flops: 0.0,
    }
}

/// Ticks of a fixed `period_ms`, with no partial step, lead or overlap.
fn plain_ticks_of(period_ms: u32) -> Schedule {
    Schedule::Tick {
        grace: 0.1,
        margin: 0.02,
        period_ms: Some(period_ms),
        overlap: false,
        partial_step: false,
        lead: false,
    }
}

fn lossless(mut cfg: EngineConfig) -> EngineConfig {
    cfg.codec = CodecKind::F32;
    cfg.error_feedback = false;
    cfg
}

#[test]
fn every_strategy_converges_on_the_toy_problem() {
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let opt = global_optimum(speeds.len());
    for s in Strategy::ALL {
        let mut cfg = EngineConfig::preset(s);
        if s == Strategy::Ddp {
            cfg.outer.eta = 0.05;
        } else {
            cfg.h = 20;
            cfg.h_min = 2;
        }
        let mut h = Harness::new(cfg, &speeds, 1);
        let start = h.distance_to(0, &opt);
        h.run_until(Micros::from_secs_f64(1000.0));
        for k in 0..speeds.len() {
            let d = h.distance_to(k, &opt);
            assert!(d < 0.1 * start, "{s}: node {k} distance {d} (start {start})");
        }
        assert!(h.engines[0].stats().applied > 20, "{s}: {:?}", h.engines[0].stats());
    }
}

/// DiLoCo equivalence at engine level: barrier rounds with delayed
/// Nesterov give one Nesterov step on the mean pseudo-gradient per round.
#[test]
fn barrier_delayed_nesterov_matches_diloco_by_hand() {
    let mut cfg = lossless(EngineConfig::preset(Strategy::Diloco));
    cfg.h = 5;
    cfg.outer.warmup_rounds = 0;
    cfg.anti_entropy.every_rounds = 0;
    let speeds = [1.0, 1.0, 1.0];
    let mut h = Harness::new(cfg, &speeds, 3);
    h.run_until(Micros::from_secs_f64(3.0 * 5.0 + 1.0));
    let rounds = h.engines[0].outer_rounds();
    assert!(rounds >= 2, "rounds {rounds}");
    // Replay by hand: x, mu; each round each node runs 5 SGD steps from x.
    let mut x = vec![0.0f32; DIM];
    let mut mu = [0.0f32; DIM];
    for r in 0..rounds {
        let mut mean = [0.0f32; DIM];
        for k in 0..speeds.len() {
            let p = LocalPhase {
                round: r,
                anchor: Arc::new(x.clone()),
                steps: 5,
                partial: 0.0,
                lr_scale: 1.0,
                mode: LocalMode::Train,
                pull: cfg.pull,
                seed: 0,
                deadline: None,
                lead: false,
            };
            let theta = toy_phase(k, &p, h.lr).params;
            for i in 0..DIM {
                mean[i] += (x[i] - theta[i]) / speeds.len() as f32;
            }
        }
        for i in 0..DIM {
            mu[i] = 0.9 * mu[i] + mean[i];
            x[i] -= 0.7 * (mean[i] + 0.9 * mu[i]);
        }
    }
    for (k, engine) in h.engines.iter().enumerate() {
        for (i, &a) in engine.anchor().iter().enumerate() {
            assert!((a - x[i]).abs() < 1e-5, "node {k} coord {i}: {a} vs {}", x[i]);
        }
    }
}

/// An announcement of an f32 `payload` based on (and published in) `base_tick`.
fn f32_announcement(run: RunId, id: UpdateId, base_tick: u64, payload: &[u8]) -> UpdateAnnouncement {
    UpdateAnnouncement {
        run_id: run,
        id,
        base_total: 0,
        base: None,
        base_tick,
        publish_tick: base_tick,
        sender_staleness: 0,
        steps: 1,
        samples: 1,
        speed: 1.0,
        loss: 0.0,
        codec: CodecKind::F32,
        num_values: (payload.len() / 4) as u64,
        payload_len: payload.len() as u64,
        payload_hash: Hash32::of(payload),
    }
}

#[test]
fn duplicates_are_ignored_and_stale_updates_dropped_with_reason() {
    let mut cfg = lossless(EngineConfig::preset(Strategy::GopalsAsync));
    cfg.staleness.tau_max = 2;
    let run = RunId(Hash32([9; 32]));
    let k0 = Keypair::deterministic(5, 0).node_id();
    let k1 = Keypair::deterministic(5, 1).node_id();
    let mut e = Engine::new(cfg, k0, run, Micros::ZERO, vec![0.0; 4], 1.0, 5);
    e.handle(Micros(0), Input::Start);
    while e.poll_output().is_some() {}
    let mut bytes = Vec::new();
    crate::codec::encode(CodecKind::F32, &[1.0, 1.0, 1.0, 1.0], &mut bytes);
    let ann = |round, stale| UpdateAnnouncement {
        sender_staleness: stale,
        ..f32_announcement(run, UpdateId { src: k1, round }, 0, &bytes)
    };
    e.handle(Micros(1), Input::Announcement { announcement: ann(0, 0), from: k1 });
    let fetches = std::iter::from_fn(|| e.poll_output()).filter(|o| matches!(o, Output::FetchPayload { .. })).count();
    assert_eq!(fetches, 1);
    assert!(e.is_fetching(&UpdateId { src: k1, round: 0 }));
    // The same announcement again while fetching: no second fetch.
    e.handle(Micros(2), Input::Announcement { announcement: ann(0, 0), from: k1 });
    assert!(!std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::FetchPayload { .. })));
    e.handle(Micros(3), Input::Payload { id: UpdateId { src: k1, round: 0 }, bytes: Arc::new(bytes.clone()) });
    assert!(e.has_applied(&UpdateId { src: k1, round: 0 }));
    assert!(!e.is_fetching(&UpdateId { src: k1, round: 0 }));
    assert_eq!(e.version().get(&k1), 1);
    // Fetched knowing only its source: we tell peers we hold it too.
    let held =
        |e: &mut Engine| std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::AnnounceHeld { .. }));
    assert!(held(&mut e));
    // Fetched with enough holders known: no announcement.
    let id2 = UpdateId { src: k1, round: 2 };
    e.handle(Micros(3), Input::Announcement { announcement: ann(2, 0), from: k1 });
    for i in 2..4 {
        e.handle(Micros(3), Input::PayloadSource { id: id2, from: Keypair::deterministic(5, i).node_id() });
    }
    e.handle(Micros(3), Input::Payload { id: id2, bytes: Arc::new(bytes.clone()) });
    assert!(e.has_applied(&id2));
    assert!(!held(&mut e));
    // Replayed after application: dropped as a replay, nothing applied.
    let before = e.anchor().to_vec();
    e.handle(Micros(4), Input::Announcement { announcement: ann(0, 0), from: k1 });
    let outs: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
    assert!(outs.iter().any(|o| matches!(o, Output::Event(EngineEvent::Dropped { reason: RejectReason::Replay, .. }))));
    assert_eq!(e.anchor(), &before[..]);
    // Too stale: dropped with a reason and a rejection receipt.
    e.handle(Micros(5), Input::Announcement { announcement: ann(1, 3), from: k1 });
    let outs: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
    assert!(
        outs.iter().any(|o| matches!(o, Output::Event(EngineEvent::Dropped { reason: RejectReason::TooStale, .. })))
    );
    assert!(outs.iter().any(|o| matches!(o, Output::Record(RecordKind::Receipt { .. }))));
    assert_eq!(e.stats().dropped[&RejectReason::TooStale], 1);
    assert!(!e.is_fetching(&UpdateId { src: k1, round: 1 }));
    assert_eq!(e.version().get(&k1), 2);
}

/// Feeds the same updates in a given order to a fresh engine and returns it.
fn engine_after(cfg: EngineConfig, order: &[usize], updates: &[(UpdateAnnouncement, Vec<u8>)]) -> Engine {
    let run = updates[0].0.run_id;
    let me = Keypair::deterministic(77, 0).node_id();
    let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![0.5; DIM], 1.0, 1);
    e.handle(Micros(0), Input::Start);
    for (t, &i) in order.iter().enumerate() {
        let (a, b) = &updates[i];
        e.handle(Micros(t as u64 + 1), Input::Announcement { announcement: a.clone(), from: a.id.src });
        e.handle(Micros(t as u64 + 1), Input::Payload { id: a.id, bytes: Arc::new(b.clone()) });
    }
    // Flush the canonical batch as a round start would.
    e.apply_pending(None);
    while e.poll_output().is_some() {}
    e
}

/// Pseudo-gradient-like updates: a shared direction plus 20% noise.
fn random_updates(cfg: &EngineConfig, n: usize, seed: u64) -> Vec<(UpdateAnnouncement, Vec<u8>)> {
    let mut r = crate::rng::SeededRng::new(seed);
    let direction: Vec<f32> = (0..DIM).map(|_| r.normal() as f32).collect();
    (0..n)
        .map(|i| {
            let src = Keypair::deterministic(seed, 1 + (i % 3) as u64).node_id();
            let g: Vec<f32> = direction.iter().map(|d| d * 0.1 + 0.02 * r.normal() as f32).collect();
            let mut bytes = Vec::new();
            crate::codec::encode(cfg.codec, &g, &mut bytes);
            let a = UpdateAnnouncement {
                run_id: RunId(Hash32([1; 32])),
                id: UpdateId { src, round: (i / 3) as u64 },
                base_total: 0,
                base: None,
                base_tick: (i / 3) as u64,
                publish_tick: (i / 3) as u64,
                sender_staleness: 0,
                steps: 1,
                samples: 1,
                speed: 1.0,
                loss: 0.0,
                codec: cfg.codec,
                num_values: DIM as u64,
                payload_len: bytes.len() as u64,
                payload_hash: Hash32::of(&bytes),
            };
            (a, bytes)
        })
        .collect()
}

#[test]
fn different_arrival_orders_end_identical_in_deterministic_mode_and_close_otherwise() {
    let mut det = lossless(EngineConfig::preset(Strategy::Gopals));
    det.outer.kind = OuterKind::Sgd;
    let updates = random_updates(&det, 9, 3);
    let forward: Vec<usize> = (0..9).collect();
    let backward: Vec<usize> = (0..9).rev().collect();
    let a = engine_after(det, &forward, &updates);
    let b = engine_after(det, &backward, &updates);
    assert_eq!(a.anchor(), b.anchor());

    let mut on_arrival = det;
    on_arrival.canonical_batches = false;
    on_arrival.outer.kind = OuterKind::DelayedNesterov;
    let a = engine_after(on_arrival, &forward, &updates);
    let b = engine_after(on_arrival, &backward, &updates);
    let dist: f32 = a.anchor().iter().zip(b.anchor()).map(|(x, y)| (x - y).powi(2)).sum::<f32>().sqrt();
    let norm: f32 = a.anchor().iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(dist / norm < 0.05, "relative distance {}", dist / norm);
}

fn max_pairwise_distance(h: &Harness) -> f32 {
    let mut worst = 0.0f32;
    for a in &h.engines {
        for b in &h.engines {
            let d: f32 = a.anchor().iter().zip(b.anchor()).map(|(x, y)| (x - y).powi(2)).sum::<f32>().sqrt();
            let n: f32 = a.anchor().iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            worst = worst.max(d / n);
        }
    }
    worst
}

/// Four equal nodes with anti-entropy every round, split 2|2 from 40 s to
/// 100 s; and the distance bound they must come back under.
fn split_two_by_two() -> (Harness, f32) {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.h = 10;
    cfg.anti_entropy.every_rounds = 1;
    let mut h = Harness::new(cfg, &[1.0, 1.0, 1.0, 1.0], 6);
    h.partition = Some((Micros::from_secs_f64(40.0), Micros::from_secs_f64(100.0), 2));
    (h, cfg.anti_entropy.distance_threshold)
}

#[test]
fn partition_then_heal_reconverges_without_double_application() {
    let (mut h, bound) = split_two_by_two();
    assert!(max_pairwise_distance(&h) == 0.0);
    h.run_until(Micros::from_secs_f64(99.0));
    let split = max_pairwise_distance(&h);
    assert!(split > 5.0 * bound, "the partition should separate the replicas ({split})");
    h.run_until(Micros::from_secs_f64(300.0));
    let healed = max_pairwise_distance(&h);
    assert!(healed < bound, "after healing {healed} (bound {bound}, during split {split})");
    assert!(h.engines.iter().map(|e| e.stats().anchors_averaged).sum::<u64>() > 0);
    // The harness asserts on every application that nothing is applied twice.
}

/// What a real node's store does: after a partition longer than the
/// rounds it keeps, what was gossiped during it cannot be fetched any more.
/// Those holes must not keep the replicas from averaging.
#[test]
fn a_partition_longer_than_stores_keep_updates_still_reconverges() {
    let (mut h, bound) = split_two_by_two();
    h.served_for = Some(Micros::from_secs_f64(20.0));
    h.run_until(Micros::from_secs_f64(300.0));
    let healed = max_pairwise_distance(&h);
    assert!(healed < bound, "after healing {healed} (bound {bound})");
    assert!(h.engines.iter().any(|e| e.given_up.sources() > 0), "some updates could not be fetched");
}

/// Two nodes that trained apart before they met (split from the start,
/// as behind NATs that only a relay crossed) hold far replicas that no
/// third contributor can vouch for: each refused the other's for good.
/// Now one takes the other's replica whole, once, and the two stay one
/// replica.
#[test]
fn two_nodes_that_trained_apart_end_on_one_replica() {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.h = 10;
    cfg.anti_entropy.every_rounds = 1;
    let bound = cfg.anti_entropy.distance_threshold;
    let mut h = Harness::new(cfg, &[1.0, 1.0], 6);
    h.partition = Some((Micros::ZERO, Micros::from_secs_f64(200.0), 1));
    h.run_until(Micros::from_secs_f64(199.0));
    let split = max_pairwise_distance(&h);
    assert!(split > 5.0 * bound, "training apart should separate the replicas ({split})");
    h.run_until(Micros::from_secs_f64(500.0));
    let met = max_pairwise_distance(&h);
    assert!(met < bound, "after meeting {met} (bound {bound}, apart {split})");
    let mut taken = h.far_replicas_taken.clone();
    taken.sort();
    assert_eq!(taken, [0, 1], "one side takes the other's replica, once");
}

#[test]
fn same_seed_same_run_bit_for_bit() {
    let cfg = EngineConfig::preset(Strategy::Gopals);
    let run = |seed| {
        let mut h = Harness::new(cfg, &[1.0, 3.0, 2.0], seed);
        h.run_until(Micros::from_secs_f64(100.0));
        h.engines.iter().map(|e| e.anchor().to_vec()).collect::<Vec<_>>()
    };
    assert_eq!(run(8), run(8));
}

#[test]
fn checkpoint_resume_continues_the_replica() {
    let cfg = EngineConfig::preset(Strategy::Gopals);
    let mut h = Harness::new(cfg, &[1.0, 2.0], 10);
    h.run_until(Micros::from_secs_f64(80.0));
    let e = &h.engines[0];
    let cp = e.checkpoint();
    let resumed = Engine::resume(cfg, e.node_id(), e.run_id(), Micros::ZERO, cp.clone(), 1);
    assert_eq!(resumed.anchor(), e.anchor());
    assert_eq!(resumed.version(), e.version());
    assert!(resumed.round() >= e.round());
    let joined =
        Engine::join(cfg, Keypair::deterministic(99, 0).node_id(), e.run_id(), Micros::ZERO, cp.replica, 1.0, 2);
    assert_eq!(joined.anchor(), e.anchor());
    assert_eq!(joined.round(), 0);
}

/// After a crash the checkpoint may predate updates we published: the
/// swarm applied them, so a resumed replica takes them back from peers; a
/// plain echo of an update we hold (or have not published) is ignored.
#[test]
fn a_resumed_node_takes_back_its_own_lost_updates() {
    let cfg = EngineConfig::preset(Strategy::Gopals);
    let mut updates = random_updates(&cfg, 3, 5);
    let me = Keypair::deterministic(77, 0).node_id();
    let peer = updates[1].0.id.src;
    let own = |e: &mut Engine, a: &UpdateAnnouncement| {
        e.handle(Micros(10), Input::Announcement { announcement: a.clone(), from: peer });
        std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::FetchPayload { .. }))
    };
    updates[0].0.id = UpdateId { src: me, round: 0 };
    let mine = updates[0].0.clone();
    // Fresh at round 0: round 0 is not published yet, so this is not ours to take.
    let mut fresh = engine_after(cfg, &[], &updates[1..]);
    assert!(!own(&mut fresh, &mine));
    // Resumed past round 0 (the ledger shows we published it) without it.
    let mut resumed = engine_after(cfg, &[], &updates[1..]);
    resumed.advance_round_to(1);
    assert!(own(&mut resumed, &mine), "the lost update should be fetched");
    // Once it is applied, an echo is ignored.
    resumed.handle(Micros(11), Input::Payload { id: mine.id, bytes: Arc::new(updates[0].1.clone()) });
    resumed.apply_pending(None);
    assert!(resumed.has_applied(&mine.id));
    assert!(!own(&mut resumed, &mine));
}

/// A speed estimate too low for h_min steps per tick (one bad measurement,
/// a stale checkpoint) must not stop a node for good: it probes.
#[test]
fn a_starved_speed_estimate_still_trains_now_and_then() {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.schedule = plain_ticks_of(2000);
    let me = Keypair::deterministic(5, 0).node_id();
    // 1 step/s: 2 steps per 2 s tick, below h_min.
    let mut e = Engine::new(cfg, me, RunId(Hash32([1; 32])), Micros::ZERO, vec![0.0; DIM], 1.0, 1);
    e.handle(Micros::ZERO, Input::Start);
    let mut phases = Vec::new();
    while let Some(t) = e.poll_timeout().filter(|t| *t < Micros::from_secs_f64(40.0)) {
        e.handle_timeout(t);
        while let Some(o) = e.poll_output() {
            if let Output::StartLocalPhase(p) = o {
                phases.push(p.steps);
            }
        }
        if !phases.is_empty() {
            break;
        }
    }
    assert_eq!(phases, vec![cfg.h_min], "the node never trained");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Random interleavings of announcements, payloads, duplicates, failures
    /// and membership changes: no panic, version vectors only grow, and no
    /// update is applied twice.
    #[test]
    fn random_interleavings_keep_the_invariants(ops in proptest::collection::vec((0u8..6, 0usize..12, 0u8..3), 1..120)) {
        let mut cfg = lossless(EngineConfig::preset(Strategy::GopalsAsync));
        cfg.staleness.measure = StalenessMeasure::Receiver;
        cfg.staleness.tau_max = 6;
        let updates = random_updates(&cfg, 12, 21);
        let me = Keypair::deterministic(21, 0).node_id();
        let mut e = Engine::new(cfg, me, updates[0].0.run_id, Micros::ZERO, vec![0.0; DIM], 1.0, 3);
        e.handle(Micros(0), Input::Start);
        let mut last_total = 0;
        let mut applied = std::collections::BTreeSet::new();
        for (t, (op, i, peer)) in ops.into_iter().enumerate() {
            let now = Micros(1 + t as u64 * 1000);
            let (a, b) = &updates[i];
            let from = Keypair::deterministic(21, 1 + peer as u64).node_id();
            let input = match op {
                0 => Input::Announcement { announcement: a.clone(), from },
                1 => Input::Payload { id: a.id, bytes: Arc::new(b.clone()) },
                2 => Input::FetchFailed { id: a.id, from, reason: None },
                3 => Input::PayloadSource { id: a.id, from },
                4 => Input::Heartbeat(Heartbeat {
                    run_id: a.run_id, src: from, seq: t as u64, speed: 1.0 + peer as f32,
                    round: 0, first_round: 0, applied_total: 0, leaving: peer == 2, clock: None,
                }),
                _ => Input::PeerDown(from),
            };
            e.handle(now, input);
            e.handle_timeout(now);
            // A driver must always make progress: the next timeout is in the future.
            prop_assert!(e.poll_timeout().is_none_or(|t| t > now), "timeout {:?} not after {:?}", e.poll_timeout(), now);
            while let Some(o) = e.poll_output() {
                if let Output::Event(EngineEvent::Applied { id, .. }) = o {
                    prop_assert!(applied.insert(id), "applied twice: {:?}", id);
                }
            }
            let total = e.version().total();
            prop_assert!(total >= last_total);
            last_total = total;
        }
    }
}

/// A drained output queue gives back what a busy tick grew it to.
#[test]
fn a_drained_output_queue_keeps_a_bounded_capacity() {
    let cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    let mut e = Engine::new(cfg, NodeId([1; 32]), RunId(Hash32([1; 32])), Micros::ZERO, vec![0.0; 4], 1.0, 1);
    for outer_rounds in 0..5_000 {
        e.event(EngineEvent::OuterRound { outer_rounds });
    }
    assert!(e.outputs.capacity() >= 5_000);
    let mut drained = 0;
    while e.poll_output().is_some() {
        drained += 1;
    }
    assert!(drained >= 5_000);
    assert!(e.outputs.capacity() <= OUTPUTS_KEPT, "{} slots kept", e.outputs.capacity());
}

/// The startup wait ends once every peer the shell knows takes part has
/// been heard, where the whole `startup_ms` (2 s) was every run's first
/// idle time; a known peer that stays silent, or none known, keeps the
/// whole wait.
#[test]
fn the_startup_wait_ends_once_the_known_peers_are_heard() {
    let cfg = EngineConfig::preset(Strategy::Gopals);
    let run = crate::ids::RunId(Hash32([7; 32]));
    let (me, a, b) = (NodeId([3; 32]), NodeId([1; 32]), NodeId([2; 32]));
    let heartbeat = |src: NodeId| Heartbeat {
        run_id: run,
        src,
        seq: 1,
        speed: 1.0,
        round: 0,
        first_round: 0,
        applied_total: 0,
        leaving: false,
        clock: None,
    };
    let hb = |src: NodeId| Input::Heartbeat(heartbeat(src));
    let started =
        |e: &mut Engine| std::iter::from_fn(|| e.poll_output()).any(|o| matches!(o, Output::StartLocalPhase(_)));
    let engine = |known: Vec<NodeId>| {
        let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![0.0; 8], 1.0, 3);
        e.handle(Micros::ZERO, Input::PeersKnown(known));
        e.handle(Micros::ZERO, Input::Start);
        e
    };
    let mut e = engine(vec![a, b]);
    e.handle(Micros(20_000), hb(a));
    assert!(!started(&mut e), "b not heard yet");
    e.handle(Micros(30_000), hb(b));
    assert!(started(&mut e), "both heard: the first round starts");
    let mut e = engine(vec![a, b]);
    e.handle(Micros(20_000), hb(a));
    e.handle_timeout(Micros(1_999_000));
    assert!(!started(&mut e), "b silent: the whole wait");
    e.handle_timeout(Micros(2_000_000));
    assert!(started(&mut e));
    let mut e = engine(Vec::new());
    e.handle(Micros(20_000), hb(a));
    e.handle(Micros(30_000), hb(b));
    e.handle_timeout(Micros(1_999_000));
    assert!(!started(&mut e), "none known: the whole wait, as before");

    // A known peer that leaves is not waited for; if every known peer
    // left, the whole wait runs.
    let mut e = engine(vec![a, b]);
    e.handle(Micros(20_000), hb(a));
    e.handle(Micros(30_000), Input::PeerDown(b));
    assert!(started(&mut e), "b left: a heard is enough");
    let mut e = engine(vec![a, b]);
    e.handle(Micros(20_000), hb(a));
    e.handle(Micros(30_000), Input::Heartbeat(Heartbeat { leaving: true, ..heartbeat(b) }));
    assert!(started(&mut e), "b said it leaves before it was heard: a heard is enough");
    let mut e = engine(vec![a, b]);
    e.handle(Micros(20_000), Input::Heartbeat(Heartbeat { leaving: true, ..heartbeat(a) }));
    e.handle(Micros(30_000), Input::PeerDown(b));
    e.handle_timeout(Micros(1_999_000));
    assert!(!started(&mut e), "both left: the whole wait");

    // The shell may tell the engine after its start; peers heard before
    // count.
    let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![0.0; 8], 1.0, 3);
    e.handle(Micros::ZERO, Input::Start);
    e.handle(Micros(20_000), hb(a));
    e.handle(Micros(30_000), hb(b));
    assert!(!started(&mut e), "nothing known yet");
    e.handle(Micros(40_000), Input::PeersKnown(vec![a, b, me]));
    assert!(started(&mut e), "told of a and b (and itself), both heard");

    // Barrier mode waits the same way.
    for strategy in [Strategy::Ddp, Strategy::Diloco] {
        let cfg = EngineConfig::preset(strategy);
        let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![0.0; 8], 1.0, 3);
        e.handle(Micros::ZERO, Input::PeersKnown(vec![a, b]));
        e.handle(Micros::ZERO, Input::Start);
        e.handle(Micros(20_000), hb(a));
        assert!(!started(&mut e), "{strategy:?}: b not heard yet");
        e.handle(Micros(30_000), hb(b));
        assert!(started(&mut e), "{strategy:?}: both heard");
    }
}
