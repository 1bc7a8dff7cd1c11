//! The shared round clock of tick mode: `tick(t) = floor((t - t0) / T_r)`.
//!
//! The period follows `H / v_ref`; it changes only at tick numbers that are
//! multiples of [`RESCALE_EVERY`] and only when v_ref moved by more than
//! [`RESCALE_THRESHOLD`]. One node decides (the clock leader, the live node
//! with the smallest id); its latest [`ClockSegment`] travels in heartbeats
//! and everyone adopts it, so all nodes agree on every boundary even when
//! their views of the speeds differ. Tick numbers never go backwards.

use serde::{Deserialize, Serialize};

pub use crate::time::ClockSegment;
use crate::time::Micros;

/// Tick numbers at which the period may change.
pub const RESCALE_EVERY: u64 = 8;
/// Relative change of the period that triggers a rescale.
pub const RESCALE_THRESHOLD: f64 = 0.25;
/// Segments kept (older ones are never needed: rounds last about one tick).
const MAX_SEGMENTS: usize = 4;

type Segment = ClockSegment;

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

    /// A clock that starts with a leader's stretch.
    pub fn from_segment(seg: ClockSegment) -> Self {
        Self { segments: vec![ClockSegment { period: Micros(seg.period.0.max(1)), ..seg }] }
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

    /// The newest stretch (what the clock leader advertises).
    pub fn latest(&self) -> ClockSegment {
        *self.segments.last().expect("at least one segment")
    }

    /// Adopts the leader's newest stretch, replacing ours from its start on.
    /// Returns whether anything changed.
    pub fn adopt(&mut self, seg: ClockSegment) -> bool {
        if seg.period.0 == 0 || self.segments.contains(&seg) {
            return false;
        }
        self.segments.retain(|s| s.start < seg.start && s.first_tick < seg.first_tick);
        self.segments.push(seg);
        if self.segments.len() > MAX_SEGMENTS {
            self.segments.remove(0);
        }
        true
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

    #[test]
    fn followers_adopt_the_leaders_stretch() {
        let mut leader = TickClock::new(Micros(0), Micros(100));
        let mut follower = TickClock::new(Micros(0), Micros(103));
        leader.propose_period(Micros(250), Micros(200));
        assert!(follower.adopt(leader.latest()));
        assert!(!follower.adopt(leader.latest()), "adopting twice changes nothing");
        for t in (800..3_000).step_by(13) {
            assert_eq!(follower.tick(Micros(t)), leader.tick(Micros(t)));
        }
        // The follower's own first stretch stays for the past.
        assert_eq!(follower.tick(Micros(103)), 1);
    }
}
