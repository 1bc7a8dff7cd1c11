//! A cooldown to a known budget: the inner rate falls linearly to a final
//! scale over the last stretch of the run. Local steps at any fixed rate sit
//! on a noise floor that a rate falling to zero gets under; DDP with a
//! cosine schedule over its budget reached teacher-digits' target before the
//! swarm did (BENCHMARKS.md, "Real swarm vs PyTorch DDP with the early
//! momentum"), whose plateau halvings had the rate at 1/32 a quarter of the
//! way in. A stable rate with a linear cooldown over the last 20% matches a
//! cosine over the whole run (Hägele et al., "Scaling Laws and
//! Compute-Optimal Training Beyond Fixed Training Durations", 2024) and
//! leaves the rate alone until the budget is near, so `swarm new --budget`
//! sets it with a constant rate before it (BENCHMARKS.md, "a budget's
//! cooldown").
//!
//! Time counts from the run's start (the manifest's `start_ms`, the engine's
//! `t0`), so every node is in the same part of the cooldown at the same
//! moment whenever it joined. Only the rate a node trains at changes: the
//! replica (anchor, outer momentum, the plateau schedule) is untouched, so
//! replicas stay bit-identical.

use serde::{Deserialize, Serialize};

use crate::time::Micros;

/// The last stretch of a run with a known budget (part of the manifest).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cooldown {
    /// Seconds after the run's start at which the rate starts to fall.
    pub start_s: u32,
    /// Seconds after the run's start at which it reaches `final_scale`.
    pub end_s: u32,
    /// The scale of the rate from `end_s` on.
    pub final_scale: f32,
}

/// The share of a budget the cooldown takes by default.
pub const DEFAULT_FRACTION: f32 = 0.2;

impl Cooldown {
    /// A linear cooldown to zero over the last `fraction` of a budget of
    /// `budget_s` seconds (1: the rate falls from the run's start).
    pub fn for_budget(budget_s: u32, fraction: f32) -> Result<Self, CooldownError> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(CooldownError::Fraction(fraction));
        }
        let length = ((budget_s as f32 * fraction).round() as u32).max(1).min(budget_s);
        Ok(Cooldown { start_s: budget_s - length, end_s: budget_s, final_scale: 0.0 })
    }

    /// What the rate is multiplied by `since_start` after the run began.
    pub fn factor(&self, since_start: Micros) -> f32 {
        let t = since_start.as_secs_f64();
        let (start, end) = (self.start_s as f64, self.end_s as f64);
        if t <= start {
            1.0
        } else if t >= end {
            self.final_scale
        } else {
            let done = ((t - start) / (end - start)) as f32;
            1.0 - done * (1.0 - self.final_scale)
        }
    }

    /// One sentence for a manifest's rationale.
    pub fn describe(&self) -> String {
        format!(
            "the inner rate falls linearly to x{} from {} s to {} s after the run's start, where the budget its \
             creator gave ends: a rate falling to zero gets under the noise floor of local steps at a fixed rate, as \
             a cosine schedule does for DDP (BENCHMARKS.md, a budget's cooldown)",
            self.final_scale, self.start_s, self.end_s
        )
    }

    /// Checks the values a manifest could get wrong.
    pub fn validate(&self) -> Result<(), CooldownError> {
        if self.start_s >= self.end_s {
            return Err(CooldownError::Order { start_s: self.start_s, end_s: self.end_s });
        }
        if !(0.0..=1.0).contains(&self.final_scale) {
            return Err(CooldownError::FinalScale(self.final_scale));
        }
        Ok(())
    }
}

/// Why a cooldown is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CooldownError {
    /// The stretch is empty or reversed.
    #[error("the cooldown must start before it ends, got {start_s} s to {end_s} s")]
    Order {
        /// Start in seconds.
        start_s: u32,
        /// End in seconds.
        end_s: u32,
    },
    /// The final scale outside [0, 1].
    #[error("the cooldown's final scale must be in [0, 1], got {0}")]
    FinalScale(f32),
    /// The share of the budget outside (0, 1].
    #[error("the cooldown's share of the budget must be in (0, 1], got {0}")]
    Fraction(f32),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: f64) -> Micros {
        Micros::from_secs_f64(s)
    }

    #[test]
    fn the_rate_is_whole_until_the_start_then_falls_linearly() {
        let c = Cooldown { start_s: 100, end_s: 200, final_scale: 0.0 };
        assert_eq!(c.factor(at(0.0)), 1.0);
        assert_eq!(c.factor(at(100.0)), 1.0);
        assert!((c.factor(at(150.0)) - 0.5).abs() < 1e-6);
        assert!((c.factor(at(190.0)) - 0.1).abs() < 1e-6);
        assert_eq!(c.factor(at(200.0)), 0.0);
        assert_eq!(c.factor(at(1e6)), 0.0);
        let floor = Cooldown { final_scale: 0.1, ..c };
        assert!((floor.factor(at(150.0)) - 0.55).abs() < 1e-6);
        assert_eq!(floor.factor(at(300.0)), 0.1);
    }

    #[test]
    fn a_budget_cools_down_over_its_last_fifth() {
        let budget = |s, f| Cooldown::for_budget(s, f).unwrap();
        assert_eq!(budget(200, DEFAULT_FRACTION), Cooldown { start_s: 160, end_s: 200, final_scale: 0.0 });
        assert_eq!(budget(1, DEFAULT_FRACTION), Cooldown { start_s: 0, end_s: 1, final_scale: 0.0 });
        assert!(budget(3600, DEFAULT_FRACTION).validate().is_ok());
        assert_eq!(budget(200, 1.0), Cooldown { start_s: 0, end_s: 200, final_scale: 0.0 });
        assert_eq!(budget(200, 0.5), Cooldown { start_s: 100, end_s: 200, final_scale: 0.0 });
        for bad in [0.0, -0.1, 1.5, f32::NAN] {
            assert!(matches!(Cooldown::for_budget(200, bad), Err(CooldownError::Fraction(_))), "{bad}");
        }
    }

    #[test]
    fn bad_cooldowns_are_refused() {
        let c = Cooldown { start_s: 10, end_s: 10, final_scale: 0.0 };
        assert_eq!(c.validate(), Err(CooldownError::Order { start_s: 10, end_s: 10 }));
        let c = Cooldown { start_s: 0, end_s: 10, final_scale: f32::NAN };
        assert!(matches!(c.validate(), Err(CooldownError::FinalScale(_))));
        assert!(Cooldown { start_s: 0, end_s: 10, final_scale: 1.5 }.validate().is_err());
    }
}
