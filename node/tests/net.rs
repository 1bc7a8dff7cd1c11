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

/// Starts a holder serving `bytes` as payload chunks; chunks further into
/// the payload are answered sooner, so a fetch with several in flight gets
/// them out of order. `tamper` may change the chunk at an offset.
async fn holder(bytes: Vec<u8>, tamper: fn(&mut ragtag_protocol::wire::Chunk)) -> (libp2p::PeerId, libp2p::Multiaddr) {
    use ragtag_protocol::{
        ids::Hash32,
        wire::{Chunk, Message},
    };
    let (server, mut events) = spawn(Vec::new());
    let addr = loop {
        match tokio::time::timeout(T, events.recv()).await.expect("holder listens").expect("network") {
            net::Event::Listening(addr) => break addr,
            _ => continue,
        }
    };
    let hash = Hash32::of(&bytes);
    let peer = server.local_peer_id();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            let net::Event::Request { id, message: Message::PayloadRequest(r), .. } = ev else { continue };
            let start = (r.offset as usize).min(bytes.len());
            let end = (start + r.max_len as usize).min(bytes.len());
            let mut chunk =
                Chunk { total_len: bytes.len() as u64, offset: r.offset, hash, bytes: bytes[start..end].to_vec() };
            tamper(&mut chunk);
            let (server, later) = (server.clone(), 200u64.saturating_sub(r.offset >> 14));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(later)).await;
                let _ = server.respond(id, Message::PayloadChunk(chunk)).await;
            });
        }
    });
    (peer, addr)
}

async fn fetch(
    bytes: &[u8],
    tamper: fn(&mut ragtag_protocol::wire::Chunk),
) -> Result<Vec<u8>, ragtag_node::runtime::FetchError> {
    let (peer, addr) = holder(bytes.to_vec(), tamper).await;
    let (client, mut events) = spawn(vec![addr]);
    loop {
        match tokio::time::timeout(T, events.recv()).await.expect("connects").expect("network") {
            net::Event::Connected(p) if p == peer => break,
            _ => continue,
        }
    }
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let id = ragtag_protocol::ids::UpdateId { src: ragtag_protocol::NodeId([1; 32]), round: 3 };
    ragtag_node::runtime::fetch_payload(&client, peer, id, bytes.len() as u64).await
}

/// A payload of several chunks comes with several requests in flight,
/// answered out of order, and is put together in order.
#[tokio::test]
async fn a_payload_of_several_chunks_arrives_whole_when_chunks_come_out_of_order() {
    const { assert!(ragtag_node::runtime::PAYLOAD_CHUNKS_IN_FLIGHT > 1) };
    let len = 3 * ragtag_protocol::wire::MAX_CHUNK_BYTES + 12_345;
    let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let got = fetch(&bytes, |_| {}).await.expect("the payload");
    assert!(got == bytes, "the payload's bytes differ");
}

/// A chunk that does not fit the others fails the fetch, whichever order
/// the chunks came in.
#[tokio::test]
async fn a_payload_with_an_inconsistent_chunk_is_refused() {
    let len = 2 * ragtag_protocol::wire::MAX_CHUNK_BYTES + 7;
    let bytes = vec![9u8; len];
    let lie = |c: &mut ragtag_protocol::wire::Chunk| {
        if c.offset > 0 {
            c.total_len += 1;
        }
    };
    let err = fetch(&bytes, lie).await.expect_err("an inconsistent chunk");
    assert!(matches!(err, ragtag_node::runtime::FetchError::Chunks(_)), "{err}");
}

async fn listening(events: &mut tokio::sync::mpsc::Receiver<net::Event>) -> libp2p::Multiaddr {
    loop {
        match tokio::time::timeout(T, events.recv()).await.expect("listens").expect("network") {
            net::Event::Listening(addr) => break addr,
            _ => continue,
        }
    }
}

async fn connected_to(events: &mut tokio::sync::mpsc::Receiver<net::Event>, peer: libp2p::PeerId) {
    loop {
        match tokio::time::timeout(T, events.recv()).await.expect("connects").expect("network") {
            net::Event::Connected(p) if p == peer => break,
            _ => continue,
        }
    }
}

fn drain(mut events: tokio::sync::mpsc::Receiver<net::Event>) {
    tokio::spawn(async move { while events.recv().await.is_some() {} });
}

/// A holder announces itself to each new peer in its routing table, so a
/// node that connects to it keeps its record; kad's first answer to a lookup comes from that
/// store without asking anyone. Taken as the list, it named one holder
/// of a run two held (and start-up then waited for one peer only).
#[tokio::test]
async fn a_provider_lookup_names_every_holder_not_only_those_in_our_store() {
    let key = net::run_key(&ragtag_protocol::ids::RunId(ragtag_protocol::ids::Hash32([7; 32])));
    let (a, mut a_events) = spawn(Vec::new());
    let a_addr = listening(&mut a_events).await;
    a.provide(key.clone()).await.unwrap();
    let a_id = net::peer_of(&a_addr).unwrap();
    drain(a_events);
    let (b, mut b_events) = spawn(vec![a_addr]);
    let b_addr = listening(&mut b_events).await;
    let b_id = net::peer_of(&b_addr).unwrap();
    connected_to(&mut b_events, a_id).await;
    b.provide(key.clone()).await.unwrap();
    drain(b_events);
    // Past b's 5-s gap between announcements, so that it announces itself
    // to c when c enters its routing table; a's record reached b when b
    // entered a's.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (c, mut c_events) = spawn(vec![b_addr]);
    connected_to(&mut c_events, b_id).await;
    drain(c_events);
    // Time for b's record to reach c's store, so that kad's first answer
    // comes from there (the case this test is about; with or without it,
    // both holders must be named).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut found = c.find_providers(key).await.unwrap();
    found.sort();
    let mut both = vec![a_id, b_id];
    both.sort();
    assert_eq!(found, both);
}
