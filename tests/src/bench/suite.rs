//! The task suite of the convergence benchmarks: each task is a model, its
//! data and the speeds of four emulated machines, run with exactly the
//! manifest `ragtag swarm new` writes for it (no per-task tuning: what
//! differs between tasks is what a user chooses, the data and the model).
//! Generated data files go under `target/bench-data` and are made once.

use std::path::{Path, PathBuf};

use super::{augmented_digits, teacher_digits};

/// Rows of each generated CSV.
const ROWS: usize = 200_000;

/// The tasks, by name.
pub const NAMES: [&str; 3] = ["teacher-digits", "char-shakespeare", "cnn-digits"];

/// The char transformer of the text task (context, width, layers, heads):
/// sized so that four processes of it train at their step floors on two
/// cores (a step took about 10 ms on one thread here, `ragtag run` alone,
/// against the fastest floor of 40 ms).
pub const TRANSFORMER: [u32; 4] = [16, 32, 1, 4];

/// One task of the suite.
#[derive(Debug, Clone)]
pub struct Task {
    /// Its name.
    pub name: &'static str,
    /// What it is, for reports.
    pub describe: String,
    /// The data file every node and DDP rank reads.
    pub data: PathBuf,
    /// `ragtag swarm new` arguments besides name, seed and output.
    pub swarm_new: Vec<String>,
    /// `ddp_baseline.py` arguments naming the same model and data.
    pub ddp_model: Vec<String>,
    /// Seconds per inner step of each of the four machines (speeds 4, 4,
    /// 2, 1: the slowdowns 1, 1, 2, 4), above a step's compute.
    pub step_times: [f64; 4],
    /// The held-out size, where the benchmark changes `swarm new`'s.
    pub eval_samples: Option<u32>,
}

/// Why a task could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// A data file could not be written or read.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The image task's source digits are unusable.
    #[error(transparent)]
    Augment(#[from] augmented_digits::AugmentError),
    /// The text task's file is missing.
    #[error("the text task needs {0} (pass --text FILE)")]
    NoText(PathBuf),
    /// Not a task of the suite.
    #[error("unknown task {0:?}: use one of {NAMES:?}")]
    Unknown(String),
}

/// The teacher-labelled digits-format CSV (generated once) and its floor.
pub fn teacher_digits_file(repo: &Path) -> Result<(PathBuf, f64), SuiteError> {
    let csv = repo.join("target/bench-data/teacher-digits-200k.csv");
    let floor_file = csv.with_extension("floor");
    let known = std::fs::read_to_string(&floor_file).ok().and_then(|s| s.trim().parse().ok());
    match known {
        Some(f) if csv.exists() => Ok((csv, f)),
        _ => {
            let t = teacher_digits::write(&csv, ROWS, 7).map_err(|e| SuiteError::Io(csv.clone(), e))?;
            std::fs::write(&floor_file, t.floor.to_string()).map_err(|e| SuiteError::Io(floor_file, e))?;
            Ok((csv, t.floor))
        }
    }
}

/// The augmented real digits (generated once).
pub fn augmented_digits_file(repo: &Path) -> Result<PathBuf, SuiteError> {
    let csv = repo.join("target/bench-data/augmented-digits-200k.csv");
    if !csv.exists() {
        let partial = csv.with_extension("partial");
        augmented_digits::write(&repo.join("candle-models/testdata/digits.csv"), &partial, ROWS, 11)?;
        std::fs::rename(&partial, &csv).map_err(|e| SuiteError::Io(csv.clone(), e))?;
    }
    Ok(csv)
}

/// The task called `name`; `text` is the text task's file.
pub fn task(repo: &Path, name: &str, text: &Path) -> Result<Task, SuiteError> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    match name {
        "teacher-digits" => {
            let (csv, floor) = teacher_digits_file(repo)?;
            let file = csv.display().to_string();
            Ok(Task {
                name: "teacher-digits",
                describe: format!(
                    "a generated teacher-labelled digits-format CSV (200,000 rows, every fifth held out, 2,000 of them evaluated; the teacher's own entropy, the loss floor, is {floor:.3}), MLP 64-256-256-10"
                ),
                swarm_new: s(&["--model", "mlp", "--hidden", "256,256", "--data", &format!("digits:{file}")]),
                ddp_model: s(&["--model", "mlp", "--hidden", "256,256", "--csv", &file]),
                data: csv,
                step_times: [0.01, 0.01, 0.02, 0.04],
                eval_samples: Some(2_000),
            })
        }
        "char-shakespeare" => {
            if !text.exists() {
                return Err(SuiteError::NoText(text.into()));
            }
            let file = text.display().to_string();
            let size = TRANSFORMER.map(|v| v.to_string()).join(",");
            Ok(Task {
                name: "char-shakespeare",
                describe: format!(
                    "{file} (the last tenth held out, swarm new's 256 windows of it evaluated), char transformer context {}, width {}, blocks {}, heads {}",
                    TRANSFORMER[0], TRANSFORMER[1], TRANSFORMER[2], TRANSFORMER[3]
                ),
                swarm_new: s(&["--data", &format!("text:{file}"), "--transformer", &size]),
                ddp_model: s(&["--model", "transformer", "--text", &file, "--transformer", &size]),
                data: text.into(),
                step_times: [0.04, 0.04, 0.08, 0.16],
                eval_samples: None,
            })
        }
        "cnn-digits" => {
            let csv = augmented_digits_file(repo)?;
            let file = csv.display().to_string();
            Ok(Task {
                name: "cnn-digits",
                describe: "the 1,797 real digits rotated, scaled, shifted and noised into 200,000 rows; every fifth row held out and drawn only from every fifth real digit (1,024 evaluated), CNN 8x8 16/32 channels, dense 64".into(),
                swarm_new: s(&["--data", &format!("digits:{file}")]),
                ddp_model: s(&["--model", "cnn", "--hidden", "64", "--channels", "16,32", "--csv", &file]),
                data: csv,
                step_times: [0.04, 0.04, 0.08, 0.16],
                eval_samples: None,
            })
        }
        other => Err(SuiteError::Unknown(other.into())),
    }
}
