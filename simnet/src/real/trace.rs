//! The study's per-layer measurements from real processes: with
//! `--trace-updates` each node's round line carries an [`UpdateTrace`] (a
//! strided sample of the round's update and local model, its first batch's
//! loss, the CKA of the local model and its anchor). Replayed in time order
//! into the simulator's [`LayerRecorder`], on the simulator's sampling
//! grid, they give the same layer, group and representation samples as
//! virtual mode, estimated from the samples.

use ragtag_models::update_trace::UpdateTrace;

use crate::measure::{LayerRecorder, PhaseRecord};

/// One node's traced round, at wall time `t` since the run's start.
#[derive(Debug)]
pub(super) struct TracedRound {
    /// When the node reported it (s).
    pub t: f64,
    /// The node's index.
    pub node: usize,
    /// What it measured.
    pub trace: UpdateTrace,
}

/// A recorder filled from `rounds` (any order), node `i` in group
/// `groups[i]`, a window closed every `every` seconds up to `end`. Empty
/// (no layers) without rounds; a round whose sample does not match the
/// first one's shape is left out with a warning.
pub(super) fn recorder_of(mut rounds: Vec<TracedRound>, groups: &[usize], every: f64, end: f64) -> LayerRecorder {
    rounds.sort_by(|a, b| a.t.total_cmp(&b.t));
    let Some(first) = rounds.first() else { return LayerRecorder::new(Vec::new(), groups.len(), 0) };
    let (flat, layers) = first.trace.flat_update();
    let params = flat.len();
    let mut rec = LayerRecorder::new(layers.clone(), groups.len(), params);
    let mut next = rounds.iter().peekable();
    let mut t = every;
    while t <= end + every {
        while let Some(r) = next.next_if(|r| r.t <= t) {
            let (delta, these) = r.trace.flat_update();
            let local = r.trace.flat_local();
            let same = these == layers && delta.len() == params && local.len() == params;
            let Some(&group) = groups.get(r.node).filter(|_| same) else {
                tracing::warn!(
                    "node {}'s traced round at {:.1} s does not match the others' layers: left out",
                    r.node,
                    r.t
                );
                continue;
            };
            rec.record(
                r.node,
                group,
                PhaseRecord { delta: &delta, local: Some(&local), steps: r.trace.steps, loss: r.trace.first_loss },
            );
            if !r.trace.similarity.is_empty() && rec.wants_representation(group) {
                rec.record_representation(group, r.trace.similarity.clone());
            }
        }
        rec.sample(t);
        t += every;
    }
    rec
}

#[cfg(test)]
mod tests {
    use ragtag_models::update_trace::LayerTrace;

    use super::*;

    fn round(t: f64, node: usize, update: f32) -> TracedRound {
        let layer =
            |name: &str| LayerTrace { name: name.into(), stride: 1, update: vec![update, 0.0], local: vec![1.0, 0.0] };
        TracedRound {
            t,
            node,
            trace: UpdateTrace {
                layers: vec![layer("a"), layer("b")],
                steps: 2,
                first_loss: 1.0 + node as f32,
                similarity: vec![("h0".into(), Some(0.5))],
            },
        }
    }

    #[test]
    fn traced_rounds_fill_the_windows_they_fall_in() {
        // Node 0 fast, node 1 slow; the slow node's updates point the other way.
        let rounds = vec![round(2.5, 1, -1.0), round(0.5, 0, 1.0), round(1.5, 1, -1.0), round(0.7, 0, 1.0)];
        let rec = recorder_of(rounds, &[0, 1], 1.0, 2.5);
        assert_eq!(rec.names(), ["a", "b"]);
        // (0, 1] has only fast rounds, so the window stays open (as in
        // virtual mode) until (1, 2] brings a slow one; (2, 3] has only a
        // slow one and is not closed.
        assert_eq!(rec.samples.iter().map(|s| s.t).collect::<Vec<_>>(), [2.0, 2.0]);
        let rounds = vec![round(0.5, 0, 1.0), round(0.6, 1, -1.0), round(1.5, 0, 1.0), round(1.6, 1, 1.0)];
        let rec = recorder_of(rounds, &[0, 1], 1.0, 2.0);
        let a: Vec<f32> = rec.samples.iter().filter(|s| s.layer == "a").map(|s| s.cosine_fast_slow).collect();
        assert_eq!(a.len(), 2);
        assert!((a[0] + 1.0).abs() < 1e-6 && (a[1] - 1.0).abs() < 1e-6, "{a:?}");
        // Norm 1 over 2 steps; drift 1 / |local + update| = 1 / 2.
        let s = &rec.samples[0];
        assert!((s.norm_fast - 1.0).abs() < 1e-6 && (s.step_norm_fast - 0.5).abs() < 1e-6);
        assert!((s.drift_fast - 0.5).abs() < 1e-6, "{}", s.drift_fast);
        assert_eq!(rec.group_samples[0].train_loss_slow, 2.0);
        assert_eq!(rec.representation_samples.len(), 2);
    }

    #[test]
    fn a_round_of_another_shape_is_left_out() {
        let mut fewer = round(0.6, 1, -1.0);
        fewer.trace.layers.pop();
        // The same total length, split differently between the layers.
        let mut shifted = round(0.6, 1, -1.0);
        shifted.trace.layers[0].update.push(0.0);
        shifted.trace.layers[1].update.pop();
        // A local model sample shorter than the update's.
        let mut short = round(0.6, 1, -1.0);
        short.trace.layers[1].local.pop();
        for odd in [fewer, shifted, short] {
            let rec = recorder_of(vec![round(0.5, 0, 1.0), odd], &[0, 1], 1.0, 1.0);
            assert!(rec.samples.is_empty(), "the slow group's only round was left out");
        }
        assert!(recorder_of(Vec::new(), &[0, 1], 1.0, 1.0).names().is_empty());
    }
}
