//! STUDY.md's section on the check with real processes: each real run's
//! final loss and specialisation figures beside the simulator's seeds of
//! the same configuration, and, per question, whether the difference the
//! question turns on has the simulator's sign in real processes too.

use std::fmt::Write as _;

use super::{
    Arm, FOCUS, Shape, Study, StudyRun, diffs_text, figures, fmt, fmt_e, layer_mean, paired, runs, sign_verdict,
};
use crate::study::{
    TaskStudy,
    metrics::{RunFigures, spread_of},
    real_check::RealCheck,
};

/// The mean over hidden layers of 1 - CKA of a fast (or slow) node's round.
fn dissimilarity(r: &RunFigures, slow: bool) -> Option<f64> {
    let v: Vec<f64> = r
        .representations
        .iter()
        .map(|x| 1.0 - if slow { x.cka_slow } else { x.cka_fast })
        .filter(|x| x.is_finite())
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// One figure of a run, for the tables and checks.
struct Figure {
    name: &'static str,
    of: fn(&RunFigures) -> Option<f64>,
}

const FIGURES: [Figure; 10] = [
    Figure { name: "final loss", of: |r| Some(r.final_loss) },
    Figure { name: "fast-slow cosine", of: |r| layer_mean(r, |l| l.cos_fast_slow) },
    Figure { name: "alignment lead (fast minus slow)", of: |r| layer_mean(r, |l| l.cos_fast_all - l.cos_slow_all) },
    Figure { name: "norm ratio (slow / fast, per step)", of: |r| layer_mean(r, |l| l.step_norm_slow_over_fast) },
    Figure { name: "drift, fast", of: |r| layer_mean(r, |l| l.drift_fast) },
    Figure { name: "drift, slow", of: |r| layer_mean(r, |l| l.drift_slow) },
    Figure { name: "drift ratio (slow / fast)", of: |r| layer_mean(r, |l| l.drift_slow / l.drift_fast) },
    Figure { name: "1 - CKA, fast", of: |r| dissimilarity(r, false) },
    Figure { name: "1 - CKA, slow", of: |r| dissimilarity(r, true) },
    Figure { name: "first-batch loss gap (slow minus fast)", of: |r| r.train_loss_gap },
];

/// The figure whose name starts with `name` (the checks name them so).
fn figure(name: &str) -> Option<&'static Figure> {
    FIGURES.iter().find(|f| f.name.starts_with(name))
}

/// A real run's value of `f` (its final loss is kept outside the figures).
fn real_value(c: &RealCheck, f: &Figure) -> Option<f64> {
    if f.name == "final loss" { Some(c.final_loss) } else { c.figures.as_ref().and_then(|r| (f.of)(r)) }
}

fn sim_runs<'a>(t: &'a TaskStudy, c: &RealCheck) -> impl Iterator<Item = &'a StudyRun> + Clone {
    runs(t, c.shape, c.strategy, c.arm)
}

fn config_name(c: &RealCheck) -> String {
    if c.arm == Arm::Preset { c.shape.label() } else { format!("{}, {}", c.shape.label(), c.arm.name()) }
}

fn real_cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| if v.abs() < 1e-2 && v != 0.0 { format!("{v:.2e}") } else { format!("{v:.4}") })
}

/// "the same direction", "**not confirmed**", "the simulator cannot tell"
/// or (no finite real value) "not measured".
fn agreement(sim: &[f64], real: Option<f64>) -> &'static str {
    match (sign_verdict(sim), real.filter(|r| r.is_finite())) {
        (_, None) => "not measured",
        ("lower on every seed", Some(r)) if r < 0.0 => "the same direction",
        ("higher on every seed", Some(r)) if r > 0.0 => "the same direction",
        ("lower on every seed" | "higher on every seed", _) => "**not confirmed**",
        _ => "the simulator cannot tell",
    }
}

/// The section, when the study has real runs.
pub(super) fn real_section(w: &mut String, study: &Study) {
    if study.real.is_empty() {
        return;
    }
    let _ = writeln!(w, "## Checked with real processes\n");
    let _ = writeln!(
        w,
        "One configuration per question as real `ragtag` processes on loopback, each emulating its node's step cost (`--step-time`) for the same number of seconds of wall time, one run each (seed 0's data, teacher and initial model), beside the simulator's seeds of the same configuration. Every node traces its rounds (`ragtag run --trace-updates`): a strided sample of each parameter tensor's update and local model (at most 512 values a tensor, scaled so that the sample's norm estimates the tensor's; the MLP's biases are whole, its weight matrices sampled every 2nd to 8th value), the first batch's loss and the CKA of its model with the anchor on the simulator's probe; `ragtag-simnet real --layers` replays them on the simulator's sampling grid into the same figures. Layer figures are means over layers, from the second half of the run.\n"
    );
    let _ = writeln!(w, "| task | configuration | figure | real | simulator over seeds |");
    let _ = writeln!(w, "| --- | --- | --- | ---: | --- |");
    for c in &study.real {
        let Some(t) = study.tasks.iter().find(|t| t.task == c.task) else { continue };
        for f in &FIGURES {
            let real =
                if f.name == "final loss" { Some(c.final_loss) } else { c.figures.as_ref().and_then(|r| (f.of)(r)) };
            let sim = spread_of(figures(sim_runs(t, c)), f.of);
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} |",
                c.task.name(),
                config_name(c),
                f.name,
                real_cell(real),
                if sim.is_some_and(|s| s.mean.abs() < 1e-2 && s.mean != 0.0) { fmt_e(sim) } else { fmt(sim, 4) }
            );
        }
    }
    checks(w, study);
}

/// Per question, the difference it turns on: per seed in the simulator,
/// and once with real processes.
fn checks(w: &mut String, study: &Study) {
    let find = |shape: Shape, arm: Arm| study.real.iter().find(|c| c.shape == shape && c.arm == arm);
    let (Some(homog), Some(mixed)) = (find(Shape::HOMOGENEOUS, Arm::Preset), find(FOCUS, Arm::Preset)) else {
        return;
    };
    let Some(t) = study.tasks.iter().find(|t| t.task == mixed.task) else { return };
    let mut rows: Vec<(String, String, Vec<f64>, Option<f64>)> = Vec::new();
    // Between two configurations, seed by seed.
    let mut between = |q: &str, a: &RealCheck, b: &RealCheck, name: &str| {
        let Some(f) = figure(name) else { return };
        let sim = paired(sim_runs(t, a), sim_runs(t, b), |r| (f.of)(r).unwrap_or(f64::NAN));
        let sim: Vec<f64> = sim.into_iter().filter(|x| x.is_finite()).collect();
        let real = real_value(a, f).zip(real_value(b, f)).map(|(x, y)| x - y);
        rows.push((q.to_string(), format!("{}: {} minus {}", f.name, config_name(a), config_name(b)), sim, real));
    };
    for name in ["alignment lead", "norm ratio", "fast-slow cosine"] {
        between("1", mixed, homog, name);
    }
    between("3", mixed, homog, "final loss");
    if let Some(fixed) = find(FOCUS, Arm::FixedWork) {
        for name in ["final loss", "alignment lead", "first-batch loss gap"] {
            between("4", fixed, mixed, name);
        }
    }
    // Question 2 as STUDY.md asks it: a straggler's drift against a fast
    // node's, and its representation's change, mixed against the control.
    for name in ["drift ratio", "1 - CKA, slow"] {
        between("2", mixed, homog, name);
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = writeln!(
        w,
        "\nPer question, the difference it turns on, seed by seed in the simulator and once with real processes; \"the same direction\" when the simulator's sign holds on every seed and the real run has it too:\n"
    );
    let _ = writeln!(w, "| question | difference | simulator, per seed | real | |");
    let _ = writeln!(w, "| --- | --- | --- | ---: | --- |");
    for (q, what, sim, real) in &rows {
        let _ = writeln!(
            w,
            "| {q} | {what} | {} ({}) | {} | {} |",
            sign_verdict(sim),
            diffs_text(sim),
            real.map_or_else(|| "-".into(), |r| format!("{r:+.4}")),
            agreement(sim, *real)
        );
    }
    let same = rows.iter().filter(|r| agreement(&r.2, r.3) == "the same direction").count();
    let decided =
        rows.iter().filter(|r| matches!(sign_verdict(&r.2), "lower on every seed" | "higher on every seed")).count();
    let _ = writeln!(
        w,
        "\n**Check**: of the {decided} differences whose sign the simulator's seeds agree on, {same} have the same sign with real processes (one run each, so no spread of their own).\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_needs_the_simulators_sign_on_every_seed() {
        assert_eq!(agreement(&[-0.1, -0.2], Some(-0.01)), "the same direction");
        assert_eq!(agreement(&[0.1, 0.2], Some(-0.01)), "**not confirmed**");
        assert_eq!(agreement(&[0.1, -0.2], Some(0.3)), "the simulator cannot tell");
        assert_eq!(agreement(&[0.1], None), "not measured");
        assert_eq!(agreement(&[0.1], Some(f64::NAN)), "not measured");
    }

    #[test]
    fn every_check_names_an_existing_figure() {
        for name in
            ["alignment lead", "norm ratio", "fast-slow cosine", "final loss", "first-batch loss gap", "drift ratio"]
        {
            assert!(figure(name).is_some_and(|f| f.name.starts_with(name)), "{name}");
        }
        assert_eq!(figure("1 - CKA, slow").map(|f| f.name), Some("1 - CKA, slow"));
        assert!(figure("no such figure").is_none());
    }
}
