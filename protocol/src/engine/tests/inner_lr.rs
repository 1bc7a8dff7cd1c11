//! The inner-rate schedule inside the engine: replicas decide alike, and a
//! loss spike drops the outer momentum.

use super::{super::inner_lr::InnerLr, *};

/// Once the reported losses stop falling the plateau schedule lowers the
/// inner rate, every replica that applied the same batches alike, and the
/// swarm still converges at the lower rate. (Whether a lower rate helps is
/// a question of gradient noise, which this toy lacks: the simulator over
/// the real trainer measures it.)
#[test]
fn a_plateau_lowers_the_inner_rate_alike_on_every_replica() {
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let opt = global_optimum(speeds.len());
    let run = |inner_lr| {
        let mut cfg = EngineConfig::preset(Strategy::Gopals);
        (cfg.h, cfg.h_min, cfg.inner_lr) = (20, 2, inner_lr);
        let mut h = Harness::new(cfg, &speeds, 4);
        let start = h.distance_to(0, &opt);
        h.run_until(Micros::from_secs_f64(400.0));
        (h, start)
    };
    let (constant, _) = run(InnerLr::Constant);
    let (plateau, start) = run(InnerLr::PLATEAU);
    assert_eq!(constant.engines[0].inner_lr_scale(), 1.0);
    let scale = plateau.engines[0].inner_lr_scale();
    assert!(scale < 0.5, "scale {scale}");
    let mut agreeing = 0;
    for e in &plateau.engines[1..] {
        if e.version() == plateau.engines[0].version() {
            assert_eq!(e.inner_lr_scale(), scale);
            agreeing += 1;
        }
    }
    assert!(agreeing > 0, "no replica had applied the same updates");
    for k in 0..speeds.len() {
        let d = plateau.distance_to(k, &opt);
        assert!(d < 0.1 * start, "node {k} distance {d} (start {start})");
    }
}

/// Two rounds whose reported loss doubles the best reading: the rate falls
/// and the outer momentum that carried the anchor there is dropped.
#[test]
fn a_loss_spike_drops_the_outer_momentum_and_the_rate() {
    let cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    let mut updates = random_updates(&cfg, 3 * 10, 8);
    for (a, _) in &mut updates {
        a.loss = if a.id.round < 8 { 1.0 } else { 5.0 };
    }
    let order: Vec<usize> = (0..updates.len()).collect();
    let e = engine_after(cfg, &order[..3 * 9], &updates);
    assert_eq!(e.inner_lr_scale(), 1.0, "one spiking round is not a divergence");
    assert!(e.outer.momentum.iter().any(|m| *m != 0.0));
    let e = engine_after(cfg, &order, &updates);
    assert_eq!(e.inner_lr_scale(), 0.5);
    assert!(e.outer.momentum.iter().all(|m| *m == 0.0));
    assert_eq!(e.replica_state().inner_lr.changes, 1);
}

/// The spike test's updates with only one peer of three reporting the
/// spike (from round 8 on, with a forged sample count): a round reads as
/// its median report, so neither the rate nor the momentum moves.
#[test]
fn one_peer_reporting_a_spike_moves_nothing() {
    let cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    let mut updates = random_updates(&cfg, 3 * 10, 8);
    for (i, (a, _)) in updates.iter_mut().enumerate() {
        a.loss = 1.0;
        if i % 3 == 2 && a.id.round >= 8 {
            (a.loss, a.samples) = (1e30, 1 << 40);
        }
    }
    let order: Vec<usize> = (0..updates.len()).collect();
    let e = engine_after(cfg, &order, &updates);
    assert_eq!(e.inner_lr_scale(), 1.0);
    assert!(e.outer.momentum.iter().any(|m| *m != 0.0));
    assert_eq!(e.replica_state().inner_lr.changes, 0);
}

/// `beta_early` is the outer momentum while the inner rate is the
/// manifest's, and `beta` once a plateau lowered it.
#[test]
fn the_early_momentum_holds_until_the_inner_rate_first_falls() {
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let run = |beta: f32, beta_early: Option<f32>, inner_lr| {
        let mut cfg = lossless(EngineConfig::preset(Strategy::Gopals));
        (cfg.h, cfg.h_min, cfg.inner_lr) = (20, 2, inner_lr);
        (cfg.outer.beta, cfg.outer.beta_early, cfg.outer.restart_below) = (beta, beta_early, None);
        let mut h = Harness::new(cfg, &speeds, 7);
        h.run_until(Micros::from_secs_f64(400.0));
        h
    };
    // The rate never falls: beta_early acts throughout, bit for bit.
    let early = run(0.9, Some(0.3), InnerLr::Constant);
    let plain = run(0.3, None, InnerLr::Constant);
    assert_eq!(early.engines[0].anchor(), plain.engines[0].anchor());
    // Once it falls, beta takes over: the runs part.
    let early = run(0.9, Some(0.3), InnerLr::PLATEAU);
    let plain = run(0.3, None, InnerLr::PLATEAU);
    assert!(early.engines[0].inner_lr_scale() < 1.0);
    assert_ne!(early.engines[0].anchor(), plain.engines[0].anchor());
}

/// A cooldown lowers the rate every node trains at by the same factor at the
/// same moment (time counts from the run's start, whenever a node joined),
/// on top of the plateau schedule, and only that: the replica's own
/// schedule state stays what the plateaus made it.
#[test]
fn a_cooldown_scales_the_rate_nodes_train_at() {
    use super::super::cooldown::Cooldown;
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let mut cfg = EngineConfig::preset(Strategy::Gopals);
    (cfg.h, cfg.h_min) = (20, 2);
    cfg.cooldown = Some(Cooldown { start_s: 100, end_s: 200, final_scale: 0.1 });
    let mut h = Harness::new(cfg, &speeds, 4);
    h.run_until(Micros::from_secs_f64(90.0));
    for e in &h.engines {
        assert_eq!(e.lr_scale(Micros::from_secs_f64(90.0)), e.inner_lr_scale(), "before the cooldown");
    }
    h.run_until(Micros::from_secs_f64(150.0));
    for e in &h.engines {
        let (plateau, now) = (e.inner_lr_scale(), e.lr_scale(Micros::from_secs_f64(150.0)));
        assert!((now - 0.55 * plateau).abs() < 1e-6, "halfway: {now} against the plateau's {plateau}");
    }
    h.run_until(Micros::from_secs_f64(250.0));
    for e in &h.engines {
        assert!((e.lr_scale(Micros::from_secs_f64(250.0)) - 0.1 * e.inner_lr_scale()).abs() < 1e-6, "after its end");
    }
}

/// The cooldown reaches the rate local phases train at: with one that is
/// over before the first round (the engine waits `startup_ms` first), every
/// round trains at a rate of zero and the anchor stays at the initial
/// weights, where the same run without it moves off.
#[test]
fn rounds_after_a_cooldown_to_zero_do_not_train() {
    use super::super::cooldown::Cooldown;
    let speeds = [1.0, 1.0, 2.0, 4.0];
    let moved = |cooldown| {
        let mut cfg = EngineConfig::preset(Strategy::Gopals);
        (cfg.h, cfg.h_min, cfg.cooldown) = (20, 2, cooldown);
        let mut h = Harness::new(cfg, &speeds, 4);
        h.run_until(Micros::from_secs_f64(100.0));
        assert!(h.engines[0].version().total() > 0, "updates were applied");
        h.engines[0].anchor().iter().map(|a| a * a).sum::<f32>().sqrt()
    };
    assert!(moved(None) > 0.1);
    assert_eq!(moved(Some(Cooldown { start_s: 0, end_s: 1, final_scale: 0.0 })), 0.0);
}
