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
    for (i, n) in nodes.iter().enumerate() {
        let (rounds, exit) = n.rounds_until_exit(T);
        let live: Vec<u64> = rounds.iter().filter_map(|r| r["live"].as_u64()).collect();
        // Peers no longer heard leave the membership after 15 s; this round
        // comes about 20 s after the start, while every node still runs
        // (later ones may follow peers that finished and said goodbye).
        let late = ROUNDS as usize - 2;
        assert_eq!(live.get(late).copied(), Some(NODES as u64), "node {i} heard {live:?}");
        let applied = exit["outcome"]["applied"].as_u64().unwrap();
        assert!(applied >= (NODES as u64) * ROUNDS / 2, "node {i} applied only {applied}");
    }
}
