//! A real ragtag swarm against PyTorch DDP (torch.distributed, gloo, on
//! 127.0.0.1), the same model, data split and speeds, and a single-node
//! control beside them, on each task of the suite (`suite.rs`): four
//! `ragtag run` processes with the manifest that `ragtag swarm new` writes,
//! one `ragtag run` alone at the fastest speed, and
//! `tests/scripts/ddp_baseline.py` with one rank per node. Each rank and
//! node emulates its hardware with a per-step floor (`--step-time`), above
//! the step's compute, so both systems see the same speeds on this 2-core
//! machine, and both take the same batch per step. The target of each seed
//! is [`TARGET_MARGIN`] below the best the lone node reached in the budget,
//! so one node alone cannot reach it by construction. PyTorch is installed
//! by this benchmark into `target/ddp-venv` (about 5.6 GB), never by CI.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ragtag_node::manifest_file;
use ragtag_protocol::manifest::Manifest;

use super::{Figure, error::BenchError, suite::Task};
use crate::Proc;

/// Evaluations averaged for a curve's loss: one evaluation scatters, and
/// the system that evaluates more often would otherwise get more draws.
const SMOOTH: usize = 3;

/// A seed's target is this fraction of the lone node's best held-out loss.
pub const TARGET_MARGIN: f64 = 0.98;

/// Inner steps between two evaluations of a ragtag node (one gopals round);
/// DDP's rank 0 evaluates as often in wall time.
const STEPS_PER_EVAL: f64 = 50.0;

/// What one system did: held-out loss over wall time since launch.
#[derive(Debug, Clone, Default)]
pub struct Curve {
    /// (seconds, held-out loss, samples processed by all nodes).
    pub points: Vec<(f64, f64, u64)>,
}

impl Curve {
    /// The mean of each evaluation and the `SMOOTH - 1` before it.
    fn smoothed(&self) -> impl Iterator<Item = (f64, f64, u64)> + '_ {
        self.points.windows(SMOOTH).map(|w| {
            let last = w[SMOOTH - 1];
            (last.0, w.iter().map(|p| p.1).sum::<f64>() / SMOOTH as f64, last.2)
        })
    }

    /// First time the smoothed loss is at or below `target`, and the
    /// samples processed by then.
    pub fn time_to(&self, target: f64) -> Option<(f64, u64)> {
        self.smoothed().find(|p| p.1 <= target).map(|p| (p.0, p.2))
    }

    /// Writes `t,eval_loss,samples` lines (for plots and for choosing targets).
    pub fn write_csv(&self, path: &Path) -> std::io::Result<()> {
        let mut text = String::from("t,eval_loss,samples\n");
        for (t, l, s) in &self.points {
            text.push_str(&format!("{t:.3},{l:.5},{s}\n"));
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, text)
    }

    /// Lowest smoothed loss.
    pub fn best(&self) -> Option<f64> {
        self.smoothed().map(|p| p.1).reduce(f64::min)
    }
}

/// The manifest a user gets from `ragtag swarm new` with the task's
/// arguments (its learning-rate probe included), with only the held-out
/// size changed where the task says. Returns its path and the manifest.
pub fn manifest(ragtag: &Path, task: &Task, seed: u64, dir: &Path) -> Result<(PathBuf, Manifest), BenchError> {
    std::fs::create_dir_all(dir)?;
    let out = Command::new(ragtag)
        .args(["swarm", "new", "--name", task.name, "--seed", &seed.to_string()])
        .args(&task.swarm_new)
        .arg("--out")
        .arg(dir)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(BenchError::failed("ragtag swarm new"));
    }
    let path = dir.join("manifest.toml");
    let mut m = manifest_file::read(&path)?;
    if let Some(n) = task.eval_samples {
        m.training.eval_samples = n;
        m.rationale.insert("eval_samples".into(), format!("{n}: the benchmark's held-out size"));
        manifest_file::write(&m, &path)?;
    }
    Ok((path, m))
}

/// A manifest with a cooldown counts its budget from its start: a copy in
/// `dir` that starts now, so every run (the lone node's, the swarm's) gets
/// its whole budget. Others are used as they are.
fn restamped(manifest: &Path, dir: &Path) -> Result<PathBuf, BenchError> {
    let mut m = manifest_file::read(manifest)?;
    if m.engine.cooldown.is_none() {
        return Ok(manifest.to_path_buf());
    }
    m.start_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    std::fs::create_dir_all(dir)?;
    let path = dir.join("manifest.toml");
    manifest_file::write(&m, &path)?;
    Ok(path)
}

/// Runs `step_times.len()` ragtag nodes for `duration_s` and returns node
/// 0's held-out loss over time since launch, with the samples all nodes
/// had processed by each evaluation.
pub fn ragtag_swarm(
    ragtag: &Path,
    manifest: &Path,
    task: &Task,
    step_times: &[f64],
    duration_s: f64,
    dir: &Path,
) -> Result<Curve, BenchError> {
    // Every run starts from nothing: a node resumes from a state directory
    // it finds, and one left by an earlier run belongs to another.
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let manifest = &restamped(manifest, dir)?;
    let launched = Instant::now();
    let args = |i: usize, bootstrap: Option<&str>| {
        let mut a: Vec<String> = [
            "run",
            "--manifest",
            manifest.to_str().unwrap_or_default(),
            "--data",
            task.data.to_str().unwrap_or_default(),
            "--json",
            "--duration",
            &duration_s.to_string(),
            "--step-time",
            &format!("{:.6}", step_times[i]),
            "--state",
            dir.join(format!("n{i}")).to_str().unwrap_or_default(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(b) = bootstrap {
            a.extend(["--bootstrap".to_string(), b.to_string()]);
        }
        a
    };
    let first = Proc::spawn(ragtag, &args(0, None), &dir.join("n0"));
    let addr = first.listen_addr(Duration::from_secs(60));
    let mut nodes = vec![(first, 0.0)];
    for i in 1..step_times.len() {
        let offset = launched.elapsed().as_secs_f64();
        nodes.push((Proc::spawn(ragtag, &args(i, Some(&addr)), &dir.join(format!("n{i}"))), offset));
    }
    // Per node: its samples so far; the curve: every evaluation of node 0.
    let mut samples = vec![0u64; nodes.len()];
    let mut curve = Curve::default();
    let mut exited = vec![false; nodes.len()];
    let end = Instant::now() + Duration::from_secs_f64(duration_s + 60.0);
    while exited.iter().any(|e| !e) && Instant::now() < end {
        for (i, (n, offset)) in nodes.iter().enumerate() {
            while let Ok(line) = n.stdout.try_recv() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
                match v["event"].as_str() {
                    Some("round") => samples[i] = v["samples"].as_u64().unwrap_or(samples[i]),
                    // One replica's model, as DDP's rank 0: node 0's.
                    Some("eval") if i == 0 => {
                        if let (Some(t), Some(l)) = (v["t"].as_f64(), v["eval_loss"].as_f64()) {
                            curve.points.push((offset + t, l, samples.iter().sum()));
                        }
                    }
                    Some("exit") => exited[i] = true,
                    _ => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    curve.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Each node's log beside its state, for what the curves do not show
    // (rate changes, peers, refusals).
    for (i, (n, _)) in nodes.iter().enumerate() {
        std::fs::write(dir.join(format!("n{i}.log")), n.stderr())?;
    }
    if curve.points.is_empty() {
        return Err(BenchError::NoMeasurement(format!(
            "node 0 reported no evaluation; its log:\n{}",
            nodes[0].0.stderr()
        )));
    }
    Ok(curve)
}

/// PyTorch in a virtualenv under `target/`, installed on first use.
fn torch_python(repo: &Path) -> Result<PathBuf, BenchError> {
    let venv = repo.join("target/ddp-venv");
    let python = venv.join("bin/python");
    if !python.exists() && !Command::new("python3").args(["-m", "venv"]).arg(&venv).status()?.success() {
        return Err(BenchError::failed("python3 -m venv"));
    }
    let has_torch = Command::new(&python).args(["-c", "import torch"]).stderr(Stdio::null()).status()?.success();
    if !has_torch {
        eprintln!("installing PyTorch into {} (about 5.6 GB)", venv.display());
        if !Command::new(&python).args(["-m", "pip", "install", "--quiet", "torch", "numpy"]).status()?.success() {
            return Err(BenchError::failed("pip install torch"));
        }
    }
    Ok(python)
}

/// DDP's learning rate over a run (`ddp_baseline.py --schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DdpSchedule {
    /// The same rate throughout.
    Constant,
    /// Cosine decay to zero over the run's budget: what a DDP user who
    /// knows the budget would run, and a rate that falls as ragtag's does.
    Cosine,
}

impl DdpSchedule {
    /// The script's name for it.
    pub fn arg(self) -> &'static str {
        match self {
            Self::Constant => "constant",
            Self::Cosine => "cosine",
        }
    }
}

/// The DDP arm of a comparison: the rates to sweep on the first seed (the
/// best is reused on the others) and the schedule every run uses.
#[derive(Debug, Clone)]
pub struct DdpPlan {
    /// Rates swept on the first seed.
    pub lrs: Vec<f64>,
    /// The rate's schedule.
    pub schedule: DdpSchedule,
}

/// How DDP is run: its rate, seed and target, the batch ragtag's manifest
/// takes, and the ragtag node's held-out size.
#[derive(Debug, Clone, Copy)]
pub struct DdpRun {
    /// AdamW's learning rate.
    pub lr: f64,
    /// The seed of its initial weights and sampling.
    pub seed: u64,
    /// It stops once its smoothed held-out loss reaches this.
    pub target: f64,
    /// Examples per step and rank (the same as a ragtag node's).
    pub batch: u32,
    /// Held-out examples (the same as a ragtag node's).
    pub eval_samples: u32,
    /// The rate's schedule.
    pub schedule: DdpSchedule,
}

/// PyTorch DDP with one rank per entry of the task's step times.
pub fn pytorch_ddp(repo: &Path, task: &Task, run: DdpRun, duration_s: f64) -> Result<Curve, BenchError> {
    let python = torch_python(repo)?;
    let joined = |v: &[f64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(python)
        .arg(repo.join("tests/scripts/ddp_baseline.py"))
        .args(&task.ddp_model)
        .args(["--slowdowns", &joined(&vec![1.0; task.step_times.len()])])
        .args(["--step-times", &joined(&task.step_times), "--lr", &run.lr.to_string()])
        .args(["--batch", &run.batch.to_string(), "--seed", &run.seed.to_string()])
        .args(["--eval-samples", &run.eval_samples.to_string(), "--duration", &duration_s.to_string()])
        // As often as a ragtag node evaluates: once a round.
        .args(["--eval-every", &(STEPS_PER_EVAL * task.step_times[0]).to_string()])
        .args(["--target", &run.target.to_string(), "--schedule", run.schedule.arg()])
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(BenchError::failed("ddp_baseline.py"));
    }
    let mut curve = Curve::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if let (Some(t), Some(l)) = (v["t"].as_f64(), v["eval_loss"].as_f64()) {
            curve.points.push((t, l, v["samples"].as_u64().unwrap_or(0)));
        }
    }
    Ok(curve)
}

/// What one seed of one task measured.
#[derive(Debug, Clone)]
pub struct SeedResult {
    /// The seed (the manifest's initial weights; DDP's weights and sampling).
    pub seed: u64,
    /// The inner rate `swarm new` probed.
    pub ragtag_lr: f32,
    /// The lone node's best smoothed held-out loss in the budget.
    pub lone_best: f64,
    /// The seed's target.
    pub target: f64,
    /// The swarm's best smoothed loss.
    pub swarm_best: f64,
    /// The swarm's time and samples to the target.
    pub swarm: Option<(f64, u64)>,
    /// DDP's learning rate (the best of `ddp_swept`).
    pub ddp_lr: f64,
    /// The rates DDP ran at, in order.
    pub ddp_swept: Vec<f64>,
    /// DDP's best smoothed loss (it stops at the target).
    pub ddp_best: f64,
    /// DDP's time and samples to the target.
    pub ddp: Option<(f64, u64)>,
}

/// `x` rounded to two significant digits (a rate that prints as 0.009,
/// not 0.009000000000000001).
fn two_digits(x: f64) -> f64 {
    let scale = 10f64.powi(1 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// Which of two DDP curves is better: first to the target, else lower.
fn better(a: &Curve, b: &Curve, target: f64) -> bool {
    match (a.time_to(target), b.time_to(target)) {
        (Some(x), Some(y)) => x.0 < y.0,
        (Some(_), None) => true,
        (None, Some(_)) => false,
        (None, None) => a.best() < b.best(),
    }
}

/// One seed: the lone node (which sets the target), the swarm, then DDP at
/// each rate of `lrs` (the best is kept).
pub fn run_seed(
    repo: &Path,
    ragtag: &Path,
    task: &Task,
    seed: u64,
    duration_s: f64,
    ddp_plan: &DdpPlan,
    out: &Path,
) -> Result<SeedResult, BenchError> {
    let out = out.join(format!("seed{seed}"));
    let (manifest_path, m) = manifest(ragtag, task, seed, &out.join("run"))?;
    eprintln!("{} seed {seed}: ragtag single node, step time {} s", task.name, task.step_times[0]);
    let single = ragtag_swarm(ragtag, &manifest_path, task, &task.step_times[..1], duration_s, &out.join("single"))?;
    single.write_csv(&out.join("single.csv"))?;
    let lone_best = single
        .best()
        .ok_or_else(|| BenchError::NoMeasurement(format!("the lone node had fewer than {SMOOTH} evaluations")))?;
    let target = lone_best * TARGET_MARGIN;
    eprintln!(
        "{} seed {seed}: lone best {lone_best:.4}, target {target:.4}; swarm, step times {:?} s",
        task.name, task.step_times
    );
    let swarm = ragtag_swarm(ragtag, &manifest_path, task, &task.step_times, duration_s, &out.join("swarm"))?;
    swarm.write_csv(&out.join("swarm.csv"))?;
    let mut ddp: Option<(f64, Curve)> = None;
    let mut sweep = ddp_plan.lrs.clone();
    let mut i = 0;
    while i < sweep.len() {
        let lr = sweep[i];
        eprintln!("{} seed {seed}: PyTorch DDP, lr {lr}", task.name);
        let run = DdpRun {
            lr,
            seed,
            target,
            batch: m.training.batch_size,
            eval_samples: m.training.eval_samples,
            schedule: ddp_plan.schedule,
        };
        let c = pytorch_ddp(repo, task, run, duration_s)?;
        c.write_csv(&out.join(format!("ddp-lr{lr}.csv")))?;
        if ddp.as_ref().is_none_or(|(_, b)| better(&c, b, target)) {
            ddp = Some((lr, c));
        }
        i += 1;
        // A sweep whose best is its largest rate has not bracketed DDP's
        // optimum: go on upwards, in the sweep's own steps, up to 0.1.
        let largest = sweep.iter().copied().fold(0.0, f64::max);
        if i == sweep.len() && sweep.len() > 1 && ddp.as_ref().is_some_and(|(l, _)| *l == largest) {
            let step = largest / sweep.iter().copied().filter(|l| *l < largest).fold(0.0, f64::max);
            if step > 1.0 && largest * step <= 0.1 {
                sweep.push(two_digits(largest * step));
            }
        }
    }
    let (ddp_lr, ddp) = ddp.ok_or_else(|| BenchError::NoMeasurement("no DDP learning rate given".into()))?;
    Ok(SeedResult {
        seed,
        ragtag_lr: m.training.lr,
        lone_best,
        target,
        swarm_best: swarm.best().unwrap_or(f64::NAN),
        swarm: swarm.time_to(target),
        ddp_lr,
        ddp_swept: sweep,
        ddp_best: ddp.best().unwrap_or(f64::NAN),
        ddp: ddp.time_to(target),
    })
}

/// The suite's figures for one task over `seeds`: DDP's rate is swept on
/// the first seed (extended upwards while its best is the largest rate)
/// and its best reused on the others.
pub fn run(
    repo: &Path,
    ragtag: &Path,
    task: &Task,
    seeds: &[u64],
    duration_s: f64,
    ddp_plan: &DdpPlan,
    out: &Path,
) -> Result<(Vec<Figure>, String), BenchError> {
    let out = out.join(task.name);
    let mut results: Vec<SeedResult> = Vec::new();
    for &seed in seeds {
        let plan = match results.first() {
            Some(first) => DdpPlan { lrs: vec![first.ddp_lr], ..ddp_plan.clone() },
            None => ddp_plan.clone(),
        };
        let r = run_seed(repo, ragtag, task, seed, duration_s, &plan, &out)?;
        eprintln!("{}", seed_line(&r));
        results.push(r);
    }
    Ok((figures(task, &results, duration_s), seed_table(&results, duration_s)))
}

fn seed_line(r: &SeedResult) -> String {
    let at = |x: Option<(f64, u64)>| x.map_or("missed".to_string(), |(t, s)| format!("{t:.1} s ({s} samples)"));
    format!(
        "seed {}: target {:.4} (lone best {:.4}); swarm {} best {:.4}; DDP lr {} {} best {:.4}",
        r.seed,
        r.target,
        r.lone_best,
        at(r.swarm),
        r.swarm_best,
        r.ddp_lr,
        at(r.ddp),
        r.ddp_best
    )
}

/// A markdown table with a row per seed.
/// Where only the swarm reached the target, its time ratio is written as a
/// bound (swarm time over the budget DDP ran out).
pub fn seed_table(results: &[SeedResult], duration_s: f64) -> String {
    let at = |x: Option<(f64, u64)>| x.map_or("missed".to_string(), |(t, s)| format!("{t:.1} s, {s}"));
    let ratio = |a: Option<(f64, u64)>, b: Option<(f64, u64)>, f: fn((f64, u64)) -> f64| match (a, b) {
        (Some(a), Some(b)) => format!("{:.3}", f(a) / f(b)),
        _ => "—".into(),
    };
    let mut t = String::from(
        "| seed | ragtag inner lr (probed) | lone node best | target | ragtag swarm: time, samples | swarm best | DDP lr | DDP: time, samples | DDP best | time ratio | samples ratio |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in results {
        let _ = writeln!(
            t,
            "| {} | {} | {:.4} | {:.4} | {} | {:.4} | {} | {} | {:.4} | {} | {} |",
            r.seed,
            r.ragtag_lr,
            r.lone_best,
            r.target,
            at(r.swarm),
            r.swarm_best,
            r.ddp_lr,
            at(r.ddp),
            r.ddp_best,
            match (r.swarm, r.ddp) {
                (Some((t, _)), None) => format!("<= {:.3}", t / duration_s),
                (s, d) => ratio(s, d, |x| x.0),
            },
            ratio(r.swarm, r.ddp, |x| x.1 as f64),
        );
    }
    t
}

/// Mean (min..max) of some values, or None without any.
fn spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    Some((mean, v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max)))
}

fn figures(task: &Task, results: &[SeedResult], duration_s: f64) -> Vec<Figure> {
    let section = "versus-ddp";
    let n = results.len();
    let both: Vec<&SeedResult> = results.iter().filter(|r| r.swarm.is_some() && r.ddp.is_some()).collect();
    let ratios = |f: fn(&SeedResult) -> f64| spread(&both.iter().map(|r| f(r)).collect::<Vec<_>>());
    let context = format!(
        "{} of {n} seeds where both reached the seed's target ({TARGET_MARGIN} x the lone node's best in {duration_s} s); DDP's rate swept over {:?} on the first seed",
        both.len(),
        results.first().map_or(&[][..], |r| &r.ddp_swept[..]),
    );
    let mut figs = Vec::new();
    let time = ratios(|r| r.swarm.map_or(f64::NAN, |s| s.0) / r.ddp.map_or(f64::NAN, |d| d.0));
    let samples = ratios(|r| r.swarm.map_or(f64::NAN, |s| s.1 as f64) / r.ddp.map_or(f64::NAN, |d| d.1 as f64));
    if let Some((mean, lo, hi)) = time {
        figs.push(
            Figure::new(
                section,
                &format!("{}: ragtag swarm time to target / PyTorch DDP's (goal <= 0.5)", task.name),
                mean,
                "",
            )
            .with_note(format!("range {lo:.3}..{hi:.3}; {context}")),
        );
    }
    if let Some((mean, lo, hi)) = samples {
        figs.push(
            Figure::new(
                section,
                &format!("{}: ragtag swarm samples to target / PyTorch DDP's (goal <= 1.2)", task.name),
                mean,
                "",
            )
            .with_note(format!("range {lo:.3}..{hi:.3}")),
        );
    }
    // Where only the swarm reached the target, DDP's time is beyond the
    // budget: the ratio is at most the swarm's time over the budget.
    let bounds: Vec<String> = results
        .iter()
        .filter_map(|r| match (r.swarm, r.ddp) {
            (Some((t, _)), None) => Some(format!("seed {}: <= {:.3}", r.seed, t / duration_s)),
            _ => None,
        })
        .collect();
    if !bounds.is_empty() {
        figs.push(
            Figure::new(
                section,
                &format!("{}: seeds where only the swarm reached the target", task.name),
                bounds.len() as f64,
                &format!("of {n}"),
            )
            .with_note(format!("time ratio to DDP bounded by swarm time / budget: {}", bounds.join(", "))),
        );
    }
    let count = |f: fn(&SeedResult) -> bool| results.iter().filter(|r| f(r)).count();
    figs.push(Figure::new(
        section,
        &format!("{}: seeds where the swarm reached the target", task.name),
        count(|r| r.swarm.is_some()) as f64,
        &format!("of {n}"),
    ));
    figs.push(Figure::new(
        section,
        &format!("{}: seeds where PyTorch DDP reached the target", task.name),
        count(|r| r.ddp.is_some()) as f64,
        &format!("of {n}"),
    ));
    figs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_keep_two_digits() {
        assert_eq!(two_digits(0.003 * 3.0).to_string(), "0.009");
        assert_eq!(two_digits(0.0123).to_string(), "0.012");
    }

    #[test]
    fn the_curve_reaches_a_target_by_its_smoothed_loss() {
        let c = Curve { points: vec![(1.0, 1.0, 10), (2.0, 0.1, 20), (3.0, 1.0, 30), (4.0, 0.5, 40), (5.0, 0.5, 50)] };
        // Means of three: 0.7 at 3 s, 0.533 at 4 s, 0.667 at 5 s: one
        // lucky evaluation (0.1) does not reach 0.6.
        assert_eq!(c.time_to(0.6), Some((4.0, 40)));
        assert_eq!(c.time_to(0.5), None);
        assert!((c.best().unwrap() - 1.6 / 3.0).abs() < 1e-12);
    }
}
