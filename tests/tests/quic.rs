//! A public swarm over QUIC only: the bootstrap and both nodes listen on
//! QUIC and nothing else, so every byte between them crosses QUIC (UDP).

use std::time::Duration;

use ragtag_tests::{Proc, bootstrap, node};

const T: Duration = Duration::from_secs(120);

#[test]
fn a_public_swarm_trains_over_quic_only() {
    let dir = tempfile::tempdir().unwrap();
    let quic = "/ip4/127.0.0.1/udp/0/quic-v1";
    let (_bs, bs_addr) = bootstrap(&dir.path().join("bs"), &["--listen", quic]);
    assert!(bs_addr.contains("/quic-v1/"), "the bootstrap should print its QUIC address: {bs_addr}");
    let start =
        |who: &str| node(&dir.path().join(who), &["--listen", quic, "--bootstrap", &bs_addr, "--duration", "40"]);
    let (a, b): (Proc, Proc) = (start("a"), start("b"));
    let (_, ea) = a.rounds_until_exit(T);
    let (_, eb) = b.rounds_until_exit(T);
    let logs = format!("a:\n{}\nb:\n{}", a.stderr(), b.stderr());
    for (name, e, other) in [("a", &ea, &eb), ("b", &eb, &ea)] {
        let s = &e["status"];
        let listen: Vec<&str> = s["listen_addrs"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
        assert!(
            !listen.is_empty() && listen.iter().all(|a| a.contains("/udp/") && a.contains("/quic-v1/")),
            "{name} should listen on QUIC only: {listen:?}"
        );
        let other_id = other["status"]["peer_id"].as_str().unwrap();
        let peer = s["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["peer_id"] == other_id)
            .unwrap_or_else(|| panic!("{name} never met the other node:\n{logs}"));
        assert_eq!(peer["connection"], "quic", "{name} reaches the other node by {}:\n{logs}", peer["connection"]);
        let applied = peer["applied"].as_u64().unwrap_or(0);
        assert!(applied >= 3, "{name} applied {applied} of the other's updates:\n{logs}");
        let quic_bytes = s["bytes_in_by_connection"]["quic"].as_u64().unwrap_or(0);
        assert!(quic_bytes > 10_000, "{name} received {quic_bytes} bytes over QUIC: {s}");
        eprintln!("{name}: {applied} updates of the other applied, {quic_bytes} bytes in over QUIC");
    }
}
