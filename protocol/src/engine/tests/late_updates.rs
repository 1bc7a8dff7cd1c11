//! Tick mode's late updates: which batch applies them, the staleness they
//! count and the weight they get.

use super::*;

/// Tick mode, with no closed ticks kept (below: kept, the default): an
/// update that arrives after its tick's batch closed is applied in the
/// first open batch and weighted by the ticks it missed, the
/// same way at every replica; beyond `tau_max` it is dropped with a reason.
#[test]
fn late_tick_updates_are_weighted_by_the_batch_that_applies_them() {
    let applied_weight = |weight: StalenessWeight| {
        let mut cfg = lossless(EngineConfig::preset(Strategy::Gopals));
        cfg.staleness.weight = weight;
        let run = RunId(Hash32([9; 32]));
        let me = Keypair::deterministic(6, 0).node_id();
        let mut e = Engine::new(cfg, me, run, Micros::ZERO, vec![0.0; 4], 1.0, 6);
        // Late updates fold into the next tick (none put back into their own).
        e.late_updates.set_window(0);
        e.handle(Micros(0), Input::Start);
        while e.poll_output().is_some() {}
        let mut bytes = Vec::new();
        crate::codec::encode(CodecKind::F32, &[0.1, 0.1, 0.1, 0.1], &mut bytes);
        let ann = |src: u64, base_tick: u64| {
            let id = UpdateId { src: Keypair::deterministic(6, src).node_id(), round: base_tick };
            f32_announcement(run, id, base_tick, &bytes)
        };
        let deliver = |e: &mut Engine, a: UpdateAnnouncement| {
            let from = a.id.src;
            e.handle(Micros(1), Input::Update { announcement: a, from, payload: Arc::new(bytes.clone()) });
        };
        // Tick 0's batch closes with one update in it...
        deliver(&mut e, ann(1, 0));
        e.apply_pending(Some(1));
        while e.poll_output().is_some() {}
        // ...then another update of tick 0 arrives: applied in batch 1.
        deliver(&mut e, ann(2, 0));
        e.apply_pending(Some(2));
        let outs: Vec<Output> = std::iter::from_fn(|| e.poll_output()).collect();
        let (staleness, w) = outs
            .iter()
            .find_map(|o| match o {
                Output::Event(EngineEvent::Applied { staleness, weight, .. }) => Some((*staleness, *weight)),
                _ => None,
            })
            .expect("the late update is applied");
        assert_eq!(staleness, 1);
        let receipt = outs.iter().find_map(|o| match o {
            Output::Record(RecordKind::Receipt {
                outcome: crate::ledger::ReceiptOutcome::Accepted { staleness, weight },
                ..
            }) => Some((*staleness, *weight)),
            _ => None,
        });
        assert_eq!(receipt, Some((1, w)), "the receipt records what was applied");
        // Close batches up to tick 5; an update of tick 0 is now 6 ticks late.
        deliver(&mut e, ann(1, 5));
        e.apply_pending(Some(6));
        while e.poll_output().is_some() {}
        let before = e.anchor().to_vec();
        deliver(&mut e, ann(3, 0));
        e.apply_pending(None);
        assert_eq!(e.stats().dropped.get(&RejectReason::TooStale), Some(&1));
        assert_eq!(e.anchor(), &before[..], "a dropped update never touches the anchor");
        // A late update (tick 3) whose open batch (6) is not due yet waits
        // for it instead of closing it early, and joins it when it closes.
        deliver(&mut e, ann(4, 3));
        e.apply_pending(Some(6));
        assert!(!e.has_applied(&UpdateId { src: Keypair::deterministic(6, 4).node_id(), round: 3 }));
        while e.poll_output().is_some() {}
        deliver(&mut e, ann(1, 6));
        e.apply_pending(Some(7));
        let applied: Vec<(u64, usize)> = std::iter::from_fn(|| e.poll_output())
            .filter_map(|o| match o {
                Output::Event(EngineEvent::Applied { staleness, nodes, .. }) => Some((staleness, nodes)),
                _ => None,
            })
            .collect();
        assert_eq!(applied, vec![(3, 2), (0, 2)], "one batch of two: the late update (tau 3), then tick 6's");
        w
    };
    let poly = applied_weight(StalenessWeight::Polynomial { a: 0.5 });
    assert!((poly - 0.5f32.sqrt()).abs() < 1e-6, "(1 + 1)^-0.5, got {poly}");
    assert_eq!(applied_weight(StalenessWeight::None), 1.0);
}

/// Tick mode sizes a round to its tick and gives it the tick's deadline;
/// fixed work takes H steps with no deadline (a slow node's round spans
/// ticks and publishes late, so its staleness counts).
#[test]
fn tick_rounds_have_a_deadline_unless_work_is_fixed() {
    let first_phase = |work: Work| {
        let mut cfg = EngineConfig::preset(Strategy::Gopals);
        cfg.schedule = plain_ticks_of(2000);
        cfg.work = work;
        let me = Keypair::deterministic(5, 0).node_id();
        let mut e = Engine::new(cfg, me, RunId(Hash32([1; 32])), Micros::ZERO, vec![0.0; DIM], 10.0, 1);
        e.handle(Micros::ZERO, Input::Start);
        loop {
            while let Some(o) = e.poll_output() {
                if let Output::StartLocalPhase(p) = o {
                    return (p.steps, p.deadline, cfg.h);
                }
            }
            let t = e.poll_timeout().expect("a waiting engine has a timeout");
            assert!(t < Micros::from_secs_f64(60.0), "no phase in 60 s");
            e.handle_timeout(t);
        }
    };
    let (steps, deadline, h) = first_phase(Work::Fixed);
    assert_eq!((steps, deadline), (h, None));
    let (steps, deadline, _) = first_phase(Work::ProportionalToSpeed);
    assert!(deadline.is_some());
    assert!(steps <= 20, "10 steps/s for under 2 s: {steps}");
}

/// Node 5 receives every payload 1.3 ticks late for 200 s (full
/// dissemination). It puts each late update back into its tick and
/// recomputes the ticks since, so once it holds the same updates as the
/// others its anchor and outer state are theirs, bit for bit; with no ticks
/// kept it folds them into the next tick (another normaliser and momentum
/// step) and, with anti-entropy off, stays apart.
#[test]
fn a_replica_whose_updates_come_late_ends_identical_to_the_others() {
    const NODES: usize = 16;
    let slow = 5;
    let speeds: Vec<f64> = (0..NODES).map(|k| 1.0 + (k % 4) as f64).collect();
    let run = |window: usize| {
        let mut cfg = lossless(EngineConfig::preset(Strategy::Gopals));
        cfg.anti_entropy.every_rounds = 0;
        let mut h = Harness::new(cfg, &speeds, 11);
        for e in &mut h.engines {
            e.late_updates.set_window(window);
        }
        h.run_until(Micros::from_secs_f64(20.0));
        let period = h.engines[0].tick_period().expect("tick mode").as_secs_f64();
        h.slow_payloads = Some((slow, Micros::from_secs_f64(1.3 * period), Micros::from_secs_f64(200.0)));
        h.run_until(Micros::from_secs_f64(300.0));
        let same: Vec<usize> =
            (0..NODES).filter(|k| *k != slow && h.engines[*k].version() == h.engines[slow].version()).collect();
        assert!(!same.is_empty(), "some replica holds the slow node's updates");
        let identical = |k: usize| {
            let (a, b) = (&h.engines[k], &h.engines[slow]);
            a.anchor() == b.anchor()
                && a.outer == b.outer
                && a.outer_rounds() == b.outer_rounds()
                && a.inner_lr == b.inner_lr
                && a.applied == b.applied
        };
        (h.updates_replayed[slow], same.iter().all(|k| identical(*k)), same.iter().any(|k| identical(*k)))
    };
    let (replayed, all_identical, _) = run(8);
    assert!(replayed > 50, "{replayed} updates put back");
    assert!(all_identical, "the slow replica differs from one holding the same updates");
    let (replayed, _, any_identical) = run(0);
    assert_eq!(replayed, 0);
    assert!(!any_identical, "without ticks kept the slow replica should differ");
}

/// A tick recomputed with an update put back sums in the order of a
/// replica that had it in time: batch key first, so updates folded into
/// that tick from older ones (beyond the kept ticks) stay ahead of it even
/// where its id sorts before theirs.
#[test]
fn an_update_put_back_takes_its_canonical_place_in_its_tick() {
    let run = RUN;
    // Sources by id: the one whose tick-4 update comes late (`put_back`)
    // has the smallest, so an order by id alone would put it ahead of the
    // two tick-1 updates folded into tick 4 (`up`, `down`), where canonical
    // order puts it after them.
    let mut srcs = [2u64, 3, 4, 5];
    srcs.sort_by_key(|s| Keypair::deterministic(6, *s).node_id());
    let [put_back, up, down, other] = srcs;
    // The folded two undo each other at a magnitude where the small ones'
    // values are lost in rounding if added between them: floating-point
    // addition is not associative, so the order shows in the anchor.
    let values = |src: u64, tick: u64| match (tick, src) {
        (1, s) if s == up => vec![6e7, -6e7, 3.3e7, 1.7e7],
        (1, _) => vec![-6e7, 6e7, -3.3e7, -1.7e7],
        (4, s) if s == put_back => vec![1.0, 0.7, -0.3, 0.11],
        (4, _) => vec![0.2, -0.1, 0.05, 0.3],
        _ => vec![0.01, -0.02, 0.03, 0.0],
    };
    let update = |src: u64, tick: u64| {
        let mut bytes = Vec::new();
        crate::codec::encode(CodecKind::F32, &values(src, tick), &mut bytes);
        let id = UpdateId { src: Keypair::deterministic(6, src).node_id(), round: tick };
        (f32_announcement(run, id, tick, &bytes), bytes)
    };
    let close = |e: &mut Engine, upto: u64| {
        e.apply_pending(Some(upto));
        while e.poll_output().is_some() {}
    };
    // In time: tick 3 closes (the first kept), then tick 4 with the two
    // tick-1 updates folded in ahead of tick 4's own two.
    let mut in_time = started_engine();
    deliver(&mut in_time, update(1, 3));
    close(&mut in_time, 4);
    for (src, tick) in [(up, 1), (down, 1), (other, 4), (put_back, 4)] {
        deliver(&mut in_time, update(src, tick));
    }
    close(&mut in_time, 5);
    // Late: tick 4 closes without `put_back`'s, which comes after it
    // closed and is put back.
    let mut late = started_engine();
    deliver(&mut late, update(1, 3));
    close(&mut late, 4);
    for (src, tick) in [(up, 1), (down, 1), (other, 4)] {
        deliver(&mut late, update(src, tick));
    }
    close(&mut late, 5);
    deliver(&mut late, update(put_back, 4));
    late.apply_pending(Some(5));
    let replayed = std::iter::from_fn(|| late.poll_output())
        .filter(|o| matches!(o, Output::Event(EngineEvent::UpdateReplayed { key: 4, .. })))
        .count();
    assert_eq!(replayed, 1, "the late update goes back into tick 4");
    assert_eq!(late.version(), in_time.version());
    assert_eq!(late.anchor(), in_time.anchor(), "the update put back summed in another order");
    assert_eq!(late.outer, in_time.outer);
}

/// An update that arrives five ticks after its tick closed here is too
/// stale for the first open tick but not for its own, which is still kept:
/// admitted and put back there, the replica ends where one that had it in
/// time is (it was given up as too stale before).
#[test]
fn a_late_announcement_is_judged_stale_at_its_own_tick() {
    let run = RUN;
    let update = |src: u64, tick: u64| {
        let mut bytes = Vec::new();
        let v = [0.1 * src as f32, -0.03 * tick as f32, 0.2, 0.05 * (src + tick) as f32];
        crate::codec::encode(CodecKind::F32, &v, &mut bytes);
        let id = UpdateId { src: Keypair::deterministic(6, src).node_id(), round: tick };
        (f32_announcement(run, id, tick, &bytes), bytes)
    };
    let ticks = |e: &mut Engine, with_late: bool| {
        for tick in 3..8 {
            deliver(e, update(1, tick));
            if with_late && tick == 3 {
                deliver(e, update(2, 3));
            }
            e.apply_pending(Some(tick + 1));
            while e.poll_output().is_some() {}
        }
    };
    let mut in_time = started_engine();
    ticks(&mut in_time, true);
    let mut late = started_engine();
    ticks(&mut late, false);
    let tau_max = u64::from(late.config().staleness.tau_max);
    assert!(late.first_open_key() - 3 > tau_max, "too stale for the first open tick");
    deliver(&mut late, update(2, 3));
    late.apply_pending(Some(8));
    while late.poll_output().is_some() {}
    assert_eq!(late.stats().dropped.get(&RejectReason::TooStale), None);
    assert_eq!(late.version(), in_time.version());
    assert_eq!(late.anchor(), in_time.anchor());
    assert_eq!(late.outer, in_time.outer);
}

/// The run of the single-engine tests below.
const RUN: RunId = RunId(Hash32([9; 32]));

/// A started engine of four values that applies lossless updates.
fn started_engine() -> Engine {
    let me = Keypair::deterministic(6, 0).node_id();
    let cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    let mut e = Engine::new(cfg, me, RUN, Micros::ZERO, vec![0.0; 4], 1.0, 6);
    e.handle(Micros(0), Input::Start);
    while e.poll_output().is_some() {}
    e
}

/// An update and its payload, arriving from its source.
fn deliver(e: &mut Engine, (a, bytes): (UpdateAnnouncement, Vec<u8>)) {
    let from = a.id.src;
    e.handle(Micros(1), Input::Update { announcement: a, from, payload: Arc::new(bytes) });
}
