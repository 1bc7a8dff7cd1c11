//! The heterogeneity study on its MLP task, one seed, quick: the target is
//! one a lone node missed, the measurements are there and sane, the arms
//! change what they say, and STUDY.md answers every question.

use ragtag_protocol::engine::Strategy;
use ragtag_simnet::study::{Arm, FOCUS, Shape, StudyOptions, Task, markdown, run_study, tasks::NODES};

#[test]
fn a_quick_study_of_the_mlp_task_answers_every_question() {
    let opts =
        StudyOptions { quick: true, seeds: 1, text: Default::default(), tasks: vec![Task::Teacher], progress: false };
    let study = run_study(&opts).unwrap();
    let t = &study.tasks[0];

    // The target is below what the lone node reached, and a swarm of the
    // same task reaches it (or the study would measure nothing).
    assert!(t.control.iter().all(|c| t.target_loss < c.best_loss), "{:?} vs {}", t.control, t.target_loss);
    assert!(t.runs.iter().any(|r| r.figures.time_to_target_s.is_some()), "no swarm reached {}", t.target_loss);

    // Every shape ran every strategy; every mitigation arm ran on the focus shape.
    let shapes = opts.shapes(Task::Teacher);
    assert_eq!(t.runs.len(), shapes.len() * 3 + Arm::OFF.len());
    assert!(t.runs.iter().all(|r| r.figures.final_loss.is_finite()));

    let run = |shape: Shape, arm: Arm| {
        let strategy = if arm == Arm::FreeRunning { Strategy::GopalsAsync } else { Strategy::Gopals };
        &t.runs.iter().find(|r| r.shape == shape && r.arm == arm && r.strategy == strategy).unwrap().figures
    };
    // Two groups of equal speed take steps of the same size; in the mixed
    // swarm both groups publish and every layer is measured.
    let homo = run(Shape::HOMOGENEOUS, Arm::Preset);
    assert_eq!(homo.layers.len(), run(FOCUS, Arm::Preset).layers.len());
    for l in &homo.layers {
        assert!((0.8..1.25).contains(&l.step_norm_slow_over_fast), "{l:?}");
        assert!(l.cos_fast_slow > 0.0, "{l:?}");
    }
    // In tick mode nothing is late; fixed work lets a slow node's round
    // run past its tick, so its updates arrive late.
    assert_eq!(run(FOCUS, Arm::Preset).mean_staleness, 0.0);
    assert!(run(FOCUS, Arm::FixedWork).mean_staleness > 0.0);

    let md = markdown::render(&study, "the test", "today", "here", &[]);
    for heading in ["## Tasks and targets", "## 1. ", "## 2. ", "## 3. ", "## 4. "] {
        assert!(md.contains(heading), "{heading} missing");
    }
    assert_eq!(md.matches("**Answer (teacher)**").count(), 3);
    assert!(md.contains(&format!("swarms of {NODES} nodes")));
}
