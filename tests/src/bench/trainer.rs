//! Training-step time of each model on the CPU, against JAX running the
//! same architecture, batch, dtype (f32) and optimiser (AdamW with clipping)
//! on the same machine in the same run.

use std::{path::Path, process::Command, time::Instant};

use ragtag_models::{Trainer, TrainerConfig, data::Shard, device::DeviceChoice};
use ragtag_protocol::manifest::{DataSpec, ModelSpec, TrainingSpec};

use super::{Figure, error::BenchError, median};

struct Case {
    name: &'static str,
    describe: &'static str,
    model: ModelSpec,
    data: DataSpec,
    data_path: Option<String>,
    batch: u32,
    lr: f32,
}

fn cases(repo: &Path) -> Vec<Case> {
    let digits = repo.join("candle-models/testdata/digits.csv");
    let digits_hash = ragtag_protocol::ids::Hash32::of(&std::fs::read(&digits).unwrap_or_default());
    vec![
        Case {
            name: "mlp",
            describe: "MLP 32-64-64-10, batch 32 (`swarm new --data teacher`)",
            model: ModelSpec::Mlp { inputs: 32, hidden: vec![64, 64], classes: 10 },
            data: DataSpec::Teacher { inputs: 32, classes: 10, hidden: 16, temperature: 0.5, test_samples: 64 },
            data_path: None,
            batch: 32,
            lr: 3e-3,
        },
        Case {
            name: "mlp-large",
            describe: "MLP 784-1024-1024-10, batch 128",
            model: ModelSpec::Mlp { inputs: 784, hidden: vec![1024, 1024], classes: 10 },
            data: DataSpec::Teacher { inputs: 784, classes: 10, hidden: 16, temperature: 0.5, test_samples: 64 },
            data_path: None,
            batch: 128,
            lr: 1e-3,
        },
        Case {
            name: "cnn",
            describe: "CNN 8x8, channels 16/32, dense 64, batch 32 (digits)",
            model: ModelSpec::Cnn { side: 8, channels: [16, 32], hidden: 64, classes: 10 },
            data: DataSpec::DigitsCsv { name: "digits".into(), hash: digits_hash },
            data_path: Some(digits.display().to_string()),
            batch: 32,
            lr: 3e-3,
        },
        Case {
            name: "transformer",
            describe: "char transformer, vocab 65, context 64, width 128, 2 layers, 4 heads, batch 16",
            model: ModelSpec::CharTransformer { vocab: 65, context: 64, width: 128, layers: 2, heads: 4 },
            data: DataSpec::Markov { vocab: 65, branching: 4, test_chars: 4096 },
            data_path: None,
            batch: 16,
            lr: 1e-3,
        },
    ]
}

fn candle_ms(c: &Case, steps: u32) -> Result<f64, BenchError> {
    let mut t = Trainer::new(TrainerConfig {
        model: c.model.clone(),
        data: c.data.clone(),
        training: TrainingSpec { batch_size: c.batch, lr: c.lr, eval_samples: 64, ..TrainingSpec::default() },
        seed: 1,
        node_seed: 1,
        shard: Shard::ALL,
        data_path: c.data_path.clone().map(Into::into),
        device: DeviceChoice::Cpu,
        micro_batch: Some(c.batch as usize),
    })?;
    let batch = t.sample_batch();
    t.train_steps_on(&batch, 5)?;
    let mut times = Vec::new();
    for _ in 0..steps {
        let s = Instant::now();
        t.train_steps_on(&batch, 1)?;
        times.push(s.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(times.into_iter()))
}

/// JAX in a throwaway virtualenv under `target/`; `None` (with the reason
/// printed) when it cannot be installed.
fn jax_ms(repo: &Path, steps: u32) -> Result<serde_json::Value, BenchError> {
    let venv = repo.join("target/bench-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let ok = Command::new("python3").args(["-m", "venv", venv.to_str().unwrap_or_default()]).status()?;
        if !ok.success() {
            return Err(BenchError::failed("python3 -m venv"));
        }
        let ok =
            Command::new(&python).args(["-m", "pip", "install", "--quiet", "jax[cpu]==0.8.1", "optax"]).status()?;
        if !ok.success() {
            return Err(BenchError::failed("pip install jax[cpu] optax"));
        }
    }
    let out = Command::new(&python).arg(repo.join("tests/scripts/jax_reference.py")).arg(steps.to_string()).output()?;
    if !out.status.success() {
        return Err(BenchError::CommandFailed {
            command: "jax_reference.py".into(),
            detail: format!(": {}", String::from_utf8_lossy(&out.stderr)),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .map_err(|source| BenchError::Json { source, text: text.into_owned() })
}

/// Runs every case; `steps` timed steps each.
pub fn run(repo: &Path, steps: u32) -> Vec<Figure> {
    let jax = jax_ms(repo, steps);
    let mut out = Vec::new();
    if let Err(e) = &jax {
        eprintln!("JAX reference unavailable: {e}");
    }
    for c in cases(repo) {
        let ours = match candle_ms(&c, steps) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("{}: {e}", c.name);
                continue;
            }
        };
        let mut f = Figure::new("trainer", &format!("{} — candle step", c.describe), ours, "ms");
        match jax.as_ref().ok().and_then(|j| j[c.name].as_f64()) {
            Some(reference) => {
                f = f
                    .with_ratio(ours / reference, "x JAX's step time")
                    .with_note(format!("JAX (jit, XLA CPU): {reference:.3} ms"));
            }
            None => f = f.with_note("JAX reference unavailable".into()),
        }
        out.push(f);
    }
    out
}
