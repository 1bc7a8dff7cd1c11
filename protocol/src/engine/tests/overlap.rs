//! Tick mode with the exchange overlapped: no wait at the boundary, every
//! update applied one tick later by every replica, and still convergent.

use super::*;

fn overlapped(overlap: bool) -> EngineConfig {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.h = 20;
    cfg.h_min = 2;
    // Against the plain waiting schedule: no lead steps in the wait.
    if let Schedule::Tick { overlap: o, lead, .. } = &mut cfg.schedule {
        *o = overlap;
        *lead = false;
    }
    cfg
}

#[test]
fn overlapped_ticks_never_wait_for_the_exchange_and_still_converge() {
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let opt = global_optimum(speeds.len());
    let mut h = Harness::new(overlapped(true), &speeds, 5);
    h.latency = Micros(300_000);
    let start = h.distance_to(0, &opt);
    h.run_until(Micros::from_secs_f64(1000.0));
    for k in 0..speeds.len() {
        let stats = h.engines[k].stats();
        assert_eq!(stats.idle.get(IdleReason::Exchange), Micros::ZERO, "node {k}: {:?}", stats.idle);
        // Updates arrive within the tick after their own: none is late.
        let total: u64 = stats.staleness_histogram.iter().sum();
        assert!(total > 50, "node {k}: {total} applied");
        assert_eq!(stats.staleness_histogram[0], total, "node {k}: {:?}", stats.staleness_histogram);
        let d = h.distance_to(k, &opt);
        assert!(d < 0.1 * start, "node {k}: distance {d} (start {start})");
    }
    assert!(h.dropped.is_empty(), "{:?}", h.dropped);
    let v0 = h.engines[0].version().clone();
    for e in &h.engines[1..] {
        if e.version() == &v0 {
            assert_eq!(e.anchor(), h.engines[0].anchor(), "canonical batches stay bit-identical");
        }
    }
}

/// The batch at tick k applies ticks up to k - 2: at any boundary an
/// overlapped replica has applied one tick fewer than a waiting one.
#[test]
fn overlapped_batches_lag_the_waiting_ones_by_one_tick() {
    let speeds = [1.0, 2.0];
    let mut wait = Harness::new(overlapped(false), &speeds, 6);
    let mut over = Harness::new(overlapped(true), &speeds, 6);
    // Longer than the margin (2% of 10 s): waiting nodes wait at each tick.
    wait.latency = Micros(500_000);
    over.latency = Micros(500_000);
    // Mid-tick, once both schedules run steadily (period 20 / 2 = 10 s).
    let t = Micros::from_secs_f64(200.0 + 5.0);
    wait.run_until(t);
    over.run_until(t);
    assert_eq!(wait.engines[0].tick_period(), over.engines[0].tick_period());
    let (w, o) = (wait.engines[0].outer_rounds(), over.engines[0].outer_rounds());
    assert_eq!(o + 1, w, "outer rounds: overlapped {o}, waiting {w}");
    assert!(over.engines[1].stats().idle.get(IdleReason::Exchange) == Micros::ZERO);
    assert!(wait.engines[1].stats().idle.get(IdleReason::Exchange) > Micros::ZERO);
}
