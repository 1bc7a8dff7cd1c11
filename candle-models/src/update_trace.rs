//! One round's measurements for the heterogeneity study, taken where the
//! round ran: a strided sample of each layer's update and of the local
//! model, the first batch's loss and how alike the local model and its
//! anchor compute. A real node prints it (`ragtag run --trace-updates`) so
//! that `ragtag-simnet real` can compute the simulator's per-layer figures
//! from real processes without shipping whole models.

use serde::{Deserialize, Serialize};

use crate::params::Layout;

/// Values sampled per layer at most (a layer this size or smaller is kept
/// whole, so the study's MLP layers up to 512 values are exact).
pub const SKETCH_PER_LAYER: usize = 512;

/// About this many representation rows per similarity measurement (a
/// probe of 512 feature vectors or images, or of 32 sequences of 16
/// positions): the simulator and the node use the same probe.
pub const PROBE_ROWS: usize = 512;

/// One parameter tensor's sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerTrace {
    /// Parameter tensor name.
    pub name: String,
    /// Every `stride`-th value was kept.
    pub stride: usize,
    /// The update (anchor minus local model), sampled, each value scaled
    /// by sqrt(stride) so the sample's norm estimates the layer's.
    #[serde(deserialize_with = "values_or_nan")]
    pub update: Vec<f32>,
    /// The local model at the end of the round, sampled and scaled alike.
    #[serde(deserialize_with = "values_or_nan")]
    pub local: Vec<f32>,
}

/// One round, as the study measures it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateTrace {
    /// Per parameter tensor, in layout order.
    pub layers: Vec<LayerTrace>,
    /// Whole inner steps of the round.
    pub steps: u32,
    /// Training loss of the round's first batch, at the anchor (NaN when
    /// the round had none).
    #[serde(deserialize_with = "value_or_nan")]
    pub first_loss: f32,
    /// Per hidden layer, linear CKA of the local model and the anchor on
    /// the probe (`None`: constant there).
    pub similarity: Vec<(String, Option<f64>)>,
}

/// JSON writes a NaN as null (a round without a first batch, a diverged
/// model): read it back as NaN instead of refusing the whole trace.
fn value_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

/// [`value_or_nan`] for every value of a sample.
fn values_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
    Ok(Vec::<Option<f32>>::deserialize(d)?.into_iter().map(|v| v.unwrap_or(f32::NAN)).collect())
}

impl LayerTrace {
    /// Samples `[offset, offset + len)` of `anchor` and `local`.
    fn of(name: &str, offset: usize, len: usize, anchor: &[f32], local: &[f32]) -> Self {
        let stride = len.div_ceil(SKETCH_PER_LAYER).max(1);
        let scale = (stride as f32).sqrt();
        let idx = (offset..offset + len).step_by(stride);
        Self {
            name: name.to_string(),
            stride,
            update: idx.clone().map(|i| (anchor[i] - local[i]) * scale).collect(),
            local: idx.map(|i| local[i] * scale).collect(),
        }
    }
}

impl UpdateTrace {
    /// The trace of a round that went from `anchor` to `local` (both laid
    /// out as `layout`; `None` when their lengths do not match it).
    pub fn of(
        layout: &Layout,
        anchor: &[f32],
        local: &[f32],
        steps: u32,
        first_loss: f32,
        similarity: Vec<(String, Option<f64>)>,
    ) -> Option<Self> {
        if anchor.len() != layout.total() || local.len() != layout.total() {
            return None;
        }
        let layers = layout.entries.iter().map(|e| LayerTrace::of(&e.name, e.offset, e.len, anchor, local)).collect();
        Some(Self { layers, steps, first_loss, similarity })
    }

    /// The sampled updates of every layer, concatenated, with each layer's
    /// range in it (the shape a layer recorder takes).
    pub fn flat_update(&self) -> (Vec<f32>, Vec<(String, std::ops::Range<usize>)>) {
        let mut flat = Vec::new();
        let mut ranges = Vec::new();
        for l in &self.layers {
            ranges.push((l.name.clone(), flat.len()..flat.len() + l.update.len()));
            flat.extend_from_slice(&l.update);
        }
        (flat, ranges)
    }

    /// The sampled local models of every layer, concatenated alike.
    pub fn flat_local(&self) -> Vec<f32> {
        self.layers.iter().flat_map(|l| l.local.iter().copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::LayoutEntry;

    fn layout(lens: &[usize]) -> Layout {
        let mut offset = 0;
        let entries = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let e = LayoutEntry { name: format!("l{i}"), shape: vec![len], offset, len };
                offset += len;
                e
            })
            .collect();
        Layout { entries }
    }

    fn norm(v: &[f32]) -> f32 {
        v.iter().map(|x| x * x).sum::<f32>().sqrt()
    }

    #[test]
    fn small_layers_are_kept_whole_and_large_ones_estimate_their_norm() {
        let l = layout(&[100, 4096]);
        let anchor: Vec<f32> = (0..4196).map(|i| (i as f32 * 0.37).sin()).collect();
        let local: Vec<f32> = anchor.iter().enumerate().map(|(i, a)| a - 0.01 * (i as f32 * 1.3).cos()).collect();
        let t = UpdateTrace::of(&l, &anchor, &local, 7, 2.5, Vec::new()).unwrap();
        assert_eq!(t.layers[0].stride, 1);
        let whole: Vec<f32> = (0..100).map(|i| anchor[i] - local[i]).collect();
        assert_eq!(t.layers[0].update, whole);
        assert_eq!(t.layers[1].stride, 8);
        assert_eq!(t.layers[1].update.len(), 512);
        let true_norm = norm(&(100..4196).map(|i| anchor[i] - local[i]).collect::<Vec<_>>());
        let est = norm(&t.layers[1].update);
        assert!((est / true_norm - 1.0).abs() < 0.05, "estimate {est} of {true_norm}");
        let (flat, ranges) = t.flat_update();
        assert_eq!(flat.len(), 612);
        assert_eq!(ranges[1].1, 100..612);
        assert_eq!(t.flat_local().len(), 612);
    }

    #[test]
    fn a_model_of_the_wrong_size_has_no_trace() {
        let l = layout(&[10]);
        assert!(UpdateTrace::of(&l, &[0.0; 10], &[0.0; 9], 1, 0.0, Vec::new()).is_none());
    }

    #[test]
    fn a_nan_is_read_back_as_nan() {
        let l = layout(&[2]);
        let t = UpdateTrace::of(&l, &[1.0, f32::NAN], &[0.5, 2.0], 2, f32::NAN, Vec::new()).unwrap();
        let back: UpdateTrace = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert!(back.first_loss.is_nan() && back.layers[0].update[1].is_nan());
        assert_eq!(back.layers[0].update[0], 0.5);
    }

    #[test]
    fn a_trace_survives_json() {
        let l = layout(&[3]);
        let t =
            UpdateTrace::of(&l, &[1.0, 2.0, 3.0], &[0.5, 2.0, 3.5], 2, 1.0, vec![("h0".into(), Some(0.9))]).unwrap();
        let back: UpdateTrace = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}
