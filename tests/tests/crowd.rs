//! More nodes on one machine than libp2p's default IP-colocation threshold
//! (ten peers per address): every node keeps hearing every other. With the
//! default, gossipsub's colocation penalty graylisted every peer on
//! 127.0.0.1 within seconds, and a 16-node swarm on one machine fell apart
//! into lone nodes whose replicas diverged.

use std::time::Duration;

use ragtag_tests::node;

const NODES: usize = 12;
const ROUNDS: u64 = 12;
const T: Duration = Duration::from_secs(150);
/// The check falls at least this many seconds into every node's run.
const MIN_T: f64 = 18.0;

#[test]
fn a_dozen_nodes_on_one_machine_all_hear_each_other_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let first = node(&dir.path().join("n0"), &["--max-rounds", &(ROUNDS + 4).to_string()]);
    let addr = first.listen_addr(T);
    let mut nodes = vec![first];
    for i in 1..NODES {
        let rounds = ROUNDS.to_string();
        nodes.push(node(&dir.path().join(format!("n{i}")), &["--bootstrap", &addr, "--max-rounds", &rounds]));
    }
    let mut runs = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let (rounds, exit) = n.rounds_until_exit(T);
        let applied = exit["outcome"]["applied"].as_u64().unwrap();
        assert!(applied >= (NODES as u64) * ROUNDS / 2, "node {i} applied only {applied}");
        let seen: Vec<(u64, u64, f64)> = rounds
            .iter()
            .map(|r| (r["tick"].as_u64().unwrap(), r["live"].as_u64().unwrap(), r["t"].as_f64().unwrap()))
            .collect();
        runs.push(seen);
    }
    // Rounds follow the run's shared tick clock, but a node that joined a
    // tick later, or skipped a tick too short to train in, finishes its
    // rounds later than the others and hears them say goodbye. So the check
    // is at the last tick before the first node's last round, when every
    // node still runs, whatever its own round count.
    let first_last = runs.iter().map(|r| r.last().unwrap().0).min().unwrap();
    for (i, seen) in runs.iter().enumerate() {
        let at = seen.iter().rfind(|(tick, ..)| *tick < first_last);
        let Some(&(tick, live, t)) = at else { panic!("node {i} had no round before tick {first_last}: {seen:?}") };
        // Late enough that a peer graylisted in the first seconds would
        // have been forgotten (15 s unheard) by then.
        assert!(t >= MIN_T, "node {i}: the check at tick {tick} came only {t:.1} s in: {seen:?}");
        assert_eq!(live, NODES as u64, "node {i} heard {live} at tick {tick} (tick, live, s): {seen:?}");
    }
}
