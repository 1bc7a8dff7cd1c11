//! A malicious peer against an aggregated run (`swarm new --aggregate 2`):
//! signed sum hashes it has no right to sign, or that no replica could
//! count, are refused by the honest node with their reason and go no
//! further on gossip; the malformed ones cost the sender gossip score, the
//! one an honest replica a tick behind could also refuse (not a designated
//! aggregator) does not; a sum offered by a node that is not our parent in
//! the group's tree is refused; the honest replicas, two of which join
//! while the attackers are connected and silent, stay identical.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use ragtag_node::{identity, manifest_file, net};
use ragtag_protocol::{
    Keypair, Signed,
    aggregate::AggregateAnnouncement,
    ids::{Hash32, RunId},
    wire::{AggregateOffer, ErrorReply, Message},
};
use ragtag_tests::{connected, free_port, node, peer_client as client, sketch_distance, status_json};

const T: Duration = Duration::from_secs(120);

#[test]
fn forged_sum_hashes_and_offers_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = ragtag_tests::aggregated_manifest(dir.path(), 2);
    let run = manifest_file::read(&manifest).unwrap().run_id();
    let m = manifest.to_str().unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let a = node(&dir.path().join("a"), &["--manifest", m, "--duration", "40", "--metrics", &metrics]);
    let addr = a.listen_addr(T);
    let a_peer = net::peer_of(&addr.parse().unwrap()).expect("a's peer id");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    // Each attack from its own identity: gossipsub graylists a peer after
    // its first invalid message.
    let keys: Vec<Keypair> = (0..4).map(|_| identity::generate().unwrap()).collect();
    let spy = identity::generate().unwrap();
    let (attackers, offer_reply, clients, honest) = rt.block_on(async {
        // Listen like an honest peer, keeping the newest honest sum hash:
        // a forged one must name a tick the honest node still takes.
        let (listener, mut events) = client(&spy, run, &addr);
        let newest: Arc<std::sync::Mutex<Option<AggregateAnnouncement>>> = Arc::default();
        let seen = Arc::new(AtomicU64::new(0));
        let (keep, count) = (newest.clone(), seen.clone());
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                if let net::Event::Gossip { propagation_source, message_id, data, .. } = ev {
                    listener.report(message_id, propagation_source, libp2p::gossipsub::MessageAcceptance::Accept).await;
                    if let Ok(Message::AggregateAnnounce(s)) = Message::decode(&data) {
                        *keep.lock().unwrap() = Some(s.decode_unverified().unwrap());
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        let mut clients = Vec::new();
        for key in &keys {
            let (c, events) = client(key, run, &addr);
            connected(events).await;
            clients.push(c);
        }
        // The honest nodes join while our clients, on the run's topic, never
        // answer their state requests: a joiner must not wait on them so
        // long that the state it did get is old (it fell out of step, 2 of 2
        // runs, before the heads' grace of this change).
        let honest: Vec<_> = [("b", "1"), ("c", "2")]
            .iter()
            .map(|(n, slowdown)| {
                node(
                    &dir.path().join(n),
                    &["--manifest", m, "--bootstrap", &addr, "--duration", "40", "--slowdown", slowdown],
                )
            })
            .collect();
        let waited = tokio::time::Instant::now();
        while seen.load(Ordering::Relaxed) < 6 {
            assert!(waited.elapsed() < T, "no honest sum hashes on gossip");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let template = newest.lock().unwrap().clone().unwrap();
        let forge = |key: &Keypair, a: AggregateAnnouncement| {
            Message::AggregateAnnounce(Signed::sign(&AggregateAnnouncement { aggregator: key.node_id(), ..a }, key))
                .encode()
        };
        let body_hash = Hash32([7; 32]);
        let attacks = [
            // Validly signed, for a tick being summed, by a node no roster designates.
            ("not_an_aggregator", forge(&keys[0], AggregateAnnouncement { body_hash, ..template.clone() })),
            // A group the run does not have.
            ("aggregate_mismatch", forge(&keys[1], AggregateAnnouncement { group: 99, ..template.clone() })),
            // Another run.
            (
                "wrong_run",
                forge(&keys[2], AggregateAnnouncement { run_id: RunId(Hash32([9; 32])), ..template.clone() }),
            ),
        ];
        for (c, (_, bytes)) in clients.iter().zip(&attacks) {
            c.publish(bytes.clone()).await.unwrap();
        }
        // A sum offered to a by a node that is not its parent in any tree.
        let offer = AggregateOffer { run_id: run, key: template.key, group: 0, hash: body_hash, len: 100 };
        let offer_reply = clients[3].request(a_peer, Message::AggregateOffer(offer)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let attackers: Vec<(&str, String)> =
            clients.iter().zip(&attacks).map(|(c, (reason, _))| (*reason, c.local_peer_id().to_string())).collect();
        (attackers, offer_reply, clients, honest)
    });

    let status = status_json(&metrics);
    for (reason, peer) in &attackers {
        let n = status["rejected"][*reason].as_u64().unwrap_or(0);
        assert!(n >= 1, "a did not refuse a sum's hash with {reason}: {}", status["rejected"]);
        let score = status["peer_scores"][peer.as_str()].as_f64();
        if *reason == "not_an_aggregator" {
            // Ignored, not punished: a replica a tick behind refuses honest ones so.
            assert!(!score.is_some_and(|s| s < 0.0), "{reason} cost score: {score:?}");
        } else {
            assert!(score.is_some_and(|s| s < 0.0), "{reason}: the sender's score should drop: {score:?}");
        }
    }
    assert!(
        matches!(offer_reply, Ok(Message::Error(ErrorReply::BadRequest))),
        "an offer from a non-parent was taken: {offer_reply:?}"
    );
    assert!(a.stderr().contains("a sum offer from a node not our parent"), "a did not say why:\n{}", a.stderr());
    drop(clients);

    // Nothing forged was applied: the honest replicas agree at every version they share.
    let runs: Vec<_> = std::iter::once(&a).chain(&honest).map(|n| n.rounds_until_exit(T).0).collect();
    let mut compared = 0;
    for (i, x) in runs.iter().enumerate() {
        for y in &runs[i + 1..] {
            for r in x {
                for s in y.iter().filter(|s| s["version"] == r["version"]) {
                    assert_eq!(sketch_distance(&r["sketch"], &s["sketch"]), 0.0, "replicas differ at {}", r["version"]);
                    compared += 1;
                }
            }
        }
    }
    assert!(compared >= 10, "too few rounds at equal versions to compare: {compared}");
}
