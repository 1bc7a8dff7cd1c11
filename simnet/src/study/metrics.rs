//! The figures the study keeps from one run: time to target, losses, and
//! the specialisation measurements reduced to one number per layer.

use serde::{Deserialize, Serialize};

use crate::{ablation::Spread, measure::LayerSample, report::RunSummary, sim::RunOutput};

/// One layer's specialisation figures over the second half of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerFigures {
    /// Layer (parameter tensor) name.
    pub layer: String,
    /// Mean cosine of the fast and slow groups' summed updates.
    #[serde(deserialize_with = "nan_if_null")]
    pub cos_fast_slow: f64,
    /// Mean cosine of the fast group's summed update with all updates.
    #[serde(deserialize_with = "nan_if_null")]
    pub cos_fast_all: f64,
    /// The same for the slow group.
    #[serde(deserialize_with = "nan_if_null")]
    pub cos_slow_all: f64,
    /// A slow node's update norm per inner step over a fast node's.
    #[serde(deserialize_with = "nan_if_null")]
    pub step_norm_slow_over_fast: f64,
    /// Mean relative distance of a fast node's round-end model from its anchor.
    #[serde(deserialize_with = "nan_if_null")]
    pub drift_fast: f64,
    /// The same for the slow nodes.
    #[serde(deserialize_with = "nan_if_null")]
    pub drift_slow: f64,
}

/// One hidden layer's representation similarity over the second half of a
/// run: linear CKA of a round's local model with its anchor on the probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepresentationFigures {
    /// Hidden layer name.
    pub layer: String,
    /// Mean over a fast node's measured rounds.
    #[serde(deserialize_with = "nan_if_null")]
    pub cka_fast: f64,
    /// The same for a slow node's.
    #[serde(deserialize_with = "nan_if_null")]
    pub cka_slow: f64,
}

/// What the study keeps of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunFigures {
    /// Virtual time to the task's target.
    pub time_to_target_s: Option<f64>,
    /// Held-out loss of the mean replica at the end.
    #[serde(deserialize_with = "nan_if_null")]
    pub final_loss: f64,
    /// Lowest held-out loss of the mean replica, smoothed over three samples.
    #[serde(deserialize_with = "nan_if_null")]
    pub best_loss: f64,
    /// Mean staleness of applied updates.
    #[serde(deserialize_with = "nan_if_null")]
    pub mean_staleness: f64,
    /// Per-layer figures (empty when a group published nothing).
    pub layers: Vec<LayerFigures>,
    /// Per hidden layer, representation similarity (empty for strategies
    /// that send gradients, and in studies saved before it was measured).
    #[serde(default)]
    pub representations: Vec<RepresentationFigures>,
    /// Layer-mean cosine of fast and slow updates in the first third.
    pub cos_fast_slow_early: Option<f64>,
    /// The same in the last third.
    pub cos_fast_slow_late: Option<f64>,
    /// Slow nodes' mean training loss minus fast nodes', second half.
    pub train_loss_gap: Option<f64>,
    /// (t, held-out loss) of the mean replica.
    pub loss_series: Vec<(f64, f64)>,
    /// (t, layer-mean cosine of fast and slow updates).
    pub cos_series: Vec<(f64, f64)>,
}

/// serde_json writes a NaN as null; read it back as NaN (a drift of a
/// strategy that sends gradients, a loss of a run that diverged).
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut s, mut n) = (0.0, 0u32);
    for x in v.filter(|x| x.is_finite()) {
        s += x;
        n += 1;
    }
    (n > 0).then(|| s / f64::from(n))
}

/// The lowest mean of three consecutive values (the single lowest value
/// when there are fewer than three).
pub fn best_smoothed(losses: &[f64]) -> f64 {
    if losses.len() < 3 {
        return losses.iter().copied().fold(f64::INFINITY, f64::min);
    }
    losses.windows(3).map(|w| (w[0] + w[1] + w[2]) / 3.0).fold(f64::INFINITY, f64::min)
}

impl RunFigures {
    /// The figures of parameter tensor `layer`, if measured.
    pub fn layer(&self, layer: &str) -> Option<&LayerFigures> {
        self.layers.iter().find(|l| l.layer == layer)
    }

    /// The representation figures of hidden layer `layer`, if measured.
    pub fn representation(&self, layer: &str) -> Option<&RepresentationFigures> {
        self.representations.iter().find(|l| l.layer == layer)
    }

    /// Reduces a run; `duration_s` splits it into thirds and halves.
    pub fn of(summary: &RunSummary, out: &RunOutput, duration_s: f64) -> Self {
        let samples = &out.layers.samples;
        let late: Vec<&LayerSample> = samples.iter().filter(|s| s.t > duration_s / 2.0).collect();
        let layers = out
            .layers
            .names()
            .iter()
            .filter_map(|name| {
                let of = |f: &dyn Fn(&LayerSample) -> f64| mean(late.iter().filter(|s| &s.layer == name).map(|s| f(s)));
                Some(LayerFigures {
                    layer: name.clone(),
                    cos_fast_slow: of(&|s| s.cosine_fast_slow as f64)?,
                    cos_fast_all: of(&|s| s.cosine_fast_all as f64)?,
                    cos_slow_all: of(&|s| s.cosine_slow_all as f64)?,
                    step_norm_slow_over_fast: of(&|s| s.step_norm_slow as f64 / s.step_norm_fast as f64)?,
                    drift_fast: of(&|s| s.drift_fast as f64).unwrap_or(f64::NAN),
                    drift_slow: of(&|s| s.drift_slow as f64).unwrap_or(f64::NAN),
                })
            })
            .collect();
        let late_reps: Vec<_> = out.layers.representation_samples.iter().filter(|s| s.t > duration_s / 2.0).collect();
        let mut representations: Vec<RepresentationFigures> = Vec::new();
        for s in &late_reps {
            if representations.iter().any(|r| r.layer == s.layer) {
                continue;
            }
            let of = |f: &dyn Fn(&crate::measure::RepresentationSample) -> f64| {
                mean(late_reps.iter().filter(|x| x.layer == s.layer).map(|x| f(x)))
            };
            if let (Some(cka_fast), Some(cka_slow)) = (of(&|x| x.cka_fast), of(&|x| x.cka_slow)) {
                representations.push(RepresentationFigures { layer: s.layer.clone(), cka_fast, cka_slow });
            }
        }
        let cos_in = |from: f64, to: f64| {
            mean(samples.iter().filter(|s| s.t > from && s.t <= to).map(|s| s.cosine_fast_slow as f64))
        };
        let mut cos_series: Vec<(f64, f64)> = Vec::new();
        for s in samples {
            match cos_series.last_mut() {
                Some((t, _)) if *t == s.t => {}
                _ => {
                    let at: Vec<f64> =
                        samples.iter().filter(|x| x.t == s.t).map(|x| x.cosine_fast_slow as f64).collect();
                    cos_series.push((s.t, at.iter().sum::<f64>() / at.len() as f64));
                }
            }
        }
        let losses: Vec<f64> = out.series.iter().map(|s| s.loss as f64).collect();
        Self {
            time_to_target_s: summary.time_to_target_s,
            final_loss: summary.final_loss as f64,
            best_loss: best_smoothed(&losses),
            mean_staleness: summary.mean_staleness,
            layers,
            representations,
            cos_fast_slow_early: cos_in(0.0, duration_s / 3.0),
            cos_fast_slow_late: cos_in(2.0 * duration_s / 3.0, f64::INFINITY),
            train_loss_gap: mean(
                out.layers
                    .group_samples
                    .iter()
                    .filter(|g| g.t > duration_s / 2.0)
                    .map(|g| (g.train_loss_slow - g.train_loss_fast) as f64),
            ),
            loss_series: out.series.iter().map(|s| (s.t, s.loss as f64)).collect(),
            cos_series,
        }
    }
}

/// The first time the loss, smoothed over three consecutive samples (the
/// time of the third), is at or below `target`.
pub fn time_to(series: &[(f64, f64)], target: f64) -> Option<f64> {
    series.windows(3).find(|w| (w[0].1 + w[1].1 + w[2].1) / 3.0 <= target).map(|w| w[2].0)
}

/// A figure over seeds, `None` when no run has it.
pub fn spread_of<'a>(
    runs: impl Iterator<Item = &'a RunFigures>,
    f: impl Fn(&RunFigures) -> Option<f64>,
) -> Option<Spread> {
    let v: Vec<f64> = runs.filter_map(f).filter(|x| x.is_finite()).collect();
    Spread::of(&v)
}

/// A layer's figure over seeds.
pub fn layer_spread<'a>(
    runs: impl Iterator<Item = &'a RunFigures>,
    layer: &str,
    f: impl Fn(&LayerFigures) -> f64,
) -> Option<Spread> {
    spread_of(runs, |r| r.layer(layer).map(&f))
}

/// Whether two sets of seeds tell a difference: their ranges do not overlap.
pub fn separated(a: Option<Spread>, b: Option<Spread>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.max < b.min || b.max < a.min,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoothing_takes_the_lowest_run_of_three() {
        assert_eq!(best_smoothed(&[3.0, 1.0, 2.0, 0.0, 9.0]), 1.0);
        assert_eq!(best_smoothed(&[2.0, 1.5]), 1.5);
    }

    #[test]
    fn time_to_target_is_read_from_the_smoothed_series() {
        let s = [(0.0, 3.0), (1.0, 1.0), (2.0, 2.0), (3.0, 0.0), (4.0, 9.0)];
        assert_eq!(time_to(&s, 2.0), Some(2.0));
        assert_eq!(time_to(&s, 1.0), Some(3.0));
        assert_eq!(time_to(&s, 0.5), None);
    }

    #[test]
    fn a_nan_survives_the_json_round_trip() {
        let l = LayerFigures {
            layer: "l0".into(),
            cos_fast_slow: 0.5,
            cos_fast_all: 0.5,
            cos_slow_all: 0.5,
            step_norm_slow_over_fast: 1.0,
            drift_fast: f64::NAN,
            drift_slow: 0.25,
        };
        let back: LayerFigures = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert!(back.drift_fast.is_nan());
        assert_eq!(back.drift_slow, 0.25);
    }

    #[test]
    fn only_disjoint_ranges_are_a_difference() {
        let s = |min, max| Some(Spread { mean: (min + max) / 2.0, min, max });
        assert!(separated(s(0.0, 1.0), s(1.5, 2.0)));
        assert!(!separated(s(0.0, 1.6), s(1.5, 2.0)));
        assert!(!separated(s(0.0, 1.0), None));
    }
}
