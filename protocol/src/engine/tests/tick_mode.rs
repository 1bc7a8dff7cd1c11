//! Tick mode against its references: no staleness at constant speeds, and
//! the synchronous result under an unbounded grace.

use super::*;

#[test]
fn tick_mode_with_constant_speeds_has_zero_staleness_and_identical_replicas() {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.h = 20;
    cfg.h_min = 2;
    let mut h = Harness::new(cfg, &[1.0, 1.0, 2.0, 4.0], 2);
    h.run_until(Micros::from_secs_f64(200.0));
    let stats = h.engines[0].stats();
    let total: u64 = stats.staleness_histogram.iter().sum();
    assert!(total > 50);
    assert_eq!(stats.staleness_histogram[0], total, "{:?}", stats.staleness_histogram);
    assert!(h.dropped.is_empty(), "{:?}", h.dropped);
    // Canonical batches: replicas that applied the same set are bit-identical.
    let v0 = h.engines[0].version().clone();
    for e in &h.engines[1..] {
        if e.version() == &v0 {
            assert_eq!(e.anchor(), h.engines[0].anchor());
        }
    }
}

/// Async with plain outer SGD, no momentum and an unbounded grace window
/// gives exactly the synchronous result.
#[test]
fn tick_mode_with_unbounded_grace_equals_the_synchronous_result() {
    let mut sync = lossless(EngineConfig::preset(Strategy::Diloco));
    sync.h = 5;
    sync.outer.kind = OuterKind::Sgd;
    sync.outer.warmup_rounds = 0;
    sync.anti_entropy.every_rounds = 0;
    let mut tick = sync;
    tick.schedule = Schedule::Tick {
        grace: 1e9,
        margin: 0.0,
        period_ms: Some(6_000),
        overlap: false,
        partial_step: false,
        lead: false,
    };
    tick.staleness.measure = StalenessMeasure::Tick;
    // Equal speeds: every node's round fits one tick.
    let speeds = [1.0, 1.0, 1.0, 1.0];
    let mut a = Harness::new(sync, &speeds, 4);
    let mut b = Harness::new(tick, &speeds, 4);
    a.run_until(Micros::from_secs_f64(200.0));
    b.run_until(Micros::from_secs_f64(400.0));
    let ra = a.engines[0].outer_rounds();
    let rb = b.engines[0].outer_rounds();
    assert!(ra >= 10 && rb >= 10, "{ra} {rb}");
    // Compare at equal outer rounds: replay the synchronous run to rb's count.
    let mut a2 = Harness::new(sync, &speeds, 4);
    let mut t = 0.0;
    while a2.engines[0].outer_rounds() < rb && t < 1000.0 {
        t += 0.5;
        a2.run_until(Micros::from_secs_f64(t));
    }
    a2.run_until(Micros::from_secs_f64(t + 0.1));
    assert_eq!(a2.engines[0].outer_rounds(), rb);
    assert_eq!(a2.engines[0].anchor(), b.engines[0].anchor(), "bit-identical");
}
