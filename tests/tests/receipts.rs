//! Receipts reach the author of the update they are about. Each node sends
//! its receipts to the updates' authors by request-response (not by gossip
//! to everyone, which cost every node N² receipts a round): in a swarm of
//! three where every node is connected to every other, that direct path is
//! the only one used, so each node's credit comes from the receipts the
//! other two sent it.

use std::time::Duration;

use ragtag_tests::node;

const T: Duration = Duration::from_secs(150);

#[test]
fn every_node_is_vouched_for_by_both_other_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", "14"]);
    let addr = a.listen_addr(T);
    let others: Vec<_> =
        ["b", "c"].iter().map(|n| node(&dir.path().join(n), &["--bootstrap", &addr, "--max-rounds", "12"])).collect();
    let mut peers_seen = Vec::new();
    for (name, n) in [("a", &a), ("b", &others[0]), ("c", &others[1])] {
        let (rounds, _) = n.rounds_until_exit(T);
        peers_seen.push((name, rounds.iter().filter_map(|r| r["peers"].as_u64()).max().unwrap_or(0)));
    }
    for name in ["a", "b", "c"] {
        let out = std::process::Command::new(ragtag_tests::bin("ragtag"))
            .args(["ledger", "summary", "--json", "-k", "2", "--state"])
            .arg(dir.path().join(name).join("state"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let me = &summary["me"];
        assert_eq!(
            me["receipts_from_distinct_peers"].as_u64(),
            Some(2),
            "{name} was not vouched for by both others (peers connected {peers_seen:?}): {me}"
        );
        assert!(me["credit"].as_f64().unwrap_or(0.0) > 0.0, "{name} earned no credit at k = 2: {me}");
    }
}
