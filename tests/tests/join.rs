//! The README's join flow, as written: a `ragtag-bootstrap` (which never
//! trains), two training nodes, then a third started with only `--run-id`
//! and the bootstrap's address. It gets the manifest through the bootstrap,
//! finds the training peers through the DHT (their provider records), syncs
//! the replica state from them, in chunks from both at once (not a fresh
//! start), and the others apply its updates.

use std::time::Duration;

use ragtag_protocol::{engine::Strategy, manifest::Manifest};
use ragtag_tests::{bootstrap, node};

const T: Duration = Duration::from_secs(120);

#[test]
fn a_node_joins_by_run_id_through_a_bootstrap_that_does_not_train() {
    let dir = tempfile::tempdir().unwrap();
    let (_bs, addr) = bootstrap(&dir.path().join("bs"), &[]);
    let a = node(&dir.path().join("a"), &["--bootstrap", &addr, "--max-rounds", "30"]);
    let _b = node(&dir.path().join("b"), &["--bootstrap", &addr, "--max-rounds", "30"]);
    for _ in 0..4 {
        a.wait_json("round", T).unwrap_or_else(|| panic!("a does not train:\n{}", a.stderr()));
    }
    let run = Manifest::builtin(Strategy::Gopals).run_id().to_string();
    let c = node(&dir.path().join("c"), &["--run-id", &run, "--bootstrap", &addr, "--max-rounds", "6"]);
    let ec = c.wait_json("exit", T).unwrap_or_else(|| panic!("c did not finish:\n{}", c.stderr()));
    assert_eq!(ec["outcome"]["origin"], "joined", "c started fresh:\n{}", c.stderr());
    assert!(c.stderr().contains("joined with the state of"), "{}", c.stderr());
    // The bootstrap knows the run only through the DHT's provider records:
    // the joiner's lookup names both training nodes.
    assert!(c.stderr().contains("the DHT names 2 holder(s) of this run"), "{}", c.stderr());
    // The two trainers hold the same shared state: the joiner took it once,
    // in chunks from both at once (they would differ only if a batch were
    // applied between the two head requests, a few ms apart in a tick of
    // seconds), and said how far it got.
    let split = c
        .stderr()
        .lines()
        .find(|l| l.contains("shared part: chunks"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no shared part fetched:\n{}", c.stderr()));
    let from_each: Vec<u64> = split
        .split("chunks ")
        .nth(1)
        .unwrap()
        .split(", ")
        .filter_map(|part| part.split(' ').next()?.parse().ok())
        .collect();
    assert!(from_each.len() == 2 && from_each.iter().all(|&n| n >= 1), "not taken from both trainers: {split}");
    assert!(c.stderr().contains("(100%) from 2 peer(s)"), "no download progress shown:\n{}", c.stderr());
    let c_id = ec["status"]["node_id"].as_str().unwrap().to_string();

    // a applied c's updates: its ledger holds receipts accepting them.
    let (_, ea) = a.rounds_until_exit(T);
    assert!(ea["outcome"]["rounds"].as_u64().unwrap() > 0);
    let export = std::process::Command::new(ragtag_tests::bin("ragtag"))
        .args(["ledger", "export", "--state", dir.path().join("a/state").to_str().unwrap()])
        .output()
        .unwrap();
    let accepted_from_c = String::from_utf8_lossy(&export.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["kind"] == "receipt" && r.to_string().contains(&c_id) && r.to_string().contains("Accepted"))
        .count();
    assert!(accepted_from_c >= 1, "a accepted none of c's updates");
}

/// A provider record outlives its node (its TTL is ten minutes), so a
/// joiner is named holders that have left. It must not wait for them:
/// a dial that fails takes a holder off what start-up waits for. And the
/// lookup names every holder: a node that bootstraps one holder was told
/// of another alone when kad's first answer, from its own store (a record
/// the other holder sent it on connecting), was taken as the list.
#[test]
fn a_joiner_names_every_holder_and_does_not_wait_for_those_that_left() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", "60"]);
    let addr = a.listen_addr(T);
    let _b = node(&dir.path().join("b"), &["--bootstrap", &addr, "--max-rounds", "60"]);
    for _ in 0..3 {
        a.wait_json("round", T).unwrap_or_else(|| panic!("a does not train:\n{}", a.stderr()));
    }
    // A node announces itself again to a new peer at most every 5 s: past
    // that, b sends c its record once c enters b's routing table, which is
    // how kad's first answer came from c's own store.
    std::thread::sleep(Duration::from_secs(6));
    let mut c = node(&dir.path().join("c"), &["--bootstrap", &addr, "--max-rounds", "2"]);
    let c_id = c.listen_addr(T).rsplit("/p2p/").next().unwrap().to_string();
    let ec = c.wait_json("exit", T).unwrap_or_else(|| panic!("c did not finish:\n{}", c.stderr()));
    assert_eq!(ec["outcome"]["origin"], "joined", "c started fresh:\n{}", c.stderr());
    assert!(c.stderr().contains("the DHT names 2 holder(s) of this run"), "{}", c.stderr());

    // c has left; its record at a has not.
    c.wait_exit(T).unwrap_or_else(|| panic!("c did not exit:\n{}", c.stderr()));
    let d = node(&dir.path().join("d"), &["--bootstrap", &addr, "--max-rounds", "2"]);
    let ed = d.wait_json("exit", T).unwrap_or_else(|| panic!("d did not finish:\n{}", d.stderr()));
    assert_eq!(ed["outcome"]["origin"], "joined", "d started fresh:\n{}", d.stderr());
    let err = d.stderr();
    assert!(err.contains("the DHT names 3 holder(s) of this run"), "{err}");
    assert!(
        err.contains(&format!("not waiting for {c_id}: it cannot be reached")),
        "d waited for c, which left:\n{err}"
    );
}
