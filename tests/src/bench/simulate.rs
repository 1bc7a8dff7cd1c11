//! The simulator's figures: every strategy on the heterogeneous scenarios
//! (against ddp and the ideal), and the 1,000-node scale run (wall time and
//! peak memory of a separate process).

use std::{path::Path, process::Command, time::Instant};

use ragtag_protocol::engine::Strategy;
use ragtag_simnet::{
    compare::{Comparison, compare, table},
    outputs::write_all,
    scenario::Scenario,
};

use super::{Figure, error::BenchError};

/// Compares `strategies` on a scenario with `seeds` seeds; writes the
/// reports under `out`; returns the comparison and its table.
pub fn compare_scenario(
    name: &str,
    strategies: &[Strategy],
    seeds: u32,
    out: &Path,
) -> Result<(Comparison, String), BenchError> {
    let s = Scenario::load(name)?;
    let (c, outputs) = compare(&s, strategies, seeds, true)?;
    write_all(&out.join(name), &c, &outputs)?;
    let t = table(&c);
    Ok((c, t))
}

/// The headline figures of a comparison against the goals.
pub fn headline(c: &Comparison) -> Vec<Figure> {
    let mut out = Vec::new();
    let row = |s: &str| c.rows.iter().find(|r| r.strategy == s);
    let Some(g) = row("gopals") else { return out };
    if let Some(r) = g.vs_ddp {
        out.push(
            Figure::new(&c.scenario, "gopals time to target / ddp's (goal <= 0.35)", r, "")
                .with_note(format!("target loss {}", c.target_loss)),
        );
    }
    if let Some(r) = g.vs_ideal {
        out.push(Figure::new(&c.scenario, "gopals time to target / ideal (goal <= 1.15)", r, ""));
    }
    out.push(Figure::new(&c.scenario, "gopals mean utilisation per node (goal >= 97%)", 100.0 * g.utilisation, "%"));
    if let Some(r) = g.bytes_fewer_than_ddp {
        out.push(Figure::new(&c.scenario, "ddp bytes per sample / gopals' (goal >= 200)", r, "x"));
    }
    if let Some(r) = g.loss_vs_ddp_at_equal_samples {
        out.push(Figure::new(
            &c.scenario,
            "gopals held-out loss vs ddp at equal samples (goal within 2%)",
            100.0 * r,
            "%",
        ));
    }
    if let Some(dp) = row("diloco-proportional")
        && let (Some(a), Some(b)) = (g.time_to_target_s, dp.time_to_target_s)
    {
        out.push(Figure::new(&c.scenario, "gopals time to target / diloco-proportional's", a / b, ""));
    }
    out
}

#[allow(unsafe_code)]
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    }
}

/// The `large` scenario (1,000 nodes) in its own process.
pub fn large(simnet: &Path, duration_s: Option<f64>) -> Vec<Figure> {
    let start = Instant::now();
    let mut scenario = "large".to_string();
    if let Some(d) = duration_s {
        // A shorter run for the quick mode: the scenario with a smaller duration.
        let text =
            ragtag_simnet::scenario::BUILTIN.iter().find(|(n, _)| *n == "large").map(|(_, t)| *t).unwrap_or_default();
        let path = std::env::temp_dir().join(format!("ragtag-large-{}.toml", std::process::id()));
        let _ = std::fs::write(&path, text.replace("duration_s = 300", &format!("duration_s = {d}")));
        scenario = path.display().to_string();
    }
    let mut cmd = Command::new(simnet);
    cmd.args(["run", "--scenario", &scenario, "--strategy", "gopals", "--json"]);
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            return vec![
                Figure::new("large", "1,000-node run", f64::NAN, "s").with_note(format!("failed to start: {e}")),
            ];
        }
    };
    let wall = start.elapsed().as_secs_f64();
    let rss = children_max_rss_kib() as f64 / 1024.0;
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let rounds = summary["updates_total"].as_f64().unwrap_or(0.0) / 1000.0;
    vec![
        Figure::new("large", "wall time, 1,000 nodes (goal: 100 rounds in < 10 minutes)", wall, "s").with_note(
            format!(
                "{rounds:.0} rounds per node in {:.0} virtual s, {} events",
                summary["end_s"].as_f64().unwrap_or(0.0),
                summary["events"]
            ),
        ),
        Figure::new("large", "peak memory of the simulator process", rss, "MiB"),
    ]
}

/// The same scenario with real `ragtag` processes on loopback (simnet's
/// real mode), one run per strategy, against ddp's real run: time to
/// target and final loss, next to the virtual figures of `virtual_rows`.
pub fn real_mode(simnet: &Path, scenario: &str, duration_s: f64, out: &Path, virtual_rows: &Comparison) -> Vec<Figure> {
    let mut figures = Vec::new();
    let mut ddp_time = None;
    for strategy in ["ddp", "gopals"] {
        let dir = out.join(format!("real-{scenario}-{strategy}"));
        let _ = std::fs::remove_dir_all(&dir);
        let run = Command::new(simnet)
            .args(["real", "--scenario", scenario, "--strategy", strategy, "--duration", &format!("{duration_s}")])
            .arg("--out")
            .arg(&dir)
            .env("RAYON_NUM_THREADS", "1")
            .output();
        let summary: serde_json::Value = std::fs::read(dir.join("summary.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let row = summary["rows"].as_array().and_then(|r| r.first()).cloned().unwrap_or_default();
        let ok = run.as_ref().is_ok_and(|o| o.status.success());
        let time = row["time_to_target_s"].as_f64();
        if strategy == "ddp" {
            ddp_time = time;
        }
        let virt = virtual_rows.rows.iter().find(|r| r.strategy == strategy);
        let note = format!(
            "final loss {:.3} (virtual {}), utilisation {:.0}% (virtual {}){}",
            row["final_loss"].as_f64().unwrap_or(f64::NAN),
            virt.map_or("-".into(), |v| format!("{:.3}", v.final_loss)),
            100.0 * row["utilisation"].as_f64().unwrap_or(f64::NAN),
            virt.map_or("-".into(), |v| format!("{:.0}%", 100.0 * v.utilisation)),
            if ok {
                String::new()
            } else {
                format!(
                    "; run failed: {}",
                    run.map_or_else(
                        |e| e.to_string(),
                        |o| String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string()
                    )
                )
            }
        );
        let mut f = Figure::new(
            "real",
            &format!(
                "{strategy}: time to target, {} processes on loopback",
                summary["runs"][0]["nodes"].as_u64().unwrap_or(0)
            ),
            time.unwrap_or(f64::NAN),
            "s",
        )
        .with_note(note);
        if let (Some(t), Some(d)) = (time, ddp_time) {
            f = f.with_ratio(t / d, "of real ddp's time");
        }
        figures.push(f);
    }
    figures
}
