//! Why the engine's schedule, staleness, codec and anti-entropy settings
//! of a new run have their values: the manifest's rationale names the
//! measurement behind each preset value (in BENCHMARKS.md), or says that
//! the run's creator chose it.

use ragtag_protocol::engine::{EngineConfig, Schedule, StalenessWeight, Strategy};

/// Rationale entries for the engine settings a run's creator did not set
/// by hand (`creator_set` names those they did).
pub(super) fn engine_entries(engine: &EngineConfig, strategy: Strategy, creator_set: &[&str]) -> Vec<(String, String)> {
    let preset = strategy.name();
    let mut v = Vec::new();
    let schedule = match engine.schedule {
        Schedule::Tick { grace, margin, period_ms, overlap, partial_step } => format!(
            "ticks {}, grace {grace}, margin {margin} of a tick: the {preset} preset. Partial step {}: it took \
             hetero-4x's least busy simulated node from 67-78% to 79-91% busy. Overlap {}: it cost 3.8x the \
             time to target on hetero-8x-16 (BENCHMARKS.md: a partial step fills the tick; where the idle time goes)",
            period_ms.map_or_else(
                || "every H / v_ref (v_ref: the 90th percentile speed)".into(),
                |p| format!("every {p} ms")
            ),
            if partial_step { "on" } else { "off" },
            if overlap { "on" } else { "off" },
        ),
        Schedule::Barrier => format!("barrier: every member's update before the next round, the {preset} preset"),
        Schedule::FreeRunning => {
            format!("free running: a round starts when the last one is published, the {preset} preset")
        }
    };
    v.push(("schedule".to_string(), schedule));
    let weight = match engine.staleness.weight {
        StalenessWeight::None => "full weight".to_string(),
        StalenessWeight::Polynomial { a } => format!("(1 + tau)^-{a}"),
        StalenessWeight::Exponential { lambda } => format!("exp(-{lambda} tau)"),
        StalenessWeight::Hinge { free, slope } => format!("1 up to {free}, then 1 / (1 + {slope} (tau - {free}))"),
    };
    v.push((
        "staleness".to_string(),
        format!(
            "{weight} by {:?} lateness, dropped beyond {}: the {preset} preset. With 5% of messages lost, 2% of \
             updates came late; dropping them ended worse on 5 of 6 seeds, this weight could not be told from 1 \
             (BENCHMARKS.md, staleness ablation)",
            engine.staleness.measure, engine.staleness.tau_max
        ),
    ));
    v.push((
        "codec".to_string(),
        format!(
            "{}, error feedback {}: the {preset} preset. Top-k at 3% cut bytes per sample 3.8x but raised samples \
             to target 1.2-3.6x in the simulator (BENCHMARKS.md, sparse top-k)",
            engine.codec.name(),
            if engine.error_feedback { "on" } else { "off" }
        ),
    ));
    v.push((
        "anti_entropy".to_string(),
        format!(
            "one peer every {} rounds, anchors further apart than {} averaged: the {preset} preset; it brings \
             replicas back together after a partition (tests/tests/partition.rs)",
            engine.anti_entropy.every_rounds, engine.anti_entropy.distance_threshold
        ),
    ));
    for (key, text) in &mut v {
        if creator_set.contains(&key.as_str()) {
            *text = format!("chosen by the run's creator ({text})");
        }
    }
    v
}
