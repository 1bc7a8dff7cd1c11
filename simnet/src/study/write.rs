//! Runs the study and writes STUDY.md, its plots and its raw figures.

use std::path::{Path, PathBuf};

use super::{Study, StudyError, StudyOptions, markdown, plots, run_study};

fn write_err(path: &Path, e: impl std::error::Error + Send + Sync + 'static) -> StudyError {
    StudyError::Write { what: path.display().to_string(), source: Box::new(e) }
}

/// Runs the study (or takes its simulations from `reuse`, an earlier
/// `study.json`), with the real-process check when `real`, and writes
/// `out/STUDY.md`, with its PNG plots and `study.json` (every run's
/// figures) in `out/docs/study/`; returns the path of STUDY.md. `command`
/// is the command line STUDY.md names.
pub fn run_and_write(
    opts: &StudyOptions,
    out: &Path,
    command: &str,
    reuse: Option<&Path>,
    real: bool,
) -> Result<PathBuf, StudyError> {
    let mut study = match reuse {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| write_err(path, e))?;
            serde_json::from_str(&text).map_err(|e| write_err(path, e))?
        }
        None => run_study(opts)?,
    };
    if real {
        // The simulations first, so a failing real check loses none of them
        // (`--reuse docs/study/study.json --real` takes them up again).
        write(&study, out, command)?;
        let dir = out.join("target/study-real");
        study.real = super::real_check::run(opts, &dir)?;
    }
    write(&study, out, command)
}

/// Writes a finished study (see [`run_and_write`]).
pub fn write(study: &Study, out: &Path, command: &str) -> Result<PathBuf, StudyError> {
    let dir = out.join("docs/study");
    std::fs::create_dir_all(&dir).map_err(|e| write_err(&dir, e))?;
    let json = dir.join("study.json");
    let text = serde_json::to_string(study).map_err(|e| write_err(&json, e))?;
    std::fs::write(&json, text).map_err(|e| write_err(&json, e))?;
    let mut files = Vec::new();
    for t in &study.tasks {
        files.push((t.task.name().to_string(), plots::write(&dir, t, &t.spreads, &t.slow_fractions)?));
    }
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine = format!("{cores} cores");
    let md = markdown::render(study, command, &date, &machine, &files);
    let path = out.join("STUDY.md");
    std::fs::write(&path, md).map_err(|e| write_err(&path, e))?;
    Ok(path)
}
