//! Forged ticks: an update naming a tick from the future, or a second
//! update from one source in one tick, is refused with a reason and never
//! reaches a batch.

use super::*;

/// A flood of signed updates whose ticks are forged, gossiped to every
/// node: those from the future are refused, one update per source and tick
/// is kept, and the replicas go on bit-identical. Admitted, the flood would
/// fill the pending queue, whose overflow applies every queued batch at
/// once, future ones included.
#[test]
fn updates_from_the_future_and_second_updates_in_a_tick_are_refused() {
    let mut cfg = lossless(EngineConfig::preset(Strategy::Gopals));
    cfg.h = 20;
    cfg.h_min = 2;
    let mut h = Harness::new(cfg, &[1.0, 1.0, 2.0, 4.0], 3);
    h.run_until(Micros::from_secs_f64(60.0));
    let now = h.now;
    let k = h.engines[0].tick_at(now).expect("tick mode runs a clock");
    let run = h.engines[0].run_id();
    let mut bytes = Vec::new();
    crate::codec::encode(CodecKind::F32, &[0.01; DIM], &mut bytes);
    let attacker = Keypair::deterministic(99, 0).node_id();
    let id = |round| UpdateId { src: attacker, round };
    let flood = MAX_PENDING as u64 + 4;
    let far = k + FUTURE_TICK_SLACK + 8;
    let near = k + 1;
    for round in 0..2 * flood {
        let base_tick = if round < flood { near } else { far };
        let announcement = f32_announcement(run, id(round), base_tick, &bytes);
        for node in 0..h.engines.len() {
            let payload = Arc::new(bytes.clone());
            let input = Input::Update { announcement: announcement.clone(), from: attacker, payload };
            h.push(now, Ev::Input(node, Box::new(input)));
        }
    }
    h.run_until(now + Micros::from_secs_f64(60.0));
    for e in &h.engines {
        let dropped = |r| e.stats().dropped.get(&r).copied().unwrap_or(0);
        assert_eq!(dropped(RejectReason::FromTheFuture), flood, "every update from tick {far} (ours {k})");
        assert_eq!(dropped(RejectReason::SecondInTick), flood - 1, "all but one of tick {near}");
        assert!(e.tick_at(h.now).unwrap() > far, "the run went past the forged tick");
    }
    // Every node applied the attacker's first update of tick `near`, an
    // update like any other, and nothing else of its.
    let applied: Vec<(usize, u64)> =
        h.applied_log.iter().filter(|(_, i)| i.src == attacker).map(|(node, i)| (*node, i.round)).collect();
    let expected: Vec<(usize, u64)> = (0..h.engines.len()).map(|node| (node, 0)).collect();
    assert!(
        applied == expected,
        "{} of the attacker's updates applied, the first {:?}",
        applied.len(),
        applied.iter().take(8).collect::<Vec<_>>()
    );
    let v0 = h.engines[0].version().clone();
    let same: Vec<&Engine> = h.engines.iter().filter(|e| e.version() == &v0).collect();
    assert!(same.len() >= 2, "replicas with the same updates to compare");
    for e in same {
        assert_eq!(e.anchor(), h.engines[0].anchor(), "replicas stay bit-identical");
    }
}
