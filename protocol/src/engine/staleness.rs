//! The weight of a stale update.

use super::config::{StalenessConfig, StalenessWeight};

/// `w(tau)` for the configured form; with `normalize_by_nodes`,
/// `min(1, ((1 + tau) / n)^-a)`-style normalisation is applied by scaling
/// `1 + tau` down by the live node count first (DESIGN §2.2).
pub fn staleness_weight(cfg: &StalenessConfig, tau: u64, live_nodes: usize) -> f32 {
    let tau = tau as f64;
    let n = live_nodes.max(1) as f64;
    let w = match cfg.weight {
        StalenessWeight::None => 1.0,
        StalenessWeight::Polynomial { a } => {
            let base = if cfg.normalize_by_nodes { (1.0 + tau) / n } else { 1.0 + tau };
            base.powf(-(a as f64))
        }
        StalenessWeight::Exponential { lambda } => {
            let t = if cfg.normalize_by_nodes { (tau - (n - 1.0)).max(0.0) } else { tau };
            (-(lambda as f64) * t).exp()
        }
        StalenessWeight::Hinge { free, slope } => {
            let t = if cfg.normalize_by_nodes { tau - (n - 1.0) } else { tau };
            let over = (t - free as f64).max(0.0);
            1.0 / (1.0 + slope as f64 * over)
        }
    };
    w.min(1.0) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::StalenessMeasure;

    fn cfg(weight: StalenessWeight, normalize: bool) -> StalenessConfig {
        StalenessConfig { measure: StalenessMeasure::Tick, weight, normalize_by_nodes: normalize, tau_max: 10 }
    }

    #[test]
    fn polynomial_matches_the_design() {
        let c = cfg(StalenessWeight::Polynomial { a: 0.5 }, false);
        assert_eq!(staleness_weight(&c, 0, 4), 1.0);
        assert!((staleness_weight(&c, 1, 4) - 2f32.powf(-0.5)).abs() < 1e-7);
        assert!((staleness_weight(&c, 3, 4) - 0.5).abs() < 1e-7);
    }

    #[test]
    fn normalised_weight_is_one_at_steady_state_staleness() {
        let c = cfg(StalenessWeight::Polynomial { a: 0.5 }, true);
        // Free-running steady state: each update absorbed the other N-1.
        assert_eq!(staleness_weight(&c, 15, 16), 1.0);
        assert!((staleness_weight(&c, 31, 16) - 2f32.powf(-0.5)).abs() < 1e-6);
    }

    #[test]
    fn exponential_and_hinge_decrease() {
        let e = cfg(StalenessWeight::Exponential { lambda: 0.5 }, false);
        let h = cfg(StalenessWeight::Hinge { free: 2, slope: 1.0 }, false);
        assert!(staleness_weight(&e, 2, 1) < staleness_weight(&e, 1, 1));
        assert_eq!(staleness_weight(&h, 2, 1), 1.0);
        assert_eq!(staleness_weight(&h, 3, 1), 0.5);
        let none = cfg(StalenessWeight::None, false);
        assert_eq!(staleness_weight(&none, 100, 1), 1.0);
    }
}
