//! What a run measures: time series of the mean replica, per-node
//! accounting, staleness, and the research measurements (per-layer update
//! norms by node, cosine similarity of fast and slow groups' updates, how
//! far a round's local model drifts from its anchor and how alike their
//! hidden representations stay, each group's training loss).

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
    /// Cosine of the fast nodes' summed update with every update of the
    /// window summed (what the swarm applies, before weights).
    #[serde(default)]
    pub cosine_fast_all: f32,
    /// The same for the slow nodes.
    #[serde(default)]
    pub cosine_slow_all: f32,
    /// Mean norm of a fast node's update per inner step (rounds of
    /// different lengths compare).
    #[serde(default)]
    pub step_norm_fast: f32,
    /// The same for the slow nodes.
    #[serde(default)]
    pub step_norm_slow: f32,
    /// Mean distance of a fast node's local model at the end of its round
    /// from the anchor it started from, relative to the anchor's norm
    /// (NaN when the strategy sends gradients, not models).
    #[serde(default)]
    pub drift_fast: f32,
    /// The same for the slow nodes.
    #[serde(default)]
    pub drift_slow: f32,
}

/// The two groups' training loss in a window: the loss of the first batch
/// of each round, at the anchor the round started from (the examples each
/// group drew, at the model every node starts from).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupSample {
    /// Window end (s).
    pub t: f64,
    /// Mean first-batch loss of the fast nodes' rounds.
    pub train_loss_fast: f32,
    /// Mean first-batch loss of the slow nodes' rounds.
    pub train_loss_slow: f32,
}

/// How alike a round's local model and its anchor compute, per hidden
/// layer, in a window: linear CKA of their representations of a fixed
/// probe batch (1: alike), for one round of each group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepresentationSample {
    /// Window end (s).
    pub t: f64,
    /// Hidden layer name.
    pub layer: String,
    /// A fast node's round (the window's first).
    pub cka_fast: f64,
    /// A slow node's round (the window's first).
    pub cka_slow: f64,
}

/// Per hidden layer, the CKA of one round (`None`: constant on the probe).
pub type Similarity = Vec<(String, Option<f64>)>;

/// One finished local phase, as the recorder sees it.
#[derive(Clone, Copy, Debug)]
pub struct PhaseRecord<'a> {
    /// The update: anchor minus local model (or the gradient, for ddp).
    pub delta: &'a [f32],
    /// The local model at the end of the round (`None` for gradients).
    pub local: Option<&'a [f32]>,
    /// Inner steps of the round.
    pub steps: u32,
    /// Training loss of the round's first batch, at the anchor it started
    /// from (the examples it drew, at the common model).
    pub loss: f32,
}

/// Per-group sums of one window.
#[derive(Debug)]
struct GroupWindow {
    sum: Vec<f64>,
    norms: Vec<f64>,
    step_norms: Vec<f64>,
    drifts: Vec<f64>,
    drift_count: u64,
    count: u64,
    loss: f64,
    loss_count: u64,
}

impl GroupWindow {
    fn new(params: usize, layers: usize) -> Self {
        Self {
            sum: vec![0.0; params],
            norms: vec![0.0; layers],
            step_norms: vec![0.0; layers],
            drifts: vec![0.0; layers],
            drift_count: 0,
            count: 0,
            loss: 0.0,
            loss_count: 0,
        }
    }

    fn clear(&mut self) {
        for v in [&mut self.sum, &mut self.norms, &mut self.step_norms, &mut self.drifts] {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
        (self.drift_count, self.count, self.loss, self.loss_count) = (0, 0, 0.0, 0);
    }
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

fn cosine(a: &[f64], b: impl Iterator<Item = f64> + Clone) -> f32 {
    let dot: f64 = a.iter().zip(b.clone()).map(|(x, y)| x * y).sum();
    (dot / (norm(a.iter().copied()) * norm(b)).max(1e-30)) as f32
}

/// Collects group update sums between samples.
#[derive(Debug)]
pub struct LayerRecorder {
    names: Vec<String>,
    ranges: Vec<std::ops::Range<usize>>,
    groups: [GroupWindow; 2],
    /// Per node, per layer: sum of update norms and count.
    pub per_node: Vec<(Vec<f64>, u64)>,
    /// The samples so far.
    pub samples: Vec<LayerSample>,
    /// The groups' training losses so far.
    pub group_samples: Vec<GroupSample>,
    /// Per group, the window's representation similarity, once measured.
    representation: [Option<Similarity>; 2],
    /// The representation samples so far.
    pub representation_samples: Vec<RepresentationSample>,
}

impl LayerRecorder {
    /// For a model with these (name, range) layers and `nodes` nodes.
    pub fn new(layers: Vec<(String, std::ops::Range<usize>)>, nodes: usize, params: usize) -> Self {
        let (names, ranges): (Vec<_>, Vec<_>) = layers.into_iter().unzip();
        let l = names.len();
        Self {
            names,
            ranges,
            groups: [GroupWindow::new(params, l), GroupWindow::new(params, l)],
            per_node: vec![(vec![0.0; l], 0); nodes],
            samples: Vec::new(),
            group_samples: Vec::new(),
            representation: [None, None],
            representation_samples: Vec::new(),
        }
    }

    /// Whether this window still wants a representation measurement of a
    /// round of `group` (one per group per window: each costs two forward
    /// passes of the probe).
    pub fn wants_representation(&self, group: usize) -> bool {
        self.representation[group].is_none()
    }

    /// Records the per-layer CKA of one round of `group` with its anchor.
    pub fn record_representation(&mut self, group: usize, similarity: Similarity) {
        self.representation[group] = Some(similarity);
    }

    /// Records node `node`'s finished phase (group 0 = fast, 1 = slow).
    pub fn record(&mut self, node: usize, group: usize, phase: PhaseRecord<'_>) {
        let g = &mut self.groups[group];
        for (s, d) in g.sum.iter_mut().zip(phase.delta) {
            *s += *d as f64;
        }
        g.count += 1;
        if phase.loss.is_finite() {
            g.loss += phase.loss as f64;
            g.loss_count += 1;
        }
        if phase.local.is_some() {
            g.drift_count += 1;
        }
        let (node_norms, node_count) = &mut self.per_node[node];
        *node_count += 1;
        let steps = phase.steps.max(1) as f64;
        for (i, r) in self.ranges.iter().enumerate() {
            let delta = &phase.delta[r.clone()];
            let n = norm(delta.iter().map(|d| *d as f64));
            g.norms[i] += n;
            g.step_norms[i] += n / steps;
            node_norms[i] += n;
            if let Some(local) = phase.local {
                // The update is anchor - local, so the anchor is local + update.
                let anchor = norm(local[r.clone()].iter().zip(delta).map(|(l, d)| (*l + *d) as f64));
                g.drifts[i] += n / anchor.max(1e-30);
            }
        }
    }

    /// Closes the window at `t`.
    pub fn sample(&mut self, t: f64) {
        let [fast, slow] = &self.groups;
        if fast.count == 0 || slow.count == 0 {
            return;
        }
        let per = |v: f64, n: u64| if n == 0 { f32::NAN } else { (v / n as f64) as f32 };
        for (i, r) in self.ranges.iter().enumerate() {
            let (a, b) = (&fast.sum[r.clone()], &slow.sum[r.clone()]);
            let all = a.iter().zip(b).map(|(x, y)| x + y);
            self.samples.push(LayerSample {
                t,
                layer: self.names[i].clone(),
                cosine_fast_slow: cosine(a, b.iter().copied()),
                norm_fast: per(fast.norms[i], fast.count),
                norm_slow: per(slow.norms[i], slow.count),
                cosine_fast_all: cosine(a, all.clone()),
                cosine_slow_all: cosine(b, all),
                step_norm_fast: per(fast.step_norms[i], fast.count),
                step_norm_slow: per(slow.step_norms[i], slow.count),
                drift_fast: per(fast.drifts[i], fast.drift_count),
                drift_slow: per(slow.drifts[i], slow.drift_count),
            });
        }
        self.group_samples.push(GroupSample {
            t,
            train_loss_fast: per(fast.loss, fast.loss_count),
            train_loss_slow: per(slow.loss, slow.loss_count),
        });
        if let [Some(fast), Some(slow)] = &self.representation {
            for ((layer, f), (_, s)) in fast.iter().zip(slow) {
                self.representation_samples.push(RepresentationSample {
                    t,
                    layer: layer.clone(),
                    cka_fast: f.unwrap_or(f64::NAN),
                    cka_slow: s.unwrap_or(f64::NAN),
                });
            }
            self.representation = [None, None];
        }
        for g in &mut self.groups {
            g.clear();
        }
    }

    /// Layer names.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Each node's group for the layer measurements, from the nodes' speeds:
/// 1 (slow) below the mean speed, else 0 (fast), so both groups have a
/// node whatever the share of slow ones (a median would put every node of
/// a swarm that is mostly slow in the fast group). Equal speeds: halves by
/// index, so a homogeneous control has the same two groups to compare as a
/// mixed swarm.
pub fn groups(speeds: &[f64]) -> Vec<usize> {
    let mean = speeds.iter().sum::<f64>() / speeds.len().max(1) as f64;
    let all_equal = speeds.iter().all(|s| *s == speeds[0]);
    speeds
        .iter()
        .enumerate()
        .map(|(i, s)| if all_equal { usize::from(2 * i >= speeds.len()) } else { usize::from(*s < mean) })
        .collect()
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
    /// Groups a replica closed a batch without a quorum sum for
    /// (aggregated dissemination), over all replicas.
    #[serde(default)]
    pub aggregates_missed: u64,
}

impl Tally {
    /// Mean staleness of applied updates.
    pub fn mean_staleness(&self) -> f64 {
        let n: u64 = self.staleness_histogram.iter().sum();
        let s: u64 = self.staleness_histogram.iter().enumerate().map(|(i, c)| i as u64 * c).sum();
        s as f64 / n.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(delta: &[f32]) -> PhaseRecord<'_> {
        PhaseRecord { delta, local: Some(delta), steps: 1, loss: 1.0 }
    }

    #[test]
    fn slow_nodes_are_those_below_the_mean_and_equal_ones_split_by_index() {
        assert_eq!(groups(&[1.0, 1.0, 2.0, 4.0]), vec![1, 1, 0, 0]);
        // Mostly slow: the slow ones are still a group.
        assert_eq!(groups(&[4.0, 0.5, 0.5, 0.5, 4.0]), vec![0, 1, 1, 1, 0]);
        assert_eq!(groups(&[0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 3.4, 3.4]), vec![1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(groups(&[1.0; 4]), vec![0, 0, 1, 1]);
        assert!(groups(&[]).is_empty());
    }

    fn similarity(cka: f64) -> Similarity {
        vec![("l0".into(), Some(cka)), ("l1".into(), None)]
    }

    /// One measurement per group per window; a window closes with both
    /// groups' (a missing layer reads NaN), and one without a slow round
    /// keeps the fast one's for the next.
    #[test]
    fn representations_are_sampled_once_per_group_per_window() {
        let mut r = LayerRecorder::new(vec![("w".into(), 0..2)], 2, 2);
        r.record(0, 0, phase(&[1.0, 0.0]));
        assert!(r.wants_representation(0));
        r.record_representation(0, similarity(0.9));
        assert!(!r.wants_representation(0) && r.wants_representation(1));
        r.sample(1.0);
        assert!(r.representation_samples.is_empty(), "no slow round yet");
        r.record(1, 1, phase(&[0.0, 1.0]));
        r.record_representation(1, similarity(0.5));
        r.sample(2.0);
        let got: Vec<(f64, &str, f64, f64)> =
            r.representation_samples.iter().map(|s| (s.t, s.layer.as_str(), s.cka_fast, s.cka_slow)).collect();
        assert_eq!(got[0], (2.0, "l0", 0.9, 0.5));
        assert_eq!((got[1].1, got[1].2.is_nan(), got[1].3.is_nan()), ("l1", true, true));
        assert!(r.wants_representation(0) && r.wants_representation(1), "a new window");
    }
}
