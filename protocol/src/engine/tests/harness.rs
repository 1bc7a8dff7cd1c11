//! The tests' event loop: constant latency, every message delivered
//! unless a partition is set; aggregated dissemination's sums included.

use std::{cmp::Reverse, collections::BinaryHeap};

use super::*;

#[derive(Debug)]
pub(super) enum Ev {
    Timeout(usize, u64),
    Input(usize, Box<Input>),
}

/// A minimal event loop: constant latency, every message delivered.
pub(super) struct Harness {
    pub(super) engines: Vec<Engine>,
    pub(super) speeds: Vec<f64>,
    pub(super) latency: Micros,
    pub(super) queue: BinaryHeap<Reverse<(Micros, u64, usize)>>,
    pub(super) events: BTreeMap<u64, Ev>,
    pub(super) seq: u64,
    pub(super) timer_gen: Vec<u64>,
    pub(super) payloads: BTreeMap<UpdateId, Vec<u8>>,
    pub(super) announcements: BTreeMap<UpdateId, UpdateAnnouncement>,
    pub(super) applied_log: std::collections::BTreeSet<(usize, UpdateId)>,
    pub(super) dropped: Vec<(usize, RejectReason)>,
    pub(super) lr: f32,
    pub(super) now: Micros,
    /// Messages between the two sides are lost while `now` is in the window.
    pub(super) partition: Option<(Micros, Micros, usize)>,
    /// Holders serve an announcement only this long after it was published
    /// (a node's store keeps recent rounds); `None`: forever.
    pub(super) served_for: Option<Micros>,
    pub(super) published_at: BTreeMap<UpdateId, Micros>,
    /// Aggregate bodies by (tick, group, hash), served by anyone asked.
    pub(super) aggregates: BTreeMap<(u64, u32, Hash32), Arc<Vec<u8>>>,
    /// Who published each aggregate body.
    pub(super) aggregators: Vec<NodeId>,
    /// These nodes' sums are replaced by forged ones (same members, other
    /// values: every byte 0x3f, or the honest values times `forge_scale`,
    /// so that two forgers of one group agree on the forgery).
    pub(super) forgers: Vec<usize>,
    pub(super) forge_scale: Option<f32>,
    /// (tick, group, hash) of each forged sum published.
    pub(super) forged: Vec<(u64, u32, Hash32)>,
    /// Payloads and sums delivered to each node.
    pub(super) received: Vec<u64>,
    /// Sums reach this node this much later than others, until the time
    /// given: (node, extra latency, until).
    pub(super) slow_sums: Option<(usize, Micros, Micros)>,
    /// Late sums each node put back into their tick.
    pub(super) replayed: Vec<u64>,
    /// Payloads fetched by one node arrive later than the latency while
    /// given: (node, extra latency, until).
    pub(super) slow_payloads: Option<(usize, Micros, Micros)>,
    /// Late updates each node put back into their tick.
    pub(super) updates_replayed: Vec<u64>,
    /// Far replicas each node took whole (founders that trained apart).
    pub(super) far_replicas_taken: Vec<u64>,
}

impl Harness {
    pub(super) fn new(cfg: EngineConfig, speeds: &[f64], seed: u64) -> Self {
        let run = RunId(Hash32([9; 32]));
        let engines = speeds
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let me = Keypair::deterministic(seed, k as u64).node_id();
                Engine::new(cfg, me, run, Micros::ZERO, vec![0.0; DIM], *s as f32, seed + k as u64)
            })
            .collect();
        let mut h = Self {
            engines,
            speeds: speeds.to_vec(),
            latency: Micros(10_000),
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            seq: 0,
            timer_gen: vec![0; speeds.len()],
            payloads: BTreeMap::new(),
            announcements: BTreeMap::new(),
            applied_log: std::collections::BTreeSet::new(),
            dropped: Vec::new(),
            lr: 0.02,
            now: Micros::ZERO,
            partition: None,
            served_for: None,
            published_at: BTreeMap::new(),
            aggregates: BTreeMap::new(),
            aggregators: Vec::new(),
            forgers: Vec::new(),
            forge_scale: None,
            forged: Vec::new(),
            received: vec![0; speeds.len()],
            slow_sums: None,
            replayed: vec![0; speeds.len()],
            slow_payloads: None,
            updates_replayed: vec![0; speeds.len()],
            far_replicas_taken: vec![0; speeds.len()],
        };
        for k in 0..speeds.len() {
            h.push(Micros::ZERO, Ev::Input(k, Box::new(Input::Start)));
        }
        h
    }

    pub(super) fn push(&mut self, at: Micros, ev: Ev) {
        self.seq += 1;
        let node = match &ev {
            Ev::Timeout(k, _) | Ev::Input(k, _) => *k,
        };
        self.queue.push(Reverse((at, self.seq, node)));
        self.events.insert(self.seq, ev);
    }

    pub(super) fn link_up(&self, a: usize, b: usize) -> bool {
        match self.partition {
            Some((from, to, split)) if self.now >= from && self.now < to => (a < split) == (b < split),
            _ => true,
        }
    }

    /// When a sum sent now reaches node `to`.
    fn sum_arrival(&self, to: usize) -> Micros {
        let extra = match self.slow_sums {
            Some((k, extra, until)) if k == to && self.now < until => extra,
            _ => Micros::ZERO,
        };
        self.now + self.latency + extra
    }

    pub(super) fn index_of(&self, id: &NodeId) -> usize {
        self.engines.iter().position(|e| e.node_id() == *id).expect("known node")
    }

    pub(super) fn run_until(&mut self, end: Micros) {
        while let Some(Reverse((at, seq, _))) = self.queue.peek().copied() {
            if at > end {
                break;
            }
            self.queue.pop();
            self.now = at;
            let ev = self.events.remove(&seq).expect("event stored");
            let k = match ev {
                Ev::Timeout(k, generation) => {
                    if generation != self.timer_gen[k] {
                        continue;
                    }
                    self.engines[k].handle_timeout(at);
                    k
                }
                Ev::Input(k, input) => {
                    self.engines[k].handle(at, *input);
                    k
                }
            };
            self.drain(k);
        }
        self.now = end;
    }

    pub(super) fn drain(&mut self, k: usize) {
        let now = self.now;
        let lat = self.latency;
        while let Some(out) = self.engines[k].poll_output() {
            match out {
                Output::StartLocalPhase(p) => {
                    let r = toy_phase(k, &p, self.lr);
                    let dt = Micros::from_secs_f64((p.steps as f64 + p.partial as f64) / self.speeds[k]);
                    self.push(now + dt, Ev::Input(k, Box::new(Input::LocalPhaseDone(r))));
                }
                Output::Publish(p) => {
                    let id = p.announcement.id;
                    self.payloads.insert(id, p.payload.as_ref().clone());
                    self.announcements.insert(id, p.announcement.clone());
                    self.published_at.insert(id, now);
                    for j in 0..self.engines.len() {
                        let to = self.engines[j].node_id();
                        if j != k && self.link_up(k, j) && (p.to.is_empty() || p.to.contains(&to)) {
                            let input = Input::Announcement { announcement: p.announcement.clone(), from: id.src };
                            self.push(now + lat, Ev::Input(j, Box::new(input)));
                        }
                    }
                }
                Output::FetchPayload { id, .. } => {
                    self.received[k] += 1;
                    let bytes = Arc::new(self.payloads[&id].clone());
                    let extra = match self.slow_payloads {
                        Some((slow, extra, until)) if slow == k && now < until => extra,
                        _ => Micros::ZERO,
                    };
                    self.push(now + lat + extra, Ev::Input(k, Box::new(Input::Payload { id, bytes })));
                }
                Output::PublishAggregate { mut announcement, mut body } => {
                    if self.forgers.contains(&k) {
                        let mut forged = crate::aggregate::Aggregate::decode(&body, CodecKind::F32, DIM).unwrap();
                        match self.forge_scale {
                            None => forged.payload.iter_mut().for_each(|b| *b = 0x3f),
                            Some(scale) => {
                                let values = crate::codec::Payload::parse(CodecKind::F32, DIM, &forged.payload)
                                    .unwrap()
                                    .to_vec()
                                    .iter()
                                    .map(|v| v * scale)
                                    .collect::<Vec<f32>>();
                                forged.payload.clear();
                                crate::codec::encode(CodecKind::F32, &values, &mut forged.payload);
                            }
                        }
                        body = Arc::new(forged.encode());
                        announcement.body_hash = Hash32::of(&body);
                        announcement.body_len = body.len() as u64;
                        self.forged.push((announcement.key, announcement.group, announcement.body_hash));
                    }
                    let from = announcement.aggregator;
                    self.aggregators.push(from);
                    self.aggregates.insert((announcement.key, announcement.group, announcement.body_hash), body);
                    for j in 0..self.engines.len() {
                        if j != k && self.link_up(k, j) {
                            let input = Input::AggregateAnnouncement { announcement: announcement.clone(), from };
                            self.push(now + lat, Ev::Input(j, Box::new(input)));
                        }
                    }
                }
                Output::SendAggregate { key, group, to, body, .. } => {
                    let from = self.engines[k].node_id();
                    for j in 0..self.engines.len() {
                        if to.contains(&self.engines[j].node_id()) && self.link_up(k, j) {
                            self.received[j] += 1;
                            let input = Input::AggregateBody { key, group, from, bytes: body.clone() };
                            self.push(self.sum_arrival(j), Ev::Input(j, Box::new(input)));
                        }
                    }
                }
                Output::FetchAggregate { key, group, from, hash, .. } => {
                    let input = match self.aggregates.get(&(key, group, hash)) {
                        Some(bytes) if self.link_up(k, self.index_of(&from)) => {
                            self.received[k] += 1;
                            Input::AggregateBody { key, group, from, bytes: bytes.clone() }
                        }
                        _ => Input::AggregateFetchFailed { key, group, from },
                    };
                    self.push(self.sum_arrival(k), Ev::Input(k, Box::new(input)));
                }
                Output::FetchAnnouncement { id, from } => {
                    let gone = self.served_for.is_some_and(|d| self.published_at[&id] + d < now);
                    let input = if gone {
                        Input::AnnouncementGone(id)
                    } else {
                        Input::Announcement { announcement: self.announcements[&id].clone(), from }
                    };
                    self.push(now + lat, Ev::Input(k, Box::new(input)));
                }
                Output::AnnounceHeld { id, .. } => {
                    let from = self.engines[k].node_id();
                    for j in 0..self.engines.len() {
                        if j != k && self.link_up(k, j) {
                            self.push(now + lat, Ev::Input(j, Box::new(Input::PayloadSource { id, from })));
                        }
                    }
                }
                Output::SendHeartbeat(hb) => {
                    for j in 0..self.engines.len() {
                        if j != k && self.link_up(k, j) {
                            self.push(now + lat, Ev::Input(j, Box::new(Input::Heartbeat(hb.clone()))));
                        }
                    }
                }
                Output::AntiEntropy { peer, digest } => {
                    let j = self.index_of(&peer);
                    if !self.link_up(k, j) {
                        continue;
                    }
                    let me = self.engines[k].node_id();
                    let back = self.engines[j].digest();
                    self.push(now + lat, Ev::Input(j, Box::new(Input::PeerDigest { from: me, digest })));
                    self.push(now + lat + lat, Ev::Input(k, Box::new(Input::PeerDigest { from: peer, digest: back })));
                }
                Output::FetchAnchor { from } => {
                    let j = self.index_of(&from);
                    let state = Box::new(self.engines[j].replica_state());
                    self.push(now + lat, Ev::Input(k, Box::new(Input::PeerAnchor { from, state })));
                }
                Output::Record(_) => {}
                Output::Event(EngineEvent::Applied { id, .. }) => {
                    assert!(self.applied_log.insert((k, id)), "node {k} applied {id:?} twice");
                }
                Output::Event(EngineEvent::Dropped { reason, .. }) => self.dropped.push((k, reason)),
                Output::Event(EngineEvent::AggregateReplayed { .. }) => self.replayed[k] += 1,
                Output::Event(EngineEvent::UpdateReplayed { .. }) => self.updates_replayed[k] += 1,
                Output::Event(EngineEvent::FarReplicaTaken { .. }) => self.far_replicas_taken[k] += 1,
                Output::Event(_) => {}
            }
        }
        self.timer_gen[k] += 1;
        if let Some(t) = self.engines[k].poll_timeout() {
            let generation = self.timer_gen[k];
            self.push(t.max(now), Ev::Timeout(k, generation));
        }
    }

    pub(super) fn distance_to(&self, k: usize, opt: &[f32]) -> f32 {
        self.engines[k].anchor().iter().zip(opt).map(|(a, b)| (a - b).powi(2)).sum::<f32>().sqrt()
    }
}
