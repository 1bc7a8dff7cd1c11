//! The idle-time breakdown accounts for every second a node is up and not
//! training, under the reason the schedule gave.

use super::*;

/// Seconds a harness node trained: its steps (a partial step as its share
/// of the samples of one) at its fixed speed.
fn trained_s(h: &Harness, k: usize) -> f64 {
    h.engines[k].stats().samples as f64 / f64::from(TOY_BATCH) / h.speeds[k]
}

fn secs(m: Micros) -> f64 {
    m.as_secs_f64()
}

#[test]
fn tick_mode_books_every_idle_second_to_a_reason() {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.h = 20;
    cfg.h_min = 2;
    let mut h = Harness::new(cfg, &[1.0, 1.0, 2.0, 4.0], 3);
    // Longer than the tick's margin (2% of 5 s): updates arrive after the
    // boundary they are due at.
    h.latency = Micros(300_000);
    let end = 200.0;
    h.run_until(Micros::from_secs_f64(end));
    let period = secs(h.engines[0].tick_period().expect("tick mode"));
    for k in 0..4 {
        let idle = &h.engines[k].stats().idle;
        let booked = trained_s(&h, k) + secs(idle.total());
        // Only the interval in progress at the end (a phase or a wait, at
        // most one tick) is not booked yet.
        assert!(booked <= end + 1e-6 && booked >= end - period, "node {k}: {booked} s booked of {end}");
        assert!(idle.get(IdleReason::Startup) > Micros::ZERO, "node {k}: {idle:?}");
        assert_eq!(idle.get(IdleReason::Barrier), Micros::ZERO, "tick mode has no barrier: {idle:?}");
    }
    // Nodes too slow to fit a lead step into the wait wait for the last
    // tick's updates after each boundary.
    assert!(h.engines[0].stats().idle.get(IdleReason::Exchange) > Micros::ZERO);
    // The slow nodes' whole steps do not fill the tick: the rest is booked.
    assert!(h.engines[0].stats().idle.get(IdleReason::TickRest) > Micros::ZERO);
}

#[test]
fn barrier_mode_books_the_wait_for_the_slowest_as_barrier() {
    let mut cfg = lossless(EngineConfig::preset(Strategy::Diloco));
    cfg.h = 5;
    let mut h = Harness::new(cfg, &[1.0, 4.0], 4);
    let end = 100.0;
    h.run_until(Micros::from_secs_f64(end));
    let fast = &h.engines[1].stats().idle;
    let slow = &h.engines[0].stats().idle;
    // The fast node finishes its H steps in a quarter of the slow node's
    // time and waits the rest at the barrier.
    assert!(secs(fast.get(IdleReason::Barrier)) > 0.5 * end, "{fast:?}");
    assert!(slow.get(IdleReason::Barrier) < fast.get(IdleReason::Barrier), "{slow:?} vs {fast:?}");
    for k in 0..2 {
        let booked = trained_s(&h, k) + secs(h.engines[k].stats().idle.total());
        assert!(booked <= end + 1e-6 && booked >= end - 5.0, "node {k}: {booked} s booked of {end}");
        assert_eq!(h.engines[k].stats().idle.get(IdleReason::Exchange), Micros::ZERO);
    }
}
