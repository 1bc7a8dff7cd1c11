//! Real `ragtag` processes on loopback: nodes train together, late joiners
//! sync, a SIGKILLed node resumes, private swarms keep outsiders out.

use std::time::Duration;

use ragtag_tests::{bootstrap, node, sketch_distance};

/// Replicas that absorbed the same updates hold the same anchor (canonical
/// batches): compare every pair of round reports with equal version totals.
fn assert_replicas_agree(a: &[serde_json::Value], b: &[serde_json::Value]) -> usize {
    let mut pairs = 0;
    for x in a {
        for y in b.iter().filter(|y| y["version"] == x["version"] && x["version"].as_u64() > Some(0)) {
            let d = sketch_distance(&x["sketch"], &y["sketch"]);
            assert!(d < 1e-4, "replicas with version {} are {d} apart", x["version"]);
            pairs += 1;
        }
    }
    pairs
}

const T: Duration = Duration::from_secs(120);

#[test]
fn two_nodes_train_together() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", "10"]);
    let addr = a.listen_addr(T);
    let b = node(&dir.path().join("b"), &["--bootstrap", &addr, "--max-rounds", "8", "--slowdown", "2"]);
    let (rb_events, eb) = b.rounds_until_exit(T);
    let (ra_events, ea) = a.rounds_until_exit(T);
    let first = &rb_events[0];
    // Every update of one node is applied by the other (up to the rounds in
    // flight when the first one stops).
    let (ra, rb) = (ea["outcome"]["rounds"].as_u64().unwrap(), eb["outcome"]["rounds"].as_u64().unwrap());
    let (aa, ab) = (ea["outcome"]["applied"].as_u64().unwrap(), eb["outcome"]["applied"].as_u64().unwrap());
    assert!(ab >= rb + rb - 2, "b applied {ab} with {rb} rounds each");
    assert!(aa >= ra + rb - 2, "a applied {aa}");
    // Replicas agree whenever they hold the same updates.
    assert!(assert_replicas_agree(&ra_events, &rb_events) >= 2, "too few comparable rounds");
    // Held-out loss fell, below chance (ln 32: the built-in task's classes).
    let chance = 32f64.ln();
    let first_eval = first["eval_loss"].as_f64().unwrap_or(f64::MAX);
    let last_eval = eb["outcome"]["eval_loss"].as_f64().unwrap();
    assert!(last_eval < first_eval.min(chance), "held-out loss {first_eval} -> {last_eval}");
    assert_eq!(eb["outcome"]["origin"], "joined");
}

#[test]
fn three_nodes_find_each_other_through_a_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let (_bs, addr) = bootstrap(&dir.path().join("bs"), &[]);
    let nodes: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| node(&dir.path().join(n), &["--bootstrap", &addr, "--max-rounds", "8"]))
        .collect();
    let all: Vec<_> = nodes.iter().map(|n| n.rounds_until_exit(T)).collect();
    for (rounds, e) in &all {
        let applied = e["outcome"]["applied"].as_u64().unwrap();
        assert!(applied >= 8 + 2 * 5, "applied only {applied}");
        let live = rounds.iter().filter_map(|r| r["live"].as_u64()).max().unwrap_or(0);
        assert_eq!(live, 3, "every node should see the other two");
    }
    let pairs: usize = all.windows(2).map(|w| assert_replicas_agree(&w[0].0, &w[1].0)).sum();
    assert!(pairs >= 2, "too few comparable rounds");
}

#[test]
fn a_late_joiner_syncs_state_and_contributes() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", "14"]);
    let addr = a.listen_addr(T);
    for _ in 0..4 {
        a.wait_json("round", T).expect("a trains alone first");
    }
    let b = node(&dir.path().join("b"), &["--bootstrap", &addr, "--max-rounds", "5"]);
    let eb = b.wait_json("exit", T).unwrap_or_else(|| panic!("b did not finish:\n{}", b.stderr()));
    assert_eq!(eb["outcome"]["origin"], "joined", "{}", b.stderr());
    let ea = a.wait_json("exit", T).unwrap_or_else(|| panic!("a did not finish:\n{}", a.stderr()));
    let applied_a = ea["outcome"]["applied"].as_u64().unwrap();
    let rounds_a = ea["outcome"]["rounds"].as_u64().unwrap();
    assert!(applied_a >= rounds_a + 3, "a applied {applied_a} for its {rounds_a} rounds: b's work did not count");
}

#[test]
fn a_killed_node_resumes_from_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", "16"]);
    let addr = a.listen_addr(T);
    let b_dir = dir.path().join("b");
    let mut b = node(&b_dir, &["--bootstrap", &addr, "--checkpoint-every", "2"]);
    for _ in 0..5 {
        b.wait_json("round", T).unwrap_or_else(|| panic!("b does not train:\n{}", b.stderr()));
    }
    b.kill9();
    let b2 = node(&b_dir, &["--bootstrap", &addr, "--max-rounds", "3"]);
    let e = b2.wait_json("exit", T).unwrap_or_else(|| panic!("b did not restart:\n{}", b2.stderr()));
    assert_eq!(e["outcome"]["origin"], "resumed", "{}", b2.stderr());
    let out = std::process::Command::new(ragtag_tests::bin("ragtag"))
        .args(["ledger", "verify", "--state", b_dir.join("state").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ledger verify failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    a.wait_json("exit", T).expect("the swarm keeps going");
}

#[test]
fn private_swarms_keep_outsiders_out() {
    let dir = tempfile::tempdir().unwrap();
    let key = |name: &str, digit: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("/key/swarm/psk/1.0.0/\n/base16/\n{}\n", digit.repeat(64))).unwrap();
        p.display().to_string()
    };
    let (k1, k2) = (key("one.key", "1"), key("two.key", "2"));
    // a admits only itself and c.
    let c_key = dir.path().join("c.key");
    let out = std::process::Command::new(ragtag_tests::bin("ragtag"))
        .args(["keygen", "--out", c_key.to_str().unwrap()])
        .output()
        .unwrap();
    let c_peer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let a = node(&dir.path().join("a"), &["--swarm-key", &k1, "--allow", &c_peer, "--max-rounds", "20"]);
    let addr = a.listen_addr(T);
    // b has the wrong key: it cannot even complete a handshake.
    let b = node(&dir.path().join("b"), &["--swarm-key", &k2, "--bootstrap", &addr, "--max-rounds", "3"]);
    // d has the key but is not allowed: disconnected, nothing applied.
    let d = node(&dir.path().join("d"), &["--swarm-key", &k1, "--bootstrap", &addr, "--max-rounds", "3"]);
    // c has the key and is allowed: trains with a. Every member runs the
    // swarm's allowlist: a c that admitted anyone let d in through itself
    // when it found d in the DHT before d stopped (CI saw d count 3 live
    // nodes; a refuses d, so d can only have met them through c).
    let a_peer = ragtag_node::net::peer_of(&addr.parse().unwrap()).expect("a's peer id").to_string();
    let c = node(
        &dir.path().join("c"),
        &[
            "--swarm-key",
            &k1,
            "--key",
            c_key.to_str().unwrap(),
            "--allow",
            &a_peer,
            "--bootstrap",
            &addr,
            "--max-rounds",
            "5",
        ],
    );
    let eb = b.wait_json("exit", T).unwrap_or_else(|| panic!("b did not finish:\n{}", b.stderr()));
    assert_eq!(eb["status"]["live_nodes"], 1, "b joined without the key");
    assert!(b.stderr().contains("swarm key"), "b's log should explain the key mismatch:\n{}", b.stderr());
    let ed = d.wait_json("exit", T).expect("d finishes");
    assert_eq!(ed["status"]["live_nodes"], 1, "d was let in:\n{}", d.stderr());
    let ec = c.wait_json("exit", T).unwrap_or_else(|| panic!("c did not finish:\n{}", c.stderr()));
    let applied = ec["outcome"]["applied"].as_u64().unwrap();
    assert!(applied > 5, "c should apply a's updates too: applied {applied}");
    let ea = a.wait_json("exit", T).unwrap_or_else(|| panic!("a did not finish:\n{}", a.stderr()));
    let rejected = &ea["status"]["rejected"];
    assert!(rejected["not_allowed"].as_u64().unwrap_or(0) >= 1, "a should reject d: {rejected}");
}
