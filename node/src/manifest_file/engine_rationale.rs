//! Why the engine's schedule, staleness, codec, anti-entropy and aggregation settings
//! of a new run have their values: the manifest's rationale names the
//! measurement behind each value (in BENCHMARKS.md), and whether the value
//! is the strategy's preset or the run's creator chose it.

use ragtag_protocol::engine::{EngineConfig, Schedule, StalenessWeight, Strategy};

fn on_off(v: bool) -> &'static str {
    if v { "on" } else { "off" }
}

/// Rationale entries for the engine settings (`creator_set` names those the
/// run's creator set by hand).
pub(super) fn engine_entries(engine: &EngineConfig, strategy: Strategy, creator_set: &[&str]) -> Vec<(String, String)> {
    let preset = format!("the {} preset", strategy.name());
    let source =
        |key: &str| if creator_set.contains(&key) { "chosen by the run's creator".to_string() } else { preset.clone() };
    let mut v = Vec::new();
    let schedule = match engine.schedule {
        Schedule::Tick { grace, margin, period_ms, overlap, partial_step, lead } => format!(
            "ticks {}, grace {grace}, margin {margin} of a tick, partial step {}, lead steps {}, overlap {}: {}. A partial step \
             took hetero-4x's least busy simulated node from 67-78% to 79-91% busy; lead steps took \
             hetero-8x-16's exchange wait from 5.4% to 2.7% of up time; overlap cost 3.8x the time to target \
             there (BENCHMARKS.md: a partial step fills the tick; lead steps; where the idle time goes)",
            period_ms.map_or_else(
                || "every H / v_ref (v_ref: the 90th percentile speed)".into(),
                |p| format!("every {p} ms")
            ),
            on_off(partial_step),
            on_off(lead),
            on_off(overlap),
            source("schedule"),
        ),
        Schedule::Barrier => format!("barrier (every member's update before the next round): {}", source("schedule")),
        Schedule::FreeRunning => {
            format!("free running (a round starts when the last one is published): {}", source("schedule"))
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
            "{weight} by {:?} lateness, dropped beyond {}: {}. With 5% of messages lost, 2% of updates came \
             late; dropping them ended worse on 5 of 6 seeds, (1 + tau)^-0.5 could not be told from full weight \
             (BENCHMARKS.md, staleness ablation)",
            engine.staleness.measure,
            engine.staleness.tau_max,
            source("staleness")
        ),
    ));
    v.push((
        "codec".to_string(),
        format!(
            "{}, error feedback {}: {}. Top-k at 3% cut bytes per sample 3.8x but raised samples to target \
             1.2-3.6x in the simulator (BENCHMARKS.md, sparse top-k)",
            engine.codec.name(),
            on_off(engine.error_feedback),
            source("codec")
        ),
    ));
    let anti_entropy = match engine.anti_entropy.every_rounds {
        0 => format!(
            "off: {}. Replicas that miss updates (a partition) are not brought back together",
            source("anti_entropy")
        ),
        n => format!(
            "one peer every {n} rounds, anchors further apart than {} averaged: {}; it brings replicas back \
             together after a partition (tests/tests/partition.rs)",
            engine.anti_entropy.distance_threshold,
            source("anti_entropy")
        ),
    };
    v.push(("anti_entropy".to_string(), anti_entropy));
    let aggregation = match engine.aggregation {
        None => format!(
            "off: {}. Every update reaches every node, so a node's bytes per round grow with the swarm \
             (1,000 simulated nodes: 14.5 MB against 0.37 MB aggregated; BENCHMARKS.md, aggregated dissemination)",
            source("aggregation")
        ),
        Some(a) => format!(
            "{} groups, {} aggregators, quorum {}, fan-out {}, ticks at least {} ms: {}. 1,000 simulated nodes: \
             0.37 MB per node-round against 14.5 MB; five real processes kept identical replicas at 1-s ticks \
             and drifted at 250 ms (BENCHMARKS.md, aggregated dissemination)",
            a.groups,
            a.aggregators,
            a.quorum,
            a.fanout,
            a.min_tick_ms,
            source("aggregation")
        ),
    };
    v.push(("aggregation".to_string(), aggregation));
    v
}
