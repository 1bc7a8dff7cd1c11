//! The heterogeneity study: the open questions about mixed-speed training
//! answered with the simulator's real engines and trainers. For each task
//! it runs a single-node control (which sets the target: one node alone
//! must miss it), a sweep of swarm shapes at equal total compute for three
//! strategies, and the mitigations turned off one at a time, several seeds
//! each; `markdown` turns the figures into STUDY.md.

pub mod markdown;
pub mod metrics;
pub mod plots;
pub mod real_check;
pub mod tasks;
pub mod write;

use std::path::PathBuf;

use ragtag_protocol::engine::{StalenessWeight, Strategy, Work};
use serde::{Deserialize, Serialize};

use crate::{
    report::RunSummary,
    scenario::{Nodes, Scenario, ScenarioError},
    sim::{RunOptions, run},
};
pub use metrics::RunFigures;
pub use tasks::{Shape, Task};

/// A mitigation turned off (or none: the preset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// The strategy's preset.
    Preset,
    /// Late updates at full weight.
    NoStalenessWeights,
    /// H steps per round whatever the node's speed (no tick deadline).
    FixedWork,
    /// Free running (gopals-async) instead of ticks.
    FreeRunning,
    /// No anti-entropy between replicas.
    NoAntiEntropy,
}

impl Arm {
    /// The arms that turn something off, in table order.
    pub const OFF: [Arm; 4] = [Arm::NoStalenessWeights, Arm::FixedWork, Arm::FreeRunning, Arm::NoAntiEntropy];

    /// What the arm is, for tables.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Preset => "gopals preset",
            Arm::NoStalenessWeights => "no staleness weights",
            Arm::FixedWork => "fixed work (H steps, no tick deadline)",
            Arm::FreeRunning => "free running (no ticks)",
            Arm::NoAntiEntropy => "no anti-entropy",
        }
    }

    /// The scenario and strategy of this arm of gopals.
    fn apply(self, s: &Scenario) -> (Scenario, Strategy) {
        let mut s = s.clone();
        let mut strategy = Strategy::Gopals;
        match self {
            Arm::Preset => {}
            Arm::NoStalenessWeights => s.engine.weight = Some(StalenessWeight::None),
            Arm::FixedWork => s.engine.work = Some(Work::Fixed),
            Arm::FreeRunning => strategy = Strategy::GopalsAsync,
            Arm::NoAntiEntropy => s.engine.anti_entropy_every = Some(0),
        }
        (s, strategy)
    }
}

/// One run of the study.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudyRun {
    /// The task.
    pub task: Task,
    /// The swarm's shape.
    pub shape: Shape,
    /// The strategy.
    pub strategy: Strategy,
    /// The mitigation turned off, if any.
    pub arm: Arm,
    /// The seed.
    pub seed: u64,
    /// What it measured.
    pub figures: RunFigures,
}

/// One seed of the single-node control.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlRun {
    /// ddp (plain AdamW on one node) or gopals alone.
    pub strategy: Strategy,
    /// The seed.
    pub seed: u64,
    /// Its lowest held-out loss, smoothed over three samples.
    pub best_loss: f64,
}

/// One task's part of the study.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskStudy {
    /// The task.
    pub task: Task,
    /// The model and data, in words.
    pub description: String,
    /// Virtual seconds per run.
    pub duration_s: f64,
    /// The lone node's speed: the fastest node of any shape in the study.
    pub control_speed: f64,
    /// Spreads swept.
    pub spreads: Vec<f64>,
    /// Slow fractions swept.
    pub slow_fractions: Vec<f64>,
    /// The control's seeds.
    pub control: Vec<ControlRun>,
    /// 2% below the control's best loss on any seed (what the simulations
    /// were told; reports use [`TaskStudy::seed_target`]).
    pub target_loss: f64,
    /// Every swarm run.
    pub runs: Vec<StudyRun>,
}

impl TaskStudy {
    /// The target of one seed: 2% below the lone node's best on that seed
    /// (each seed draws its own teacher, so the reachable loss differs).
    pub fn seed_target(&self, seed: u64) -> f64 {
        let best = self.control.iter().filter(|c| c.seed == seed).map(|c| c.best_loss).fold(f64::INFINITY, f64::min);
        if best.is_finite() { 0.98 * best } else { self.target_loss }
    }

    /// A run's time to its seed's target.
    pub fn time_to_target(&self, run: &StudyRun) -> Option<f64> {
        metrics::time_to(&run.figures.loss_series, self.seed_target(run.seed))
    }
}

/// What the study ran and found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Study {
    /// The quick version (fewer shapes, half the duration).
    pub quick: bool,
    /// Seeds per configuration.
    pub seeds: u32,
    /// The shape the mitigation arms and the specialisation questions use.
    pub focus: Shape,
    /// Per task.
    pub tasks: Vec<TaskStudy>,
    /// Wall seconds the simulations took.
    pub wall_s: f64,
    /// Configurations re-run with real processes (`--real`).
    #[serde(default)]
    pub real: Vec<real_check::RealCheck>,
}

/// How the study is run.
#[derive(Clone, Debug)]
pub struct StudyOptions {
    /// The quick version.
    pub quick: bool,
    /// Seeds per configuration.
    pub seeds: u32,
    /// The transformer's text file.
    pub text: PathBuf,
    /// Tasks to run.
    pub tasks: Vec<Task>,
    /// Print a line per run on stderr.
    pub progress: bool,
}

/// Why the study stopped.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// A task's scenario did not load.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The text file could not be read.
    #[error("reading the text file {0}: {1}")]
    Text(String, #[source] std::io::Error),
    /// A simulation failed.
    #[error("simulating {what}: {source}")]
    Run {
        /// The configuration.
        what: String,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing the report failed.
    #[error("writing {what}: {source}")]
    Write {
        /// The file.
        what: String,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The strategies of the shape sweep.
pub const STRATEGIES: [Strategy; 3] = [Strategy::Gopals, Strategy::DilocoProportional, Strategy::Ddp];

impl StudyOptions {
    /// Spreads swept on `task` (the transformer, forty times the MLP's
    /// cost per step, sweeps fewer in the quick version).
    pub fn spreads(&self, task: Task) -> Vec<f64> {
        match (self.quick, task) {
            (false, _) => vec![1.0, 2.0, 4.0, 8.0, 16.0],
            (true, Task::Teacher) => vec![1.0, 4.0, 8.0],
            (true, Task::Char) => vec![1.0, 8.0],
        }
    }

    /// Slow fractions swept on `task` (the transformer: half slow only).
    pub fn slow_fractions(&self, task: Task) -> Vec<f64> {
        match (self.quick, task) {
            (false, Task::Teacher) => vec![0.25, 0.5, 0.75],
            _ => vec![0.5],
        }
    }

    /// Every shape of `task`: the homogeneous control once, then spread by
    /// fraction.
    pub fn shapes(&self, task: Task) -> Vec<Shape> {
        let mut v = vec![Shape::HOMOGENEOUS];
        for spread in self.spreads(task).into_iter().filter(|s| *s > 1.0) {
            for slow_fraction in self.slow_fractions(task) {
                v.push(Shape { spread, slow_fraction });
            }
        }
        v
    }
}

/// The shape the specialisation questions and mitigation arms use.
pub const FOCUS: Shape = Shape { spread: 8.0, slow_fraction: 0.5 };

/// Runs the whole study.
pub fn run_study(opts: &StudyOptions) -> Result<Study, StudyError> {
    let wall = std::time::Instant::now();
    let mut tasks = Vec::new();
    for &task in &opts.tasks {
        tasks.push(study_task(task, opts)?);
    }
    Ok(Study {
        quick: opts.quick,
        seeds: opts.seeds,
        focus: FOCUS,
        tasks,
        wall_s: wall.elapsed().as_secs_f64(),
        real: Vec::new(),
    })
}

fn simulate(s: &Scenario, strategy: Strategy, seed: u64, what: &str) -> Result<RunFigures, StudyError> {
    let out = run(s, &RunOptions { strategy, seed, progress: false, ddp_lr: None })
        .map_err(|e| StudyError::Run { what: what.to_string(), source: e.into() })?;
    Ok(RunFigures::of(&RunSummary::new(s, &out), &out, s.duration_s))
}

fn study_task(task: Task, opts: &StudyOptions) -> Result<TaskStudy, StudyError> {
    let base = task.scenario(&opts.text, opts.quick)?;
    let shapes = opts.shapes(task);
    let control_speed = shapes.iter().map(|s| s.fastest()).fold(0.0, f64::max);
    let start = std::time::Instant::now();
    let say = |what: &str| {
        if opts.progress {
            eprintln!("[{task} {:>5.0}s] {what}", start.elapsed().as_secs_f64(), task = task.name());
        }
    };
    let mut lone = base.clone();
    lone.nodes = Nodes { speeds: vec![control_speed], ..Default::default() };
    let mut control = Vec::new();
    for strategy in [Strategy::Ddp, Strategy::Gopals] {
        for seed in 0..u64::from(opts.seeds) {
            let what =
                format!("{}: one node at speed {control_speed:.2}, {}, seed {seed}", task.name(), strategy.name());
            say(&what);
            let f = simulate(&lone, strategy, seed, &what)?;
            control.push(ControlRun { strategy, seed, best_loss: f.best_loss });
        }
    }
    let best = control.iter().map(|c| c.best_loss).fold(f64::INFINITY, f64::min);
    let target_loss = 0.98 * best;
    let mut base = base;
    base.target_loss = target_loss as f32;
    let mut runs = Vec::new();
    let mut add = |s: &Scenario, shape: Shape, strategy: Strategy, arm: Arm| -> Result<(), StudyError> {
        for seed in 0..u64::from(opts.seeds) {
            let arm_name = if arm == Arm::Preset { String::new() } else { format!(", {}", arm.name()) };
            let what = format!("{}: {}, {}{arm_name}, seed {seed}", task.name(), shape.label(), strategy.name());
            say(&what);
            let figures = simulate(s, strategy, seed, &what)?;
            runs.push(StudyRun { task, shape, strategy, arm, seed, figures });
        }
        Ok(())
    };
    for &shape in &shapes {
        let s = shape.apply(&base);
        for strategy in STRATEGIES {
            add(&s, shape, strategy, Arm::Preset)?;
        }
    }
    for arm in Arm::OFF {
        let (s, strategy) = arm.apply(&FOCUS.apply(&base));
        add(&s, FOCUS, strategy, arm)?;
    }
    Ok(TaskStudy {
        task,
        description: format!("{}; {}", base.model, base.description),
        duration_s: base.duration_s,
        control_speed,
        spreads: opts.spreads(task),
        slow_fractions: opts.slow_fractions(task),
        control,
        target_loss,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_turn_off_what_they_name() {
        let s = Task::Teacher.scenario(std::path::Path::new(""), true).unwrap();
        let c = |arm: Arm| {
            let (s, strategy) = arm.apply(&s);
            (s.engine.apply(strategy), strategy)
        };
        let (preset, _) = c(Arm::Preset);
        assert_ne!(preset.staleness.weight, StalenessWeight::None);
        assert_eq!(preset.work, Work::ProportionalToSpeed);
        assert!(preset.anti_entropy.every_rounds > 0);
        assert_eq!(c(Arm::NoStalenessWeights).0.staleness.weight, StalenessWeight::None);
        assert_eq!(c(Arm::FixedWork).0.work, Work::Fixed);
        assert_eq!(c(Arm::FreeRunning).1, Strategy::GopalsAsync);
        assert_eq!(c(Arm::NoAntiEntropy).0.anti_entropy.every_rounds, 0);
    }

    #[test]
    fn the_focus_shape_is_swept_in_both_versions() {
        for quick in [true, false] {
            let o = StudyOptions { quick, seeds: 1, text: PathBuf::new(), tasks: vec![], progress: false };
            for task in Task::ALL {
                assert!(o.shapes(task).contains(&FOCUS));
                assert_eq!(o.shapes(task).iter().filter(|s| s.spread == 1.0).count(), 1);
            }
        }
    }
}
