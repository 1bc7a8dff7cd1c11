//! In a private swarm credit comes from members only: a member that
//! gossips a receipt signed by a key outside the allowlist (to mint credit
//! for someone with keys it made up) has it refused with reason
//! `not_allowed`; a receipt signed by a member passes. The same holds for
//! receipts sent straight to the node as an update's author (the path
//! receipts take between connected nodes), and a batch over the size limit
//! sent that way is refused as `too_large`.

use std::time::Duration;

use ragtag_node::{identity, net, swarm_key};
use ragtag_protocol::{
    engine::Strategy,
    ids::{Hash32, UpdateId},
    ledger::{LedgerWriter, ReceiptOutcome, RecordKind},
    manifest::Manifest,
    wire::{MAX_RECEIPTS_PER_MESSAGE, Message},
};
use ragtag_tests::{free_port, node, status_json};

const T: Duration = Duration::from_secs(120);

#[test]
fn receipts_signed_outside_the_allowlist_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let psk_path = dir.path().join("swarm.key");
    std::fs::write(&psk_path, format!("/key/swarm/psk/1.0.0/\n/base16/\n{}\n", "7".repeat(64))).unwrap();
    let member = identity::generate().unwrap();
    let member_peer = libp2p::PeerId::from(identity::libp2p_keypair(&member).public()).to_string();
    let metrics = format!("127.0.0.1:{}", free_port());
    let a = node(
        dir.path(),
        &[
            "--swarm-key",
            psk_path.to_str().unwrap(),
            "--allow",
            &member_peer,
            "--metrics",
            &metrics,
            "--max-rounds",
            "40",
        ],
    );
    let addr = a.listen_addr(T);
    a.wait_json("round", T).unwrap_or_else(|| panic!("a does not train:\n{}", a.stderr()));

    let run = Manifest::builtin(Strategy::Gopals).run_id();
    let receipt = |signer: &ragtag_protocol::Keypair| {
        LedgerWriter::new(signer.clone(), run).next(
            0,
            RecordKind::Receipt {
                update: UpdateId { src: member.node_id(), round: 0 },
                payload_hash: Hash32::default(),
                samples: 1_000_000,
                outcome: ReceiptOutcome::Accepted { weight: 1.0, staleness: 0 },
            },
        )
    };
    let outsider = identity::generate().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let psk = swarm_key::load(&psk_path).unwrap();
        let cfg = net::Config::loopback_client(
            identity::libp2p_keypair(&member),
            &format!("ragtag/{run}"),
            vec![addr.parse().unwrap()],
            Some(psk),
        );
        let mut reg = prometheus_client::registry::Registry::default();
        let (client, mut events, _task) = net::spawn(cfg, &mut reg).unwrap();
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        tokio::time::sleep(Duration::from_secs(3)).await; // connection, subscriptions, mesh
        client.publish(Message::Receipts(vec![receipt(&member)]).encode()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = status_json(&metrics)["rejected"]["not_allowed"].as_u64().unwrap_or(0);
        assert_eq!(before, 0, "a member's receipt was refused: {}", status_json(&metrics)["rejected"]);
        client.publish(Message::Receipts(vec![receipt(&outsider)]).encode()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rejected = status_json(&metrics)["rejected"].clone();
        assert_eq!(rejected["not_allowed"].as_u64(), Some(1), "the outsider's receipt was not refused: {rejected}");

        // Sent straight to the node, by request-response.
        let a_peer: libp2p::PeerId = addr.rsplit('/').next().unwrap().parse().unwrap();
        let answer = client.request(a_peer, Message::Receipts(vec![receipt(&member)])).await.unwrap();
        assert_eq!(answer, Message::Ack, "a member's receipt, sent directly, was not taken");
        let answer = client.request(a_peer, Message::Receipts(vec![receipt(&outsider)])).await.unwrap();
        assert!(matches!(answer, Message::Error(_)), "an outsider's receipt, sent directly, was taken: {answer:?}");
        let over = vec![receipt(&member); MAX_RECEIPTS_PER_MESSAGE + 1];
        let answer = client.request(a_peer, Message::Receipts(over)).await;
        assert!(!matches!(answer, Ok(Message::Ack)), "a batch over the limit was taken: {answer:?}");
        tokio::time::sleep(Duration::from_secs(2)).await; // the status refreshes every second
        client.shutdown().await;
    });
    let rejected = status_json(&metrics)["rejected"].clone();
    assert_eq!(
        rejected["not_allowed"].as_u64(),
        Some(2),
        "the directly sent outsider's receipt was not refused: {rejected}"
    );
    assert_eq!(rejected["too_large"].as_u64(), Some(1), "the oversized batch was not refused as too_large: {rejected}");
}
