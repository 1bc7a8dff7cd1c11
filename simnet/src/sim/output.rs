//! What a run produced.

use std::collections::BTreeMap;

use ragtag_protocol::engine::Strategy;

use crate::measure::{LayerRecorder, Sample, Tally};

/// Everything a run produced.
#[derive(Debug)]
pub struct RunOutput {
    /// The strategy.
    pub strategy: Strategy,
    /// The seed offset.
    pub seed: u64,
    /// Samples of the mean replica over time.
    pub series: Vec<Sample>,
    /// Per-node accounting.
    pub nodes: Vec<NodeOutput>,
    /// Staleness and drops.
    pub tally: Tally,
    /// Research measurements.
    pub layers: LayerRecorder,
    /// Held-out loss of each live replica at the end.
    pub replica_losses: Vec<f32>,
    /// When the target was first reached (interpolated), if it was.
    pub time_to_target_s: Option<f64>,
    /// Virtual time at the end.
    pub end_s: f64,
    /// Messages lost in the network.
    pub messages_lost: u64,
    /// The dataset's floor (best achievable loss), when known.
    pub floor: Option<f32>,
    /// Aggregate compute available over the run (speed-seconds).
    pub aggregate_work: f64,
    /// Events processed.
    pub events: u64,
}

/// One node's accounting.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeOutput {
    /// Index in the scenario.
    pub index: usize,
    /// Base speed.
    pub speed: f64,
    /// Fast (0) or slow (1) half.
    pub group: usize,
    /// Seconds computing.
    pub busy_s: f64,
    /// Seconds up.
    pub alive_s: f64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received (absent in reports written before it was measured).
    #[serde(default)]
    pub bytes_received: u64,
    /// Updates published.
    pub updates: u64,
    /// Samples processed.
    pub samples: u64,
    /// Seconds up but not computing, by reason (`IdleReason` names); empty
    /// where not measured.
    #[serde(default)]
    pub idle_s: BTreeMap<String, f64>,
}

impl NodeOutput {
    /// Fraction of its up time the node computed.
    pub fn utilisation(&self) -> f64 {
        if self.alive_s > 0.0 { self.busy_s / self.alive_s } else { 0.0 }
    }
}
