//! A real ragtag swarm against PyTorch DDP (torch.distributed, gloo, on
//! 127.0.0.1), the same model, data split and speeds, and a single-node
//! control beside them: four `ragtag run` processes with the manifest that
//! `ragtag swarm new` writes, one `ragtag run` alone at the fastest speed,
//! and `tests/scripts/ddp_baseline.py` with one rank per node. Each rank and
//! node emulates its hardware with a per-step floor (`--step-time`), far
//! above the step's compute, so both systems see the same speeds on this
//! 2-core machine. PyTorch is installed by this benchmark into
//! `target/ddp-venv` (about 5.6 GB), never by CI.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ragtag_node::manifest_file;

use super::{Figure, teacher_digits};
use crate::Proc;

/// Seconds per inner step of each node: speeds 4, 4, 2 and 1 (the issue's
/// slowdowns 1, 1, 2, 4), well above the compute of one step here.
pub const STEP_TIMES: [f64; 4] = [0.01, 0.01, 0.02, 0.04];
/// Rows of the generated task.
const ROWS: usize = 200_000;
/// Held-out examples.
const EVAL_SAMPLES: u32 = 2_000;

/// The task: a teacher-labelled digits-format CSV and an MLP 64-256-256-10.
#[derive(Debug, Clone)]
pub struct Task {
    /// The CSV.
    pub csv: PathBuf,
    /// Its loss floor.
    pub floor: f64,
    /// The held-out loss to reach.
    pub target: f64,
}

/// What one system did: held-out loss over wall time since launch.
#[derive(Debug, Clone, Default)]
pub struct Curve {
    /// (seconds, held-out loss, samples processed by all nodes).
    pub points: Vec<(f64, f64, u64)>,
}

/// Evaluations averaged for a curve's loss: one evaluation scatters, and
/// the system that evaluates more often would otherwise get more draws.
const SMOOTH: usize = 3;

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

/// Generates the task's CSV under `target/bench-data` (once).
pub fn task(repo: &Path, target: f64) -> std::io::Result<Task> {
    let csv = repo.join("target/bench-data/teacher-digits-200k.csv");
    let floor_file = csv.with_extension("floor");
    let floor = match std::fs::read_to_string(&floor_file).ok().and_then(|s| s.trim().parse().ok()) {
        Some(f) if csv.exists() => f,
        _ => {
            let t = teacher_digits::write(&csv, ROWS, 7)?;
            std::fs::write(&floor_file, t.floor.to_string())?;
            t.floor
        }
    };
    Ok(Task { csv, floor, target })
}

/// The manifest a user gets from `ragtag swarm new --data digits:FILE
/// --model mlp --hidden 256,256` (its learning-rate probe included), with
/// only the held-out size changed. Returns its path and the chosen rate.
pub fn manifest(ragtag: &Path, task: &Task, dir: &Path) -> anyhow::Result<(PathBuf, f32)> {
    std::fs::create_dir_all(dir)?;
    let out = Command::new(ragtag)
        .args(["swarm", "new", "--name", "versus-ddp", "--model", "mlp", "--hidden", "256,256", "--data"])
        .arg(format!("digits:{}", task.csv.display()))
        .arg("--out")
        .arg(dir)
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(out.status.success(), "ragtag swarm new failed");
    let path = dir.join("manifest.toml");
    let mut m = manifest_file::read(&path)?;
    m.training.eval_samples = EVAL_SAMPLES;
    m.rationale.insert("eval_samples".into(), format!("{EVAL_SAMPLES}: the benchmark's held-out size"));
    manifest_file::write(&m, &path)?;
    Ok((path, m.training.lr))
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
) -> anyhow::Result<Curve> {
    // Every run starts from nothing: a node resumes from a state directory
    // it finds, and one left by an earlier run belongs to another.
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let launched = Instant::now();
    let args = |i: usize, bootstrap: Option<&str>| {
        let mut a: Vec<String> = [
            "run",
            "--manifest",
            manifest.to_str().unwrap_or_default(),
            "--data",
            task.csv.to_str().unwrap_or_default(),
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
    // Per node: its samples so far; the curve: every evaluation of any node.
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
    anyhow::ensure!(!curve.points.is_empty(), "node 0 reported no evaluation; its log:\n{}", nodes[0].0.stderr());
    Ok(curve)
}

/// PyTorch in a virtualenv under `target/`, installed on first use.
fn torch_python(repo: &Path) -> anyhow::Result<PathBuf> {
    let venv = repo.join("target/ddp-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        anyhow::ensure!(
            Command::new("python3").args(["-m", "venv"]).arg(&venv).status()?.success(),
            "python3 -m venv failed"
        );
    }
    let has_torch = Command::new(&python).args(["-c", "import torch"]).stderr(Stdio::null()).status()?.success();
    if !has_torch {
        eprintln!("installing PyTorch into {} (about 5.6 GB)", venv.display());
        anyhow::ensure!(
            Command::new(&python).args(["-m", "pip", "install", "--quiet", "torch", "numpy"]).status()?.success(),
            "pip install torch failed"
        );
    }
    Ok(python)
}

/// PyTorch DDP with one rank per entry of `step_times` at learning rate `lr`.
pub fn pytorch_ddp(repo: &Path, task: &Task, step_times: &[f64], lr: f64, duration_s: f64) -> anyhow::Result<Curve> {
    let python = torch_python(repo)?;
    let joined = |v: &[f64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(python)
        .arg(repo.join("tests/scripts/ddp_baseline.py"))
        .args(["--csv", task.csv.to_str().unwrap_or_default()])
        .args(["--hidden", "256,256", "--slowdowns", &joined(&vec![1.0; step_times.len()])])
        .args(["--step-times", &joined(step_times), "--lr", &lr.to_string()])
        .args(["--eval-samples", &EVAL_SAMPLES.to_string(), "--duration", &duration_s.to_string()])
        // About as often as a ragtag node evaluates (every round, ~0.5 s here).
        .args(["--eval-every", "0.5"])
        .args(["--target", &task.target.to_string()])
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(out.status.success(), "ddp_baseline.py failed");
    let mut curve = Curve::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if let (Some(t), Some(l)) = (v["t"].as_f64(), v["eval_loss"].as_f64()) {
            curve.points.push((t, l, v["samples"].as_u64().unwrap_or(0)));
        }
    }
    Ok(curve)
}

/// The comparison's figures: swarm against DDP's best rate, single node
/// beside them. `lrs`: DDP's learning-rate sweep.
pub fn run(repo: &Path, ragtag: &Path, duration_s: f64, lrs: &[f64], out: &Path) -> anyhow::Result<Vec<Figure>> {
    let task = task(repo, TARGET)?;
    let section = "versus-ddp";
    eprintln!("ragtag swarm, step times {STEP_TIMES:?} s, {duration_s} s");
    let (manifest, lr_ragtag) = manifest(ragtag, &task, &out.join("run"))?;
    let swarm = ragtag_swarm(ragtag, &manifest, &task, &STEP_TIMES, duration_s, &out.join("swarm"))?;
    eprintln!("ragtag single node, step time {} s", STEP_TIMES[0]);
    let single = ragtag_swarm(ragtag, &manifest, &task, &STEP_TIMES[..1], duration_s, &out.join("single"))?;
    let mut ddp: Option<(f64, Curve)> = None;
    for &lr in lrs {
        eprintln!("PyTorch DDP, lr {lr}");
        let c = pytorch_ddp(repo, &task, &STEP_TIMES, lr, duration_s)?;
        c.write_csv(&out.join(format!("ddp-lr{lr}.csv")))?;
        let better = match &ddp {
            None => true,
            Some((_, b)) => match (c.time_to(task.target), b.time_to(task.target)) {
                (Some(x), Some(y)) => x.0 < y.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => c.best() < b.best(),
            },
        };
        if better {
            ddp = Some((lr, c));
        }
    }
    swarm.write_csv(&out.join("swarm.csv"))?;
    single.write_csv(&out.join("single.csv"))?;
    let (lr, ddp) = ddp.ok_or_else(|| anyhow::anyhow!("no DDP learning rate given"))?;
    let mut figures = Vec::new();
    // The run's target, and the easier one on the way (where a constant
    // inner rate left the swarm's plateau: BENCHMARKS.md).
    for target in [task.target, EASIER_TARGET] {
        let context = format!(
            "target {target} (floor {:.3}); ragtag's inner rate {lr_ragtag} (probed by swarm new); DDP's best rate {lr} of {lrs:?}; {duration_s} s budget",
            task.floor
        );
        match (swarm.time_to(target), ddp.time_to(target)) {
            (Some((ts, ss)), Some((td, sd))) => {
                figures.push(
                    Figure::new(
                        section,
                        &format!("ragtag swarm time to {target} / PyTorch DDP's (goal <= 0.5)"),
                        ts / td,
                        "",
                    )
                    .with_note(format!("ragtag {ts:.1} s, DDP {td:.1} s; {context}")),
                );
                figures.push(
                    Figure::new(
                        section,
                        &format!("ragtag swarm samples to {target} / PyTorch DDP's (goal <= 1.2)"),
                        ss as f64 / sd as f64,
                        "",
                    )
                    .with_note(format!("ragtag {ss}, DDP {sd}")),
                );
            }
            (s, d) => {
                // Not both reached it: no ratio, each system's best instead.
                let reached = |x: Option<(f64, u64)>| {
                    x.map_or(format!("missed {target}"), |x| format!("{target} at {:.1} s", x.0))
                };
                for (name, curve, r) in [("ragtag swarm", &swarm, s), ("PyTorch DDP", &ddp, d)] {
                    if let Some(b) = curve.best() {
                        figures.push(
                            Figure::new(section, &format!("{name} best held-out loss"), b, "")
                                .with_note(format!("{}; {context}", reached(r))),
                        );
                    }
                }
            }
        }
    }
    if let Some(b) = single.best() {
        figures.push(Figure::new(section, "single ragtag node (fastest speed) best held-out loss", b, "").with_note(
            match single.time_to(task.target) {
                Some((t, _)) => format!("reached the target alone at {t:.1} s: the target is too easy"),
                None => format!("did not reach {} in {duration_s} s", task.target),
            },
        ));
    }
    Ok(figures)
}

/// The held-out loss to reach: below what one node reaches in the budget
/// (measured, see BENCHMARKS.md), above the task's floor (0.533). DDP's
/// script stops there, so the easier target is read on the way.
pub const TARGET: f64 = 0.62;

/// Where a constant inner rate left the swarm's plateau (BENCHMARKS.md).
pub const EASIER_TARGET: f64 = 0.65;
