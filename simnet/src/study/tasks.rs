//! The study's tasks and swarm shapes: two tasks (an MLP on a 16-class
//! teacher, a char transformer on a text file), eight nodes whose speeds
//! always sum to eight, so every configuration has the same total compute.

use std::path::Path;

use ragtag_protocol::{
    ids::Hash32,
    manifest::{DataSpec, ModelSpec},
};
use serde::{Deserialize, Serialize};

use super::StudyError;
use crate::scenario::{Nodes, Scenario};

/// Nodes in every swarm of the study.
pub const NODES: usize = 8;

const TEACHER: &str = include_str!("../../scenarios/study/teacher.toml");
const CHAR: &str = include_str!("../../scenarios/study/char.toml");

/// One of the study's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// MLP 32-64-64-16 on a 16-class teacher.
    Teacher,
    /// Char transformer on a text file.
    Char,
}

impl Task {
    /// Both tasks, in report order.
    pub const ALL: [Task; 2] = [Task::Teacher, Task::Char];

    /// The task's name in tables and file names.
    pub fn name(self) -> &'static str {
        match self {
            Task::Teacher => "teacher",
            Task::Char => "char",
        }
    }

    /// The task's scenario (one node of speed 1; the study sets nodes and
    /// target), with `text` as the transformer's data.
    pub fn scenario(self, text: &Path, quick: bool) -> Result<Scenario, StudyError> {
        let mut s = match self {
            Task::Teacher => Scenario::parse("study/teacher.toml", TEACHER)?,
            Task::Char => {
                let mut s = Scenario::parse("study/char.toml", CHAR)?;
                let bytes = std::fs::read(text).map_err(|e| StudyError::Text(text.display().to_string(), e))?;
                let chars = String::from_utf8_lossy(&bytes).chars().collect::<std::collections::BTreeSet<_>>().len();
                if let ModelSpec::CharTransformer { vocab, .. } = &mut s.model {
                    *vocab = chars as u32;
                }
                let name = text.file_name().map_or_else(|| "text".into(), |n| n.to_string_lossy().to_string());
                s.data = DataSpec::TextFile { name, hash: Hash32::of(&bytes) };
                s.data_file = Some(text.to_path_buf());
                s
            }
        };
        if quick {
            s.duration_s /= 2.0;
        }
        s.after_target_s = s.duration_s;
        Ok(s)
    }
}

/// A swarm shape: the fastest node is `spread` times the slowest, a
/// `slow_fraction` of the nodes are slow, the rest fast, and the speeds
/// sum to [`NODES`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// Fastest over slowest speed (1: homogeneous).
    pub spread: f64,
    /// Share of slow nodes.
    pub slow_fraction: f64,
}

impl Shape {
    /// The homogeneous control.
    pub const HOMOGENEOUS: Shape = Shape { spread: 1.0, slow_fraction: 0.5 };

    /// The nodes' speeds, slow ones first.
    pub fn speeds(self) -> Vec<f64> {
        let slow = ((self.slow_fraction * NODES as f64).round() as usize).clamp(1, NODES - 1);
        let fast = NODES - slow;
        // fast * f + slow * f / spread = NODES.
        let f = NODES as f64 / (fast as f64 + slow as f64 / self.spread);
        let mut v = vec![f / self.spread; slow];
        v.extend(std::iter::repeat_n(f, fast));
        v
    }

    /// The fastest node's speed.
    pub fn fastest(self) -> f64 {
        self.speeds().into_iter().fold(0.0, f64::max)
    }

    /// The scenario with this shape's nodes.
    pub fn apply(self, s: &Scenario) -> Scenario {
        let mut s = s.clone();
        s.nodes = Nodes { speeds: self.speeds(), ..Default::default() };
        s.name = format!("{} {}", s.name, self.label());
        s
    }

    /// "8x, 50% slow" or "homogeneous".
    pub fn label(self) -> String {
        if self.spread == 1.0 {
            "homogeneous".into()
        } else {
            format!("{}x, {:.0}% slow", self.spread, 100.0 * self.slow_fraction)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_has_the_same_total_compute() {
        for spread in [1.0, 2.0, 4.0, 8.0, 16.0] {
            for slow_fraction in [0.25, 0.5, 0.75] {
                let v = Shape { spread, slow_fraction }.speeds();
                assert_eq!(v.len(), NODES);
                assert!((v.iter().sum::<f64>() - NODES as f64).abs() < 1e-9, "{v:?}");
                let (lo, hi) = (v[0], v[NODES - 1]);
                assert!((hi / lo - spread).abs() < 1e-9, "{v:?}");
                let slow = v.iter().filter(|x| **x < hi).count();
                assert_eq!(slow, if spread == 1.0 { 0 } else { (slow_fraction * NODES as f64) as usize });
            }
        }
        assert_eq!(Shape::HOMOGENEOUS.speeds(), vec![1.0; NODES]);
    }

    #[test]
    fn the_teacher_task_loads_without_a_text_file() {
        let s = Task::Teacher.scenario(Path::new("/nonexistent"), true).unwrap();
        assert_eq!(s.duration_s, 60.0);
        assert!(Task::Char.scenario(Path::new("/nonexistent"), false).is_err());
    }
}
