//! The study's PNG plots: the specialisation measurements over time and
//! per layer, and the heterogeneity frontier.

use std::path::Path;

use ragtag_protocol::engine::Strategy;

use super::{Arm, FOCUS, Shape, StudyError, StudyRun, TaskStudy, metrics::spread_of};
use crate::plot::{Series, line_chart};

fn chart(path: &Path, title: &str, x: &str, y: &str, series: &[Series], hline: Option<f64>) -> Result<(), StudyError> {
    line_chart(path, title, x, y, series, hline)
        .map_err(|e| StudyError::Write { what: path.display().to_string(), source: e.into() })
}

fn first_seed(t: &TaskStudy, shape: Shape, strategy: Strategy, arm: Arm) -> Option<&StudyRun> {
    t.runs.iter().find(|r| r.shape == shape && r.strategy == strategy && r.arm == arm && r.seed == 0)
}

/// Writes the task's plots into `dir`; returns the file names written.
pub fn write(dir: &Path, t: &TaskStudy, spreads: &[f64], fractions: &[f64]) -> Result<Vec<String>, StudyError> {
    let name = t.task.name();
    let mut files = Vec::new();

    // Q1: fast-slow cosine over time, mixed swarm against the homogeneous control.
    let cos: Vec<Series> = [(FOCUS, "mixed"), (Shape::HOMOGENEOUS, "homogeneous")]
        .into_iter()
        .filter_map(|(shape, label)| {
            first_seed(t, shape, Strategy::Gopals, Arm::Preset)
                .map(|r| (format!("{label} ({})", shape.label()), r.figures.cos_series.clone()))
        })
        .collect();
    let f = format!("study-{name}-cosine.png");
    chart(
        &dir.join(&f),
        &format!("{name}: cosine of fast and slow groups' updates (layer mean, gopals, seed 0)"),
        "virtual time (s)",
        "cosine",
        &cos,
        Some(0.0),
    )?;
    files.push(f);

    // Q1/Q2: per layer, slow over fast step norm and drift, mixed and homogeneous.
    let mut per_layer: Vec<Series> = Vec::new();
    for (shape, arm, label) in [
        (FOCUS, Arm::Preset, "mixed"),
        (FOCUS, Arm::NoStalenessWeights, "mixed, no staleness weights"),
        (Shape::HOMOGENEOUS, Arm::Preset, "homogeneous"),
    ] {
        let runs_of = || {
            t.runs
                .iter()
                .filter(move |r| r.shape == shape && r.arm == arm && r.strategy == Strategy::Gopals)
                .map(|r| &r.figures)
        };
        let Some(first) = runs_of().next() else { continue };
        let layers: Vec<String> = first.layers.iter().map(|l| l.layer.clone()).collect();
        let point = |f: fn(&super::metrics::LayerFigures) -> f64| -> Vec<(f64, f64)> {
            layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    spread_of(runs_of(), |r| r.layers.iter().find(|x| &x.layer == l).map(f)).map(|s| (i as f64, s.mean))
                })
                .collect()
        };
        per_layer.push((format!("{label}: step norm slow/fast"), point(|l| l.step_norm_slow_over_fast)));
        per_layer.push((format!("{label}: drift slow/fast"), point(|l| l.drift_slow / l.drift_fast)));
    }
    let f = format!("study-{name}-layers.png");
    chart(
        &dir.join(&f),
        &format!("{name}: slow over fast nodes per layer (gopals, mean over seeds)"),
        "layer (input to output)",
        "ratio",
        &per_layer,
        Some(1.0),
    )?;
    files.push(f);

    // Q3: final loss against spread, per strategy and slow fraction.
    let mut frontier: Vec<Series> = Vec::new();
    for strategy in super::STRATEGIES {
        for &fraction in fractions {
            let pts = spreads
                .iter()
                .filter_map(|&spread| {
                    let shape =
                        if spread == 1.0 { Shape::HOMOGENEOUS } else { Shape { spread, slow_fraction: fraction } };
                    let runs =
                        t.runs.iter().filter(|r| r.shape == shape && r.strategy == strategy && r.arm == Arm::Preset);
                    spread_of(runs.map(|r| &r.figures), |r| Some(r.final_loss)).map(|s| (spread.log2(), s.mean))
                })
                .collect();
            frontier.push((format!("{}, {:.0}% slow", strategy.name(), 100.0 * fraction), pts));
        }
    }
    let f = format!("study-{name}-frontier.png");
    chart(
        &dir.join(&f),
        &format!("{name}: final held-out loss at equal total compute (mean over seeds)"),
        "log2 spread (fastest / slowest)",
        "held-out loss",
        &frontier,
        Some(t.target_loss),
    )?;
    files.push(f);
    Ok(files)
}
