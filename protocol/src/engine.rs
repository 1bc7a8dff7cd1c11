//! The GoPALS engine: one deterministic state machine per node.
//!
//! Driven like quinn-proto or str0m: the shell calls [`Engine::handle`] with
//! the current time and an [`Input`], drains [`Engine::poll_output`] until it
//! returns `None`, and calls [`Engine::handle_timeout`] when
//! [`Engine::poll_timeout`] is reached. The engine never reads a clock,
//! never touches a socket, file or thread, and draws randomness only from
//! its seed: the same inputs give the same outputs, bit for bit. The node
//! (tokio + libp2p + candle) and the simulator (virtual time) drive this
//! same code.
//!
//! It works on flat f32 parameter buffers; the trainer converts to and from
//! tensors. Every mechanism is a switch in [`EngineConfig`]; the baselines
//! (`ddp`, `diloco`, `diloco-proportional`, `async`) are presets.

mod aggregation;
pub mod anti_entropy;
pub mod config;
pub mod cooldown;
pub mod idle;
pub mod inner_lr;
mod io;
mod late_updates;
mod lead;
pub mod membership;
pub mod outer;
mod phase;
mod receive;
pub mod roster;
mod round;
pub mod snapshot;
pub mod staleness;
pub mod state_transfer;
pub mod sum_guard;
pub mod tick;
pub mod trust;

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::Arc,
};

pub use aggregation::SharedSums;
pub use config::{
    AntiEntropyConfig, ConfigError, EngineConfig, EngineOverrides, LocalMode, MIN_PARTIAL_STEP, MembershipConfig,
    OuterConfig, OuterKind, PARTIAL_STEP_SLACK, PullConfig, Schedule, StalenessConfig, StalenessMeasure,
    StalenessWeight, Strategy, Work,
};
pub use idle::{IdleReason, IdleTimes};
pub use io::{EngineEvent, Input, LocalPhase, LocalResult, Output, Publication};
use membership::{Membership, PeerInfo};
use outer::OuterState;
use phase::{Phase, Training};
pub use snapshot::{EngineCheckpoint, ReplicaState};
use tick::TickClock;

use crate::{
    codec::ErrorFeedback,
    ids::{NodeId, RunId, UpdateId},
    ledger::RecordKind,
    rng::SeededRng,
    sorted_walk,
    time::Micros,
    validate::RejectReason,
    version::{AppliedSet, VersionVector},
    wire::{Heartbeat, UpdateAnnouncement},
};

/// Most fetches in flight at once; beyond it the oldest is abandoned.
pub const MAX_AWAITING: usize = 1024;
/// Most updates waiting for the next canonical batch.
pub const MAX_PENDING: usize = 4096;
/// A node that fetched a payload announces it holds it only while it knew
/// fewer holders than this (the source included).
pub const ANNOUNCE_HELD_BELOW: usize = 3;
/// Most holders remembered per awaited payload: enough to retry, and no
/// per-announcement scan growing with the swarm.
pub const MAX_FETCH_SOURCES: usize = 8;
/// Most announcements fetched per anti-entropy exchange.
pub const MAX_ANTI_ENTROPY_FETCHES: usize = 32;
/// An update may name a tick at most this many ticks after the receiver's
/// own (tick mode): loosely synchronised clocks, and a period change the
/// receiver has not adopted from the leader's heartbeat yet.
pub const FUTURE_TICK_SLACK: u64 = 2;
/// Ticks of arrival bookkeeping kept.
const ARRIVAL_HISTORY: u64 = 8;
/// A fetch not answered within this long is abandoned.
const FETCH_TIMEOUT: Micros = Micros(60_000_000);
/// Output slots kept once a shell has drained the queue. A tick that
/// applies a thousand peers' updates queues two outputs for each (receipt
/// and event), and a queue keeps what it grew to: 0.5 GB over the
/// simulator's 1,000 engines.
const OUTPUTS_KEPT: usize = 256;

/// An update whose payload is being fetched.
#[derive(Clone, Debug)]
struct Awaiting {
    announcement: UpdateAnnouncement,
    sources: Vec<NodeId>,
    tried: usize,
    since: Micros,
}

impl Awaiting {
    /// Remembers another holder of the payload, up to [`MAX_FETCH_SOURCES`].
    fn add_source(&mut self, from: NodeId) {
        if self.sources.len() < MAX_FETCH_SOURCES && !self.sources.contains(&from) {
            self.sources.push(from);
        }
    }
}

/// An update ready to apply at the next canonical batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// Its announcement.
    pub announcement: UpdateAnnouncement,
    /// Its payload.
    #[serde(with = "arc_bytes")]
    pub bytes: Arc<Vec<u8>>,
}

mod arc_bytes {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Arc<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(v.as_slice(), s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Vec<u8>>, D::Error> {
        serde_bytes::ByteBuf::deserialize(d).map(|b| Arc::new(b.into_vec()))
    }
}

/// Counters the shells export as metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Local phases completed.
    pub rounds: u64,
    /// Updates applied (own included).
    pub applied: u64,
    /// Updates dropped, by reason.
    pub dropped: BTreeMap<RejectReason, u64>,
    /// Staleness of applied updates: index = tau (last bucket = 7 or more).
    pub staleness_histogram: [u64; 8],
    /// Anchor averages done by anti-entropy.
    pub anchors_averaged: u64,
    /// Inner steps taken.
    pub steps: u64,
    /// Samples processed.
    pub samples: u64,
    /// Mean training loss of the last round.
    pub last_loss: f32,
    /// Time up but not training, by reason.
    pub idle: IdleTimes,
}

use serde::{Deserialize, Serialize};

/// The GoPALS state machine of one node.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    me: NodeId,
    run_id: RunId,
    t0: Micros,
    rng: SeededRng,
    // The replica (shared state).
    anchor: Arc<Vec<f32>>,
    outer: OuterState,
    inner_lr: inner_lr::InnerLrState,
    version: VersionVector,
    applied: AppliedSet,
    given_up: AppliedSet,
    clock: Option<TickClock>,
    // Our own work.
    round: u64,
    first_round: u64,
    phase: Phase,
    started_at: Micros,
    residual: ErrorFeedback,
    membership: Membership,
    last_base_tick: Option<u64>,
    /// The tick of this process's first round: it sums no earlier tick.
    first_base_tick: Option<u64>,
    last_batch_tick: Option<u64>,
    /// The newest batch key (tick or round) whose outer round is closed.
    last_closed_key: Option<u64>,
    // Receive pipeline.
    awaiting: BTreeMap<UpdateId, Awaiting>,
    pending: Vec<Pending>,
    pending_ids: BTreeSet<UpdateId>,
    /// (source, base tick) of each pending update (tick mode).
    pending_ticks: BTreeSet<(NodeId, u64)>,
    tick_arrivals: BTreeMap<u64, BTreeSet<NodeId>>,
    /// Latest base tick each live peer contributed to, and how many live
    /// peers have each value: tick completeness in O(log N).
    last_tick_of: BTreeMap<NodeId, u64>,
    last_tick_counts: BTreeMap<u64, u32>,
    /// Recent contributors to applied sums: who may hold a role in a tick.
    roster: roster::Roster,
    /// Scaled norms of recently applied sums: the guard against forged ones.
    sum_guard: sum_guard::SumGuard,
    /// The anchor fetch in flight.
    anchor_fetch: Option<anti_entropy::AnchorFetch>,
    /// Anti-entropy runs every round while replicas are known or suspected
    /// to differ, at its configured period otherwise.
    repairing: bool,
    /// How far our anchor moves per round: the scale a peer's anchor is
    /// judged by.
    movement: trust::Movement,
    /// Our round in which we last averaged with a peer (once per round).
    last_average_round: Option<u64>,
    /// An average moved our anchor since the last round started, so that
    /// movement is not the swarm's alone and is not recorded.
    averaged_this_round: bool,
    /// A far anchor waiting for a second peer to vouch for it.
    far_candidate: Option<anti_entropy::FarCandidate>,
    /// The peer whose far anchor, with nobody to vouch for it, we last
    /// fetched whole, and our round then.
    far_checked: Option<(NodeId, u64)>,
    /// Contributors whose whole anchor we last checked far from ours, with
    /// our round then: evidence that no fellow contributor shares our
    /// replica (`anti_entropy`'s founders' rule).
    far_peers: BTreeMap<NodeId, u64>,
    /// The anchor our last round started from.
    last_base: Option<Arc<Vec<f32>>>,
    /// The last tick in which a starved speed estimate was probed.
    last_probe_tick: Option<u64>,
    /// The lead steps of the round about to start (tick mode, `lead`).
    lead: Option<lead::Lead>,
    // Timers and outputs.
    wake_at: Option<Micros>,
    /// The wait in progress, booked into `stats.idle`.
    idle: idle::IdleClock,
    startup_until: Option<Micros>,
    /// Peers the shell knows take part: heard from all, the startup wait
    /// is over.
    startup_expects: BTreeSet<NodeId>,
    next_heartbeat: Micros,
    heartbeat_seq: u64,
    outputs: VecDeque<Output>,
    stats: EngineStats,
    /// Aggregated dissemination's sums, votes and fetches.
    aggregation: aggregation::AggregationState,
    /// Closed ticks a late update can be put back into (full dissemination).
    late_updates: late_updates::LateUpdateLog,
}

impl Engine {
    /// A fresh engine for node `me` of run `run_id`, starting from
    /// `initial` parameters, with an initial speed guess (steps/s). `t0`
    /// is tick 0 of the run's clock; `seed` drives every random choice.
    pub fn new(
        cfg: EngineConfig,
        me: NodeId,
        run_id: RunId,
        t0: Micros,
        initial: Vec<f32>,
        initial_speed: f32,
        seed: u64,
    ) -> Self {
        let n = initial.len();
        let membership = Membership::new(
            me,
            initial_speed.max(1e-6),
            Micros(cfg.membership.peer_timeout_ms as u64 * 1000),
            cfg.membership.max_peers as usize,
        );
        Self {
            outer: OuterState::new(cfg.outer.kind, n),
            inner_lr: inner_lr::InnerLrState::default(),
            cfg,
            me,
            run_id,
            t0,
            rng: SeededRng::derive(seed, "engine"),
            anchor: Arc::new(initial),
            version: VersionVector::new(),
            applied: AppliedSet::new(),
            given_up: AppliedSet::new(),
            clock: None,
            round: 0,
            first_round: 0,
            phase: Phase::Created,
            started_at: Micros::ZERO,
            residual: ErrorFeedback::new(),
            membership,
            last_base_tick: None,
            first_base_tick: None,
            last_batch_tick: None,
            last_closed_key: None,
            awaiting: BTreeMap::new(),
            pending: Vec::new(),
            pending_ids: BTreeSet::new(),
            pending_ticks: BTreeSet::new(),
            tick_arrivals: BTreeMap::new(),
            last_tick_of: BTreeMap::new(),
            roster: roster::Roster::default(),
            sum_guard: sum_guard::SumGuard::default(),
            last_tick_counts: BTreeMap::new(),
            anchor_fetch: None,
            repairing: false,
            movement: trust::Movement::default(),
            last_average_round: None,
            averaged_this_round: false,
            last_base: None,
            far_candidate: None,
            far_checked: None,
            far_peers: BTreeMap::new(),
            last_probe_tick: None,
            lead: None,
            wake_at: None,
            idle: idle::IdleClock::default(),
            startup_until: None,
            startup_expects: BTreeSet::new(),
            next_heartbeat: Micros::ZERO,
            heartbeat_seq: 0,
            outputs: VecDeque::new(),
            stats: EngineStats::default(),
            aggregation: aggregation::AggregationState::default(),
            late_updates: late_updates::LateUpdateLog::default(),
        }
    }

    /// Handles one input at time `now`; drain [`Engine::poll_output`] after.
    pub fn handle(&mut self, now: Micros, input: Input) {
        self.expire_peers(now);
        match input {
            Input::Start => self.on_start(now),
            Input::PeersKnown(peers) => {
                let cap = self.cfg.membership.max_peers as usize;
                self.startup_expects = peers.into_iter().filter(|p| *p != self.me).take(cap).collect();
            }
            Input::LocalPhaseDone(result) => self.on_local_phase_done(now, result),
            Input::Announcement { announcement, from } => self.on_announcement(now, announcement, from),
            Input::Update { announcement, from, payload } => self.on_update(now, announcement, from, payload),
            Input::PayloadSource { id, from } => self.on_payload_source(id, from),
            Input::Payload { id, bytes } => self.on_payload(id, bytes),
            Input::FetchFailed { id, from, reason } => self.on_fetch_failed(id, from, reason),
            Input::AnnouncementGone(id) => self.on_announcement_gone(id),
            Input::Heartbeat(hb) => self.on_heartbeat(now, hb),
            Input::PeerDown(peer) => self.peer_gone(peer),
            Input::PeerDigest { from, digest } => self.on_peer_digest(from, digest),
            Input::PeerAnchor { from, state } => self.on_peer_anchor(from, *state),
            Input::AnchorUnavailable { from } => self.on_anchor_unavailable(from),
            Input::AggregateAnnouncement { announcement, from } => {
                self.on_aggregate_announcement(now, announcement, from)
            }
            Input::AggregateBody { key, group, from, bytes } => self.on_aggregate_body(key, group, from, bytes),
            Input::AggregateFetchFailed { key, group, from } => self.next_aggregate_source(key, group, from),
            Input::Leave => self.on_leave(now),
        }
        self.publish_due_aggregates(now);
        self.try_start_round(now);
    }

    /// Handles timers due at `now`.
    pub fn handle_timeout(&mut self, now: Micros) {
        self.expire_peers(now);
        self.expire_fetches(now);
        if matches!(self.phase, Phase::Stopped | Phase::Created) {
            return;
        }
        if now >= self.next_heartbeat {
            self.send_heartbeat(now, false);
        }
        if self.wake_at.is_some_and(|t| now >= t) {
            self.wake_at = None;
        }
        self.publish_due_aggregates(now);
        self.try_start_round(now);
    }

    /// The next time [`Engine::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Micros> {
        if matches!(self.phase, Phase::Stopped | Phase::Created) {
            return None;
        }
        let mut t = Some(self.next_heartbeat);
        let mut consider = |x: Option<Micros>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        consider(self.wake_at);
        consider(self.aggregation.wake_at);
        consider(self.membership.next_expiry());
        consider(self.awaiting.values().map(|a| a.since + FETCH_TIMEOUT + Micros(1)).min());
        t
    }

    /// The next output to act on.
    pub fn poll_output(&mut self) -> Option<Output> {
        let next = self.outputs.pop_front();
        if next.is_none() && self.outputs.capacity() > OUTPUTS_KEPT {
            self.outputs.shrink_to(OUTPUTS_KEPT);
        }
        next
    }

    /// The anchor (this node's replica of the shared model).
    pub fn anchor(&self) -> &[f32] {
        &self.anchor
    }

    /// The anchor, shared without copying.
    pub fn anchor_arc(&self) -> Arc<Vec<f32>> {
        self.anchor.clone()
    }

    /// The version vector.
    pub fn version(&self) -> &VersionVector {
        &self.version
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// This node.
    pub fn node_id(&self) -> NodeId {
        self.me
    }

    /// The run.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// Counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Why this node is waiting instead of training (`None` while it
    /// trains, or before it starts).
    pub fn idle_reason(&self) -> Option<IdleReason> {
        self.idle.reason()
    }

    /// Idle time by reason up to `now`, the wait in progress included.
    pub fn idle_at(&self, now: Micros) -> IdleTimes {
        self.idle.at(now, &self.stats.idle)
    }

    /// The inner learning rate's scale now (1 = the manifest's rate).
    pub fn inner_lr_scale(&self) -> f32 {
        self.inner_lr.scale
    }

    /// The round this node trains (or will train next).
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Live nodes, us included.
    pub fn live_nodes(&self) -> usize {
        self.membership.live_count()
    }

    /// Our speed estimate (steps/s).
    pub fn speed(&self) -> f32 {
        self.membership.my_speed()
    }

    /// The tick period in use (tick mode, once the clock started).
    pub fn tick_period(&self) -> Option<Micros> {
        self.clock.as_ref().map(|c| c.period())
    }

    /// The tick containing `t` (tick mode, once the clock started).
    pub fn tick_at(&self, t: Micros) -> Option<u64> {
        self.clock.as_ref().map(|c| c.tick(t))
    }

    /// Outer rounds completed.
    pub fn outer_rounds(&self) -> u64 {
        self.outer.outer_rounds
    }

    /// True while a local phase runs.
    pub fn is_training(&self) -> bool {
        matches!(self.phase, Phase::Training(_))
    }

    /// Live peers and what we know of them.
    pub fn peers(&self) -> impl Iterator<Item = (&NodeId, &PeerInfo)> {
        self.membership.peers()
    }

    /// Whether `id` has been applied.
    pub fn has_applied(&self, id: &UpdateId) -> bool {
        self.applied.contains(id)
    }

    /// Whether the payload of `id` is wanted and not yet here: a shell keeps
    /// what it needs to check a fetched payload only while this holds.
    pub fn is_fetching(&self, id: &UpdateId) -> bool {
        self.awaiting.contains_key(id)
    }

    fn emit(&mut self, output: Output) {
        self.outputs.push_back(output);
    }

    fn event(&mut self, event: EngineEvent) {
        self.outputs.push_back(Output::Event(event));
    }

    /// Drops an update with a reason. Only honest-but-late updates (too
    /// stale) get a rejection receipt in the ledger: invalid input never
    /// touches the ledger, only metrics and logs.
    fn drop_update(&mut self, announcement: &UpdateAnnouncement, reason: RejectReason, record: bool) {
        *self.stats.dropped.entry(reason).or_insert(0) += 1;
        self.given_up.insert(announcement.id);
        if record {
            self.emit(Output::Record(RecordKind::Receipt {
                update: announcement.id,
                payload_hash: announcement.payload_hash,
                samples: announcement.samples,
                outcome: crate::ledger::ReceiptOutcome::Rejected { reason },
            }));
        }
        self.event(EngineEvent::Dropped { id: announcement.id, reason });
    }

    fn on_start(&mut self, now: Micros) {
        if !matches!(self.phase, Phase::Created) {
            return;
        }
        self.phase = Phase::Waiting;
        self.started_at = now;
        self.emit(Output::Record(RecordKind::Join { speed: self.membership.my_speed(), device: String::new() }));
        self.send_heartbeat(now, false);
        // Let heartbeats of peers arrive before the first round: tick mode
        // sizes its period from their speeds, barrier mode waits for those
        // heard. Over once the peers the shell knows have been heard.
        if !matches!(self.cfg.schedule, Schedule::FreeRunning) {
            let until = now + Micros(self.cfg.membership.startup_ms as u64 * 1000);
            self.startup_until = Some(until);
            self.wake_at = Some(until);
        }
    }

    fn on_leave(&mut self, now: Micros) {
        if matches!(self.phase, Phase::Stopped) {
            return;
        }
        self.idle.leave(now, &mut self.stats.idle);
        self.phase = Phase::Stopped;
        let round = self.round;
        self.emit(Output::Record(RecordKind::Leave { round, reason: "clean shutdown".into() }));
        self.send_heartbeat(Micros::ZERO, true);
    }

    fn send_heartbeat(&mut self, now: Micros, leaving: bool) {
        self.heartbeat_seq += 1;
        let hb = Heartbeat {
            run_id: self.run_id,
            src: self.me,
            seq: self.heartbeat_seq,
            speed: self.membership.my_speed(),
            round: self.round,
            first_round: self.first_round,
            applied_total: self.version.total(),
            leaving,
            clock: self.clock.as_ref().map(|c| c.latest()),
        };
        self.emit(Output::SendHeartbeat(hb));
        self.next_heartbeat = now + Micros(self.cfg.membership.heartbeat_ms as u64 * 1000);
    }

    fn on_heartbeat(&mut self, now: Micros, hb: Heartbeat) {
        if hb.run_id != self.run_id || hb.src == self.me {
            return;
        }
        if hb.leaving {
            self.peer_gone(hb.src);
            return;
        }
        let info = PeerInfo { speed: hb.speed, last_seen: now, first_round: hb.first_round, round: hb.round };
        if self.membership.heard(hb.src, info) == membership::MembershipChange::Joined {
            self.event(EngineEvent::PeerJoined(hb.src));
            // A (re)joining peer may hold a replica that drifted apart (a
            // healed partition): compare at the next round, not in ten.
            self.repairing = true;
        }
        // Tick mode: follow the clock leader's stretch of the clock.
        if let Some(seg) = hb.clock
            && self.clock_leader() == hb.src
        {
            match self.clock.as_mut() {
                Some(c) => {
                    c.adopt(seg);
                }
                None => self.clock = Some(tick::TickClock::from_segment(seg)),
            }
        }
    }

    /// The node that decides the tick period: the live node with the smallest id.
    fn clock_leader(&self) -> NodeId {
        self.membership.peers().next().map_or(self.me, |(first, _)| (*first).min(self.me))
    }

    fn expire_peers(&mut self, now: Micros) {
        for peer in self.membership.expire(now) {
            self.forget_peer(peer);
        }
    }

    /// A peer said it leaves, or the shell saw it go.
    fn peer_gone(&mut self, peer: NodeId) {
        // Known but never heard, so not a member: not waited for either.
        self.startup_expects.remove(&peer);
        if self.membership.remove(&peer) {
            self.forget_peer(peer);
        }
    }

    fn forget_peer(&mut self, peer: NodeId) {
        // A known peer that left is not waited for at start-up.
        self.startup_expects.remove(&peer);
        if let Some(t) = self.last_tick_of.remove(&peer) {
            self.count_last_tick(t, -1);
        }
        self.event(EngineEvent::PeerLeft(peer));
    }

    fn count_last_tick(&mut self, tick: u64, delta: i32) {
        let c = self.last_tick_counts.entry(tick).or_insert(0);
        *c = c.saturating_add_signed(delta);
        if *c == 0 {
            self.last_tick_counts.remove(&tick);
        }
    }

    /// Records that live peer `src` contributed to base tick `tick`.
    fn note_contribution(&mut self, src: NodeId, tick: u64) {
        if src == self.me || !self.membership.is_live(&src) {
            return;
        }
        use std::collections::btree_map::Entry;
        let old = match self.last_tick_of.entry(src) {
            Entry::Occupied(e) if *e.get() >= tick => return,
            Entry::Occupied(mut e) => Some(e.insert(tick)),
            Entry::Vacant(e) => {
                e.insert(tick);
                None
            }
        };
        if let Some(o) = old {
            self.count_last_tick(o, -1);
        }
        self.count_last_tick(tick, 1);
    }

    /// [`Engine::note_contribution`] for each source of `batch` (in id
    /// order, each once), all to tick `tick`: one pass over the live set
    /// and one over the last ticks.
    fn note_contributions_sorted(&mut self, batch: &[(NodeId, ())], tick: u64) {
        let me = self.me;
        let mut live = Vec::with_capacity(batch.len());
        self.membership.live_sorted(batch, |src, (), is_live| {
            if *src != me && is_live {
                live.push((*src, ()));
            }
        });
        let mut moved_from = Vec::new();
        let mut added = 0;
        sorted_walk::update_sorted(&mut self.last_tick_of, &live, |last, ()| match last {
            Some(t) if *t >= tick => None,
            Some(t) => {
                moved_from.push(std::mem::replace(t, tick));
                None
            }
            None => {
                added += 1;
                Some(tick)
            }
        });
        for o in &moved_from {
            self.count_last_tick(*o, -1);
        }
        let joined = i32::try_from(moved_from.len() + added).unwrap_or(i32::MAX);
        if joined > 0 {
            self.count_last_tick(tick, joined);
        }
    }
}

#[cfg(test)]
mod tests;
