//! The study's check with real processes: one configuration per question
//! of the MLP task (the homogeneous control, the mixed swarm, and the
//! mixed swarm with fixed work, the mitigation whose removal changed most
//! in the simulator) run as real `ragtag` processes on loopback, each
//! emulating its node's step cost and tracing its rounds, beside the
//! simulator's seeds of the same configurations: the frontier's ordering
//! and the per-layer answers are checked outside virtual time.

use std::path::Path;

use ragtag_protocol::engine::Strategy;
use serde::{Deserialize, Serialize};

use super::{Arm, FOCUS, RunFigures, Shape, StudyError, StudyOptions, Task};
use crate::{
    real::{RealOptions, run_real},
    report::RunSummary,
};

/// One configuration run with real processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RealCheck {
    /// The task.
    pub task: Task,
    /// The swarm's shape.
    pub shape: Shape,
    /// The strategy.
    pub strategy: Strategy,
    /// The mitigation turned off, if any.
    #[serde(default = "preset")]
    pub arm: Arm,
    /// Wall seconds every process ran.
    pub duration_s: f64,
    /// Held-out loss of the mean replica at the end.
    pub final_loss: f64,
    /// Lowest held-out loss of the mean replica, smoothed over three samples.
    pub best_loss: f64,
    /// The figures the simulator's runs keep, from the nodes' traced
    /// rounds (absent in studies saved before real runs were traced).
    #[serde(default)]
    pub figures: Option<RunFigures>,
}

fn preset() -> Arm {
    Arm::Preset
}

/// The configurations run with real processes: (shape, arm, directory name).
pub const CONFIGURATIONS: [(Shape, Arm, &str); 3] = [
    (Shape::HOMOGENEOUS, Arm::Preset, "homogeneous"),
    (FOCUS, Arm::Preset, "mixed"),
    (FOCUS, Arm::FixedWork, "mixed-fixed-work"),
];

/// Runs the [`CONFIGURATIONS`] of the MLP task with real processes, node
/// state and reports under `dir`.
pub fn run(opts: &StudyOptions, dir: &Path) -> Result<Vec<RealCheck>, StudyError> {
    let task = Task::Teacher;
    let base = task.scenario(&opts.text, opts.quick)?;
    let mut checks = Vec::new();
    for (shape, arm, name) in CONFIGURATIONS {
        let (s, strategy) = arm.apply(&shape.apply(&base));
        if opts.progress {
            eprintln!("[real] {}: {name} with real processes for {:.0} s", task.name(), s.duration_s);
        }
        let real = RealOptions {
            strategy,
            duration_s: s.duration_s,
            netem: None,
            out: dir.join(format!("real-{}-{name}", task.name())),
            tick_ms: None,
            trace_updates: true,
        };
        let out = run_real(&s, &real)
            .map_err(|e| StudyError::Run { what: format!("{} {name} (real)", task.name()), source: e.into() })?;
        let f = RunFigures::of(&RunSummary::new(&s, &out), &out, s.duration_s);
        checks.push(RealCheck {
            task,
            shape,
            strategy,
            arm,
            duration_s: s.duration_s,
            final_loss: f.final_loss,
            best_loss: f.best_loss,
            figures: Some(f),
        });
    }
    Ok(checks)
}
