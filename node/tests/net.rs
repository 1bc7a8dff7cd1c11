//! Two network tasks on loopback, as the node runs them.

use std::time::Duration;

use libp2p::identity::Keypair;
use ragtag_node::net;

const T: Duration = Duration::from_secs(30);
/// AutoNAT probes 2 s after start, or 90 s later when b had no peer yet.
const PROBE: Duration = Duration::from_secs(120);

fn spawn(bootstrap: Vec<libp2p::Multiaddr>) -> (net::Client, tokio::sync::mpsc::Receiver<net::Event>) {
    let cfg = net::Config::loopback_client(Keypair::generate_ed25519(), "ragtag/net-test", bootstrap, None);
    let mut registry = prometheus_client::registry::Registry::default();
    let (client, events, _task) = net::spawn(cfg, &mut registry).unwrap();
    (client, events)
}

/// AutoNAT proves a peer reachable by dialing it back on a fresh connection.
/// Gossipsub's mesh would keep that connection alive for good, so every
/// probe used to add one; the server closes it once the probe is answered.
#[tokio::test]
async fn a_reachability_probe_leaves_one_connection_per_peer() {
    let (a, mut a_events) = spawn(Vec::new());
    let a_addr = loop {
        match tokio::time::timeout(T, a_events.recv()).await.expect("a listens").expect("network") {
            net::Event::Listening(addr) => break addr,
            _ => continue,
        }
    };
    tokio::spawn(async move { while a_events.recv().await.is_some() {} });
    let (b, mut b_events) = spawn(vec![a_addr]);
    // b asks a (its only peer) to dial it back; the answer is "public".
    loop {
        match tokio::time::timeout(PROBE, b_events.recv()).await.expect("b's probe is answered").expect("network") {
            net::Event::Reachability(r) if r == "public" => break,
            _ => continue,
        }
    }
    tokio::spawn(async move { while b_events.recv().await.is_some() {} });
    // The dial-back was established before the answer went out; give its
    // close a moment to reach both sides.
    let mut counts = (0, 0);
    for _ in 0..50 {
        counts = (a.info().await.unwrap().connections, b.info().await.unwrap().connections);
        if counts == (1, 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(counts, (1, 1), "connections at a and b after the probe");
    // And it stays that way: nothing else reopens it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(a.info().await.unwrap().connections, 1);
    assert_eq!(b.info().await.unwrap().connections, 1);
}
