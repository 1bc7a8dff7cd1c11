//! Tick mode with lead steps: a node fast enough to fit a step into the
//! exchange wait trains it on the anchor as it is and carries it onto the
//! new anchor, so the wait becomes training and replicas stay identical.

use super::*;

fn with_lead(on: bool) -> EngineConfig {
    let mut cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    cfg.h = 20;
    cfg.h_min = 2;
    if let Schedule::Tick { lead, .. } = &mut cfg.schedule {
        *lead = on;
    }
    cfg
}

#[test]
fn lead_steps_turn_the_exchange_wait_into_training() {
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let opt = global_optimum(speeds.len());
    let mut off = Harness::new(with_lead(false), &speeds, 9);
    let mut on = Harness::new(with_lead(true), &speeds, 9);
    // Ticks of 20 / 4 = 5 s, a grace of 0.5 s: the updates arrive 0.3 s
    // into each tick, time for one step of the fastest node only.
    off.latency = Micros(300_000);
    on.latency = Micros(300_000);
    let start = on.distance_to(0, &opt);
    off.run_until(Micros::from_secs_f64(400.0));
    on.run_until(Micros::from_secs_f64(400.0));
    let exchange = |h: &Harness, k: usize| h.engines[k].stats().idle.get(IdleReason::Exchange).as_secs_f64();
    let (without, with) = (exchange(&off, 3), exchange(&on, 3));
    assert!(without > 10.0, "the fastest node waited {without:.1} s for the exchange without lead steps");
    assert!(with < 0.5 * without, "fastest node: exchange wait {with:.1} s with lead steps, {without:.1} s without");
    assert!(on.engines[3].stats().steps > off.engines[3].stats().steps);
    // The slow nodes fit no step into the wait: they wait as before.
    assert!(exchange(&on, 0) > 0.5 * exchange(&off, 0));
    for k in 0..speeds.len() {
        let stats = on.engines[k].stats();
        let total: u64 = stats.staleness_histogram.iter().sum();
        assert!(total > 100, "node {k}: {total} applied");
        assert_eq!(stats.staleness_histogram[0], total, "node {k}: a lead made an update late");
        let d = on.distance_to(k, &opt);
        assert!(d < 0.1 * start, "node {k}: distance {d} (start {start})");
    }
    assert!(on.dropped.is_empty(), "{:?}", on.dropped);
    // Lead steps change what a node trains, not how replicas apply.
    let v0 = on.engines[0].version().clone();
    let same: Vec<_> = on.engines[1..].iter().filter(|e| e.version() == &v0).collect();
    assert!(!same.is_empty());
    for e in same {
        assert_eq!(e.anchor(), on.engines[0].anchor(), "canonical batches stay bit-identical");
    }
}
