//! The shared round clock of tick mode: `tick(t) = floor((t - t0) / T_r)`.
//!
//! The period follows `H / v_ref`; it changes only at tick numbers that are
//! multiples of [`RESCALE_EVERY`] and only when v_ref moved by more than
//! [`RESCALE_THRESHOLD`], so nodes that see the same speeds agree on every
//! boundary, and tick numbers never go backwards.

use serde::{Deserialize, Serialize};

use crate::time::Micros;

/// Tick numbers at which the period may change.
pub const RESCALE_EVERY: u64 = 8;
/// Relative change of the period that triggers a rescale.
pub const RESCALE_THRESHOLD: f64 = 0.10;
/// Segments kept (older ones are never needed: rounds last about one tick).
const MAX_SEGMENTS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Segment {
    start: Micros,
    first_tick: u64,
    period: Micros,
}

/// Tick numbering over a period that may change over time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TickClock {
    segments: Vec<Segment>,
}

impl TickClock {
    /// Ticks of `period` counted from `t0`.
    pub fn new(t0: Micros, period: Micros) -> Self {
        Self { segments: vec![Segment { start: t0, first_tick: 0, period: Micros(period.0.max(1)) }] }
    }

    fn segment_at(&self, t: Micros) -> &Segment {
        self.segments.iter().rev().find(|s| s.start <= t).unwrap_or(&self.segments[0])
    }

    /// The tick that contains `t` (tick 0 for times before t0).
    pub fn tick(&self, t: Micros) -> u64 {
        let s = self.segment_at(t);
        s.first_tick + t.saturating_sub(s.start).0 / s.period.0
    }

    /// When tick `k` starts.
    pub fn boundary(&self, k: u64) -> Micros {
        let s = self.segments.iter().rev().find(|s| s.first_tick <= k).unwrap_or(&self.segments[0]);
        s.start + Micros((k.saturating_sub(s.first_tick)).saturating_mul(s.period.0))
    }

    /// The current period.
    pub fn period(&self) -> Micros {
        self.segments.last().expect("at least one segment").period
    }

    /// Proposes a new period at time `now`: adopted from the next tick that
    /// is a multiple of [`RESCALE_EVERY`] if it differs enough.
    pub fn propose_period(&mut self, now: Micros, period: Micros) {
        let period = Micros(period.0.max(1));
        let current = self.period();
        let change = (period.0 as f64 - current.0 as f64).abs() / current.0 as f64;
        if change <= RESCALE_THRESHOLD {
            return;
        }
        let k = self.tick(now);
        let last = self.segments.last().expect("at least one segment");
        if last.first_tick > k {
            // A rescale is already scheduled: replace its period.
            let start = last.start;
            let first_tick = last.first_tick;
            self.segments.pop();
            self.segments.push(Segment { start, first_tick, period });
            return;
        }
        let next = (k / RESCALE_EVERY + 1) * RESCALE_EVERY;
        let start = self.boundary(next);
        self.segments.push(Segment { start, first_tick: next, period });
        if self.segments.len() > MAX_SEGMENTS {
            self.segments.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_boundaries_agree() {
        let c = TickClock::new(Micros(1_000), Micros(100));
        assert_eq!(c.tick(Micros(0)), 0);
        assert_eq!(c.tick(Micros(1_099)), 0);
        assert_eq!(c.tick(Micros(1_100)), 1);
        assert_eq!(c.boundary(3), Micros(1_300));
    }

    #[test]
    fn rescale_happens_at_a_multiple_and_is_monotonic() {
        let mut c = TickClock::new(Micros(0), Micros(100));
        c.propose_period(Micros(250), Micros(105)); // within threshold: ignored
        assert_eq!(c.period(), Micros(100));
        c.propose_period(Micros(250), Micros(200));
        // Adopted from tick 8 (t = 800).
        assert_eq!(c.tick(Micros(799)), 7);
        assert_eq!(c.tick(Micros(800)), 8);
        assert_eq!(c.tick(Micros(999)), 8);
        assert_eq!(c.tick(Micros(1_000)), 9);
        assert_eq!(c.boundary(9), Micros(1_000));
        let mut last = 0;
        for t in (0..5_000).step_by(7) {
            let k = c.tick(Micros(t));
            assert!(k >= last);
            last = k;
        }
    }
}
