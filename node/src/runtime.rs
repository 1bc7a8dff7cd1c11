//! The node's event loop: drives the engine with wall-clock time, moves its
//! outputs to the network, the trainer and the ledger, and feeds it what
//! arrives. No algorithm logic lives here.

mod aggregates;
mod error;
mod fetch;
mod inbound;
mod outputs;
mod peer_table;
mod phases;
mod reachability;
mod settle;
pub mod startup;
mod startup_inbox;
mod status_view;

pub use error::RuntimeError;
pub use fetch::{
    FetchError, PAYLOAD_CHUNKS_IN_FLIGHT, payload as fetch_payload, payload_pipelined as fetch_payload_pipelined,
};

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use libp2p::{Multiaddr, PeerId};
use ragtag_models::{TrainerConfig, data::Shard, device::DeviceChoice};
use ragtag_protocol::{
    Keypair, NodeId, Signed,
    engine::{Engine, Input},
    ids::{Hash32, UpdateId},
    ledger::{LedgerWriter, RecordKind, SignedRecord},
    manifest::Manifest,
    validate::{RejectReason, UpdateValidator},
    wire::UpdateAnnouncement,
};
use tokio::sync::mpsc;

use crate::{
    checkpoint, identity,
    ledger::SledLedger,
    metrics::{Endpoint, NodeMetrics},
    net,
    payload_store::PayloadStore,
    status::Status,
    trainer_thread::{self, TrainerCommand, TrainerHandle, TrainerReply},
};

/// Internal results queued at most (fetches finishing).
const INTERNAL_CAPACITY: usize = 1024;
/// How often the status recomputes our credit (it reads the whole ledger).
const CREDIT_EVERY: Duration = Duration::from_secs(30);

/// Unreachable peers remembered for logging at most.
const MAX_UNREACHABLE_LOGGED: usize = 1024;
/// Distinct (peer, reason) pairs logged at most.
const MAX_LOGGED_REJECTIONS: usize = 10_000;
/// Announcements remembered for validating fetched payloads at most; when
/// full, those the engine no longer fetches are dropped (it fetches at most
/// `MAX_AWAITING`, so room always remains).
const MAX_ANNOUNCED: usize = 2 * ragtag_protocol::engine::MAX_AWAITING;

/// Everything `ragtag run` decided.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The run.
    pub manifest: Manifest,
    /// Our key.
    pub key: Keypair,
    /// Our state directory (locked by the caller).
    pub state: PathBuf,
    /// The data file.
    pub data: Option<PathBuf>,
    /// The device.
    pub device: DeviceChoice,
    /// Emulated slower hardware.
    pub pace: trainer_thread::Pace,
    /// Metrics/status address.
    pub metrics: Option<SocketAddr>,
    /// Stop after this many rounds.
    pub max_rounds: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop at this held-out loss.
    pub target_loss: Option<f32>,
    /// Evaluate every this many rounds.
    pub eval_every: u64,
    /// Checkpoint every this many rounds.
    pub checkpoint_every: u64,
    /// JSON lines on stdout.
    pub json: bool,
    /// The study's per-round measurements in the JSON round lines.
    pub trace_updates: bool,
    /// The network's configuration (keypair, topic, addresses, key...).
    pub net: net::Config,
    /// Allowed contributors (private swarms); `None` = anyone.
    pub allow: Option<BTreeSet<NodeId>>,
}

/// Results of background tasks, back on the loop (an announcement of
/// `Ok(None)`: the peer no longer holds it).
#[derive(Debug)]
pub(crate) enum Internal {
    Payload {
        id: UpdateId,
        from: NodeId,
        result: Result<Vec<u8>, fetch::FetchError>,
    },
    Announcement {
        id: UpdateId,
        from: NodeId,
        result: Result<Option<Signed<UpdateAnnouncement>>, fetch::FetchError>,
    },
    Digest {
        from: NodeId,
        result: Result<ragtag_protocol::wire::ReplicaDigest, fetch::FetchError>,
    },
    Anchor {
        from: NodeId,
        /// Which pull (`Node::anchor_pulls`).
        pull: u64,
        /// The state and the bytes it took.
        result: Result<(Box<ragtag_protocol::engine::ReplicaState>, usize), fetch::FetchError>,
    },
    /// A sum pulled from `from`: one the engine asked for, or one offered.
    Sum {
        key: u64,
        group: u32,
        from: NodeId,
        hash: Hash32,
        asked: bool,
        result: Result<Vec<u8>, fetch::FetchError>,
    },
}

pub use crate::wall_clock::now;

/// How a node run ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// Why it stopped.
    pub reason: String,
    /// It stopped on an error (the trainer failed), not by choice.
    pub failed: bool,
    /// Rounds completed.
    pub rounds: u64,
    /// Latest held-out loss.
    pub eval_loss: Option<f32>,
    /// Updates applied.
    pub applied: u64,
    /// How the engine started: resumed, joined or fresh.
    pub origin: String,
    /// A strided sample of the final anchor (compare replicas).
    pub anchor_sketch: Vec<f32>,
}

pub(crate) struct Node {
    opts: NodeOptions,
    me: NodeId,
    engine: Engine,
    validator: UpdateValidator,
    ledger: SledLedger,
    writer: LedgerWriter,
    pending_records: Vec<SignedRecord>,
    trainer: TrainerHandle,
    net: net::Client,
    internal_tx: mpsc::Sender<Internal>,
    store: PayloadStore,
    announced: BTreeMap<UpdateId, (UpdateAnnouncement, Signed<UpdateAnnouncement>)>,
    /// Sums we can serve (aggregated dissemination).
    sums: aggregates::SumStore,
    /// Offered sums being pulled, by hash.
    offers_pulling: BTreeSet<Hash32>,
    /// Sums published and received.
    sum_counts: crate::status::SumStatus,
    /// Requests for a new replica state held until the last tick's sums
    /// are closed (aggregated dissemination), oldest first.
    deferred_states: VecDeque<(Instant, u64, PeerId, ragtag_protocol::wire::Message)>,
    metrics: NodeMetrics,
    status: Arc<RwLock<Status>>,
    logged: BTreeSet<(PeerId, RejectReason)>,
    /// (peer, reason) pairs whose refused replica state was logged at warn.
    logged_states: BTreeSet<(NodeId, &'static str)>,
    rejected: BTreeMap<String, u64>,
    /// Replica-state snapshots of transfers in progress, newest last.
    state_snapshots: VecDeque<outputs::StateSnapshot>,
    started: Instant,
    busy_s: f64,
    connected: BTreeSet<PeerId>,
    /// Peers whose failed dial was logged since they were last connected.
    unreachable: BTreeSet<PeerId>,
    listen: Vec<Multiaddr>,
    reachability: reachability::Reachability,
    eval: Option<ragtag_models::EvalResult>,
    last_checkpoint_round: u64,
    ledger_records: u64,
    bytes_out: u64,
    bytes_in: u64,
    /// Bytes received by how the sender was reached.
    bytes_in_by_connection: BTreeMap<&'static str, u64>,
    hole_punch: crate::status::HolePunchStatus,
    peer_scores: BTreeMap<String, f64>,
    /// Peers whose replica state is not pulled now, as it would cross a
    /// relay while a direct connection may come (`net::NetInfo`).
    bulk_waits: BTreeSet<PeerId>,
    /// Replica-state pulls the engine asked for so far: only the latest
    /// one's failure is reported (the engine has one in flight at most,
    /// and an older pull's late failure must not free a newer one's slot).
    anchor_pulls: u64,
    /// The local phase in the trainer's hands.
    phase: phases::PhaseWatch,
    /// Our stdout was closed (`ragtag run --json | head`): stop cleanly.
    stdout_closed: bool,
    /// Evaluations over time and per-peer standing, for the status page.
    peer_table: peer_table::PeerTable,
    /// Our credit by the ledger's rule, and when it was last computed.
    credit: Option<(f64, Instant)>,
}

/// Runs a node until a stop condition or a signal.
pub async fn run(opts: NodeOptions) -> Result<Outcome, RuntimeError> {
    let manifest = opts.manifest.clone();
    let run_id = manifest.run_id();
    let me = opts.key.node_id();

    // Metrics first: the swarm registers libp2p's into the same registry.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = NodeMetrics::register(&mut registry);
    let (net, mut net_events, net_task) = net::spawn(opts.net.clone(), &mut registry).map_err(RuntimeError::Net)?;
    let registry = Arc::new(Mutex::new(registry));
    let status = Arc::new(RwLock::new(Status::default()));
    if let Some(addr) = opts.metrics {
        let bound = crate::metrics::serve(addr, Endpoint { registry: registry.clone(), status: status.clone() })
            .await
            .map_err(|source| RuntimeError::Metrics { addr, source })?;
        tracing::info!("metrics and status on http://{bound}/metrics and /status");
    }

    // The manifest beside the state, for `ragtag export` and the curious.
    if let Err(e) = crate::manifest_file::write(&manifest, &opts.state.join(crate::export::MANIFEST_FILE)) {
        tracing::warn!("cannot keep the manifest in {}: {e}", opts.state.display());
    }

    // The ledger, continuing our own chain.
    let ledger = SledLedger::open(&opts.state.join("ledger")).map_err(RuntimeError::OpenLedger)?;
    let last = ragtag_protocol::ledger::LedgerStore::last(&ledger).map_err(RuntimeError::ReadLedger)?;
    let writer = LedgerWriter::resume(opts.key.clone(), run_id, last.as_ref()).map_err(RuntimeError::Chain)?;
    let last_round = ragtag_protocol::ledger::LedgerStore::records(&ledger)
        .map_err(RuntimeError::ReadLedger)?
        .iter()
        .rev()
        .filter_map(|r| r.decode_unverified().ok())
        .find_map(|b| if let RecordKind::Contribution { round, .. } = b.kind { Some(round) } else { None });

    // The trainer, on its own thread.
    let (trainer_tx, mut trainer_rx) = mpsc::channel(8);
    let node_seed = u64::from_le_bytes(me.0[..8].try_into().expect("8 bytes"));
    let trainer_cfg = TrainerConfig {
        model: manifest.model.clone(),
        data: manifest.data.clone(),
        training: manifest.training,
        seed: manifest.seed,
        node_seed,
        shard: Shard::ALL,
        data_path: opts.data.clone(),
        device: opts.device,
        micro_batch: None,
    };
    let (pace, trace) = (opts.pace, opts.json && opts.trace_updates);
    let trainer = tokio::task::spawn_blocking(move || trainer_thread::spawn(trainer_cfg, pace, trace, trainer_tx))
        .await?
        .map_err(RuntimeError::Trainer)?;
    if let Some(reason) = &trainer.info.fallback_reason {
        tracing::info!("{reason}");
    }
    tracing::info!("data: {}", trainer.info.data);
    tracing::info!(
        "device {}, {:.0} inner steps/s{}",
        trainer.info.device,
        trainer.info.steps_per_s,
        if opts.pace.slowdown > 1.0 || !opts.pace.step_floor.is_zero() {
            format!(" (emulated: {}x slower, steps of at least {:?})", opts.pace.slowdown, opts.pace.step_floor)
        } else {
            String::new()
        }
    );

    // Wait (bounded) for the bootstrap connections and the run's peers.
    let mut inbox = startup_inbox::StartupInbox::default();
    let found = settle::settle(&net, &mut net_events, &opts.net.bootstrap, run_id, &mut inbox).await;
    if found.no_bootstrap_reached {
        match opts.net.swarm_key {
            Some(psk) => tracing::warn!(
                "could not complete a handshake with any bootstrap peer: in a private swarm this means a different \
                 swarm key (ours has fingerprint {}); check --swarm-key, the address, and that the peer runs",
                psk.fingerprint()
            ),
            None => tracing::warn!(
                "could not reach any bootstrap peer yet: check the --bootstrap address and that the peer runs"
            ),
        }
    }
    print_join_hint(&manifest, &found.listen);

    // The engine: resumed, joined or fresh.
    let seed = manifest.seed ^ node_seed;
    // Peers keep asking while we fetch: answer them, keep the rest.
    let (mut engine, origin) = {
        let setup = startup::engine(startup::EngineSetup {
            manifest: &manifest,
            key: &opts.key,
            state: &opts.state,
            initial: trainer.info.initial.clone(),
            speed: trainer.info.steps_per_s,
            seed,
            peers: found.state_sources,
            net: &net,
            refused: &metrics.state_refused,
        });
        tokio::pin!(setup);
        loop {
            tokio::select! {
                r = &mut setup => break r?,
                Some(ev) = net_events.recv() => inbox.take(&net, ev).await,
            }
        }
    };
    if origin == startup::Origin::Resumed {
        let path = opts.state.join(checkpoint::TRAINER_FILE);
        if path.exists() {
            trainer.send(TrainerCommand::Restore(path)).map_err(RuntimeError::Restore)?;
        }
    }
    if let Some(r) = last_round {
        engine.advance_round_to(r + 1);
    }
    tracing::info!("{:?} at round {} of run {} ({})", origin, engine.round(), manifest.name, run_id);
    // Holders of the run are found through the DHT by joiners and bootstrap nodes.
    net.provide(net::run_key(&run_id)).await.map_err(RuntimeError::Net)?;

    let (internal_tx, mut internal_rx) = mpsc::channel(INTERNAL_CAPACITY);
    let num_values = trainer.info.initial.len() as u64;
    let store_rounds = PayloadStore::rounds_for_horizon(engine.config().staleness.tau_max);
    let mut node = Node {
        validator: UpdateValidator::new(run_id, num_values, engine.config().h, opts.allow.clone()),
        me,
        engine,
        ledger,
        writer,
        pending_records: Vec::new(),
        trainer,
        net: net.clone(),
        internal_tx,
        store: PayloadStore::new(4096, 512 << 20, store_rounds),
        announced: BTreeMap::new(),
        sums: aggregates::SumStore::default(),
        offers_pulling: BTreeSet::new(),
        sum_counts: Default::default(),
        deferred_states: VecDeque::new(),
        metrics,
        status,
        logged: BTreeSet::new(),
        logged_states: BTreeSet::new(),
        rejected: BTreeMap::new(),
        state_snapshots: VecDeque::new(),
        started: Instant::now(),
        busy_s: 0.0,
        connected: found.connected,
        unreachable: BTreeSet::new(),
        listen: found.listen,
        reachability: reachability::Reachability::default(),
        eval: None,
        last_checkpoint_round: 0,
        ledger_records: 0,
        bytes_out: 0,
        bytes_in: 0,
        bytes_in_by_connection: BTreeMap::new(),
        hole_punch: Default::default(),
        peer_scores: BTreeMap::new(),
        bulk_waits: BTreeSet::new(),
        anchor_pulls: 0,
        phase: phases::PhaseWatch::default(),
        stdout_closed: false,
        peer_table: peer_table::PeerTable::default(),
        credit: None,
        opts,
    };
    let known = found.training.iter().filter_map(identity::node_id).collect();
    node.engine.handle(now(), Input::PeersKnown(known));
    node.engine.handle(now(), Input::Start);
    node.drain().await;
    for ev in inbox.into_events() {
        node.on_net_event(ev).await;
    }

    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Streams made once: a future made per loop turn (`ctrl_c()`) misses a
    // signal that arrives while the loop is busy between turns.
    let signal = |kind| tokio::signal::unix::signal(kind).map_err(RuntimeError::Signal);
    use tokio::signal::unix::SignalKind;
    let (mut sigterm, mut sigint, mut sighup) =
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?);
    let reason = loop {
        let timeout = node.engine.poll_timeout().map(|t| Duration::from_micros(t.0.saturating_sub(now().0)));
        let sleep = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(3600)));
        tokio::select! {
            _ = sleep => node.engine.handle_timeout(now()),
            Some(ev) = net_events.recv() => node.on_net_event(ev).await,
            Some(reply) = trainer_rx.recv() => node.on_trainer(reply),
            Some(i) = internal_rx.recv() => node.on_internal(i).await,
            _ = tick.tick() => {
                node.send_phase();
                node.refresh_net_info().await;
                node.refresh_status();
                if let Some(reason) = node.stop_reason() { break reason; }
            }
            _ = sigint.recv() => break "interrupted (SIGINT)".to_string(),
            _ = sigterm.recv() => break "terminated (SIGTERM)".to_string(),
            _ = sighup.recv() => break "hung up (SIGHUP)".to_string(),
        }
        node.drain().await;
        node.answer_deferred_states().await;
        if let Some(reason) = node.stop_reason() {
            break reason;
        }
    };
    node.shutdown(&reason).await;
    let failed = node.phase.fatal().is_some();
    let outcome = Outcome {
        failed,
        reason,
        rounds: node.engine.stats().rounds,
        eval_loss: node.eval.map(|e| e.loss),
        applied: node.engine.stats().applied,
        origin: format!("{origin:?}").to_lowercase(),
        anchor_sketch: ragtag_protocol::engine::anti_entropy::anchor_sketch(node.engine.anchor()),
    };
    let exit_line = node.opts.json.then(|| {
        serde_json::json!({ "event": "exit", "outcome": &outcome, "status": &*node.status.read().expect("status lock") })
    });
    net.shutdown().await;
    let _ = net_task.await;
    node.trainer.shutdown();
    // The exit line promises that the state directory is free: the ledger's
    // database lock goes with the ledger.
    drop(node.ledger);
    if let Some(line) = exit_line {
        // Nobody may be reading any more; that is no error now.
        let _ = write_line(&line);
    }
    Ok(outcome)
}

/// A line on stdout, flushed; an error when stdout is closed.
fn write_line(v: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()
}

fn print_join_hint(m: &Manifest, listen: &[Multiaddr]) {
    let Some(addr) = listen.iter().find(|a| a.to_string().contains("/tcp/")).or(listen.first()) else { return };
    let builtin = ragtag_protocol::engine::Strategy::ALL.iter().any(|s| Manifest::builtin(*s) == *m);
    let how = if builtin {
        if m.engine.strategy == ragtag_protocol::engine::Strategy::Gopals {
            String::new()
        } else {
            format!(" --strategy {}", m.engine.strategy)
        }
    } else {
        format!(" --run-id {}", m.run_id())
    };
    eprintln!("listening on {addr}\nto add a node from another terminal:\n    ragtag run --bootstrap {addr}{how}");
}

impl Node {
    fn stop_reason(&self) -> Option<String> {
        if let Some(fatal) = self.phase.fatal() {
            return Some(fatal);
        }
        if self.stdout_closed {
            return Some("stdout was closed".into());
        }
        let rounds = self.engine.stats().rounds;
        if self.opts.max_rounds.is_some_and(|m| rounds >= m) {
            return Some(format!("reached {rounds} rounds"));
        }
        if self.opts.duration.is_some_and(|d| self.started.elapsed() >= d) {
            return Some("duration elapsed".into());
        }
        if let (Some(t), Some(e)) = (self.opts.target_loss, self.eval)
            && e.loss <= t
        {
            return Some(format!("held-out loss {:.4} reached the target {t}", e.loss));
        }
        None
    }

    /// Hands the current phase to the trainer if it has not got it yet (its
    /// queue was full); called again whenever the trainer replies.
    fn send_phase(&mut self) {
        let Some(p) = self.phase.unsent() else { return };
        match self.trainer.send(TrainerCommand::Phase(p)) {
            Ok(()) => self.phase.sent(),
            Err(trainer_thread::SendError::Full) => tracing::debug!("the trainer's queue is full: the phase waits"),
            Err(e @ trainer_thread::SendError::Gone) => tracing::error!("{e}"),
        }
    }

    /// One JSON line on stdout; a closed stdout stops the node cleanly
    /// instead of panicking.
    fn json_line(&mut self, v: &serde_json::Value) {
        if !self.stdout_closed && write_line(v).is_err() {
            self.stdout_closed = true;
        }
    }

    fn on_trainer(&mut self, reply: TrainerReply) {
        self.on_trainer_reply(reply);
        self.send_phase();
    }

    fn on_trainer_reply(&mut self, reply: TrainerReply) {
        match reply {
            TrainerReply::PhaseDone { result, total_s, trace, .. } => {
                self.phase.done(result.round);
                self.busy_s += total_s;
                self.metrics.steps.inc_by(result.steps as u64);
                self.metrics.samples.inc_by(result.samples);
                let round = result.round;
                self.engine.handle(now(), Input::LocalPhaseDone(result));
                if self.engine.round() <= round {
                    return; // a lead step: the round goes on (or was dropped)
                }
                self.metrics.rounds.inc();
                let loss = self.engine.stats().last_loss;
                if loss.is_finite() {
                    self.metrics.train_loss.set(loss as f64);
                }
                if self.opts.eval_every > 0 && (round + 1).is_multiple_of(self.opts.eval_every) {
                    let params = self.engine.anchor_arc();
                    if let Err(e) = self.trainer.send(TrainerCommand::Evaluate { params, tag: round }) {
                        tracing::debug!("evaluation skipped: {e}");
                    }
                }
                if self.opts.checkpoint_every > 0
                    && round + 1 >= self.last_checkpoint_round + self.opts.checkpoint_every
                {
                    self.last_checkpoint_round = round + 1;
                    self.checkpoint();
                }
                if self.opts.json {
                    self.json_line(
                        &serde_json::json!({
                            "event": "round", "round": round, "tick": self.engine.tick_at(now()),
                            "t": self.started.elapsed().as_secs_f64(),
                            "train_loss": self.engine.stats().last_loss, "eval_loss": self.eval.map(|e| e.loss),
                            "applied": self.engine.stats().applied, "outer_rounds": self.engine.outer_rounds(),
                            "version": self.engine.version().total(), "lr_scale": self.engine.lr_scale(now()),
                            "samples": self.engine.stats().samples, "busy_s": self.busy_s,
                            "live": self.engine.live_nodes(), "peers": self.connected.len(),
                            "bytes_out": self.bytes_out,
                            "sketch": &ragtag_protocol::engine::anti_entropy::anchor_sketch(self.engine.anchor())[..32.min(self.engine.anchor().len())],
                            "trace": trace,
                        }),
                    );
                }
            }
            TrainerReply::Evaluated { result, tag } => {
                self.metrics.eval_loss.set(result.loss as f64);
                self.eval = Some(result);
                self.peer_table.eval(self.started.elapsed().as_secs_f64(), result.loss);
                if self.opts.json {
                    let t = self.started.elapsed().as_secs_f64();
                    let line = serde_json::json!({
                        "event": "eval", "round": tag, "t": t, "eval_loss": result.loss, "eval_accuracy": result.accuracy,
                    });
                    self.json_line(&line);
                }
            }
            TrainerReply::Checkpointed(Ok(path)) => tracing::debug!("trainer state saved to {}", path.display()),
            TrainerReply::Checkpointed(Err(e)) => tracing::warn!("trainer checkpoint failed: {e}"),
            TrainerReply::PhaseFailed { round, error } => self.phase.failed(round, &error),
            TrainerReply::Failed(e) => tracing::error!("trainer: {e}"),
        }
    }

    /// Writes the engine checkpoint and asks the trainer to save its state.
    fn checkpoint(&mut self) {
        let ck = self.engine.checkpoint();
        match checkpoint::save_engine(&self.opts.state, self.engine.run_id(), now().0 / 1000, &ck) {
            Ok(()) => {
                let anchor_hash =
                    Hash32::of(&ck.replica.anchor.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
                self.record(RecordKind::Checkpoint { round: ck.round, anchor_hash });
            }
            Err(e) => tracing::warn!("checkpoint failed: {e}"),
        }
        let path = self.opts.state.join(checkpoint::TRAINER_FILE);
        if let Err(e) = self.trainer.send(TrainerCommand::Checkpoint(path)) {
            tracing::debug!("trainer checkpoint skipped: {e}");
        }
    }

    fn record(&mut self, kind: RecordKind) {
        let r = self.writer.next(now().0 / 1000, kind);
        self.pending_records.push(r);
    }

    /// Counts `n` bytes received from `peer`, also by how it is reached.
    fn received(&mut self, peer: Option<PeerId>, n: usize) {
        self.bytes_in += n as u64;
        let kind = peer.map_or("unknown", |p| self.peer_table.connection_kind(&p));
        *self.bytes_in_by_connection.entry(kind).or_insert(0) += n as u64;
        self.metrics
            .bytes_in_by_connection
            .get_or_create(&crate::metrics::ConnectionLabel { connection: kind.to_string() })
            .inc_by(n as u64);
    }

    /// Counts and logs (once per peer and reason) a rejected input.
    fn reject(&mut self, peer: Option<PeerId>, reason: RejectReason, what: &str) {
        self.metrics.reject(reason.name());
        *self.rejected.entry(reason.name().to_string()).or_insert(0) += 1;
        if let Some(p) = peer {
            self.peer_table.rejected(p);
        }
        let key = (peer.unwrap_or(self.net.local_peer_id()), reason);
        if self.logged.len() < MAX_LOGGED_REJECTIONS && self.logged.insert(key) {
            tracing::warn!("rejected {what} from {}: {reason}", peer.map_or("?".into(), |p| p.to_string()));
        }
    }

    async fn shutdown(&mut self, reason: &str) {
        tracing::info!("stopping: {reason}");
        self.engine.handle(now(), Input::Leave);
        self.drain().await;
        self.checkpoint();
        self.flush_records().await;
        self.refresh_status();
        // Give the final heartbeat and records a moment to leave.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// The NodeId behind a PeerId, if it is an ed25519 one.
    fn node_of(peer: &PeerId) -> Option<NodeId> {
        identity::node_id(peer)
    }

    fn peer_of(node: &NodeId) -> Option<PeerId> {
        identity::peer_id(node)
    }
}
