//! Real mode: the same scenario with real `ragtag` processes (and a
//! bootstrap) on loopback, or each in its own network namespace shaped by
//! tc netem. Each process emulates its node's step cost (`--step-time`,
//! the scenario's `step_cost_s / speed`); each node's round reports
//! and final status become the same report and plots as virtual mode, and
//! with `trace_updates` the same per-layer measurements (`real/trace.rs`).

mod trace;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use ragtag_protocol::engine::{Schedule, Strategy};

use crate::{
    measure::{Sample, Tally},
    netns::{Lab, NetnsError},
    scenario::Scenario,
    sim::{NodeOutput, RunOutput},
    speed,
};

/// Why a real run could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RealError {
    /// Every node exited without reporting a round.
    #[error("no node reported a round: see the nodes' stderr.log under {0}")]
    NoReports(PathBuf),
    /// Our own executable's path is unknown.
    #[error(transparent)]
    CurrentExe(std::io::Error),
    /// Our executable's path has no parent directory.
    #[error("executable directory")]
    ExeDir,
    /// A workspace binary is not beside ours.
    #[error("{path} not found next to ragtag-simnet: build the workspace binaries first (cargo build --release)")]
    MissingBinary {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A directory for the run's files could not be created.
    #[error(transparent)]
    CreateDir(std::io::Error),
    /// A process's stderr.log could not be created.
    #[error(transparent)]
    StderrLog(std::io::Error),
    /// A process could not be started.
    #[error("starting {bin}")]
    Start {
        /// The binary.
        bin: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A started process has no stdout pipe.
    #[error("stdout")]
    NoStdout,
    /// The system clock is before 1970.
    #[error(transparent)]
    Clock(#[from] std::time::SystemTimeError),
    /// The manifest could not be serialised.
    #[error(transparent)]
    ManifestToml(#[from] toml::ser::Error),
    /// The manifest file could not be written.
    #[error(transparent)]
    WriteManifest(std::io::Error),
    /// The network namespaces could not be set up (shown as the command's
    /// own message, which already names its cause).
    #[error("{0}")]
    Netns(NetnsError),
    /// The bootstrap did not print its address in time.
    #[error("the bootstrap printed no address")]
    NoBootstrapAddress(#[source] mpsc::RecvTimeoutError),
    /// The data file's absolute path could not be formed.
    #[error(transparent)]
    DataPath(std::io::Error),
}

/// How a real run is set up.
#[derive(Debug, Clone)]
pub struct RealOptions {
    /// The strategy.
    pub strategy: Strategy,
    /// How long the nodes run.
    pub duration_s: f64,
    /// tc netem shaping for every node (runs each node in a namespace).
    pub netem: Option<String>,
    /// Where node state and reports go.
    pub out: PathBuf,
    /// A fixed tick period (tick mode); `None` keeps the scenario's, derived
    /// from the step cost every process emulates.
    pub tick_ms: Option<u32>,
    /// Have every node trace its rounds (`ragtag run --trace-updates`), so
    /// the run has the per-layer measurements of the study.
    pub trace_updates: bool,
}

struct Launched {
    child: Child,
    lines: mpsc::Receiver<String>,
    offset_s: f64,
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sibling(name: &str) -> Result<PathBuf, RealError> {
    let exe = std::env::current_exe().map_err(RealError::CurrentExe)?;
    let path = exe.parent().ok_or(RealError::ExeDir)?.join(name);
    if !path.exists() {
        return Err(RealError::MissingBinary { path });
    }
    Ok(path)
}

fn launch(prefix: &[String], bin: &Path, args: &[String], dir: &Path, offset_s: f64) -> Result<Launched, RealError> {
    std::fs::create_dir_all(dir).map_err(RealError::CreateDir)?;
    let (program, rest): (String, Vec<String>) = match prefix.split_first() {
        Some((p, r)) => {
            (p.clone(), r.iter().cloned().chain([bin.display().to_string()]).chain(args.iter().cloned()).collect())
        }
        None => (bin.display().to_string(), args.to_vec()),
    };
    let mut child = Command::new(program)
        .args(rest)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env("RAYON_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(dir.join("stderr.log")).map_err(RealError::StderrLog)?))
        .spawn()
        .map_err(|source| RealError::Start { bin: bin.to_path_buf(), source })?;
    let (tx, rx) = mpsc::sync_channel(1 << 16);
    let out = child.stdout.take().ok_or(RealError::NoStdout)?;
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(Launched { child, lines: rx, offset_s })
}

/// One node's reports.
#[derive(Debug, Default)]
struct NodeReport {
    rounds: Vec<RoundReport>,
    exit: Option<serde_json::Value>,
    /// Its traced rounds (`trace_updates`): (t, trace).
    traces: Vec<(f64, ragtag_models::update_trace::UpdateTrace)>,
}

/// What a node's `round` line says, as far as the report uses it.
#[derive(Debug)]
struct RoundReport {
    /// Seconds since the first process started.
    t: f64,
    /// Its last held-out loss, if it evaluated yet.
    eval: Option<f32>,
    /// Samples it trained on so far.
    samples: u64,
    /// Bytes it sent so far (its own counter).
    bytes_out: u64,
    /// The first values of its anchor sketch (the same positions on every
    /// replica).
    sketch: Vec<f32>,
}

/// Runs the scenario's nodes as real processes.
pub fn run_real(scenario: &Scenario, opts: &RealOptions) -> Result<RunOutput, RealError> {
    let ragtag = sibling("ragtag")?;
    let bootstrap_bin = sibling("ragtag-bootstrap")?;
    let profiles = speed::profiles(scenario, scenario.seed);
    let n = profiles.len();
    let mut manifest = scenario.manifest(opts.strategy, None);
    manifest.start_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    if let (Schedule::Tick { period_ms, .. }, Some(tick)) = (&mut manifest.engine.schedule, opts.tick_ms) {
        *period_ms = Some(tick);
    }
    std::fs::create_dir_all(&opts.out).map_err(RealError::CreateDir)?;
    // Every process runs in its own directory: paths it is given must not
    // be relative to ours.
    let out = std::path::absolute(&opts.out).map_err(RealError::CreateDir)?;
    // Every run is a new run (its own start time, so its own run id): a
    // node state left by an earlier run in the same place would be refused
    // by the node ("checkpoint of run ..."), so it goes.
    for i in 0..n {
        let state = out.join(format!("node{i}")).join("state");
        if state.exists() {
            std::fs::remove_dir_all(&state).map_err(RealError::CreateDir)?;
        }
    }
    let manifest_path = out.join("manifest.toml");
    std::fs::write(&manifest_path, toml::to_string_pretty(&manifest)?).map_err(RealError::WriteManifest)?;
    let lab = match &opts.netem {
        Some(spec) => {
            let lab = Lab::new("real", n + 1, 9).map_err(RealError::Netns)?;
            for i in 0..=n {
                lab.netem(i, spec).map_err(RealError::Netns)?;
            }
            Some(lab)
        }
        None => None,
    };
    let prefix = |i: usize| lab.as_ref().map_or_else(Vec::new, |l| l.wrap(i));
    let listen = |i: usize| {
        lab.as_ref().map_or_else(|| "/ip4/127.0.0.1/tcp/0".to_string(), |l| format!("/ip4/{}/tcp/4{i:03}", l.ip(i, 9)))
    };
    let started = Instant::now();
    let bs_dir = out.join("bootstrap");
    let bs = launch(
        &prefix(0),
        &bootstrap_bin,
        &["--key".into(), bs_dir.join("key").display().to_string(), "--listen".into(), listen(0)],
        &bs_dir,
        0.0,
    )?;
    let bs_addr = bs.lines.recv_timeout(Duration::from_secs(30)).map_err(RealError::NoBootstrapAddress)?;
    let mut nodes = Vec::new();
    for (i, p) in profiles.iter().enumerate() {
        let mut args: Vec<String> = [
            "run",
            "--manifest",
            manifest_path.to_str().unwrap_or_default(),
            "--bootstrap",
            &bs_addr,
            "--listen",
            &listen(i + 1),
            "--json",
            "--duration",
            &opts.duration_s.to_string(),
            // Every process emulates its node's step cost, as in virtual time.
            "--step-time",
            &format!("{:.6}", scenario.step_cost_s / p.base),
            "--state",
            out.join(format!("node{i}")).join("state").to_str().unwrap_or_default(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if opts.trace_updates {
            args.push("--trace-updates".into());
        }
        if let Some(file) = &scenario.data_file {
            let file = std::path::absolute(file).map_err(RealError::DataPath)?;
            args.extend(["--data".to_string(), file.display().to_string()]);
        }
        let offset = started.elapsed().as_secs_f64();
        nodes.push(launch(&prefix(i + 1), &ragtag, &args, &out.join(format!("node{i}")), offset)?);
    }
    // Collect until every node has exited (or a generous deadline).
    let deadline = Instant::now() + Duration::from_secs_f64(opts.duration_s + 120.0);
    let mut reports: Vec<NodeReport> = (0..n).map(|_| NodeReport::default()).collect();
    // A process whose output closed (it exited, maybe without its exit
    // report) is not waited for.
    let mut closed = vec![false; n];
    while reports.iter().zip(&closed).any(|(r, c)| r.exit.is_none() && !c) && Instant::now() < deadline {
        for ((node, report), closed) in nodes.iter().zip(reports.iter_mut()).zip(closed.iter_mut()) {
            loop {
                let line = match node.lines.try_recv() {
                    Ok(line) => line,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        *closed = true;
                        break;
                    }
                };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
                if v["event"] == "exit" {
                    report.exit = Some(v);
                } else if v["event"] == "round" {
                    let sketch = v["sketch"]
                        .as_array()
                        .map_or_else(Vec::new, |a| a.iter().filter_map(|x| x.as_f64()).map(|x| x as f32).collect());
                    // A line without the counters is not taken as zeros:
                    // it is left out (every node of this build prints them).
                    let (Some(t), Some(samples), Some(bytes_out)) =
                        (v["t"].as_f64(), v["samples"].as_u64(), v["bytes_out"].as_u64())
                    else {
                        tracing::warn!("a round line without t, samples or bytes_out, left out: {line}");
                        continue;
                    };
                    if !v["trace"].is_null() {
                        match serde_json::from_value(v["trace"].clone()) {
                            Ok(trace) => report.traces.push((node.offset_s + t, trace)),
                            Err(e) => tracing::warn!("a round's trace does not parse, left out: {e}"),
                        }
                    }
                    report.rounds.push(RoundReport {
                        t: node.offset_s + t,
                        eval: v["eval_loss"].as_f64().map(|l| l as f32),
                        samples,
                        bytes_out,
                        sketch,
                    });
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(nodes);
    drop(bs);
    if reports.iter().all(|r| r.rounds.is_empty()) {
        return Err(RealError::NoReports(out));
    }
    Ok(to_output(scenario, opts, &profiles, &reports))
}

/// The largest and the mean relative distance of the replicas' anchor
/// sketches to their mean: the consensus distance virtual mode measures on
/// whole anchors, estimated from the strided values each node prints. NaN
/// when the sketches do not compare (none, or of different lengths).
fn sketch_consensus(sketches: &[&[f32]]) -> (f32, f32) {
    let Some(len) = sketches.first().map(|s| s.len()) else { return (f32::NAN, f32::NAN) };
    if len == 0 || sketches.iter().any(|s| s.len() != len) {
        return (f32::NAN, f32::NAN);
    }
    let mean: Vec<f32> = (0..len).map(|i| sketches.iter().map(|s| s[i]).sum::<f32>() / sketches.len() as f32).collect();
    let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    let d: Vec<f32> = sketches
        .iter()
        .map(|s| s.iter().zip(&mean).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt() / norm)
        .collect();
    (d.iter().copied().fold(0.0, f32::max), d.iter().sum::<f32>() / d.len() as f32)
}

/// Builds the virtual mode's report from real nodes' reports.
fn to_output(
    scenario: &Scenario,
    opts: &RealOptions,
    profiles: &[speed::SpeedProfile],
    reports: &[NodeReport],
) -> RunOutput {
    let end = reports.iter().flat_map(|r| r.rounds.last().map(|x| x.t)).fold(0.0, f64::max);
    let mut series = Vec::new();
    let mut t = 0.0;
    let mut target_at = None;
    while t <= end + scenario.sample_every_s {
        let latest: Vec<&RoundReport> = reports.iter().filter_map(|r| r.rounds.iter().rfind(|x| x.t <= t)).collect();
        let losses: Vec<f32> = latest.iter().filter_map(|x| x.eval).collect();
        if !losses.is_empty() {
            let loss = losses.iter().sum::<f32>() / losses.len() as f32;
            if target_at.is_none() && loss <= scenario.target_loss {
                target_at = Some(t);
            }
            let sketches: Vec<&[f32]> = latest.iter().map(|x| x.sketch.as_slice()).collect();
            let (consensus_max, consensus_mean) = sketch_consensus(&sketches);
            series.push(Sample {
                t,
                loss,
                // Rounds report the held-out loss only.
                accuracy: f32::NAN,
                samples: latest.iter().map(|x| x.samples).sum(),
                updates: reports.iter().map(|r| r.rounds.iter().filter(|x| x.t <= t).count() as u64).sum(),
                consensus_max,
                consensus_mean,
                live: latest.len() as u32,
                bytes: latest.iter().map(|x| x.bytes_out).sum(),
            });
        }
        t += scenario.sample_every_s;
    }
    let mut tally = Tally::default();
    let groups = crate::measure::groups(&profiles.iter().map(|p| p.base).collect::<Vec<_>>());
    let nodes: Vec<NodeOutput> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let status = r.exit.as_ref().map(|e| &e["status"]);
            // A node that left no exit report (it died) is described by its
            // last round line; what only the exit report has is NaN.
            let last = r.rounds.last();
            let get = |k: &str| status.and_then(|s| s[k].as_f64());
            if let Some(h) = status.and_then(|s| s["staleness_histogram"].as_array()) {
                for (b, v) in h.iter().enumerate().take(8) {
                    tally.staleness_histogram[b] += v.as_u64().unwrap_or(0);
                }
            }
            if let Some(rej) = status.and_then(|s| s["rejected"].as_object()) {
                for (k, v) in rej {
                    *tally.dropped.entry(k.clone()).or_insert(0) += v.as_u64().unwrap_or(0);
                }
            }
            let uptime = get("uptime_s").unwrap_or(f64::NAN);
            NodeOutput {
                index: i,
                speed: profiles[i].base,
                group: groups[i],
                busy_s: get("utilisation").unwrap_or(f64::NAN) * uptime,
                alive_s: uptime,
                bytes_sent: get("bytes_out").map_or_else(|| last.map_or(0, |x| x.bytes_out), |b| b as u64),
                bytes_received: get("bytes_in").map_or(0, |b| b as u64),
                updates: get("rounds").map_or(r.rounds.len() as u64, |n| n as u64),
                samples: get("samples").map_or_else(|| last.map_or(0, |x| x.samples), |n| n as u64),
                idle_s: status
                    .and_then(|s| s["idle_s"].as_object())
                    .map(|o| o.iter().filter_map(|(k, v)| Some((k.clone(), v.as_f64()?))).collect())
                    .unwrap_or_default(),
            }
        })
        .collect();
    let traced = reports
        .iter()
        .enumerate()
        .flat_map(|(node, r)| {
            r.traces.iter().map(move |(t, trace)| trace::TracedRound { t: *t, node, trace: trace.clone() })
        })
        .collect();
    RunOutput {
        strategy: opts.strategy,
        seed: 0,
        series,
        nodes,
        tally,
        layers: trace::recorder_of(traced, &groups, scenario.sample_every_s, end),
        replica_losses: reports.iter().filter_map(|r| r.rounds.iter().rev().find_map(|x| x.eval)).collect(),
        time_to_target_s: target_at,
        end_s: end,
        messages_lost: 0,
        floor: None,
        aggregate_work: profiles.iter().map(|p| p.base).sum::<f64>() * end,
        events: reports.iter().map(|r| r.rounds.len() as u64).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sketch_consensus_is_the_relative_distance_to_the_mean_sketch() {
        let (a, b) = ([1.0f32, 0.0], [1.0f32, 2.0]);
        // Mean (1, 1), norm sqrt 2; each sketch lies 1 from it.
        let (max, mean) = sketch_consensus(&[&a, &b]);
        assert!((max - 1.0 / 2f32.sqrt()).abs() < 1e-6 && (mean - max).abs() < 1e-6, "{max} {mean}");
        assert_eq!(sketch_consensus(&[&a, &a]), (0.0, 0.0));
        let (m, _) = sketch_consensus(&[&a, &[1.0]]);
        assert!(m.is_nan(), "sketches of different lengths do not compare");
        assert!(sketch_consensus(&[]).0.is_nan());
    }
}
