//! The poisoning guard for quorum sums (aggregated dissemination). Single
//! updates pass the shell's norm guard; a sum reaches the anchor on the
//! word of a quorum of aggregators, so two colluding aggregators of one
//! group could otherwise add any finite vector. A sum whose scaled norm is
//! far above the median of recently applied sums is refused.
//!
//! The decision is part of the replica: checked and recorded as sums are
//! applied (in the canonical order), and sent to a joiner with the state,
//! so every replica that applied the same sums refuses the same ones.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{aggregate::Aggregate, validate::median_of};

/// Applied sums remembered.
pub const WINDOW: usize = 64;
/// Bound on a sum's scaled norm, times the window's median.
pub const FACTOR: f64 = 10.0;
/// Sums applied before the guard acts.
const MIN_SAMPLES: usize = 8;

/// Scaled norms of the last applied sums.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SumGuard {
    recent: VecDeque<f32>,
}

/// Why a guard from a peer's state is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum SumGuardError {
    /// More norms than the window holds.
    #[error("more than {WINDOW} norms")]
    TooMany,
    /// A norm that is negative or not finite.
    #[error("a norm that is negative or not finite")]
    NotANorm,
}

impl SumGuard {
    /// A sum's norm over the root of its members' summed squared weights:
    /// a one-member sum's is that update's norm, and a group of k
    /// independent, equally weighted updates scores about the same, so
    /// groups of different sizes compare. `None` when every weight is zero
    /// (the sum adds nothing).
    pub fn scaled_norm(aggregate: &Aggregate, norm_sq: f64) -> Option<f64> {
        let w_sq: f64 = aggregate.members.iter().map(|m| f64::from(m.weight).powi(2)).sum();
        (w_sq > 0.0).then(|| (norm_sq / w_sq).sqrt())
    }

    /// Whether a sum of scaled norm `norm` may be applied.
    pub fn admits(&self, norm: f64) -> bool {
        if self.recent.len() < MIN_SAMPLES {
            return true;
        }
        median_of(self.recent.iter().map(|v| f64::from(*v))).is_none_or(|m| norm <= FACTOR * m.max(f64::MIN_POSITIVE))
    }

    /// Records an applied sum's scaled norm.
    pub fn record(&mut self, norm: f64) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(norm as f32);
    }

    /// Checks a guard received with a replica state.
    pub fn check(&self) -> Result<(), SumGuardError> {
        if self.recent.len() > WINDOW {
            return Err(SumGuardError::TooMany);
        }
        if self.recent.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(SumGuardError::NotANorm);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_far_above_the_median_is_refused_once_enough_were_applied() {
        let mut g = SumGuard::default();
        for k in 0..MIN_SAMPLES {
            assert!(g.admits(1e9), "the guard waits for {MIN_SAMPLES} sums");
            g.record(1.0 + k as f64 * 0.1);
        }
        assert!(g.admits(FACTOR * 1.39));
        assert!(!g.admits(FACTOR * 1.41), "the median is the 5th of 8: 1.4");
        for _ in 0..2 * WINDOW {
            g.record(100.0);
        }
        assert!(g.admits(900.0), "the window follows the run");
        assert_eq!(g.check(), Ok(()));
    }

    #[test]
    fn a_received_guard_must_fit_the_window_and_hold_norms() {
        let mut g = SumGuard::default();
        g.recent.push_back(f32::NAN);
        assert_eq!(g.check(), Err(SumGuardError::NotANorm));
        g.recent = std::iter::repeat_n(1.0, WINDOW + 1).collect();
        assert_eq!(g.check(), Err(SumGuardError::TooMany));
    }
}
