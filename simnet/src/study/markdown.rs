//! STUDY.md from the study's figures. Every statement is derived from the
//! figures by a stated rule: a difference is claimed only where the ranges
//! over seeds do not overlap; otherwise the answer is "cannot tell".

use std::fmt::Write as _;

use ragtag_protocol::engine::Strategy;

use super::{
    Arm, FOCUS, Shape, Study, StudyRun, TaskStudy,
    metrics::{LayerFigures, RepresentationFigures, RunFigures, layer_spread, separated, spread_of},
};
use crate::ablation::Spread;

mod real;
use real::real_section;

fn fmt(s: Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) => format!("{:.d$} ({:.d$}..{:.d$})", s.mean, s.min, s.max, d = digits),
        None => "-".into(),
    }
}

/// [`fmt`] for figures that span orders of magnitude.
fn fmt_e(s: Option<Spread>) -> String {
    match s {
        Some(s) => format!("{:.2e} ({:.2e}..{:.2e})", s.mean, s.min, s.max),
        None => "-".into(),
    }
}

fn runs(t: &TaskStudy, shape: Shape, strategy: Strategy, arm: Arm) -> impl Iterator<Item = &StudyRun> + Clone {
    t.runs.iter().filter(move |r| r.shape == shape && r.strategy == strategy && r.arm == arm)
}

fn figures<'a>(it: impl Iterator<Item = &'a StudyRun> + Clone) -> impl Iterator<Item = &'a RunFigures> + Clone {
    it.map(|r| &r.figures)
}

fn layer_names(t: &TaskStudy) -> Vec<String> {
    t.runs
        .iter()
        .find(|r| !r.figures.layers.is_empty())
        .map_or_else(Vec::new, |r| r.figures.layers.iter().map(|l| l.layer.clone()).collect())
}

/// The mean over layers of one layer figure (finite values only).
fn layer_mean(r: &RunFigures, f: fn(&LayerFigures) -> f64) -> Option<f64> {
    let v: Vec<f64> = r.layers.iter().map(f).filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// "differs" or "cannot tell" for two sets of seeds.
fn verdict(a: Option<Spread>, b: Option<Spread>) -> &'static str {
    if separated(a, b) { "differs" } else { "cannot tell" }
}

/// The whole STUDY.md.
pub fn render(study: &Study, command: &str, date: &str, machine: &str, plots: &[(String, Vec<String>)]) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# The heterogeneity study\n");
    let _ = writeln!(
        w,
        "Written by `{command}` on {date} ({machine}); the simulations took {:.1} minutes{}. The whole study from scratch, with its real-process check: `cargo run -p ragtag-simnet -- study --real`.\n",
        study.wall_s / 60.0,
        if study.quick {
            "; **the quick version**: fewer shapes, half the virtual time, for a check, not for the answers"
        } else {
            ""
        }
    );
    let _ = writeln!(
        w,
        "Every figure comes from the simulator: swarms of {n} nodes, each the real GoPALS engine driving a real candle trainer, in virtual time (compute time = step cost / speed, a 20 ms, 100 Mbit/s network). Every swarm has the same total compute (speeds sum to {n}); a shape is the spread between fastest and slowest node and the share of slow nodes. Figures are mean (min..max) over seeds 0..{}. **A difference is claimed only where the ranges over seeds do not overlap**; otherwise the answer is \"cannot tell\", which is a result too. The specialisation figures come from the second half of each run (the first half is the fall from the initial loss), the cosine over time from every window. The mixed swarm of questions 1, 2 and 4 is {} (speeds {}).\n",
        study.seeds - 1,
        FOCUS.label(),
        FOCUS.speeds().iter().map(|v| format!("{v:.3}")).collect::<Vec<_>>().join(", "),
        n = super::tasks::NODES,
    );
    tasks_section(w, study);
    q1(w, study);
    q2(w, study);
    q3(w, study);
    q4(w, study);
    real_section(w, study);
    let _ = writeln!(w, "## Plots\n");
    for (task, files) in plots {
        for f in files {
            let _ = writeln!(w, "![{task}: {f}](docs/study/{f})\n");
        }
    }
    let _ = writeln!(w, "## What this study does not measure\n");
    let _ = writeln!(
        w,
        "- **The norm guard** is not an arm: it lives in the node's validation of network input (`UpdateValidator`), which the simulator does not run (honest simulated peers deliver their updates directly), so turning it off would change nothing here.\n\
         - **Replica agreement** is not in the tables: the simulator's loss is the mean replica's, the real check's the mean of each node's own replica's. With fixed work (question 4) a slow replica lags while it trains (it applies the batches that closed meanwhile when its next round starts), so there the two differ by more than noise.\n\
         - **Per-example losses**: a group's \"harder examples\" are read from the loss of each round's first batch at the anchor the round starts from (the examples it drew, at the model every node starts from), averaged per group, not per example. (A round's mean training loss would mislead: a fast node's long round descends further, so its mean is lower whatever its examples.) In the simulator every node draws from the same data stream with its own seed, so no node is handed harder examples by construction.\n\
         - **Real processes** {}\n",
        if study.real.is_empty() {
            "were not run in this study (`--real` runs one configuration per question of the MLP task)."
        } else {
            "run one configuration per question of the MLP task, one run each (the section above): a real run has no spread of its own, its layer figures are estimated from strided samples of each tensor, and the char transformer is checked in the simulator only."
        }
    );
    md
}

fn tasks_section(w: &mut String, study: &Study) {
    let _ = writeln!(w, "## Tasks and targets\n");
    let _ = writeln!(
        w,
        "The target of each seed is 2% below the best held-out loss (smoothed over three samples) that ONE node reached alone on that seed in the same virtual time, as plain AdamW (`ddp` with one node) or as `gopals` with one node (each seed draws its own teacher and initial model, so what is reachable differs between seeds). The lone node has the speed of the fastest node of any shape in the study, so no node of any swarm could reach its target alone. A swarm reaches the target when its held-out loss, smoothed over three samples, gets there.\n"
    );
    let _ = writeln!(
        w,
        "| task | model | virtual s | lone node's speed | lone node's best (ddp; gopals) per seed | target per seed |"
    );
    let _ = writeln!(w, "| --- | --- | ---: | ---: | --- | ---: |");
    for t in &study.tasks {
        let per = |s: Strategy| {
            t.control
                .iter()
                .filter(|c| c.strategy == s)
                .map(|c| format!("{:.4}", c.best_loss))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let targets: Vec<String> = (0..u64::from(study.seeds)).map(|s| format!("{:.4}", t.seed_target(s))).collect();
        let _ = writeln!(
            w,
            "| {} | {} | {:.0} | {:.2} | {}; {} | {} |",
            t.task.name(),
            t.description,
            t.duration_s,
            t.control_speed,
            per(Strategy::Ddp),
            per(Strategy::Gopals),
            targets.join(", ")
        );
    }
    let _ = writeln!(w);
}

fn layer_table(
    w: &mut String,
    t: &TaskStudy,
    columns: &[(&str, Shape, Arm)],
    figure: &str,
    f: fn(&LayerFigures) -> f64,
) -> Vec<(String, bool)> {
    let get = |r: &RunFigures, name: &str| r.layer(name).map(f);
    table(w, t, columns, &layer_names(t), figure, &|s| fmt(s, 3), &get)
}

/// Hidden layers with representation figures, in model order.
fn representation_names(t: &TaskStudy) -> Vec<String> {
    t.runs
        .iter()
        .find(|r| !r.figures.representations.is_empty())
        .map_or_else(Vec::new, |r| r.figures.representations.iter().map(|l| l.layer.clone()).collect())
}

fn representation_table(
    w: &mut String,
    t: &TaskStudy,
    columns: &[(&str, Shape, Arm)],
    figure: &str,
    f: fn(&RepresentationFigures) -> f64,
) -> Vec<(String, bool)> {
    let get = |r: &RunFigures, name: &str| r.representation(name).map(f);
    table(w, t, columns, &representation_names(t), figure, &fmt_e, &get)
}

/// One row per name, one column per (shape, arm) of gopals, each cell a
/// figure over seeds; the last column compares the first two.
fn table(
    w: &mut String,
    t: &TaskStudy,
    columns: &[(&str, Shape, Arm)],
    names: &[String],
    figure: &str,
    cell: &dyn Fn(Option<Spread>) -> String,
    get: &dyn Fn(&RunFigures, &str) -> Option<f64>,
) -> Vec<(String, bool)> {
    let _ = write!(w, "| layer |");
    for (label, ..) in columns {
        let _ = write!(w, " {label} |");
    }
    let _ = writeln!(w, " {} vs {} |", columns[0].0, columns[1].0);
    let _ = writeln!(w, "| --- |{}", " ---: |".repeat(columns.len() + 1));
    let mut verdicts = Vec::new();
    for name in names {
        let _ = write!(w, "| {name} |");
        let spreads: Vec<Option<Spread>> = columns
            .iter()
            .map(|(_, shape, arm)| spread_of(figures(runs(t, *shape, Strategy::Gopals, *arm)), |r| get(r, name)))
            .collect();
        for s in &spreads {
            let _ = write!(w, " {} |", cell(*s));
        }
        let v = verdict(spreads[0], spreads[1]);
        let _ = writeln!(w, " {v} |");
        verdicts.push((name.clone(), v == "differs"));
    }
    let _ = writeln!(w, "\n({figure})\n");
    verdicts
}

fn differing(v: &[(String, bool)]) -> String {
    let d: Vec<&str> = v.iter().filter(|(_, d)| *d).map(|(n, _)| n.as_str()).collect();
    if d.is_empty() { "none".into() } else { d.join(", ") }
}

fn q1(w: &mut String, study: &Study) {
    let _ = writeln!(
        w,
        "## 1. Do fast workers become early-layer specialists, and do slow workers carry the harder examples?\n"
    );
    let _ = writeln!(
        w,
        "Fast and slow groups are the nodes at or above and below the mean speed; in the homogeneous control (same seeds, same total compute) they are the first and second half of the nodes, so any difference the mixed swarm shows beyond the control's range is heterogeneity, not noise. Specialisation of the fast nodes in early layers would show as (a) fast and slow updates pointing apart (low cosine) in the early layers and not in the late ones, and (b) the fast group's update aligned with what the swarm applies (the sum of all updates) better than the slow group's there. Norms are per inner step, since a slow node's round has fewer steps.\n"
    );
    let cols = [("mixed", FOCUS, Arm::Preset), ("homogeneous", Shape::HOMOGENEOUS, Arm::Preset)];
    for t in &study.tasks {
        let _ = writeln!(w, "### {}\n", t.task.name());
        let _ = writeln!(w, "Cosine of the fast and slow groups' summed updates:\n");
        let a = layer_table(w, t, &cols, "1 = same direction; 0 = unrelated", |l| l.cos_fast_slow);
        let _ = writeln!(
            w,
            "Alignment with the applied update, fast minus slow (cosine of the group's sum with the sum of all):\n"
        );
        let b = layer_table(w, t, &cols, "> 0: the fast group's updates are closer to what the swarm applies", |l| {
            l.cos_fast_all - l.cos_slow_all
        });
        let _ = writeln!(w, "A slow node's update norm per inner step over a fast node's:\n");
        let c = layer_table(w, t, &cols, "1 = the same", |l| l.step_norm_slow_over_fast);
        let gap = |shape| spread_of(figures(runs(t, shape, Strategy::Gopals, Arm::Preset)), |r| r.train_loss_gap);
        let (gm, gh) = (gap(FOCUS), gap(Shape::HOMOGENEOUS));
        let early =
            |shape| spread_of(figures(runs(t, shape, Strategy::Gopals, Arm::Preset)), |r| r.cos_fast_slow_early);
        let late = |shape| spread_of(figures(runs(t, shape, Strategy::Gopals, Arm::Preset)), |r| r.cos_fast_slow_late);
        let _ = writeln!(
            w,
            "Over time (layer mean of the fast-slow cosine): first third {} mixed against {} homogeneous, last third {} against {}.\n",
            fmt(early(FOCUS), 3),
            fmt(early(Shape::HOMOGENEOUS), 3),
            fmt(late(FOCUS), 3),
            fmt(late(Shape::HOMOGENEOUS), 3)
        );
        let _ = writeln!(
            w,
            "Slow nodes' first-batch loss minus fast nodes' (second half; the loss of the examples a round draws, at the anchor it starts from): mixed {}, homogeneous {}: {}.\n",
            fmt(gm, 4),
            fmt(gh, 4),
            verdict(gm, gh)
        );
        let names = layer_names(t);
        let half = names.len() / 2;
        let early_layers: Vec<(String, bool)> = a.iter().take(half).cloned().collect();
        let _ = writeln!(
            w,
            "**Answer ({})**: layers where the mixed swarm's fast-slow cosine differs from the control beyond the seed ranges: {} (of {}; the first half of the layers: {}); where the fast group's lead in alignment differs: {}; where the per-step norm ratio differs: {}. Slow workers carrying harder examples: {}.\n",
            t.task.name(),
            differing(&a),
            names.len(),
            differing(&early_layers),
            differing(&b),
            differing(&c),
            match (separated(gm, gh), gm.zip(gh)) {
                (true, Some((m, h))) if m.mean > h.mean =>
                    "their training loss is higher than in the control beyond the seed ranges",
                (true, _) => "their training loss is lower than in the control beyond the seed ranges",
                _ => "cannot tell (the ranges overlap)",
            }
        );
    }
}

fn q2(w: &mut String, study: &Study) {
    let _ = writeln!(w, "## 2. Do stragglers' models diverge?\n");
    let _ = writeln!(
        w,
        "Drift is the distance of a node's local model at the end of its round from the anchor it started from, relative to the anchor's norm, per layer: here as the slow group's over the fast group's, in the mixed swarm with staleness weights (the preset) and without, and in the homogeneous control. Per inner step a straggler drifts as far as the others if the ratio of step norms (question 1) is near 1; this ratio is per round.\n"
    );
    let cols = [
        ("mixed, weights", FOCUS, Arm::Preset),
        ("mixed, no weights", FOCUS, Arm::NoStalenessWeights),
        ("homogeneous", Shape::HOMOGENEOUS, Arm::Preset),
    ];
    for t in &study.tasks {
        let _ = writeln!(w, "### {}\n", t.task.name());
        let a = layer_table(w, t, &cols, "drift of a slow node's round over a fast node's", |l| {
            l.drift_slow / l.drift_fast
        });
        let vs_control: Vec<(String, bool)> = layer_names(t)
            .iter()
            .map(|name| {
                let of = |shape| {
                    layer_spread(figures(runs(t, shape, Strategy::Gopals, Arm::Preset)), name, |l| {
                        l.drift_slow / l.drift_fast
                    })
                };
                (name.clone(), separated(of(FOCUS), of(Shape::HOMOGENEOUS)))
            })
            .collect();
        let stale = |arm| spread_of(figures(runs(t, FOCUS, Strategy::Gopals, arm)), |r| Some(r.mean_staleness));
        let _ = writeln!(
            w,
            "Representations: linear CKA of a round's local model with its anchor, per hidden layer, on {} held-out representation rows, shown as 1 - CKA, how far the round moved what a layer computes (0 = alike up to a rotation and scale; one fast and one slow round per sampling window, second half of the run).\n",
            crate::sim::PROBE_ROWS
        );
        let cka_slow =
            representation_table(w, t, &cols, "1 - CKA of a slow node's round-end model with its anchor", |r| {
                1.0 - r.cka_slow
            });
        representation_table(w, t, &cols, "the same for a fast node", |r| 1.0 - r.cka_fast);
        let cka_vs_control: Vec<(String, bool)> = representation_names(t)
            .iter()
            .map(|name| {
                let of = |shape| {
                    spread_of(figures(runs(t, shape, Strategy::Gopals, Arm::Preset)), |r| {
                        r.representation(name).map(|l| l.cka_slow)
                    })
                };
                (name.clone(), separated(of(FOCUS), of(Shape::HOMOGENEOUS)))
            })
            .collect();
        let _ = writeln!(
            w,
            "**Answer ({})**: layers where the slow/fast drift ratio of the mixed swarm differs from the homogeneous control: {}; where turning the staleness weights off changes it: {}. Hidden layers where a slow node's representation CKA differs from the homogeneous control's: {}; where turning the staleness weights off changes it: {}. Mean staleness of applied updates: {} with weights, {} without (weights act only on late updates).\n",
            t.task.name(),
            differing(&vs_control),
            differing(&a),
            if cka_vs_control.is_empty() { "not measured in this run".into() } else { differing(&cka_vs_control) },
            if cka_slow.is_empty() { "not measured in this run".into() } else { differing(&cka_slow) },
            fmt(stale(Arm::Preset), 3),
            fmt(stale(Arm::NoStalenessWeights), 3)
        );
    }
}

fn shape_cell(t: &TaskStudy, shape: Shape, strategy: Strategy) -> String {
    let rs: Vec<&StudyRun> = runs(t, shape, strategy, Arm::Preset).collect();
    if rs.is_empty() {
        return "-".into();
    }
    let loss = spread_of(rs.iter().map(|r| &r.figures), |f| Some(f.final_loss));
    format!("{} ({})", fmt(loss, 4), reached(t, &rs))
}

/// "k/n, time mean (min..max) s": seeds that reached their target.
fn reached(t: &TaskStudy, rs: &[&StudyRun]) -> String {
    let times: Vec<f64> = rs.iter().filter_map(|r| t.time_to_target(r)).collect();
    let time = if times.is_empty() { String::new() } else { format!(", {} s", fmt(Spread::of(&times), 1)) };
    format!("{}/{}{time}", times.len(), rs.len())
}

/// Per seed, `f` of the runs of `a` minus `f` of the runs of `b`.
fn paired<'a>(
    a: impl Iterator<Item = &'a StudyRun>,
    b: impl Iterator<Item = &'a StudyRun> + Clone,
    f: impl Fn(&RunFigures) -> f64,
) -> Vec<f64> {
    a.filter_map(|x| b.clone().find(|y| y.seed == x.seed).map(|y| f(&x.figures) - f(&y.figures))).collect()
}

/// "lower on every seed", "higher on every seed" or "either way".
fn sign_verdict(diffs: &[f64]) -> &'static str {
    if diffs.is_empty() {
        "-"
    } else if diffs.iter().all(|d| *d < 0.0) {
        "lower on every seed"
    } else if diffs.iter().all(|d| *d > 0.0) {
        "higher on every seed"
    } else {
        "either way"
    }
}

fn diffs_text(diffs: &[f64]) -> String {
    diffs.iter().map(|d| format!("{d:+.4}")).collect::<Vec<_>>().join(", ")
}

fn q3(w: &mut String, study: &Study) {
    let _ = writeln!(w, "## 3. Which heterogeneity is best?\n");
    let _ = writeln!(
        w,
        "At equal total compute, final held-out loss of the mean replica, then (seeds that reached their target / seeds, time to target over those that did). Seeds are paired: a seed is the same data, teacher and initial model in every shape, so a shape is called lower or higher than the homogeneous swarm only when its final loss is lower (or higher) on every seed.\n"
    );
    for t in &study.tasks {
        let _ = writeln!(w, "### {}\n", t.task.name());
        let _ = write!(w, "| shape |");
        for s in super::STRATEGIES {
            let _ = write!(w, " {} |", s.name());
        }
        let _ = writeln!(w, "\n| --- |{}", " --- |".repeat(super::STRATEGIES.len()));
        let mut shapes = vec![Shape::HOMOGENEOUS];
        for &fraction in &t.slow_fractions {
            for &spread in t.spreads.iter().filter(|s| **s > 1.0) {
                shapes.push(Shape { spread, slow_fraction: fraction });
            }
        }
        for &shape in &shapes {
            let _ = write!(w, "| {} |", shape.label());
            for s in super::STRATEGIES {
                let _ = write!(w, " {} |", shape_cell(t, shape, s));
            }
            let _ = writeln!(w);
        }
        let _ = writeln!(w);
        for s in super::STRATEGIES {
            let loss = |shape| spread_of(figures(runs(t, shape, s, Arm::Preset)), |r| Some(r.final_loss));
            let against_homogeneous = |shape: Shape| {
                paired(runs(t, shape, s, Arm::Preset), runs(t, Shape::HOMOGENEOUS, s, Arm::Preset), |f| f.final_loss)
            };
            let with = |verdict: &str| -> Vec<String> {
                shapes[1..]
                    .iter()
                    .filter_map(|sh| {
                        let d = against_homogeneous(*sh);
                        (sign_verdict(&d) == verdict).then(|| format!("{} ({})", sh.label(), diffs_text(&d)))
                    })
                    .collect()
            };
            let (better, worse) = (with("lower on every seed"), with("higher on every seed"));
            let best = shapes
                .iter()
                .filter_map(|sh| loss(*sh).map(|l| (sh.label(), l.mean)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let _ = writeln!(
                w,
                "- **{}**: lowest mean final loss at {}; lower than homogeneous on every seed (the differences per seed): {}; higher on every seed: {}.",
                s.name(),
                best.map_or_else(|| "-".into(), |(l, v)| format!("{l} ({v:.4})")),
                if better.is_empty() { "none".into() } else { better.join(", ") },
                if worse.is_empty() { "none".into() } else { worse.join(", ") }
            );
        }
        let _ = writeln!(w);
    }
}

fn q4(w: &mut String, study: &Study) {
    let _ = writeln!(w, "## 4. Does mitigation suppress specialisation?\n");
    let _ = writeln!(
        w,
        "gopals on the mixed swarm with one mechanism turned off at a time, against the preset: the time to target and final loss (compared seed by seed), and the specialisation figures of question 1 as layer means (fast-slow cosine, fast-minus-slow alignment with the applied update, slow/fast norm per step) and the slow-minus-fast first-batch loss (compared by their ranges over seeds). An arm whose runs are identical to the preset's changed nothing: the mechanism never acted in these runs.\n"
    );
    for t in &study.tasks {
        let _ = writeln!(w, "### {}\n", t.task.name());
        let _ = writeln!(
            w,
            "| arm | final loss (reached, time) | fast-slow cosine | alignment lead | norm ratio | first-batch loss gap |"
        );
        let _ = writeln!(w, "| --- | --- | ---: | ---: | ---: | ---: |");
        let layer_mean = |f: fn(&LayerFigures) -> f64| move |r: &RunFigures| layer_mean(r, f);
        let metrics = |arm: Arm| {
            let rs = || {
                figures(runs(
                    t,
                    FOCUS,
                    if arm == Arm::FreeRunning { Strategy::GopalsAsync } else { Strategy::Gopals },
                    arm,
                ))
            };
            [
                spread_of(rs(), |r| Some(r.final_loss)),
                spread_of(rs(), layer_mean(|l| l.cos_fast_slow)),
                spread_of(rs(), layer_mean(|l| l.cos_fast_all - l.cos_slow_all)),
                spread_of(rs(), layer_mean(|l| l.step_norm_slow_over_fast)),
                spread_of(rs(), |r| r.train_loss_gap),
            ]
        };
        let preset = metrics(Arm::Preset);
        let mut changed = Vec::new();
        for arm in std::iter::once(Arm::Preset).chain(Arm::OFF) {
            let m = metrics(arm);
            let rs: Vec<&StudyRun> = t
                .runs
                .iter()
                .filter(|r| {
                    r.shape == FOCUS
                        && r.arm == arm
                        && (r.strategy != Strategy::DilocoProportional && r.strategy != Strategy::Ddp)
                })
                .collect();
            let _ = writeln!(
                w,
                "| {} | {} ({}) | {} | {} | {} | {} |",
                arm.name(),
                fmt(m[0], 4),
                reached(t, &rs),
                fmt(m[1], 3),
                fmt(m[2], 3),
                fmt(m[3], 3),
                fmt(m[4], 4)
            );
            if arm != Arm::Preset {
                let strategy = if arm == Arm::FreeRunning { Strategy::GopalsAsync } else { Strategy::Gopals };
                let loss_diffs =
                    paired(runs(t, FOCUS, strategy, arm), runs(t, FOCUS, Strategy::Gopals, Arm::Preset), |f| {
                        f.final_loss
                    });
                let names = ["fast-slow cosine", "alignment lead", "norm ratio", "first-batch loss gap"];
                let mut d: Vec<String> = names
                    .iter()
                    .zip(m[1..].iter().zip(&preset[1..]))
                    .filter(|(_, (a, b))| separated(**a, **b))
                    .map(|(n, _)| n.to_string())
                    .collect();
                if loss_diffs.iter().any(|x| *x != 0.0) {
                    d.insert(0, format!("final loss {} ({})", sign_verdict(&loss_diffs), diffs_text(&loss_diffs)));
                }
                changed.push(format!(
                    "{}: {}",
                    arm.name(),
                    if d.is_empty() {
                        "nothing (every run identical to the preset's, or within the seed ranges)".into()
                    } else {
                        d.join(", ")
                    }
                ));
            }
        }
        let _ = writeln!(
            w,
            "\n**Answer ({})**: what turning each mechanism off changed against the preset: {}.\n",
            t.task.name(),
            changed.join("; ")
        );
    }
}
