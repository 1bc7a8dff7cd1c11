//! Four hosts in network namespaces split 2|2 and heal: the swarm merges
//! again, anti-entropy brings the replicas back under the engine's bound,
//! and no update is applied twice.

use std::{collections::BTreeSet, time::Duration};

use ragtag_tests::{netns::Lab, node_in, sketch_distance};

const T: Duration = Duration::from_secs(180);
/// Replicas must be back under the bound at some point after this many
/// seconds, 25 s after the heal at 35 s (the nodes run until 90 s). Gossip
/// resumes 8 to 9 s after the heal: stalled TCP connections wait out their
/// retransmission backoff. Pairwise averaging then takes 2 to 23 s more.
/// Measured (2026-12-01, 20 runs of this test, with and without AutoNAT's
/// dial-backs closed): gossip back at 43-44 s, the last pair first under
/// 1e-3 between 46 and 67 s. The window used to close at 70 s with the
/// nodes, and failed whenever the random pairings were slow.
const REPAIRED_BY: f64 = 60.0;

#[test]
fn a_healed_partition_reconverges_without_double_application() {
    if !ragtag_tests::lab_available(&[]) {
        return;
    }
    let lab = Lab::new("part", 4, 1).expect("namespaces");
    let dir = tempfile::tempdir().unwrap();
    // A run with frequent anti-entropy, shared as a manifest file.
    let out = std::process::Command::new(ragtag_tests::bin("ragtag"))
        .args(["swarm", "new", "--name", "partition", "--tick-ms", "2000", "--out", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest = dir.path().join("manifest.toml");
    let text = std::fs::read_to_string(&manifest).unwrap().replace("every_rounds = 10", "every_rounds = 2");
    std::fs::write(&manifest, text).unwrap();
    let m = manifest.to_str().unwrap();
    let listen = |i: usize| format!("/ip4/{}/tcp/4{i}00", lab.ip(i, 1));
    let first =
        node_in(&lab, 0, &dir.path().join("n0"), &["--manifest", m, "--listen", &listen(0), "--duration", "95"]);
    let addr = first.listen_addr(T);
    let mut nodes = vec![first];
    for i in 1..4 {
        nodes.push(node_in(
            &lab,
            i,
            &dir.path().join(format!("n{i}")),
            &["--manifest", m, "--listen", &listen(i), "--bootstrap", &addr, "--duration", "90"],
        ));
    }
    std::thread::sleep(Duration::from_secs(15));
    lab.partition(&[2, 3]).expect("split");
    std::thread::sleep(Duration::from_secs(20));
    lab.heal().expect("heal");
    let reports: Vec<Vec<serde_json::Value>> = nodes.iter().map(|n| n.rounds_until_exit(T).0).collect();

    // After the heal every node sees all four again and averages anchors
    // with its peers (the repair path runs).
    for (i, n) in nodes.iter().enumerate() {
        let merged = reports[i].iter().any(|r| r["t"].as_f64().unwrap_or(0.0) > 45.0 && r["live"] == 4);
        assert!(merged, "node {i} never saw the swarm whole again");
        assert!(n.stderr().contains("averaged our replica"), "node {i} never averaged:\n{}", n.stderr());
    }
    let mut worst: f64 = 0.0;
    let mut compared = 0;
    for a in 0..4 {
        for b in a + 1..4 {
            let late = |r: &&serde_json::Value| r["t"].as_f64().unwrap_or(0.0) > REPAIRED_BY;
            let best = reports[a]
                .iter()
                .filter(late)
                .flat_map(|x| {
                    reports[b]
                        .iter()
                        .filter(late)
                        .filter(move |y| y["version"] == x["version"])
                        .map(move |y| sketch_distance(&x["sketch"], &y["sketch"]))
                })
                .reduce(f64::min);
            if let Some(best) = best {
                worst = worst.max(best);
                compared += 1;
            }
        }
    }
    eprintln!("worst pairwise consensus distance after the heal: {worst:.2e} ({compared} pairs)");
    // Every pair held the same updates at some point after the heal, and
    // then held (nearly) the same replica: under the anti-entropy bound.
    // Before anchors were served fresh, this stayed between 0.02 and 0.2.
    assert_eq!(compared, 6, "some pairs never held the same updates after the heal");
    assert!(worst < 1e-3, "replicas did not re-converge: worst pairwise distance {worst:.2e}");

    // No update was applied twice: every accepted receipt names a distinct update.
    for i in 0..4 {
        let export = std::process::Command::new(ragtag_tests::bin("ragtag"))
            .args(["ledger", "export", "--state", dir.path().join(format!("n{i}/state")).to_str().unwrap()])
            .output()
            .unwrap();
        let mut seen = BTreeSet::new();
        for line in String::from_utf8_lossy(&export.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let receipt = &v["record"]["kind"]["Receipt"];
            if receipt.is_object() && receipt["outcome"]["Accepted"].is_object() {
                let id = (receipt["update"]["src"].to_string(), receipt["update"]["round"].as_u64());
                assert!(seen.insert(id.clone()), "node {i} applied {id:?} twice");
            }
        }
        assert!(!seen.is_empty(), "node {i} accepted nothing");
    }
}
