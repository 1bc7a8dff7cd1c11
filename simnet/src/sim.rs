//! The discrete-event loop: a priority queue of timestamped events over
//! real engines and real trainers, a modelled clock and network.
//!
//! The simulator decides only what the world does (how long compute
//! takes, when messages arrive, who crashes); every decision of the
//! protocol is the engine's. Invariants are checked after every event.

mod node;

use std::{
    cmp::{Ordering, Reverse},
    collections::{BTreeMap, BinaryHeap},
    sync::Arc,
};

use anyhow::{Context, Result};
use node::{NodeState, SimNode};
use ragtag_models::{
    Trainer, TrainerConfig,
    data::{Dataset, Shard},
    device::DeviceChoice,
};
use ragtag_protocol::{
    engine::{EngineEvent, Input, Output, ReplicaState, Strategy, anti_entropy::relative_distance},
    ids::{NodeId, RunId, UpdateId},
    manifest::Manifest,
    time::Micros,
    wire::{Heartbeat, ReplicaDigest, UpdateAnnouncement},
};

use crate::{
    measure::{LayerRecorder, Sample, Tally},
    network::Network,
    scenario::{EventKind, Scenario},
    speed,
};

/// Payloads up to this size travel inline with their announcement (one
/// gossip message), as the node does; larger ones are fetched.
pub const INLINE_PAYLOAD_BYTES: usize = 48 * 1024;
/// Wire overhead of a signed announcement beyond its body.
const SIGNED_OVERHEAD: usize = 72;
/// Size of a heartbeat on the wire.
const HEARTBEAT_BYTES: usize = 120;
/// Size of a fetch request.
const REQUEST_BYTES: usize = 64;
/// Published updates stay fetchable this long (virtual seconds).
const STORE_RETAIN_S: f64 = 900.0;

/// How a run is set up.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The strategy every node runs.
    pub strategy: Strategy,
    /// Added to the scenario's seed.
    pub seed: u64,
    /// Show a progress bar on a terminal.
    pub progress: bool,
    /// ddp's learning rate (default: the inner rate).
    pub ddp_lr: Option<f32>,
}

/// What a published update is, kept for fetches.
#[derive(Debug)]
struct Published {
    announcement: UpdateAnnouncement,
    payload: Arc<Vec<u8>>,
}

#[derive(Clone, Debug)]
enum Delivery {
    Update { id: UpdateId, from: NodeId },
    Announce { id: UpdateId, from: NodeId },
    Payload { id: UpdateId },
    FetchFailed { id: UpdateId, from: NodeId },
    Heartbeat(Arc<Heartbeat>),
    Digest { from: usize, digest: Arc<ReplicaDigest>, reply: bool },
    Anchor { from: NodeId, state: Arc<ReplicaState> },
}

#[derive(Debug)]
enum Ev {
    Timeout { node: usize, incarnation: u64, generation: u64 },
    PhaseDone { node: usize, incarnation: u64, result: Box<ragtag_protocol::engine::LocalResult>, delta: Vec<f32> },
    Deliver { node: usize, what: Delivery },
    Wave { nodes: Vec<usize>, what: Delivery },
    Scenario(usize),
    Joined { node: usize, state: Box<ReplicaState> },
    Sample,
}

#[derive(Debug)]
struct Item {
    at: Micros,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunOutput {
    /// The strategy.
    pub strategy: Strategy,
    /// The seed offset.
    pub seed: u64,
    /// Samples of the mean replica over time.
    pub series: Vec<Sample>,
    /// Per-node accounting.
    pub nodes: Vec<NodeOutput>,
    /// Staleness and drops.
    pub tally: Tally,
    /// Research measurements.
    pub layers: LayerRecorder,
    /// Held-out loss of each live replica at the end.
    pub replica_losses: Vec<f32>,
    /// When the target was first reached (interpolated), if it was.
    pub time_to_target_s: Option<f64>,
    /// Virtual time at the end.
    pub end_s: f64,
    /// Messages lost in the network.
    pub messages_lost: u64,
    /// The dataset's floor (best achievable loss), when known.
    pub floor: Option<f32>,
    /// Aggregate compute available over the run (speed-seconds).
    pub aggregate_work: f64,
    /// Events processed.
    pub events: u64,
}

/// One node's accounting.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeOutput {
    /// Index in the scenario.
    pub index: usize,
    /// Base speed.
    pub speed: f64,
    /// Fast (0) or slow (1) half.
    pub group: usize,
    /// Seconds computing.
    pub busy_s: f64,
    /// Seconds up.
    pub alive_s: f64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Updates published.
    pub updates: u64,
    /// Samples processed.
    pub samples: u64,
}

impl NodeOutput {
    /// Fraction of its up time the node computed.
    pub fn utilisation(&self) -> f64 {
        if self.alive_s > 0.0 { self.busy_s / self.alive_s } else { 0.0 }
    }
}

/// A simulation in progress.
struct Sim<'a> {
    scenario: &'a Scenario,
    strategy: Strategy,
    manifest: Manifest,
    run_id: RunId,
    now: f64,
    queue: BinaryHeap<Reverse<Item>>,
    seq: u64,
    nodes: Vec<SimNode>,
    index_of: BTreeMap<NodeId, usize>,
    network: Network,
    store: BTreeMap<UpdateId, Published>,
    store_order: std::collections::VecDeque<(f64, UpdateId)>,
    evaluator: Trainer,
    series: Vec<Sample>,
    tally: Tally,
    layers: LayerRecorder,
    target_at: Option<f64>,
    published: u64,
    events: u64,
    seed: u64,
}

/// Runs one strategy on a scenario.
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Result<RunOutput> {
    let mut sim = Sim::new(scenario, opts)?;
    let bar = progress_bar(opts.progress, scenario.duration_s);
    sim.start();
    let (mut same_time, mut last_at) = (0u64, Micros::ZERO);
    while let Some(Reverse(item)) = sim.queue.pop() {
        let t = item.at.as_secs_f64();
        if t > scenario.duration_s || sim.finished(t) {
            break;
        }
        // Invariant: virtual time advances (no event storm at one instant).
        same_time = if item.at == last_at { same_time + 1 } else { 0 };
        last_at = item.at;
        anyhow::ensure!(same_time < 10_000_000, "livelock: 10M events at t = {t}s, the last {:?}", item.ev);
        sim.now = t;
        sim.events += 1;
        sim.dispatch(item.ev)?;
        if let Some(b) = &bar
            && sim.events % 1024 == 0
        {
            b.set_position(t as u64);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    sim.finish()
}

fn progress_bar(enabled: bool, duration_s: f64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(duration_s as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} virtual {pos}/{len}s [{bar:40}] {elapsed_precise}")
            .expect("valid template"),
    );
    Some(bar)
}

impl<'a> Sim<'a> {
    fn new(scenario: &'a Scenario, opts: &RunOptions) -> Result<Self> {
        let seed = scenario.seed.wrapping_add(opts.seed);
        let mut manifest = scenario.manifest(opts.strategy, opts.ddp_lr);
        manifest.seed = seed;
        let run_id = manifest.run_id();
        let dataset = Arc::new(
            Dataset::open(&manifest.data, &manifest.model, seed, None, manifest.training.eval_samples as usize)
                .context("opening the scenario's data")?,
        );
        let trainer_cfg = |node_seed: u64, shard: Shard| TrainerConfig {
            model: manifest.model.clone(),
            data: manifest.data.clone(),
            training: manifest.training,
            seed,
            node_seed,
            shard,
            data_path: None,
            device: DeviceChoice::Cpu,
            micro_batch: Some(manifest.training.batch_size as usize),
        };
        let evaluator = Trainer::with_dataset(trainer_cfg(u64::MAX, Shard::ALL), dataset.clone())?;
        let profiles = speed::profiles(scenario, seed);
        let mut speeds: Vec<f64> = profiles.iter().map(|p| p.base).collect();
        speeds.sort_by(f64::total_cmp);
        let median = speeds[speeds.len() / 2];
        let all_equal = speeds.first() == speeds.last();
        let mut nodes = Vec::with_capacity(profiles.len());
        for (i, profile) in profiles.into_iter().enumerate() {
            let shard = if scenario.shards > 0 {
                Shard { index: i as u64 % scenario.shards as u64, count: scenario.shards as u64 }
            } else {
                Shard::ALL
            };
            let trainer = Trainer::with_dataset(trainer_cfg(seed ^ (i as u64 + 1) << 20, shard), dataset.clone())?;
            let group = usize::from(all_equal || profile.base < median);
            let late = scenario.late.contains(&(i as u32));
            nodes.push(SimNode::new(i, seed, profile, group, trainer, late));
        }
        let index_of = nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        let layout = evaluator.layout();
        let layers = LayerRecorder::new(
            layout.entries.iter().map(|e| (e.name.clone(), e.offset..e.offset + e.len)).collect(),
            nodes.len(),
            layout.total(),
        );
        Ok(Self {
            scenario,
            strategy: opts.strategy,
            network: Network::new(&scenario.network, nodes.len(), seed),
            manifest,
            run_id,
            now: 0.0,
            queue: BinaryHeap::new(),
            seq: 0,
            nodes,
            index_of,
            store: BTreeMap::new(),
            store_order: std::collections::VecDeque::new(),
            evaluator,
            series: Vec::new(),
            tally: Tally::default(),
            layers,
            target_at: None,
            published: 0,
            events: 0,
            seed,
        })
    }

    fn push(&mut self, at_s: f64, ev: Ev) {
        self.push_at(Micros::from_secs_f64(at_s), ev);
    }

    fn push_at(&mut self, at: Micros, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Item { at, seq: self.seq, ev }));
    }

    fn start(&mut self) {
        let initial = self.evaluator.export_params().expect("parameters export");
        // Everyone is up before anyone starts, so first heartbeats reach all.
        let starting: Vec<usize> = (0..self.nodes.len()).filter(|i| self.nodes[*i].state != NodeState::Late).collect();
        for &i in &starting {
            let engine =
                self.nodes[i].new_engine(&self.manifest, self.run_id, initial.clone(), self.scenario.step_cost_s);
            self.nodes[i].bring_up(engine, 0.0);
        }
        for &i in &starting {
            self.handle(i, Input::Start);
        }
        for (i, _) in self.scenario.events.iter().enumerate() {
            let at = self.scenario.events[i].at_s;
            self.push(at, Ev::Scenario(i));
        }
        self.push(0.0, Ev::Sample);
    }

    fn finished(&self, t: f64) -> bool {
        self.target_at.is_some_and(|at| t > at + self.scenario.after_target_s)
            && self.series.last().is_some_and(|s| s.t >= self.target_at.unwrap_or(0.0))
    }

    fn dispatch(&mut self, ev: Ev) -> Result<()> {
        match ev {
            Ev::Timeout { node, incarnation, generation } => {
                let n = &mut self.nodes[node];
                if n.incarnation == incarnation && n.timer_generation == generation {
                    n.scheduled_timeout = None;
                    if let Some(e) = n.engine.as_mut() {
                        e.handle_timeout(Micros::from_secs_f64(self.now));
                    }
                    self.drain(node);
                }
            }
            Ev::PhaseDone { node, incarnation, result, delta } => {
                if self.nodes[node].incarnation != incarnation {
                    return Ok(());
                }
                self.nodes[node].phase_finished(self.now, result.samples);
                let group = self.nodes[node].group;
                self.layers.record(node, group, &delta);
                self.handle(node, Input::LocalPhaseDone(*result));
            }
            Ev::Deliver { node, what } => self.deliver(node, what),
            Ev::Wave { nodes, what } => {
                for node in nodes {
                    self.deliver(node, what.clone());
                }
            }
            Ev::Scenario(i) => self.scenario_event(i),
            Ev::Joined { node, state } => {
                if self.nodes[node].state == NodeState::Joining {
                    let engine =
                        self.nodes[node].join_engine(&self.manifest, self.run_id, *state, self.scenario.step_cost_s);
                    self.nodes[node].bring_up(engine, self.now);
                    self.handle(node, Input::Start);
                }
            }
            Ev::Sample => self.sample()?,
        }
        Ok(())
    }

    fn handle(&mut self, node: usize, input: Input) {
        let now = Micros::from_secs_f64(self.now);
        let Some(engine) = self.nodes[node].engine.as_mut() else { return };
        engine.handle(now, input);
        self.drain(node);
    }

    fn live(&self, i: usize) -> bool {
        self.nodes[i].state == NodeState::Up
    }

    /// Sends a delivery from `from` to `to` through the network.
    fn send(&mut self, from: usize, to: usize, bytes: usize, what: Delivery) -> bool {
        match self.network.send(self.now, from, to, bytes) {
            Some(at) => {
                self.push(at, Ev::Deliver { node: to, what });
                true
            }
            None => false,
        }
    }

    fn drain(&mut self, k: usize) {
        while let Some(out) = self.nodes[k].engine.as_mut().and_then(|e| e.poll_output()) {
            self.act(k, out);
        }
        // Reschedule only when the engine's next timeout changed: most
        // inputs leave it as it was.
        let now = Micros::from_secs_f64(self.now);
        let n = &mut self.nodes[k];
        let wanted = n.engine.as_ref().and_then(|e| e.poll_timeout()).map(|t| t.max(now));
        if wanted != n.scheduled_timeout {
            n.timer_generation += 1;
            n.scheduled_timeout = wanted;
            if let Some(at) = wanted {
                let (incarnation, generation) = (n.incarnation, n.timer_generation);
                self.push_at(at, Ev::Timeout { node: k, incarnation, generation });
            }
        }
    }

    fn act(&mut self, k: usize, out: Output) {
        let me = self.nodes[k].id;
        match out {
            Output::StartLocalPhase(p) => {
                let n = &mut self.nodes[k];
                let result = n
                    .trainer
                    .run_phase(&p.anchor, p.steps, p.mode, p.pull, p.seed)
                    .expect("training on the CPU does not fail on valid input");
                let steps = if p.mode == ragtag_protocol::engine::LocalMode::Gradient { 1 } else { p.steps };
                let duration = n.profile.phase_duration(self.now, steps, self.scenario.step_cost_s);
                n.phase_started(self.now);
                let delta: Vec<f32> = if p.mode == ragtag_protocol::engine::LocalMode::Gradient {
                    result.params.clone()
                } else {
                    p.anchor.iter().zip(&result.params).map(|(a, t)| a - t).collect()
                };
                let local = ragtag_protocol::engine::LocalResult {
                    round: p.round,
                    params: result.params,
                    steps: result.steps,
                    samples: result.samples,
                    loss: result.loss,
                    flops: result.flops,
                };
                let incarnation = n.incarnation;
                self.push(self.now + duration, Ev::PhaseDone { node: k, incarnation, result: Box::new(local), delta });
            }
            Output::Publish(p) => {
                self.published += 1;
                self.nodes[k].published += 1;
                let id = p.announcement.id;
                let ann_bytes = postcard::to_allocvec(&p.announcement).map_or(256, |v| v.len()) + SIGNED_OVERHEAD;
                let payload_len = p.payload.len();
                self.store.insert(id, Published { announcement: p.announcement, payload: p.payload });
                self.store_order.push_back((self.now, id));
                while self.store_order.front().is_some_and(|(t, _)| *t + STORE_RETAIN_S < self.now) {
                    let (_, old) = self.store_order.pop_front().expect("checked");
                    self.store.remove(&old);
                }
                let receivers = self.others(k);
                if self.manifest.engine.local == ragtag_protocol::engine::LocalMode::Gradient {
                    self.all_reduce(k, id, ann_bytes + payload_len, &receivers);
                } else {
                    let inline = payload_len <= INLINE_PAYLOAD_BYTES;
                    let wire_bytes = if inline { ann_bytes + payload_len } else { ann_bytes };
                    let what =
                        if inline { Delivery::Update { id, from: me } } else { Delivery::Announce { id, from: me } };
                    self.broadcast(k, &receivers, wire_bytes, what);
                }
            }
            Output::FetchPayload { id, from, .. } | Output::FetchAnnouncement { id, from } => {
                let src = self.index_of.get(&from).copied();
                let timeout = self.now + self.scenario.network.request_timeout_s;
                let ok = match (src, self.store.get(&id)) {
                    (Some(s), Some(pb)) if self.live(s) && self.network.connected(k, s) => {
                        let bytes = pb.payload.len() + 16;
                        let lat = self.network.latency_s();
                        // The request reaches the holder, which then sends the payload back.
                        self.network.send(self.now, k, s, REQUEST_BYTES);
                        match self.network.send(self.now + lat, s, k, bytes) {
                            Some(at) => {
                                let what = if matches!(out, Output::FetchAnnouncement { .. }) {
                                    Delivery::Update { id, from }
                                } else {
                                    Delivery::Payload { id }
                                };
                                self.push(at, Ev::Deliver { node: k, what });
                                true
                            }
                            None => false,
                        }
                    }
                    _ => false,
                };
                if !ok {
                    self.push(timeout, Ev::Deliver { node: k, what: Delivery::FetchFailed { id, from } });
                }
            }
            Output::SendHeartbeat(hb) => {
                let receivers = self.others(k);
                self.broadcast(k, &receivers, HEARTBEAT_BYTES, Delivery::Heartbeat(Arc::new(hb)));
            }
            Output::AntiEntropy { peer, digest } => {
                if let Some(&j) = self.index_of.get(&peer) {
                    let bytes = postcard::to_allocvec(&digest).map_or(1024, |v| v.len());
                    self.send(k, j, bytes, Delivery::Digest { from: k, digest: Arc::new(digest), reply: true });
                }
            }
            Output::FetchAnchor { from } => {
                if let Some(&j) = self.index_of.get(&from)
                    && let Some(e) = self.nodes[j].engine.as_ref()
                {
                    let state = e.replica_state();
                    let bytes = 4 * (state.anchor.len() + state.outer.momentum.len()) + 1024;
                    self.send(j, k, bytes, Delivery::Anchor { from, state: Arc::new(state) });
                }
            }
            Output::Record(_) => {}
            Output::Event(ev) => self.count(ev),
        }
    }

    /// Live nodes other than `k`.
    fn others(&self, k: usize) -> Vec<usize> {
        (0..self.nodes.len()).filter(|j| *j != k && self.live(*j)).collect()
    }

    /// Sends one message to many peers in waves through `k`'s uplink.
    fn broadcast(&mut self, k: usize, receivers: &[usize], bytes: usize, what: Delivery) {
        const WAVES: usize = 8;
        let per_wave = receivers.len().div_ceil(WAVES).max(1);
        for wave in receivers.chunks(per_wave) {
            let (reached, at) = self.network.send_wave(self.now, k, wave, bytes);
            if !reached.is_empty() {
                self.push(at, Ev::Wave { nodes: reached, what: what.clone() });
            }
        }
    }

    /// ddp's gradient exchange, modelled generously as a bandwidth-optimal
    /// all-reduce: the sender's uplink carries `2 (N-1)/N` gradients (not
    /// one per peer) and every peer has it two latencies after the upload.
    fn all_reduce(&mut self, k: usize, id: UpdateId, bytes: usize, receivers: &[usize]) {
        let n = (receivers.len() + 1) as f64;
        let share = (2.0 * (n - 1.0) / n * bytes as f64) as usize;
        let Some(done) = self.network.send(self.now, k, k, share) else { return };
        let from = self.nodes[k].id;
        let reached: Vec<usize> = receivers.iter().copied().filter(|j| self.network.connected(k, *j)).collect();
        if !reached.is_empty() {
            self.push(
                done + self.network.latency_s(),
                Ev::Wave { nodes: reached, what: Delivery::Update { id, from } },
            );
        }
    }

    fn count(&mut self, ev: EngineEvent) {
        match ev {
            EngineEvent::Applied { staleness, .. } => self.tally.staleness_histogram[(staleness as usize).min(7)] += 1,
            EngineEvent::Dropped { reason, .. } => {
                *self.tally.dropped.entry(reason.name().to_string()).or_insert(0) += 1
            }
            EngineEvent::AnchorsAveraged { .. } => self.tally.anchors_averaged += 1,
            EngineEvent::FetchAbandoned { .. } => self.tally.fetches_abandoned += 1,
            _ => {}
        }
    }

    fn deliver(&mut self, node: usize, what: Delivery) {
        if !self.live(node) {
            return;
        }
        let input = match what {
            Delivery::Update { id, from } => match self.store.get(&id) {
                Some(p) => Input::Update { announcement: p.announcement.clone(), from, payload: p.payload.clone() },
                None => return,
            },
            Delivery::Announce { id, from } => match self.store.get(&id) {
                Some(p) => Input::Announcement { announcement: p.announcement.clone(), from },
                None => return,
            },
            Delivery::Payload { id } => match self.store.get(&id) {
                Some(p) => Input::Payload { id, bytes: p.payload.clone() },
                None => return,
            },
            Delivery::FetchFailed { id, from } => Input::FetchFailed { id, from, reason: None },
            Delivery::Heartbeat(hb) => Input::Heartbeat(hb.as_ref().clone()),
            Delivery::Digest { from, digest, reply } => {
                if reply && let Some(e) = self.nodes[node].engine.as_ref() {
                    let back = e.digest();
                    let bytes = postcard::to_allocvec(&back).map_or(1024, |v| v.len());
                    self.send(node, from, bytes, Delivery::Digest { from: node, digest: Arc::new(back), reply: false });
                }
                Input::PeerDigest { from: self.nodes[from].id, digest: digest.as_ref().clone() }
            }
            Delivery::Anchor { from, state } => Input::PeerAnchor { from, state: Box::new(state.as_ref().clone()) },
        };
        self.handle(node, input);
    }

    fn scenario_event(&mut self, i: usize) {
        let e = self.scenario.events[i].clone();
        match e.kind {
            EventKind::Crash => {
                for n in &e.nodes {
                    self.nodes[*n as usize].bring_down(self.now);
                }
            }
            EventKind::Leave => {
                for n in &e.nodes {
                    self.handle(*n as usize, Input::Leave);
                    self.nodes[*n as usize].bring_down(self.now);
                }
            }
            EventKind::Join => {
                for n in e.nodes.iter().map(|n| *n as usize) {
                    if self.live(n) {
                        continue;
                    }
                    // Sync state from the lowest-indexed live peer.
                    let Some(peer) = (0..self.nodes.len()).find(|j| *j != n && self.live(*j)) else { continue };
                    let state = self.nodes[peer].engine.as_ref().expect("live nodes have engines").replica_state();
                    let bytes = 4 * (state.anchor.len() + state.outer.momentum.len() + state.outer.buffer.len()) + 1024;
                    self.nodes[n].state = NodeState::Joining;
                    match self.network.send(self.now, peer, n, bytes) {
                        Some(at) => self.push(at, Ev::Joined { node: n, state: Box::new(state) }),
                        None => self.nodes[n].state = NodeState::Down,
                    }
                }
            }
            EventKind::Partition => self.network.partition(&e.groups),
            EventKind::Heal => self.network.heal(),
        }
    }

    /// The mean of the live replicas' anchors.
    fn mean_anchor(&self) -> Option<(Vec<f32>, Vec<&[f32]>)> {
        let anchors: Vec<&[f32]> = self
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Up)
            .filter_map(|n| n.engine.as_ref())
            .map(|e| e.anchor())
            .collect();
        let first = anchors.first()?;
        let mut mean = vec![0.0f64; first.len()];
        for a in &anchors {
            for (m, v) in mean.iter_mut().zip(a.iter()) {
                *m += *v as f64;
            }
        }
        let k = anchors.len() as f64;
        Some((mean.into_iter().map(|m| (m / k) as f32).collect(), anchors))
    }

    fn sample(&mut self) -> Result<()> {
        let Some((mean, anchors)) = self.mean_anchor() else {
            self.push(self.now + self.scenario.sample_every_s, Ev::Sample);
            return Ok(());
        };
        let distances: Vec<f32> = anchors.iter().filter_map(|a| relative_distance(&mean, a)).collect();
        let live = anchors.len() as u32;
        let eval = self.evaluator.evaluate(Some(&mean))?;
        let sample = Sample {
            t: self.now,
            loss: eval.loss,
            accuracy: eval.accuracy,
            samples: self.nodes.iter().map(|n| n.samples).sum(),
            updates: self.published,
            consensus_max: distances.iter().copied().fold(0.0, f32::max),
            consensus_mean: distances.iter().sum::<f32>() / distances.len().max(1) as f32,
            live,
            bytes: self.network.bytes_sent.iter().sum(),
        };
        if self.target_at.is_none() && sample.loss <= self.scenario.target_loss {
            self.target_at = Some(interpolate_crossing(self.series.last(), &sample, self.scenario.target_loss));
        }
        self.series.push(sample);
        self.layers.sample(self.now);
        self.check_invariants();
        self.push(self.now + self.scenario.sample_every_s, Ev::Sample);
        Ok(())
    }

    /// Invariants after events (checked at every sample; cheap ones always).
    fn check_invariants(&self) {
        for n in &self.nodes {
            if let Some(e) = &n.engine {
                assert!(e.anchor().iter().all(|v| v.is_finite()), "node {} has a non-finite anchor", n.index);
                assert!(e.version().total() <= self.published, "node {} applied more than was published", n.index);
            }
        }
    }

    fn finish(mut self) -> Result<RunOutput> {
        let end = self.now;
        let mut replica_losses = Vec::new();
        let anchors: Vec<Vec<f32>> = self
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Up)
            .filter_map(|n| n.engine.as_ref().map(|e| e.anchor().to_vec()))
            .collect();
        for a in &anchors {
            replica_losses.push(self.evaluator.evaluate(Some(a))?.loss);
        }
        let aggregate_work: f64 = self.nodes.iter().map(|n| n.profile.work_between(0.0, end)).sum();
        let nodes = self
            .nodes
            .iter_mut()
            .map(|n| {
                n.close(end);
                NodeOutput {
                    index: n.index,
                    speed: n.profile.base,
                    group: n.group,
                    busy_s: n.busy_s,
                    alive_s: n.alive_s,
                    bytes_sent: self.network.bytes_sent[n.index],
                    updates: n.published,
                    samples: n.samples,
                }
            })
            .collect();
        let _ = (self.strategy, self.seed);
        Ok(RunOutput {
            strategy: self.strategy,
            seed: self.seed.wrapping_sub(self.scenario.seed),
            series: self.series,
            nodes,
            tally: self.tally,
            layers: self.layers,
            replica_losses,
            time_to_target_s: self.target_at,
            end_s: end,
            messages_lost: self.network.lost,
            floor: self.evaluator.dataset().floor,
            aggregate_work,
            events: self.events,
        })
    }
}

/// The time the loss crossed `target` between two samples (linear).
fn interpolate_crossing(prev: Option<&Sample>, now: &Sample, target: f32) -> f64 {
    match prev {
        Some(p) if p.loss > target && p.loss > now.loss => {
            let f = ((p.loss - target) / (p.loss - now.loss)) as f64;
            p.t + f * (now.t - p.t)
        }
        _ => now.t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossing_is_interpolated() {
        let s = |t, loss| Sample {
            t,
            loss,
            accuracy: 0.0,
            samples: 0,
            updates: 0,
            consensus_max: 0.0,
            consensus_mean: 0.0,
            live: 1,
            bytes: 0,
        };
        assert_eq!(interpolate_crossing(Some(&s(10.0, 2.0)), &s(20.0, 1.0), 1.5), 15.0);
        assert_eq!(interpolate_crossing(None, &s(20.0, 1.0), 1.5), 20.0);
    }
}
