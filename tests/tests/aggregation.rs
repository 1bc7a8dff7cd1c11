//! Aggregated dissemination between real processes: nodes whose manifest
//! (`swarm new --aggregate 2`: two groups, three aggregators each, a
//! quorum of two, ticks of at least a second) aggregates send
//! each update to its group's aggregators only; sums travel as signed
//! hashes on gossip and bodies pulled down each group's tree or from a
//! signer. A fifth node joins mid-run from a state served once the last
//! tick's sums were closed. Every pair of replicas is identical at the
//! versions they share.

use std::time::Duration;

use ragtag_tests::{node, sketch_distance};

const T: Duration = Duration::from_secs(150);

#[test]
fn processes_that_aggregate_their_updates_keep_identical_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = ragtag_tests::aggregated_manifest(dir.path(), 2);
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("groups = 2"), "{text}");
    let m = manifest.to_str().unwrap();

    let first = node(&dir.path().join("n0"), &["--manifest", m, "--duration", "50"]);
    let addr = first.listen_addr(T);
    let mut nodes = vec![first];
    for (i, slowdown) in [(1, "1"), (2, "2"), (3, "1")] {
        nodes.push(node(
            &dir.path().join(format!("n{i}")),
            &["--manifest", m, "--bootstrap", &addr, "--duration", "50", "--slowdown", slowdown],
        ));
    }
    std::thread::sleep(Duration::from_secs(20));
    nodes.push(node(&dir.path().join("n4"), &["--manifest", m, "--bootstrap", &addr, "--duration", "30"]));

    let runs: Vec<(Vec<serde_json::Value>, serde_json::Value)> = nodes.iter().map(|n| n.rounds_until_exit(T)).collect();
    for (i, (rounds, exit)) in runs.iter().enumerate() {
        let stderr = nodes[i].stderr();
        assert!(!rounds.is_empty(), "node {i} trained no round:\n{stderr}");
        let sums = &exit["status"]["sums"];
        eprintln!("node {i}: {} rounds, sums {sums}, rejected {}", rounds.len(), exit["status"]["rejected"]);
        assert!(sums["received"].as_u64().unwrap_or(0) > 0, "node {i} received no sum:\n{stderr}");
        let rejected = &exit["status"]["rejected"];
        for reason in ["aggregate_mismatch", "hash_mismatch", "too_large", "malformed"] {
            assert!(rejected[reason].is_null(), "node {i} refused sums as {reason}: {rejected}\n{stderr}");
        }
    }
    assert!(
        runs.iter().filter(|(_, e)| e["status"]["sums"]["published"].as_u64().unwrap_or(0) > 0).count() >= 3,
        "fewer than three aggregators published sums"
    );
    assert_eq!(runs[4].1["outcome"]["origin"], "joined", "the late node started fresh:\n{}", nodes[4].stderr());

    // Replicas that applied the same updates hold the same anchor.
    let mut compared = 0;
    let mut worst: f64 = 0.0;
    for a in 0..runs.len() {
        for b in a + 1..runs.len() {
            for x in &runs[a].0 {
                for y in runs[b].0.iter().filter(|y| y["version"] == x["version"]) {
                    worst = worst.max(sketch_distance(&x["sketch"], &y["sketch"]));
                    compared += 1;
                }
            }
        }
    }
    eprintln!("{compared} round pairs at equal versions, worst distance {worst:.2e}");
    assert!(compared >= 10, "too few rounds at equal versions to compare: {compared}");
    assert_eq!(worst, 0.0, "replicas at the same version differ");
}
