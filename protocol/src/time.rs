//! Time as the engine sees it: a number the caller passes in.

use std::{fmt, ops::Add};

use serde::{Deserialize, Serialize};

/// A point in time in microseconds, on whatever clock the shell runs: Unix
/// time in the node, virtual time in the simulator. The engine only compares
/// and subtracts them; it never asks what time it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Micros(pub u64);

impl Micros {
    /// The zero point of the clock.
    pub const ZERO: Micros = Micros(0);

    /// From seconds, rounded to the nearest microsecond (so that a time
    /// converted to seconds and back is unchanged); negative and NaN give zero.
    pub fn from_secs_f64(secs: f64) -> Self {
        Micros((secs * 1e6).round().max(0.0) as u64)
    }

    /// This time in seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// The time `self - earlier`, or zero if `earlier` is later.
    pub fn saturating_sub(self, earlier: Micros) -> Micros {
        Micros(self.0.saturating_sub(earlier.0))
    }
}

/// One stretch of tick mode's round clock: from `start`, ticks of `period`,
/// numbered from `first_tick`. It travels in heartbeats (the clock leader's
/// newest stretch), so it sits here, below the wire, and the engine's tick
/// clock is built from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSegment {
    /// When the stretch begins.
    pub start: Micros,
    /// The number of its first tick.
    pub first_tick: u64,
    /// Its tick period.
    pub period: Micros,
}

impl Add for Micros {
    type Output = Micros;
    fn add(self, rhs: Micros) -> Micros {
        Micros(self.0.saturating_add(rhs.0))
    }
}

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}s", self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_trip_exactly() {
        for us in [0u64, 1, 2_050_000, 2_049_999, 123_456_789_012, u32::MAX as u64 * 1000] {
            assert_eq!(Micros::from_secs_f64(Micros(us).as_secs_f64()), Micros(us));
        }
    }
}
