//! The study's check with real processes: the MLP task's homogeneous and
//! mixed swarms run as real `ragtag` processes on loopback (each emulating
//! its node's step cost), beside the simulator's seeds of the same
//! configurations, so at least the frontier's ordering is checked outside
//! virtual time.

use std::path::Path;

use ragtag_protocol::engine::Strategy;
use serde::{Deserialize, Serialize};

use super::{FOCUS, RunFigures, Shape, StudyError, StudyOptions, Task};
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
    /// Wall seconds every process ran.
    pub duration_s: f64,
    /// Held-out loss of the mean replica at the end.
    pub final_loss: f64,
    /// Lowest held-out loss of the mean replica, smoothed over three samples.
    pub best_loss: f64,
}

/// Runs gopals on the MLP task's homogeneous and mixed shapes with real
/// processes, node state and reports under `dir`.
pub fn run(opts: &StudyOptions, dir: &Path) -> Result<Vec<RealCheck>, StudyError> {
    let task = Task::Teacher;
    let base = task.scenario(&opts.text, opts.quick)?;
    let mut checks = Vec::new();
    for (shape, name) in [(Shape::HOMOGENEOUS, "homogeneous"), (FOCUS, "mixed")] {
        let s = shape.apply(&base);
        if opts.progress {
            eprintln!("[real] {}: {} with real processes for {:.0} s", task.name(), shape.label(), s.duration_s);
        }
        let real = RealOptions {
            strategy: Strategy::Gopals,
            duration_s: s.duration_s,
            netem: None,
            out: dir.join(format!("real-{}-{name}", task.name())),
            tick_ms: None,
        };
        let out = run_real(&s, &real).map_err(|e| StudyError::Run {
            what: format!("{} {} (real)", task.name(), shape.label()),
            source: e.into(),
        })?;
        let f = RunFigures::of(&RunSummary::new(&s, &out), &out, s.duration_s);
        checks.push(RealCheck {
            task,
            shape,
            strategy: Strategy::Gopals,
            duration_s: s.duration_s,
            final_loss: f.final_loss,
            best_loss: f.best_loss,
        });
    }
    Ok(checks)
}
