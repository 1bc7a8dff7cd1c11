//! Aggregated dissemination in the simulator: the same run with sums per
//! group instead of every update to every node keeps its replicas
//! identical, applies the updates, and moves fewer bytes per node-round.

use ragtag_protocol::{aggregate::AggregationConfig, engine::Strategy};
use ragtag_simnet::{
    report::RunSummary,
    scenario::Scenario,
    sim::{RunOptions, run},
};

fn summary(aggregation: Option<AggregationConfig>) -> RunSummary {
    let mut s = Scenario::load("hetero-8x-16").unwrap();
    s.duration_s = 40.0;
    s.sample_every_s = 10.0;
    // Two hops need a tick well above the link latency (H = 20 gives
    // 0.29-s ticks against 20-ms links: most sums would come late).
    s.engine.h = Some(100);
    s.engine.anti_entropy_every = Some(0);
    s.engine.aggregation = aggregation;
    let opts = RunOptions { strategy: Strategy::Gopals, seed: 0, progress: false, ddp_lr: None };
    RunSummary::new(&s, &run(&s, &opts).unwrap())
}

#[test]
fn aggregated_runs_keep_replicas_identical_with_fewer_bytes_per_node_round() {
    let full = summary(None);
    let agg = summary(Some(AggregationConfig { groups: 4, aggregators: 3, quorum: 2, fanout: 2 }));
    assert!(full.updates_total > 100 && agg.updates_total > 100, "{} {}", full.updates_total, agg.updates_total);
    // Without anti-entropy (off in both, for equal bytes), full
    // dissemination's replicas drift where an update misses its tick on
    // some of them; every replica applies a tick's sums in the same tick.
    assert_eq!(agg.replica_loss_range.0, agg.replica_loss_range.1, "{:?}", agg.replica_loss_range);
    assert_eq!(agg.consensus_distance_final, 0.0);
    assert_eq!(agg.aggregates_missed, 0);
    // Every update but the last tick's reaches every replica.
    let missed = agg.dropped.get("missed_aggregate").copied().unwrap_or(0);
    assert!(missed <= 16 * 16, "{missed} missed, {:?}", agg.dropped);
    // 16 nodes, 4 groups: a node receives 4 sums instead of 15 updates.
    assert!(
        agg.node_bytes_per_round_mean < 0.6 * full.node_bytes_per_round_mean,
        "{} vs {}",
        agg.node_bytes_per_round_mean,
        full.node_bytes_per_round_mean
    );
    // And it trains as well (within 2% of the full run's loss).
    assert!(agg.final_loss < 1.02 * full.final_loss, "{} vs {}", agg.final_loss, full.final_loss);
}

/// The scale study's scenarios (BENCHMARKS.md, "Aggregated
/// dissemination") load, and each pair differs only in aggregation.
#[test]
fn the_scale_scenarios_load_and_pair_up() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/scale");
    for n in [16, 128, 1000] {
        let full = Scenario::load(&format!("{dir}/scale{n}-full.toml")).unwrap();
        let agg = Scenario::load(&format!("{dir}/scale{n}-agg.toml")).unwrap();
        assert_eq!(full.node_count(), n);
        assert!(full.engine.aggregation.is_none());
        assert!(agg.manifest(Strategy::Gopals, None).engine.aggregation.is_some());
        let mut same = agg.clone();
        same.engine.aggregation = None;
        same.name = full.name.clone();
        same.description = full.description.clone();
        assert_eq!(same, full);
    }
}
