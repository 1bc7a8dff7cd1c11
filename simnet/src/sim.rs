//! The discrete-event loop: a priority queue of timestamped events over
//! real engines and real trainers, a modelled clock and network.
//!
//! The simulator decides only what the world does (how long compute
//! takes, when messages arrive, who crashes); every decision of the
//! protocol is the engine's. Invariants are checked after every event.

mod actions;
mod event;
mod node;
mod output;
mod phases;
mod representation;

pub use representation::PROBE_ROWS;

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    sync::Arc,
};

use event::{Delivery, Ev, Item, Published};
use node::{NodeState, SimNode};
pub use output::{NodeOutput, RunOutput};
use ragtag_models::{
    Trainer, TrainerConfig,
    data::{Dataset, Shard},
    device::DeviceChoice,
};
use ragtag_protocol::{
    engine::{Input, LocalMode, SharedSums, Strategy, anti_entropy::relative_distance},
    ids::{NodeId, RunId, UpdateId},
    manifest::Manifest,
    time::Micros,
};

use crate::{
    measure::{LayerRecorder, PhaseRecord, Sample, Tally},
    network::Network,
    scenario::{EventKind, Scenario},
    speed,
};

/// Payloads up to this size travel inline with their announcement (one
/// gossip message); larger ones are fetched: the node's own limit.
pub const INLINE_PAYLOAD_BYTES: usize = ragtag_protocol::wire::MAX_INLINE_PAYLOAD;
/// Wire overhead of a signed announcement beyond its body.
const SIGNED_OVERHEAD: usize = 72;
/// Size of a heartbeat on the wire.
const HEARTBEAT_BYTES: usize = 120;
/// A signed "I hold this payload" gossip message.
const HAVE_BYTES: usize = 180;
/// Size of a fetch request.
const REQUEST_BYTES: usize = 64;
/// Published updates stay fetchable this long (virtual seconds).
const STORE_RETAIN_S: f64 = 900.0;

/// An aggregate body's name: tick, group, hash.
type SumKey = (u64, u32, ragtag_protocol::ids::Hash32);

/// Why a simulation stopped early: the CLI prints it, the study and the
/// ablation name the configuration that failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario's data could not be opened.
    #[error("opening the scenario's data")]
    Data(#[source] ragtag_models::Error),
    /// A node's trainer or the evaluator could not be built.
    #[error(transparent)]
    Trainer(ragtag_models::Error),
    /// Evaluating the mean or a replica's anchor failed.
    #[error(transparent)]
    Evaluate(ragtag_models::Error),
    /// Virtual time stopped advancing: an engine or the simulator loops.
    #[error("livelock: 10M events at t = {t}s, the last {last}")]
    Livelock {
        /// The virtual time (s) it stopped at.
        t: f64,
        /// The last event, debug-formatted.
        last: String,
    },
}

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
    /// Local phases started at the current instant, computed together.
    deferred: Vec<phases::DeferredPhase>,
    index_of: BTreeMap<NodeId, usize>,
    network: Network,
    store: BTreeMap<UpdateId, Published>,
    store_order: std::collections::VecDeque<(f64, UpdateId)>,
    /// Aggregate bodies by (tick, group, hash), kept like payloads, with
    /// the nodes holding each and the fetches waiting for a holder to get it.
    aggregates: BTreeMap<SumKey, Arc<Vec<u8>>>,
    aggregate_order: std::collections::VecDeque<(f64, SumKey)>,
    sum_holders: BTreeMap<SumKey, std::collections::BTreeSet<usize>>,
    sum_waiters: BTreeMap<(SumKey, usize), Vec<usize>>,
    evaluator: Trainer,
    /// The held-out inputs representations are compared on.
    probe: ragtag_models::data::Batch,
    series: Vec<Sample>,
    tally: Tally,
    layers: LayerRecorder,
    target_at: Option<f64>,
    published: u64,
    events: u64,
    seed: u64,
    /// Decoded sums, one allocation per sum for all the replicas.
    shared_sums: SharedSums,
}

/// Runs one strategy on a scenario.
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Result<RunOutput, SimError> {
    let mut sim = Sim::new(scenario, opts)?;
    let bar = progress_bar(opts.progress, scenario.duration_s);
    sim.start();
    let (mut same_time, mut last_at) = (0u64, Micros::ZERO);
    loop {
        // Once an instant is over, its phases' math runs (on every core).
        let now = Micros::from_secs_f64(sim.now);
        if sim.queue.peek().is_none_or(|Reverse(next)| next.at > now) {
            sim.run_deferred_phases();
        }
        let Some(Reverse(item)) = sim.queue.pop() else { break };
        let t = item.at.as_secs_f64();
        if t > scenario.duration_s || sim.finished(t) {
            break;
        }
        // Invariant: virtual time advances (no event storm at one instant).
        same_time = if item.at == last_at { same_time + 1 } else { 0 };
        last_at = item.at;
        if same_time >= 10_000_000 {
            return Err(SimError::Livelock { t, last: format!("{:?}", item.ev) });
        }
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
    fn new(scenario: &'a Scenario, opts: &RunOptions) -> Result<Self, SimError> {
        let seed = scenario.seed.wrapping_add(opts.seed);
        let mut manifest = scenario.manifest(opts.strategy, opts.ddp_lr);
        manifest.seed = seed;
        let run_id = manifest.run_id();
        let dataset = Arc::new(
            Dataset::open(
                &manifest.data,
                &manifest.model,
                seed,
                scenario.data_file.as_deref(),
                manifest.training.eval_samples as usize,
            )
            .map_err(SimError::Data)?,
        );
        let trainer_cfg = |node_seed: u64, shard: Shard| TrainerConfig {
            model: manifest.model.clone(),
            data: manifest.data.clone(),
            training: manifest.training,
            seed,
            node_seed,
            shard,
            data_path: scenario.data_file.clone(),
            device: DeviceChoice::Cpu,
            micro_batch: Some(manifest.training.batch_size as usize),
        };
        let evaluator =
            Trainer::with_dataset(trainer_cfg(u64::MAX, Shard::ALL), dataset.clone()).map_err(SimError::Trainer)?;
        let profiles = speed::profiles(scenario, seed);
        let groups = crate::measure::groups(&profiles.iter().map(|p| p.base).collect::<Vec<_>>());
        let mut nodes = Vec::with_capacity(profiles.len());
        for (i, profile) in profiles.into_iter().enumerate() {
            let shard = if scenario.shards > 0 {
                Shard { index: i as u64 % scenario.shards as u64, count: scenario.shards as u64 }
            } else {
                Shard::ALL
            };
            let trainer = Trainer::with_dataset(trainer_cfg(seed ^ (i as u64 + 1) << 20, shard), dataset.clone())
                .map_err(SimError::Trainer)?;
            let group = groups[i];
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
            deferred: Vec::new(),
            index_of,
            store: BTreeMap::new(),
            store_order: std::collections::VecDeque::new(),
            aggregates: BTreeMap::new(),
            aggregate_order: std::collections::VecDeque::new(),
            sum_holders: BTreeMap::new(),
            sum_waiters: BTreeMap::new(),
            probe: evaluator.probe_batch(representation::PROBE_ROWS),
            evaluator,
            series: Vec::new(),
            tally: Tally::default(),
            layers,
            target_at: None,
            published: 0,
            events: 0,
            seed,
            shared_sums: SharedSums::default(),
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
            let mut engine =
                self.nodes[i].new_engine(&self.manifest, self.run_id, initial.clone(), self.scenario.step_cost_s);
            engine.share_decoded_sums(self.shared_sums.clone());
            self.nodes[i].bring_up(engine, 0.0);
        }
        let ids: Vec<NodeId> = starting.iter().map(|&i| self.nodes[i].id).collect();
        for &i in &starting {
            // Every node up now: more than a real node's settle phase may
            // find (the peers subscribed by its end, a few at least).
            self.handle(i, Input::PeersKnown(ids.clone()));
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

    fn dispatch(&mut self, ev: Ev) -> Result<(), SimError> {
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
            Ev::PhaseDone { node, incarnation, result, delta, first_loss, lead } => {
                if self.nodes[node].incarnation != incarnation {
                    return Ok(());
                }
                self.nodes[node].phase_finished(self.now, result.samples);
                let group = self.nodes[node].group;
                let gradient =
                    self.nodes[node].engine.as_ref().is_some_and(|e| e.config().local == LocalMode::Gradient);
                // The study measures rounds (a carried round from where its
                // own steps started), not their lead steps.
                if !lead {
                    let phase = PhaseRecord {
                        delta: &delta,
                        local: (!gradient).then_some(result.params.as_slice()),
                        steps: result.steps,
                        loss: first_loss,
                    };
                    self.layers.record(node, group, phase);
                    if !gradient && self.layers.wants_representation(group) {
                        self.record_representation(group, &result.params, &delta)?;
                    }
                }
                self.handle(node, Input::LocalPhaseDone(*result));
            }
            Ev::Deliver { node, what } => self.deliver(node, what),
            Ev::Wave { nodes, what } => {
                for node in nodes {
                    self.deliver(node, what.clone());
                }
            }
            Ev::Scenario(i) => self.scenario_event(i),
            Ev::Join { node } => {
                if self.nodes[node].state == NodeState::Joining {
                    self.join(node);
                }
            }
            Ev::Joined { node, state } => {
                if self.nodes[node].state == NodeState::Joining
                    && !state.current_at(&self.manifest.engine, Micros::from_secs_f64(self.now))
                {
                    // Sums were announced while it travelled: ask again.
                    self.join(node);
                } else if self.nodes[node].state == NodeState::Joining {
                    let mut engine =
                        self.nodes[node].join_engine(&self.manifest, self.run_id, *state, self.scenario.step_cost_s);
                    engine.share_decoded_sums(self.shared_sums.clone());
                    self.nodes[node].bring_up(engine, self.now);
                    let up = (0..self.nodes.len()).filter(|&i| i != node && self.nodes[i].state == NodeState::Up);
                    let ids = up.map(|i| self.nodes[i].id).collect();
                    self.handle(node, Input::PeersKnown(ids));
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
                    if !self.live(n) {
                        self.join(n);
                    }
                }
            }
            EventKind::Partition => self.network.partition(&e.groups),
            EventKind::Heal => self.network.heal(),
        }
    }

    /// Node `n` asks the lowest-indexed live peer for its state, which
    /// serves it once its engine says it is fit for a joiner.
    fn join(&mut self, n: usize) {
        let Some(peer) = (0..self.nodes.len()).find(|j| *j != n && self.live(*j)) else {
            self.nodes[n].state = NodeState::Down;
            return;
        };
        self.nodes[n].state = NodeState::Joining;
        let engine = self.nodes[peer].engine.as_ref().expect("live nodes have engines");
        if let Some(at) = engine.state_ready_at(Micros::from_secs_f64(self.now)) {
            self.push_at(at, Ev::Join { node: n });
            return;
        }
        let state = engine.replica_state();
        let bytes = 4 * (state.anchor.len() + state.outer.momentum.len() + state.outer.buffer.len()) + 1024;
        match self.network.send(self.now, peer, n, bytes) {
            Some(at) => self.push(at, Ev::Joined { node: n, state: Box::new(state) }),
            None => self.nodes[n].state = NodeState::Down,
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

    fn sample(&mut self) -> Result<(), SimError> {
        let Some((mean, anchors)) = self.mean_anchor() else {
            self.push(self.now + self.scenario.sample_every_s, Ev::Sample);
            return Ok(());
        };
        let distances: Vec<f32> = anchors.iter().filter_map(|a| relative_distance(&mean, a)).collect();
        let live = anchors.len() as u32;
        let eval = self.evaluator.evaluate(Some(&mean)).map_err(SimError::Evaluate)?;
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

    fn finish(mut self) -> Result<RunOutput, SimError> {
        let end = self.now;
        let mut replica_losses = Vec::new();
        let anchors: Vec<Vec<f32>> = self
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Up)
            .filter_map(|n| n.engine.as_ref().map(|e| e.anchor().to_vec()))
            .collect();
        for a in &anchors {
            replica_losses.push(self.evaluator.evaluate(Some(a)).map_err(SimError::Evaluate)?.loss);
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
                    bytes_received: self.network.bytes_received[n.index],
                    updates: n.published,
                    samples: n.samples,
                    idle_s: n.idle.seconds_by_name(),
                }
            })
            .collect();
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
