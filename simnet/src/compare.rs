//! Every strategy on the same scenario, side by side, against ddp and the
//! ideal (the time the swarm's aggregate compute needs for the samples
//! that ddp needed).

use std::{collections::BTreeMap, fmt::Write as _};

use ragtag_protocol::engine::Strategy;
use serde::{Deserialize, Serialize};

use crate::{
    report::{RunSummary, idle_text, loss_at_samples, secs},
    scenario::Scenario,
    sim::{RunOptions, RunOutput, SimError, run},
};

/// Why a comparison could not be run.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// One of the runs failed.
    #[error(transparent)]
    Run(#[from] SimError),
}

/// One strategy's figures, averaged over seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StrategyRow {
    /// Strategy.
    pub strategy: String,
    /// Seeds that reached the target.
    pub reached: u32,
    /// Seeds run.
    pub seeds: u32,
    /// Mean virtual time to target over the seeds that reached it.
    pub time_to_target_s: Option<f64>,
    /// Time to target over ddp's.
    pub vs_ddp: Option<f64>,
    /// Time to target over the ideal.
    pub vs_ideal: Option<f64>,
    /// Mean utilisation per node.
    pub utilisation: f64,
    /// Mean share of up time per idle reason, over seeds (empty: not measured).
    #[serde(default)]
    pub idle_share: BTreeMap<String, f64>,
    /// Bytes sent per sample processed.
    pub bytes_per_sample: f64,
    /// ddp's bytes per sample over this strategy's.
    pub bytes_fewer_than_ddp: Option<f64>,
    /// Final held-out loss of the mean replica.
    pub final_loss: f32,
    /// Held-out loss at the number of samples ddp processed, relative to ddp's (0.01 = 1% worse).
    pub loss_vs_ddp_at_equal_samples: Option<f64>,
    /// Mean staleness of applied updates.
    pub mean_staleness: f64,
    /// Largest replica distance seen.
    pub consensus_distance_max: f32,
}

/// A comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Scenario name.
    pub scenario: String,
    /// Target loss.
    pub target_loss: f32,
    /// Seeds per strategy.
    pub seeds: u32,
    /// The ideal time to target (needs ddp in the comparison).
    pub ideal_time_s: Option<f64>,
    /// Samples per virtual second the swarm's hardware can process.
    pub aggregate_samples_per_s: f64,
    /// ddp's learning-rate sweep: (rate, time to target, final loss) on seed 0.
    pub ddp_sweep: Vec<(f32, Option<f64>, f32)>,
    /// The rate ddp ran with (the sweep's best).
    pub ddp_lr: Option<f32>,
    /// One row per strategy.
    pub rows: Vec<StrategyRow>,
    /// Every run.
    pub runs: Vec<RunSummary>,
}

/// Extra rates ddp's sweep may add above its top rate.
const MAX_SWEEP_EXTENSIONS: usize = 2;

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Runs `strategies` × `seeds` on `scenario`. ddp first sweeps its
/// learning rate on seed 0 and keeps the best (fastest to target, else
/// lowest final loss), so it is never compared untuned.
pub fn compare(
    scenario: &Scenario,
    strategies: &[Strategy],
    seeds: u32,
    progress: bool,
) -> Result<(Comparison, Vec<RunOutput>), CompareError> {
    let mut outputs = Vec::new();
    let mut sweep = Vec::new();
    let mut ddp_lr = None;
    for &strategy in strategies {
        let mut first_seed = 0;
        if strategy == Strategy::Ddp {
            let mut best: Option<(f32, RunOutput)> = None;
            let mut rates = scenario.ddp_sweep();
            let max_rates = rates.len() + MAX_SWEEP_EXTENSIONS;
            let mut i = 0;
            while i < rates.len() {
                let lr = rates[i];
                i += 1;
                if progress {
                    eprintln!("running ddp (lr {lr}) seed 0 on {}", scenario.name);
                }
                let o = run(scenario, &RunOptions { strategy, seed: 0, progress, ddp_lr: Some(lr) })?;
                let final_loss = o.series.last().map_or(f32::NAN, |s| s.loss);
                sweep.push((lr, o.time_to_target_s, final_loss));
                let better = match &best {
                    None => true,
                    Some((_, b)) => match (o.time_to_target_s, b.time_to_target_s) {
                        (Some(a), Some(c)) => a < c,
                        (Some(_), None) => true,
                        (None, Some(_)) => false,
                        (None, None) => final_loss < b.series.last().map_or(f32::NAN, |s| s.loss),
                    },
                };
                if better {
                    best = Some((lr, o));
                }
                // A best at the default sweep's top rate may not be ddp's
                // best: go on up (x3, at most MAX_SWEEP_EXTENSIONS times)
                // until a rate loses. A scenario's own list is swept as given.
                let top = rates.iter().copied().fold(f32::MIN, f32::max);
                let extend = scenario.ddp_lrs.is_empty() && i == rates.len() && rates.len() < max_rates;
                if extend && best.as_ref().is_some_and(|(b, _)| *b == top) {
                    rates.push(top * 3.0);
                }
            }
            let (lr, o) = best.expect("the sweep has at least one rate");
            ddp_lr = Some(lr);
            outputs.push(o);
            first_seed = 1;
        }
        for seed in first_seed..seeds as u64 {
            if progress {
                eprintln!("running {} seed {seed} on {}", strategy.name(), scenario.name);
            }
            outputs.push(run(scenario, &RunOptions { strategy, seed, progress, ddp_lr })?);
        }
    }
    let mut c = summarize(scenario, strategies, seeds, &outputs);
    c.ddp_sweep = sweep;
    c.ddp_lr = ddp_lr;
    Ok((c, outputs))
}

/// Builds the comparison from finished runs.
pub fn summarize(scenario: &Scenario, strategies: &[Strategy], seeds: u32, outputs: &[RunOutput]) -> Comparison {
    let runs: Vec<RunSummary> = outputs.iter().map(|o| RunSummary::new(scenario, o)).collect();
    let of = |s: Strategy| runs.iter().zip(outputs).filter(move |(r, _)| r.strategy == s.name());
    let ddp_samples = mean(of(Strategy::Ddp).filter_map(|(r, _)| r.samples_to_target.map(|v| v as f64)));
    let ddp_time = mean(of(Strategy::Ddp).filter_map(|(r, _)| r.time_to_target_s));
    let ddp_bytes = mean(of(Strategy::Ddp).map(|(r, _)| r.bytes_per_sample));
    let rate_runs = if ddp_samples.is_some() { of(Strategy::Ddp).collect::<Vec<_>>() } else { Vec::new() };
    let aggregate_samples_per_s =
        mean(rate_runs.iter().map(|(r, _)| r.aggregate_work / r.end_s.max(1e-9))).unwrap_or_else(|| {
            let speeds: f64 = crate::speed::profiles(scenario, scenario.seed).iter().map(|p| p.base).sum();
            speeds
        }) / scenario.step_cost_s
            * scenario.training.batch_size as f64;
    let ideal_time_s = ddp_samples.map(|s| s / aggregate_samples_per_s);
    let rows = strategies
        .iter()
        .map(|&s| {
            let these: Vec<(&RunSummary, &RunOutput)> = of(s).collect();
            let time = mean(these.iter().filter_map(|(r, _)| r.time_to_target_s));
            let bytes = mean(these.iter().map(|(r, _)| r.bytes_per_sample)).unwrap_or(0.0);
            let loss_vs = mean(these.iter().filter_map(|(r, o)| {
                let (_, ddp_out) = of(Strategy::Ddp).find(|(d, _)| d.seed == r.seed)?;
                let samples = ddp_out.series.last()?.samples.min(o.series.last()?.samples);
                let mine = loss_at_samples(&o.series, samples)? as f64;
                let theirs = loss_at_samples(&ddp_out.series, samples)? as f64;
                Some(mine / theirs - 1.0)
            }));
            StrategyRow {
                strategy: s.name().into(),
                reached: these.iter().filter(|(r, _)| r.time_to_target_s.is_some()).count() as u32,
                seeds: these.len() as u32,
                time_to_target_s: time,
                vs_ddp: time.zip(ddp_time).map(|(a, b)| a / b),
                vs_ideal: time.zip(ideal_time_s).map(|(a, b)| a / b),
                utilisation: mean(these.iter().map(|(r, _)| r.utilisation_mean)).unwrap_or(0.0),
                idle_share: crate::report::idle_share(these.iter().flat_map(|(_, o)| o.nodes.iter())),
                bytes_per_sample: bytes,
                bytes_fewer_than_ddp: ddp_bytes.filter(|_| bytes > 0.0).map(|d| d / bytes),
                final_loss: mean(these.iter().map(|(r, _)| r.final_loss as f64)).unwrap_or(f64::NAN) as f32,
                loss_vs_ddp_at_equal_samples: loss_vs,
                mean_staleness: mean(these.iter().map(|(r, _)| r.mean_staleness)).unwrap_or(0.0),
                consensus_distance_max: these.iter().map(|(r, _)| r.consensus_distance_max).fold(0.0, f32::max),
            }
        })
        .collect();
    Comparison {
        scenario: scenario.name.clone(),
        target_loss: scenario.target_loss,
        seeds,
        ideal_time_s,
        aggregate_samples_per_s,
        ddp_sweep: Vec::new(),
        ddp_lr: None,
        rows,
        runs,
    }
}

fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// The comparison as a text table.
pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scenario {} | target loss {} | seeds {} | ideal time to target {}",
        c.scenario,
        c.target_loss,
        c.seeds,
        secs(c.ideal_time_s)
    );
    if let Some(lr) = c.ddp_lr {
        let tried: Vec<String> = c.ddp_sweep.iter().map(|(lr, t, _)| format!("{lr} ({})", secs(*t))).collect();
        let _ = writeln!(out, "ddp learning rate {lr}, best of {}", tried.join(", "));
    }
    let _ = writeln!(
        out,
        "{:<20} {:>8} {:>12} {:>8} {:>8} {:>7} {:>12} {:>10} {:>10} {:>12} {:>9}",
        "strategy",
        "reached",
        "to target",
        "x ddp",
        "x ideal",
        "util",
        "bytes/sample",
        "x fewer",
        "final loss",
        "loss@ddp-S",
        "staleness"
    );
    for r in &c.rows {
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>12} {:>8} {:>8} {:>6.1}% {:>12.1} {:>10} {:>10.4} {:>12} {:>9.2}",
            r.strategy,
            format!("{}/{}", r.reached, r.seeds),
            secs(r.time_to_target_s),
            ratio(r.vs_ddp),
            ratio(r.vs_ideal),
            100.0 * r.utilisation,
            r.bytes_per_sample,
            ratio(r.bytes_fewer_than_ddp),
            r.final_loss,
            r.loss_vs_ddp_at_equal_samples.map_or_else(|| "-".into(), |v| format!("{:+.1}%", 100.0 * v)),
            r.mean_staleness,
        );
    }
    for r in c.rows.iter().filter(|r| !r.idle_share.is_empty()) {
        let _ = writeln!(out, "{} idle, share of up time: {}", r.strategy, idle_text(&r.idle_share));
    }
    out
}
