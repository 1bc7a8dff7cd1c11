//! Reports: the JSON summary of a run, CSV time series, and the table.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::Write,
    path::{Path, PathBuf},
};

use ragtag_protocol::engine::IdleReason;
use serde::{Deserialize, Serialize};

use crate::{
    measure::Sample,
    scenario::Scenario,
    sim::{NodeOutput, RunOutput},
};

/// Why the CSV reports could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A report file could not be created.
    #[error("creating {path}")]
    Create {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing or flushing a report file failed.
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// A node's line in a summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    /// Its accounting.
    #[serde(flatten)]
    pub node: NodeOutput,
    /// Busy time over up time.
    pub utilisation: f64,
    /// Updates per virtual second of up time.
    pub update_rate: f64,
}

/// Everything one run reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Scenario name.
    pub scenario: String,
    /// Strategy.
    pub strategy: String,
    /// Seed offset.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// The target held-out loss.
    pub target_loss: f32,
    /// Best achievable loss of the data, when known.
    pub floor: Option<f32>,
    /// Virtual time to the target (interpolated between samples).
    pub time_to_target_s: Option<f64>,
    /// Samples processed by the swarm when the target was reached.
    pub samples_to_target: Option<u64>,
    /// Updates published when the target was reached.
    pub updates_to_target: Option<u64>,
    /// Held-out loss of the mean replica at the end.
    pub final_loss: f32,
    /// Held-out accuracy of the mean replica at the end.
    pub final_accuracy: f32,
    /// Best and worst held-out loss of a single replica at the end.
    pub replica_loss_range: (f32, f32),
    /// Virtual time at the end.
    pub end_s: f64,
    /// Samples processed in all.
    pub samples_total: u64,
    /// Updates published in all.
    pub updates_total: u64,
    /// Bytes sent by all nodes.
    pub bytes_total: u64,
    /// Mean bytes sent per node.
    pub bytes_per_node_mean: f64,
    /// Bytes sent per sample processed.
    pub bytes_per_sample: f64,
    /// Bytes a node sent and received per round it trained, mean over the
    /// nodes that trained (absent in reports written before).
    #[serde(default)]
    pub node_bytes_per_round_mean: f64,
    /// The same, for the node with the most.
    #[serde(default)]
    pub node_bytes_per_round_max: f64,
    /// Groups closed without a quorum sum (aggregated dissemination).
    #[serde(default)]
    pub aggregates_missed: u64,
    /// Mean utilisation (busy / up) over nodes.
    pub utilisation_mean: f64,
    /// Lowest node utilisation.
    pub utilisation_min: f64,
    /// Mean share of up time each idle reason took, over the nodes that
    /// measured it (empty: not measured).
    #[serde(default)]
    pub idle_share: BTreeMap<String, f64>,
    /// Applied updates by staleness (last bucket: 7+), all replicas.
    pub staleness_histogram: [u64; 8],
    /// Mean staleness.
    pub mean_staleness: f64,
    /// Largest relative replica distance at the last sample.
    pub consensus_distance_final: f32,
    /// Largest relative replica distance at any sample.
    pub consensus_distance_max: f32,
    /// Dropped updates by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Anchor averages by anti-entropy.
    pub anchors_averaged: u64,
    /// Peers' anchors not used, by reason.
    #[serde(default)]
    pub anchors_refused: BTreeMap<String, u64>,
    /// Inner learning-rate changes by reason, over all replicas.
    #[serde(default)]
    pub inner_lr_changes: BTreeMap<String, u64>,
    /// The lowest inner learning-rate scale any replica reached (none: the
    /// rate never changed).
    #[serde(default)]
    pub inner_lr_scale_min: Option<f32>,
    /// Messages lost in the network.
    pub messages_lost: u64,
    /// Compute available over the run (speed-seconds, straggler episodes removed).
    pub aggregate_work: f64,
    /// Events processed.
    pub events: u64,
    /// Per node.
    pub per_node: Vec<NodeSummary>,
}

/// Linear interpolation of a counter at time `t` over the samples.
pub fn counter_at(series: &[Sample], t: f64, f: impl Fn(&Sample) -> u64) -> Option<u64> {
    let after = series.iter().position(|s| s.t >= t)?;
    if after == 0 {
        return Some(f(&series[0]));
    }
    let (a, b) = (&series[after - 1], &series[after]);
    let w = if b.t > a.t { (t - a.t) / (b.t - a.t) } else { 1.0 };
    Some((f(a) as f64 + w * (f(b) as f64 - f(a) as f64)).round() as u64)
}

/// Held-out loss when the swarm had processed `samples`, interpolated.
pub fn loss_at_samples(series: &[Sample], samples: u64) -> Option<f32> {
    let after = series.iter().position(|s| s.samples >= samples)?;
    if after == 0 {
        return Some(series[0].loss);
    }
    let (a, b) = (&series[after - 1], &series[after]);
    let w = if b.samples > a.samples { (samples - a.samples) as f32 / (b.samples - a.samples) as f32 } else { 1.0 };
    Some(a.loss + w * (b.loss - a.loss))
}

impl RunSummary {
    /// Summarises a run.
    pub fn new(scenario: &Scenario, out: &RunOutput) -> Self {
        let last = out.series.last();
        let samples_total: u64 = out.nodes.iter().map(|n| n.samples).sum();
        let bytes_total: u64 = out.nodes.iter().map(|n| n.bytes_sent).sum();
        let per_node: Vec<NodeSummary> = out
            .nodes
            .iter()
            .map(|n| NodeSummary {
                node: n.clone(),
                utilisation: n.utilisation(),
                update_rate: if n.alive_s > 0.0 { n.updates as f64 / n.alive_s } else { 0.0 },
            })
            .collect();
        let alive: Vec<&NodeSummary> = per_node.iter().filter(|n| n.node.alive_s > 0.0).collect();
        let per_round: Vec<f64> = out
            .nodes
            .iter()
            .filter(|n| n.updates > 0)
            .map(|n| (n.bytes_sent + n.bytes_received) as f64 / n.updates as f64)
            .collect();
        let range = out.replica_losses.iter().fold((f32::MAX, f32::MIN), |(lo, hi), l| (lo.min(*l), hi.max(*l)));
        Self {
            scenario: scenario.name.clone(),
            strategy: out.strategy.name().into(),
            seed: out.seed,
            nodes: out.nodes.len(),
            target_loss: scenario.target_loss,
            floor: out.floor,
            time_to_target_s: out.time_to_target_s,
            samples_to_target: out.time_to_target_s.and_then(|t| counter_at(&out.series, t, |s| s.samples)),
            updates_to_target: out.time_to_target_s.and_then(|t| counter_at(&out.series, t, |s| s.updates)),
            final_loss: last.map_or(f32::NAN, |s| s.loss),
            final_accuracy: last.map_or(f32::NAN, |s| s.accuracy),
            replica_loss_range: if out.replica_losses.is_empty() { (f32::NAN, f32::NAN) } else { range },
            end_s: out.end_s,
            samples_total,
            updates_total: out.nodes.iter().map(|n| n.updates).sum(),
            bytes_total,
            bytes_per_node_mean: bytes_total as f64 / out.nodes.len().max(1) as f64,
            bytes_per_sample: bytes_total as f64 / samples_total.max(1) as f64,
            node_bytes_per_round_mean: per_round.iter().sum::<f64>() / per_round.len().max(1) as f64,
            node_bytes_per_round_max: per_round.iter().copied().fold(0.0, f64::max),
            aggregates_missed: out.tally.aggregates_missed,
            utilisation_mean: alive.iter().map(|n| n.utilisation).sum::<f64>() / alive.len().max(1) as f64,
            utilisation_min: alive.iter().map(|n| n.utilisation).fold(1.0, f64::min),
            idle_share: idle_share(alive.iter().map(|n| &n.node)),
            staleness_histogram: out.tally.staleness_histogram,
            mean_staleness: out.tally.mean_staleness(),
            // NaN where nothing was measured (f32::max skips NaN).
            consensus_distance_final: last.map_or(f32::NAN, |s| s.consensus_max),
            consensus_distance_max: out.series.iter().map(|s| s.consensus_max).fold(f32::NAN, f32::max),
            dropped: out.tally.dropped.clone(),
            anchors_averaged: out.tally.anchors_averaged,
            anchors_refused: out.tally.anchors_refused.clone(),
            inner_lr_changes: out.tally.inner_lr_changes.clone(),
            inner_lr_scale_min: out.tally.inner_lr_scale_min,
            messages_lost: out.messages_lost,
            aggregate_work: out.aggregate_work,
            events: out.events,
            per_node,
        }
    }
}

/// The mean share of up time per idle reason over `nodes` that measured
/// their idle time.
pub fn idle_share<'a>(nodes: impl Iterator<Item = &'a NodeOutput>) -> BTreeMap<String, f64> {
    let mut sum: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for n in nodes.filter(|n| n.alive_s > 0.0) {
        for (why, s) in &n.idle_s {
            let e = sum.entry(why.clone()).or_insert((0.0, 0));
            e.0 += s / n.alive_s;
            e.1 += 1;
        }
    }
    sum.into_iter().map(|(why, (s, n))| (why, s / n as f64)).collect()
}

/// Idle shares as text, largest first, leaving out what took nothing.
pub fn idle_text(share: &BTreeMap<String, f64>) -> String {
    let mut v: Vec<(&String, &f64)> = share.iter().filter(|(_, s)| **s > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    let parts: Vec<String> = v.iter().map(|(why, s)| format!("{why} {:.1}%", 100.0 * *s)).collect();
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

fn create(dir: &Path, name: &str) -> Result<std::io::BufWriter<std::fs::File>, ReportError> {
    let path = dir.join(name);
    match std::fs::File::create(&path) {
        Ok(f) => Ok(std::io::BufWriter::new(f)),
        Err(source) => Err(ReportError::Create { path, source }),
    }
}

/// Writes the CSV files of a set of runs into `dir`. The per-layer and
/// per-group files are written only when some run measured them (real
/// processes report no layers): an absent file says "not measured", where
/// a file of headers would read as "nothing happened".
pub fn write_csv(dir: &Path, runs: &[RunOutput]) -> Result<(), ReportError> {
    let mut ts = create(dir, "timeseries.csv")?;
    writeln!(ts, "strategy,seed,t,loss,accuracy,samples,updates,consensus_max,consensus_mean,live,bytes")?;
    let mut nodes = create(dir, "nodes.csv")?;
    writeln!(
        nodes,
        "strategy,seed,node,speed,group,utilisation,busy_s,alive_s,bytes_sent,updates,update_rate,samples,{}",
        IdleReason::ALL.map(|r| format!("idle_{}_s", r.name())).join(",")
    )?;
    let layered = runs.iter().any(|r| !r.layers.samples.is_empty() || !r.layers.group_samples.is_empty());
    for r in runs {
        write_series(&mut ts, &mut nodes, r)?;
    }
    for mut w in [ts, nodes] {
        w.flush()?;
    }
    if layered {
        write_layers(dir, runs)?;
    }
    Ok(())
}

type Csv = std::io::BufWriter<std::fs::File>;

fn write_series(ts: &mut Csv, nodes: &mut Csv, r: &RunOutput) -> Result<(), ReportError> {
    let s = r.strategy.name();
    for x in &r.series {
        writeln!(
            ts,
            "{s},{},{:.3},{:.6},{:.6},{},{},{:.3e},{:.3e},{},{}",
            r.seed, x.t, x.loss, x.accuracy, x.samples, x.updates, x.consensus_max, x.consensus_mean, x.live, x.bytes
        )?;
    }
    for n in &r.nodes {
        let rate = if n.alive_s > 0.0 { n.updates as f64 / n.alive_s } else { 0.0 };
        // Blank where the idle time was not measured.
        let idle: Vec<String> = IdleReason::ALL
            .iter()
            .map(|r| n.idle_s.get(r.name()).map_or_else(String::new, |v| format!("{v:.3}")))
            .collect();
        writeln!(
            nodes,
            "{s},{},{},{},{},{:.5},{:.3},{:.3},{},{},{:.4},{},{}",
            r.seed,
            n.index,
            n.speed,
            n.group,
            n.utilisation(),
            n.busy_s,
            n.alive_s,
            n.bytes_sent,
            n.updates,
            rate,
            n.samples,
            idle.join(",")
        )?;
    }
    Ok(())
}

fn write_layers(dir: &Path, runs: &[RunOutput]) -> Result<(), ReportError> {
    let mut layers = create(dir, "layers.csv")?;
    writeln!(
        layers,
        "strategy,seed,t,layer,cosine_fast_slow,norm_fast,norm_slow,cosine_fast_all,cosine_slow_all,\
         step_norm_fast,step_norm_slow,drift_fast,drift_slow"
    )?;
    let mut groups = create(dir, "group_train_loss.csv")?;
    writeln!(groups, "strategy,seed,t,train_loss_fast,train_loss_slow")?;
    let mut by_node = create(dir, "layer_norms_by_node.csv")?;
    writeln!(by_node, "strategy,seed,node,speed,layer,mean_update_norm,updates")?;
    let mut reps = create(dir, "representations.csv")?;
    writeln!(reps, "strategy,seed,t,layer,cka_fast,cka_slow")?;
    for r in runs {
        let s = r.strategy.name();
        for l in &r.layers.samples {
            writeln!(
                layers,
                "{s},{},{:.3},{},{:.5},{:.4e},{:.4e},{:.5},{:.5},{:.4e},{:.4e},{:.4e},{:.4e}",
                r.seed,
                l.t,
                l.layer,
                l.cosine_fast_slow,
                l.norm_fast,
                l.norm_slow,
                l.cosine_fast_all,
                l.cosine_slow_all,
                l.step_norm_fast,
                l.step_norm_slow,
                l.drift_fast,
                l.drift_slow
            )?;
        }
        for x in &r.layers.representation_samples {
            writeln!(reps, "{s},{},{:.3},{},{:.6},{:.6}", r.seed, x.t, x.layer, x.cka_fast, x.cka_slow)?;
        }
        for g in &r.layers.group_samples {
            writeln!(groups, "{s},{},{:.3},{:.6},{:.6}", r.seed, g.t, g.train_loss_fast, g.train_loss_slow)?;
        }
        for (i, (norms, count)) in r.layers.per_node.iter().enumerate() {
            for (layer, sum) in r.layers.names().iter().zip(norms) {
                let mean = if *count > 0 { sum / *count as f64 } else { 0.0 };
                writeln!(by_node, "{s},{},{i},{},{layer},{mean:.4e},{count}", r.seed, r.nodes[i].speed)?;
            }
        }
    }
    for mut w in [layers, by_node, groups] {
        w.flush()?;
    }
    Ok(())
}

/// Formats a duration or "-".
pub fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "not reached".into(), |s| format!("{s:.1}s"))
}

/// One line per run, for `run`.
pub fn run_line(s: &RunSummary) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{} on {}: target {} in {}, final loss {:.4} (replicas {:.4}..{:.4}), utilisation {:.1}% (min {:.1}%), \
         {:.1} bytes/sample, {:.0} bytes per node-round (max {:.0}), mean staleness {:.2}, consensus distance {:.2e}",
        s.strategy,
        s.scenario,
        s.target_loss,
        secs(s.time_to_target_s),
        s.final_loss,
        s.replica_loss_range.0,
        s.replica_loss_range.1,
        100.0 * s.utilisation_mean,
        100.0 * s.utilisation_min,
        s.bytes_per_sample,
        s.node_bytes_per_round_mean,
        s.node_bytes_per_round_max,
        s.mean_staleness,
        s.consensus_distance_final
    );
    if !s.idle_share.is_empty() {
        let _ = write!(out, ", idle {}", idle_text(&s.idle_share));
    }
    if let Some(scale) = s.inner_lr_scale_min {
        let changes: Vec<String> = s.inner_lr_changes.iter().map(|(why, n)| format!("{n} {why}")).collect();
        let _ = write!(out, ", inner lr down to {scale} x ({} over all replicas)", changes.join(", "));
    }
    out
}
