//! Choosing the inner learning rate on the run creator's machine, so a new
//! run's rate is measured on its own model and data instead of carried over
//! from a task it was tuned on: each candidate trains the same initial
//! weights on the same stream for the same steps, and the one with the
//! lowest held-out loss wins (the smaller rate on a tie). The loss is the
//! mean of evaluations at three quarters and at the end of the probe, so
//! one lucky or unlucky evaluation does not decide.

use std::sync::Arc;

use ragtag_protocol::engine::{LocalMode, PullConfig};

use crate::{Error, Result, Trainer, TrainerConfig};

/// The candidate rates `swarm new` tries.
pub const DEFAULT_GRID: [f32; 4] = [3e-4, 1e-3, 3e-3, 1e-2];

/// One candidate's result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrTrial {
    /// The rate.
    pub lr: f32,
    /// Mean held-out loss at 3/4 and at the end (infinite when it diverged).
    pub loss: f32,
}

/// The probe's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct LrProbe {
    /// Inner steps each candidate trained.
    pub steps: u32,
    /// Every candidate, in grid order.
    pub trials: Vec<LrTrial>,
    /// The chosen rate.
    pub chosen: f32,
}

impl LrProbe {
    /// One line of evidence for the manifest's rationale.
    pub fn evidence(&self) -> String {
        let trials: Vec<String> = self.trials.iter().map(|t| format!("{} -> {:.4}", t.lr, t.loss)).collect();
        format!(
            "{}: lowest held-out loss after {} inner steps from the initial weights on the creator's machine ({})",
            self.chosen,
            self.steps,
            trials.join(", ")
        )
    }
}

/// Trains `steps` inner steps at each rate of `grid` (on `cfg`'s model,
/// data and seed) and picks the best; an error when every rate diverged
/// or `grid` is empty.
pub fn probe(cfg: &TrainerConfig, grid: &[f32], steps: u32) -> Result<LrProbe> {
    probe_with_progress(cfg, grid, steps, |_| {})
}

/// [`probe`], calling `on_trial` as each candidate finishes (a large model's
/// probe takes minutes on a CPU: the creator sees it move).
pub fn probe_with_progress(
    cfg: &TrainerConfig,
    grid: &[f32],
    steps: u32,
    mut on_trial: impl FnMut(&LrTrial),
) -> Result<LrProbe> {
    let dataset = Arc::new(Trainer::open_dataset(cfg)?);
    let steps = steps.max(4);
    let first = steps * 3 / 4;
    let no_pull = PullConfig { p: 0.0, lambda: 0.0 };
    let mut trials = Vec::with_capacity(grid.len());
    for &lr in grid {
        let mut c = cfg.clone();
        c.training.lr = lr;
        let mut t = Trainer::with_dataset(c, dataset.clone())?;
        let init = t.export_params()?;
        let mid = t.run_phase(&init, first, LocalMode::Train, no_pull, cfg.seed)?.params;
        let at_mid = t.evaluate(Some(&mid))?.loss;
        let end = t.run_phase(&mid, steps - first, LocalMode::Train, no_pull, cfg.seed ^ 1)?.params;
        let at_end = t.evaluate(Some(&end))?.loss;
        let loss = 0.5 * (at_mid + at_end);
        let trial = LrTrial { lr, loss: if loss.is_finite() { loss } else { f32::INFINITY } };
        on_trial(&trial);
        trials.push(trial);
    }
    let best = trials.iter().copied().fold(None::<LrTrial>, |best, t| match best {
        Some(b) if b.loss < t.loss || (b.loss == t.loss && b.lr <= t.lr) => Some(b),
        _ => Some(t),
    });
    match best {
        Some(b) if b.loss.is_finite() => Ok(LrProbe { steps, trials, chosen: b.lr }),
        _ => Err(Error::Training(format!("no learning rate of {grid:?} trained without diverging"))),
    }
}

#[cfg(test)]
mod tests {
    use ragtag_protocol::manifest::{DataSpec, ModelSpec, TrainingSpec};

    use super::*;
    use crate::{data::Shard, device::DeviceChoice};

    fn cfg() -> TrainerConfig {
        TrainerConfig {
            model: ModelSpec::Mlp { inputs: 8, hidden: vec![16], classes: 4 },
            data: DataSpec::Teacher { inputs: 8, classes: 4, hidden: 8, temperature: 0.5, test_samples: 256 },
            training: TrainingSpec { eval_samples: 256, ..TrainingSpec::default() },
            seed: 3,
            node_seed: 3,
            shard: Shard::ALL,
            data_path: None,
            device: DeviceChoice::Cpu,
            micro_batch: None,
        }
    }

    #[test]
    fn the_probe_is_deterministic_and_refuses_a_rate_that_cannot_learn() {
        // 1e-7 barely moves the weights in 200 steps; 1e-2 learns this tiny task.
        let grid = [1e-7, 1e-2];
        let a = probe(&cfg(), &grid, 200).unwrap();
        let mut seen = Vec::new();
        assert_eq!(a, probe_with_progress(&cfg(), &grid, 200, |t| seen.push(*t)).unwrap(), "same seed, same probe");
        assert_eq!(seen, a.trials, "every trial reported as it finished");
        assert_eq!(a.trials.len(), 2);
        assert!(a.trials[1].loss < a.trials[0].loss, "{a:?}");
        assert_eq!(a.chosen, 1e-2);
        assert!(a.evidence().contains("after 200 inner steps"), "{}", a.evidence());
    }
}
