//! What a run measures: time series of the mean replica, per-node
//! accounting, staleness, and the research measurements (per-layer update
//! norms by node, cosine similarity of fast and slow groups' updates).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One sample of the swarm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Virtual time (s).
    pub t: f64,
    /// Held-out loss of the mean replica.
    pub loss: f32,
    /// Held-out accuracy of the mean replica.
    pub accuracy: f32,
    /// Samples processed by all nodes so far.
    pub samples: u64,
    /// Updates published so far.
    pub updates: u64,
    /// Largest relative distance of a replica to the mean replica.
    pub consensus_max: f32,
    /// Mean relative distance of replicas to the mean replica.
    pub consensus_mean: f32,
    /// Live nodes.
    pub live: u32,
    /// Bytes sent by all nodes so far.
    pub bytes: u64,
}

/// Per-layer similarity of the fast and slow groups' updates in a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerSample {
    /// Window end (s).
    pub t: f64,
    /// Layer (parameter tensor) name.
    pub layer: String,
    /// Cosine similarity of the summed updates of fast and slow nodes.
    pub cosine_fast_slow: f32,
    /// Mean norm of a fast node's update to this layer.
    pub norm_fast: f32,
    /// Mean norm of a slow node's update to this layer.
    pub norm_slow: f32,
}

/// Collects group update sums between samples.
#[derive(Debug)]
pub struct LayerRecorder {
    names: Vec<String>,
    ranges: Vec<std::ops::Range<usize>>,
    sums: [Vec<f64>; 2],
    norm_sums: [Vec<f64>; 2],
    counts: [u64; 2],
    /// Per node, per layer: sum of update norms and count.
    pub per_node: Vec<(Vec<f64>, u64)>,
    /// The samples so far.
    pub samples: Vec<LayerSample>,
}

impl LayerRecorder {
    /// For a model with these (name, range) layers and `nodes` nodes.
    pub fn new(layers: Vec<(String, std::ops::Range<usize>)>, nodes: usize, params: usize) -> Self {
        let (names, ranges): (Vec<_>, Vec<_>) = layers.into_iter().unzip();
        let l = names.len();
        Self {
            names,
            ranges,
            sums: [vec![0.0; params], vec![0.0; params]],
            norm_sums: [vec![0.0; l], vec![0.0; l]],
            counts: [0, 0],
            per_node: vec![(vec![0.0; l], 0); nodes],
            samples: Vec::new(),
        }
    }

    /// Records node `node`'s update `delta` (group 0 = fast, 1 = slow).
    pub fn record(&mut self, node: usize, group: usize, delta: &[f32]) {
        let sums = &mut self.sums[group];
        for (s, d) in sums.iter_mut().zip(delta) {
            *s += *d as f64;
        }
        self.counts[group] += 1;
        let (node_norms, node_count) = &mut self.per_node[node];
        *node_count += 1;
        for (i, r) in self.ranges.iter().enumerate() {
            let n = delta[r.clone()].iter().map(|d| (*d as f64).powi(2)).sum::<f64>().sqrt();
            self.norm_sums[group][i] += n;
            node_norms[i] += n;
        }
    }

    /// Closes the window at `t`.
    pub fn sample(&mut self, t: f64) {
        if self.counts[0] == 0 || self.counts[1] == 0 {
            return;
        }
        for (i, r) in self.ranges.iter().enumerate() {
            let (a, b) = (&self.sums[0][r.clone()], &self.sums[1][r.clone()]);
            let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
            let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
            self.samples.push(LayerSample {
                t,
                layer: self.names[i].clone(),
                cosine_fast_slow: (dot / (na * nb).max(1e-30)) as f32,
                norm_fast: (self.norm_sums[0][i] / self.counts[0] as f64) as f32,
                norm_slow: (self.norm_sums[1][i] / self.counts[1] as f64) as f32,
            });
        }
        for g in 0..2 {
            self.sums[g].iter_mut().for_each(|x| *x = 0.0);
            self.norm_sums[g].iter_mut().for_each(|x| *x = 0.0);
            self.counts[g] = 0;
        }
    }

    /// Layer names.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Staleness and drops over the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Applied updates by staleness (last bucket: 7 or more), over all replicas.
    pub staleness_histogram: [u64; 8],
    /// Dropped updates by reason, over all replicas.
    pub dropped: BTreeMap<String, u64>,
    /// Anchor averages by anti-entropy.
    pub anchors_averaged: u64,
    /// Peers' anchors not used, by reason.
    #[serde(default)]
    pub anchors_refused: BTreeMap<String, u64>,
    /// Fetches abandoned.
    pub fetches_abandoned: u64,
    /// Inner learning-rate changes by reason, over all replicas.
    #[serde(default)]
    pub inner_lr_changes: BTreeMap<String, u64>,
    /// The lowest inner learning-rate scale any replica reached.
    #[serde(default)]
    pub inner_lr_scale_min: Option<f32>,
}

impl Tally {
    /// Mean staleness of applied updates.
    pub fn mean_staleness(&self) -> f64 {
        let n: u64 = self.staleness_histogram.iter().sum();
        let s: u64 = self.staleness_histogram.iter().enumerate().map(|(i, c)| i as u64 * c).sum();
        s as f64 / n.max(1) as f64
    }
}
