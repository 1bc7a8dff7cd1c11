//! An anti-entropy exchange driven by a peer: any bytes as a digest
//! message, then any bytes as the replica state it serves, into an engine
//! that has applied updates from that peer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{
    engine::{Engine, EngineConfig, Input, ReplicaState, Strategy},
    ids::{Hash32, NodeId, RunId},
    time::Micros,
    wire::Message,
};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let (digest, state) = rest.split_at((split as usize * 16).min(rest.len()));
    let run = RunId(Hash32([0; 32]));
    let cfg = EngineConfig::preset(Strategy::Gopals);
    let mut e = Engine::new(cfg, NodeId([3; 32]), run, Micros::ZERO, vec![1.0; 16], 1.0, 0);
    e.handle(Micros::ZERO, Input::Start);
    let peer = NodeId([2; 32]);
    if let Ok(Message::Digest(mut d)) = Message::decode(digest) {
        d.run_id = run;
        e.handle(Micros(1), Input::PeerDigest { from: peer, digest: d });
    }
    while e.poll_output().is_some() {}
    if let Ok(s) = postcard::from_bytes::<ReplicaState>(state)
        && s.verify(&cfg, 16).is_ok()
    {
        e.handle(Micros(2), Input::PeerAnchor { from: peer, state: Box::new(s) });
    }
    while e.poll_output().is_some() {}
    assert!(e.anchor().iter().all(|x| x.is_finite()));
});
