//! Tick mode with a partial last step: a slow node fills the part of its
//! tick too short for a whole step, and its speed estimate stays in whole
//! steps per second.

use super::*;

fn with_partial_step(on: bool) -> EngineConfig {
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    cfg.h = 20;
    cfg.h_min = 2;
    if let Schedule::Tick { partial_step, .. } = &mut cfg.schedule {
        *partial_step = on;
    }
    cfg
}

#[test]
fn a_partial_step_fills_the_rest_of_a_slow_nodes_tick() {
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let opt = global_optimum(speeds.len());
    let mut off = Harness::new(with_partial_step(false), &speeds, 7);
    let mut on = Harness::new(with_partial_step(true), &speeds, 7);
    let start = on.distance_to(0, &opt);
    off.run_until(Micros::from_secs_f64(300.0));
    on.run_until(Micros::from_secs_f64(300.0));
    for k in 0..2 {
        // At 4.9 steps' time per tick (a 5-s tick less its margin, at 1
        // step/s), whole steps leave most of a step's time unused.
        let rest = |h: &Harness| h.engines[k].stats().idle.get(IdleReason::TickRest).as_secs_f64();
        let (without, with) = (rest(&off), rest(&on));
        assert!(with < 0.5 * without, "node {k}: tick rest {with:.1} s with a partial step, {without:.1} s without");
        // The partial step is counted as its share of a step: the speed
        // estimate stays at the node's 1 step/s instead of falling to
        // whole steps over the longer phase.
        let v = on.engines[k].speed();
        assert!((v - 1.0).abs() < 0.02, "node {k}: speed estimate {v}");
        assert!(on.engines[k].stats().samples > off.engines[k].stats().samples, "node {k}");
    }
    for k in 0..speeds.len() {
        let d = on.distance_to(k, &opt);
        assert!(d < 0.1 * start, "node {k}: distance {d} (start {start})");
    }
    assert!(on.dropped.is_empty(), "{:?}", on.dropped);
}
