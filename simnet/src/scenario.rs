//! Scenarios: who takes part at what speed, over which network, with which
//! events, training what, to which target. Written in TOML; a set of
//! built-in scenarios ships with the binary.

use std::path::Path;

use ragtag_protocol::{
    engine::{EngineOverrides, Strategy},
    manifest::{DataSpec, Manifest, ModelSpec, TrainingSpec},
};
use serde::{Deserialize, Serialize};

/// One named hardware tier: a speed and how many nodes have it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Tier name (e.g. "a100").
    pub name: String,
    /// Relative speed (1 = the reference laptop).
    pub speed: f64,
    /// Nodes of this tier.
    pub count: u32,
}

/// A log-normal spread of speeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogNormal {
    /// Nodes.
    pub count: u32,
    /// Median speed.
    pub median: f64,
    /// Sigma of the log.
    pub sigma: f64,
    /// Clamp below.
    pub min: f64,
    /// Clamp above.
    pub max: f64,
}

/// Transient straggler episodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stragglers {
    /// Mean time between episodes per affected node (exponential).
    pub every_s: f64,
    /// Length of an episode.
    pub duration_s: f64,
    /// Speed is divided by this during an episode.
    pub slowdown: f64,
    /// Fraction of nodes that have episodes.
    pub fraction: f64,
}

/// Who takes part.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Nodes {
    /// Explicit speeds.
    pub speeds: Vec<f64>,
    /// Hardware tiers.
    pub tiers: Vec<Tier>,
    /// A log-normal spread.
    pub lognormal: Option<LogNormal>,
    /// Straggler episodes.
    pub stragglers: Option<Stragglers>,
}

/// The network between nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSpec {
    /// One-way latency between any two nodes.
    pub latency_ms: f64,
    /// Per-node upload bandwidth.
    pub upload_mbit: f64,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Request timeout after which a lost fetch is reported failed.
    pub request_timeout_s: f64,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        Self { latency_ms: 20.0, upload_mbit: 100.0, loss: 0.0, request_timeout_s: 10.0 }
    }
}

/// What happens during a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// When (virtual seconds).
    pub at_s: f64,
    /// What.
    pub kind: EventKind,
    /// Which nodes (crash, leave, join, rejoin).
    #[serde(default)]
    pub nodes: Vec<u32>,
    /// Partition groups (partition).
    #[serde(default)]
    pub groups: Vec<Vec<u32>>,
}

/// Kinds of events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// Nodes stop without a word.
    Crash,
    /// Nodes leave cleanly.
    Leave,
    /// Nodes (listed with `late = true` or crashed earlier) join, syncing state from a peer.
    Join,
    /// The network splits into groups.
    Partition,
    /// The partition heals.
    Heal,
}

/// A scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// One line on what it shows.
    pub description: String,
    /// Base seed (each run adds its seed index).
    #[serde(default)]
    pub seed: u64,
    /// Stop after this much virtual time.
    pub duration_s: f64,
    /// Evaluate the mean replica every this often.
    pub sample_every_s: f64,
    /// Stop this long after the target was reached (0: at once).
    #[serde(default)]
    pub after_target_s: f64,
    /// Virtual seconds of one inner step at speed 1.
    pub step_cost_s: f64,
    /// Held-out loss to reach.
    pub target_loss: f32,
    /// The model.
    pub model: ModelSpec,
    /// The data.
    pub data: DataSpec,
    /// Inner training settings.
    pub training: TrainingSpec,
    /// Changes to every strategy's preset.
    #[serde(default)]
    pub engine: EngineOverrides,
    /// Nodes.
    pub nodes: Nodes,
    /// Network.
    #[serde(default)]
    pub network: NetworkSpec,
    /// Events.
    #[serde(default)]
    pub events: Vec<Event>,
    /// Nodes that start only when a `join` event names them.
    #[serde(default)]
    pub late: Vec<u32>,
    /// Nodes split into `shards` disjoint data shards (0: each its own stream).
    #[serde(default)]
    pub shards: u32,
    /// ddp's learning rates to sweep in `compare` (empty: the inner rate
    /// times 1/3, 1 and 3, then on up by 3x, at most twice, while the
    /// largest wins); the best is reported.
    #[serde(default)]
    pub ddp_lrs: Vec<f32>,
    /// The data file of file-backed data (text, digits CSV, IDX); a relative
    /// path is taken from the working directory.
    #[serde(default)]
    pub data_file: Option<std::path::PathBuf>,
}

/// Why a scenario is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Unknown built-in name and no such file.
    #[error("no scenario named {0:?} (built-ins: {1})")]
    Unknown(String, String),
    /// The file cannot be read.
    #[error("cannot read {0}: {1}")]
    Io(String, std::io::Error),
    /// The TOML is invalid.
    #[error("invalid scenario {0}: {1}")]
    Parse(String, String),
    /// A value is out of range.
    #[error("scenario {0}: {1}")]
    Invalid(String, String),
}

/// The built-in scenarios, name and TOML.
pub const BUILTIN: [(&str, &str); 8] = [
    ("homogeneous", include_str!("../scenarios/homogeneous.toml")),
    ("hetero-4x", include_str!("../scenarios/hetero-4x.toml")),
    ("hetero-8x-16", include_str!("../scenarios/hetero-8x-16.toml")),
    ("stragglers", include_str!("../scenarios/stragglers.toml")),
    ("churn", include_str!("../scenarios/churn.toml")),
    ("partition", include_str!("../scenarios/partition.toml")),
    ("large", include_str!("../scenarios/large.toml")),
    ("demo", include_str!("../scenarios/demo.toml")),
];

impl Scenario {
    /// A built-in scenario by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Self, ScenarioError> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::parse(name_or_path, text);
        }
        let path = Path::new(name_or_path);
        if path.exists() {
            let text = std::fs::read_to_string(path).map_err(|e| ScenarioError::Io(path.display().to_string(), e))?;
            return Self::parse(name_or_path, &text);
        }
        let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
        Err(ScenarioError::Unknown(name_or_path.into(), names.join(", ")))
    }

    /// Parses and checks a scenario.
    pub fn parse(origin: &str, text: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse(origin.into(), e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |m: String| Err(ScenarioError::Invalid(self.name.clone(), m));
        if !(self.duration_s > 0.0 && self.sample_every_s > 0.0 && self.step_cost_s > 0.0) {
            return bad("duration_s, sample_every_s and step_cost_s must be positive".into());
        }
        let n = self.node_count();
        if n == 0 {
            return bad("no nodes".into());
        }
        for e in &self.events {
            if e.nodes.iter().chain(e.groups.iter().flatten()).any(|i| *i >= n) {
                return bad(format!("event at {}s names a node >= {n}", e.at_s));
            }
        }
        if self.late.iter().any(|i| *i >= n) {
            return bad("late node index out of range".into());
        }
        for strategy in Strategy::ALL {
            self.manifest(strategy, None)
                .validate()
                .map_err(|e| ScenarioError::Invalid(self.name.clone(), e.to_string()))?;
        }
        Ok(())
    }

    /// Number of nodes.
    pub fn node_count(&self) -> u32 {
        let tiers: u32 = self.nodes.tiers.iter().map(|t| t.count).sum();
        self.nodes.speeds.len() as u32 + tiers + self.nodes.lognormal.as_ref().map_or(0, |l| l.count)
    }

    /// The ddp learning rates `compare` sweeps.
    pub fn ddp_sweep(&self) -> Vec<f32> {
        if self.ddp_lrs.is_empty() {
            let lr = self.training.lr;
            vec![lr / 3.0, lr, lr * 3.0]
        } else {
            self.ddp_lrs.clone()
        }
    }

    /// The manifest every node of a `strategy` run shares. ddp's optimiser
    /// runs at the inner learning rate unless `ddp_lr` says otherwise.
    pub fn manifest(&self, strategy: Strategy, ddp_lr: Option<f32>) -> Manifest {
        let mut engine = self.engine.apply(strategy);
        if strategy == Strategy::Ddp {
            engine.outer.eta = ddp_lr.unwrap_or(self.training.lr);
        }
        Manifest {
            format: Manifest::FORMAT,
            name: self.name.clone(),
            start_ms: 0,
            seed: self.seed,
            model: self.model.clone(),
            data: self.data.clone(),
            training: TrainingSpec { target_loss: Some(self.target_loss), ..self.training },
            engine,
            private: false,
            rationale: std::collections::BTreeMap::from([(
                "all".to_string(),
                format!("from the simulator scenario {:?}", self.name),
            )]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses() {
        for (name, _) in BUILTIN {
            let s = Scenario::load(name).unwrap();
            assert!(s.node_count() > 0, "{name}");
        }
        assert_eq!(Scenario::load("hetero-4x").unwrap().node_count(), 4);
        assert_eq!(Scenario::load("hetero-8x-16").unwrap().node_count(), 16);
        assert_eq!(Scenario::load("large").unwrap().node_count(), 1000);
        assert!(matches!(Scenario::load("nope"), Err(ScenarioError::Unknown(..))));
    }

    #[test]
    fn bad_values_are_named() {
        let text = BUILTIN[1].1.replace("duration_s = ", "duration_s = -");
        assert!(matches!(Scenario::parse("x", &text), Err(ScenarioError::Invalid(..))));
        assert!(matches!(Scenario::parse("x", "name = 1"), Err(ScenarioError::Parse(..))));
    }
}
