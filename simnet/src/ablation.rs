//! The staleness ablation: one scenario under each way of treating a late
//! update (no weight, the polynomial weight, dropped), several seeds each,
//! so the effect of the weights is told apart from seed noise.

use std::fmt::Write as _;

use ragtag_protocol::{
    engine::{StalenessWeight, Strategy},
    validate::RejectReason,
};
use serde::{Deserialize, Serialize};

use crate::{
    report::RunSummary,
    scenario::Scenario,
    sim::{RunOptions, run},
};

/// How late updates are treated in one arm of the ablation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LateUpdates {
    /// Applied at full weight (up to the preset's `tau_max`).
    FullWeight,
    /// Weighted `(1 + tau)^-0.5`, the default.
    Polynomial,
    /// Dropped: `tau_max = 0`.
    Drop,
}

impl LateUpdates {
    /// Every arm, in table order.
    pub const ALL: [LateUpdates; 3] = [LateUpdates::FullWeight, LateUpdates::Polynomial, LateUpdates::Drop];

    /// The arm's name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            LateUpdates::FullWeight => "none",
            LateUpdates::Polynomial => "polynomial",
            LateUpdates::Drop => "drop",
        }
    }

    /// Parses a name as printed by [`LateUpdates::name`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The scenario with this arm's staleness settings, run for its whole
    /// duration (not stopped at the target) so final losses compare.
    fn apply(self, scenario: &Scenario) -> Scenario {
        let mut s = scenario.clone();
        s.after_target_s = s.duration_s;
        match self {
            LateUpdates::FullWeight => s.engine.weight = Some(StalenessWeight::None),
            LateUpdates::Polynomial => s.engine.weight = Some(StalenessWeight::Polynomial { a: 0.5 }),
            LateUpdates::Drop => s.engine.tau_max = Some(0),
        }
        s
    }
}

/// Mean, smallest and largest of a figure over seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Mean over the seeds that have the figure.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// `None` when no seed has the figure.
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Self { mean, min, max })
    }
}

/// One arm's figures over its seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AblationRow {
    /// The arm.
    pub late_updates: LateUpdates,
    /// Seeds run.
    pub seeds: u32,
    /// Seeds that reached the target.
    pub reached: u32,
    /// Virtual time to target over the seeds that reached it.
    pub time_to_target_s: Option<Spread>,
    /// Final held-out loss of the mean replica.
    pub final_loss: Option<Spread>,
    /// Applied updates that were late (tau >= 1), over all applied, all replicas and seeds.
    pub late_fraction: f64,
    /// Updates dropped as too stale, all replicas and seeds.
    pub dropped_too_stale: u64,
}

/// The ablation of one scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ablation {
    /// Scenario name.
    pub scenario: String,
    /// Strategy every arm runs.
    pub strategy: String,
    /// Target loss.
    pub target_loss: f32,
    /// One row per arm.
    pub rows: Vec<AblationRow>,
    /// Every run.
    pub runs: Vec<RunSummary>,
}

/// Why an ablation stopped.
#[derive(Debug, thiserror::Error)]
pub enum AblationError {
    /// A simulation failed.
    #[error("simulating {scenario} ({arm}, seed {seed}): {source}")]
    Run {
        /// The scenario.
        scenario: String,
        /// The arm.
        arm: &'static str,
        /// The seed.
        seed: u64,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Runs `strategy` on `scenario` under each arm with seeds `0..seeds`.
pub fn ablate_staleness(
    scenario: &Scenario,
    strategy: Strategy,
    arms: &[LateUpdates],
    seeds: u32,
    progress: bool,
) -> Result<Ablation, AblationError> {
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for &arm in arms {
        let s = arm.apply(scenario);
        let mut summaries = Vec::new();
        for seed in 0..seeds as u64 {
            if progress {
                eprintln!("running {} ({} late updates) seed {seed} on {}", strategy.name(), arm.name(), s.name);
            }
            let output = run(&s, &RunOptions { strategy, seed, progress, ddp_lr: None }).map_err(|e| {
                AblationError::Run { scenario: s.name.clone(), arm: arm.name(), seed, source: e.into() }
            })?;
            summaries.push(RunSummary::new(&s, &output));
        }
        rows.push(row(arm, &summaries));
        runs.extend(summaries);
    }
    Ok(Ablation {
        scenario: scenario.name.clone(),
        strategy: strategy.name().into(),
        target_loss: scenario.target_loss,
        rows,
        runs,
    })
}

fn row(arm: LateUpdates, runs: &[RunSummary]) -> AblationRow {
    let times: Vec<f64> = runs.iter().filter_map(|r| r.time_to_target_s).collect();
    let losses: Vec<f64> = runs.iter().map(|r| r.final_loss as f64).filter(|l| l.is_finite()).collect();
    let applied: u64 = runs.iter().flat_map(|r| r.staleness_histogram).sum();
    let late: u64 = runs.iter().flat_map(|r| r.staleness_histogram.into_iter().skip(1)).sum();
    AblationRow {
        late_updates: arm,
        seeds: runs.len() as u32,
        reached: times.len() as u32,
        time_to_target_s: Spread::of(&times),
        final_loss: Spread::of(&losses),
        late_fraction: if applied == 0 { 0.0 } else { late as f64 / applied as f64 },
        dropped_too_stale: runs
            .iter()
            .map(|r| r.dropped.get(RejectReason::TooStale.name()).copied().unwrap_or(0))
            .sum(),
    }
}

/// A plain-text table of the ablation.
pub fn table(a: &Ablation) -> String {
    let spread = |s: Option<Spread>, digits: usize| match s {
        Some(s) => format!("{:.d$} ({:.d$}..{:.d$})", s.mean, s.min, s.max, d = digits),
        None => "not reached".into(),
    };
    let mut out = String::new();
    let _ = writeln!(out, "{} on {}, target {}:", a.strategy, a.scenario, a.target_loss);
    let _ = writeln!(
        out,
        "{:<11} {:>7} {:>24} {:>24} {:>6} {:>9}",
        "late", "reached", "time to target s", "final loss", "late%", "dropped"
    );
    for r in &a.rows {
        let _ = writeln!(
            out,
            "{:<11} {:>7} {:>24} {:>24} {:>6.2} {:>9}",
            r.late_updates.name(),
            format!("{}/{}", r.reached, r.seeds),
            spread(r.time_to_target_s, 1),
            spread(r.final_loss, 4),
            100.0 * r.late_fraction,
            r.dropped_too_stale
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_set_what_they_name() {
        let s = Scenario::load("stragglers").unwrap();
        let none = LateUpdates::FullWeight.apply(&s).engine.apply(Strategy::Gopals);
        assert_eq!(none.staleness.weight, StalenessWeight::None);
        let drop = LateUpdates::Drop.apply(&s).engine.apply(Strategy::Gopals);
        assert_eq!(drop.staleness.tau_max, 0);
        for arm in LateUpdates::ALL {
            assert_eq!(LateUpdates::parse(arm.name()), Some(arm));
        }
    }

    #[test]
    fn spread_of_values() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[2.0, 1.0, 6.0]), Some(Spread { mean: 3.0, min: 1.0, max: 6.0 }));
    }
}
