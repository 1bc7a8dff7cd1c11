//! A malicious peer against two honest nodes: every kind of bad input is
//! rejected with its reason (visible in the honest node's status), the
//! honest replicas and ledgers are unaffected, and the attacker's gossip
//! score drops.

use std::time::Duration;

use ragtag_node::{identity, net};
use ragtag_protocol::{
    Keypair, Signed,
    codec::{CodecKind, Payload, encode},
    engine::Strategy,
    identity::Signable,
    ids::{Hash32, RunId, UpdateId},
    manifest::Manifest,
    wire::{Message, MessageKind, UpdateAnnouncement, WIRE_VERSION},
};
use ragtag_tests::{connected, free_port, node, peer_client};

const T: Duration = Duration::from_secs(120);

/// An update of the attacker's own, validly signed, with these values.
fn own_update(key: &Keypair, template: &UpdateAnnouncement, round: u64, codec: CodecKind, values: &[f32]) -> Message {
    let mut payload = Vec::new();
    encode(codec, values, &mut payload);
    let a = UpdateAnnouncement {
        id: UpdateId { src: key.node_id(), round },
        codec,
        num_values: values.len() as u64,
        payload_len: payload.len() as u64,
        payload_hash: Hash32::of(&payload),
        ..template.clone()
    };
    Message::Update { announcement: Signed::sign(&a, key), payload }
}

/// A client on the built-in run's topic.
fn client(key: &Keypair, addr: &str) -> (net::Client, tokio::sync::mpsc::Receiver<net::Event>) {
    peer_client(key, Manifest::builtin(Strategy::Gopals).run_id(), addr)
}

#[test]
fn every_bad_input_is_rejected_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let a = node(&dir.path().join("a"), &["--max-rounds", "16", "--metrics", &metrics]);
    let addr = a.listen_addr(T);
    let b = node(&dir.path().join("b"), &["--bootstrap", &addr, "--max-rounds", "14"]);

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let spy = identity::generate().unwrap();
    // Each attack comes from its own identity: gossipsub graylists a peer
    // after its first invalid message, so one identity would only ever get
    // one attack through.
    let keys: Vec<Keypair> = (0..9).map(|_| identity::generate().unwrap()).collect();
    let (attackers, clients) = rt.block_on(async {
        let (listener, mut events) = client(&spy, &addr);
        // Listen like an honest peer until we hold an update from each
        // honest node (a replay of a's own update would be a mere echo to a).
        let mut captured: Vec<Signed<UpdateAnnouncement>> = Vec::new();
        let mut payloads = Vec::new();
        let mut sources = std::collections::BTreeSet::new();
        while sources.len() < 2 {
            let ev = tokio::time::timeout(T, events.recv()).await.expect("honest gossip").expect("network");
            if let net::Event::Gossip { propagation_source, message_id, data, .. } = ev {
                listener.report(message_id, propagation_source, libp2p::gossipsub::MessageAcceptance::Accept).await;
                if let Ok(Message::Update { announcement, payload }) = Message::decode(&data)
                    && sources.insert(announcement.decode_unverified().unwrap().id.src)
                {
                    captured.push(announcement);
                    payloads.push(payload);
                }
            }
        }
        listener.shutdown().await;
        // Let the honest nodes apply them and warm up their norm guard.
        tokio::time::sleep(Duration::from_secs(9)).await;
        let honest = captured[0].decode_unverified().unwrap();
        let n = honest.num_values as usize;
        let values = Payload::parse(honest.codec, n, &payloads[0]).unwrap().to_vec();
        let mut attacks: Vec<(&str, Vec<u8>)> = Vec::new();
        // 1. A forged signature: someone else's update, signed by us.
        let forged = Signed::<UpdateAnnouncement>::from_parts(
            captured[0].body().to_vec(),
            keys[0].sign(UpdateAnnouncement::DOMAIN, captured[0].body()),
        );
        attacks
            .push(("bad_signature", Message::Update { announcement: forged, payload: payloads[0].clone() }.encode()));
        // 2. Replays of updates already applied (their announcements again).
        for c in &captured {
            attacks.push(("replay", Message::Announce(c.clone()).encode()));
        }
        // 3. An oversized message for its kind.
        let mut big = vec![WIRE_VERSION, MessageKind::Heartbeat as u8];
        big.resize(5_000, 1);
        attacks.push(("too_large", big));
        // 4. NaN values.
        let mut nan = values.clone();
        nan[7] = f32::NAN;
        attacks.push(("non_finite", own_update(&keys[4], &honest, 0, CodecKind::F32, &nan).encode()));
        // 5. The wrong shape.
        attacks.push(("shape_mismatch", own_update(&keys[5], &honest, 0, CodecKind::F32, &values[..n - 1]).encode()));
        // 6. A hundred times the norm of an honest update.
        let huge: Vec<f32> = values.iter().map(|v| v * 100.0).collect();
        attacks.push(("norm_too_large", own_update(&keys[6], &honest, 0, honest.codec, &huge).encode()));
        // 7. Another run.
        let mut other = honest.clone();
        other.run_id = RunId(Hash32([9; 32]));
        attacks.push(("wrong_run", own_update(&keys[7], &other, 0, honest.codec, &values).encode()));
        // 8. Garbage.
        attacks.push(("malformed", (0..300u32).map(|i| (i * 7919 % 251) as u8).collect()));

        let mut clients = Vec::new();
        for key in &keys[..attacks.len()] {
            let (c, events) = client(key, &addr);
            connected(events).await;
            clients.push(c);
        }
        // Give gossipsub a heartbeat to exchange subscriptions.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for (c, (_, bytes)) in clients.iter().zip(&attacks) {
            c.publish(bytes.clone()).await.unwrap();
        }
        // Keep the connections while the honest nodes report.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let attackers: Vec<(String, String)> = clients
            .iter()
            .zip(&attacks)
            .map(|(c, (reason, _))| (reason.to_string(), c.local_peer_id().to_string()))
            .collect();
        (attackers, clients) // still connected while we read a's status
    });

    // The honest node saw each attack and says why it refused it.
    let status = ragtag_tests::status_json(&metrics);
    for (reason, _) in &attackers {
        let n = status["rejected"][reason.as_str()].as_u64().unwrap_or(0);
        assert!(n >= 1, "a did not reject with {reason}: {}", status["rejected"]);
    }
    // Misbehaviour costs gossip score; a replay is only ignored (whether an
    // update was applied depends on the receiver, and honest peers forward).
    for (reason, peer) in attackers.iter().filter(|(r, _)| r != "replay") {
        let score = status["peer_scores"][peer.as_str()].as_f64();
        assert!(
            score.is_some_and(|s| s < 0.0),
            "{reason}: the attacker's score should drop: {score:?} in {}",
            status["peer_scores"]
        );
    }

    drop(clients);

    let (ra, ea) = a.rounds_until_exit(T);
    let (rb, _) = b.rounds_until_exit(T);
    // Nothing of the attacker was applied: versions count only honest updates,
    // and the honest replicas agree whenever they hold the same updates.
    let rounds_a = ea["outcome"]["rounds"].as_u64().unwrap();
    let max_version = ra.iter().filter_map(|r| r["version"].as_u64()).max().unwrap_or(0);
    assert!(max_version <= rounds_a + 14, "a holds more updates ({max_version}) than the honest nodes made");
    let mut pairs = 0;
    for x in &ra {
        for y in rb.iter().filter(|y| y["version"] == x["version"]) {
            assert!(ragtag_tests::sketch_distance(&x["sketch"], &y["sketch"]) < 1e-4, "honest replicas diverged");
            pairs += 1;
        }
    }
    assert!(pairs >= 2);
    // And the honest ledger has no record about the attacker.
    let export = std::process::Command::new(ragtag_tests::bin("ragtag"))
        .args(["ledger", "export", "--state", dir.path().join("a/state").to_str().unwrap()])
        .output()
        .unwrap();
    let export = String::from_utf8_lossy(&export.stdout);
    assert!(export.lines().count() > 5);
    for key in keys.iter().chain([&spy]) {
        assert!(!export.contains(&key.node_id().to_hex()), "an attacker reached a's ledger");
    }
}
