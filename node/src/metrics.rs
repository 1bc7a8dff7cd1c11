//! Prometheus metrics (ours and libp2p's) and the HTTP endpoint that serves
//! them with `/status`.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, RwLock, atomic::AtomicU64},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::status::Status;

/// A reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason, snake_case.
    pub reason: String,
}

/// A message-kind label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The kind, snake_case.
    pub kind: String,
}

/// A connection-kind label (direct, relayed, quic, unknown).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabel {
    /// The kind.
    pub connection: String,
}

/// What a node waits for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabel {
    /// next_round, trainer_queue or training.
    pub on: String,
}

/// An outcome label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The outcome, snake_case.
    pub outcome: String,
}

/// Our metrics.
#[derive(Debug)]
pub struct NodeMetrics {
    /// Local phases completed.
    pub rounds: Counter,
    /// Inner steps taken.
    pub steps: Counter,
    /// Samples processed.
    pub samples: Counter,
    /// Updates published.
    pub published: Counter,
    /// Updates applied to our replica.
    pub applied: Counter,
    /// Outer rounds closed.
    pub outer_rounds: Counter,
    /// Inputs rejected or updates dropped, by reason.
    pub rejected: Family<ReasonLabel, Counter>,
    /// Staleness of applied updates.
    pub staleness: Histogram,
    /// Mean training loss of the last round.
    pub train_loss: Gauge<f64, AtomicU64>,
    /// Latest held-out loss.
    pub eval_loss: Gauge<f64, AtomicU64>,
    /// Connected peers.
    pub connected_peers: Gauge,
    /// Live members.
    pub live_nodes: Gauge,
    /// Fraction of time training.
    pub utilisation: Gauge<f64, AtomicU64>,
    /// Our steps per second.
    pub speed: Gauge<f64, AtomicU64>,
    /// Bytes of our messages sent, by kind.
    pub bytes_out: Family<KindLabel, Counter>,
    /// Bytes of messages received, by kind.
    pub bytes_in: Family<KindLabel, Counter>,
    /// Ledger records written.
    pub ledger_records: Counter,
    /// Anchor averages by anti-entropy.
    pub anchors_averaged: Counter,
    /// Peers' replica states not used (anti-entropy or a join), by reason.
    pub state_refused: Family<ReasonLabel, Counter>,
    /// Updates that arrived after their batch closed here.
    pub late_updates: Counter,
    /// Late updates put back into their own tick (the ticks since recomputed).
    pub updates_replayed: Counter,
    /// Quorum sums published, received, put back into their tick or applied late, and offers declined (aggregated dissemination).
    pub sums: Family<OutcomeLabel, Counter>,
    /// Dials that failed (a peer gone, or unreachable).
    pub dial_failures: Counter,
    /// Estimated relative distance to peers' replicas.
    pub consensus_distance: Gauge<f64, AtomicU64>,
    /// The same distance in rounds of our anchor's recent movement.
    pub consensus_distance_rounds: Gauge<f64, AtomicU64>,
    /// The inner learning rate's scale of the manifest's rate.
    pub inner_lr_scale: Gauge<f64, AtomicU64>,
    /// Changes of the inner learning rate, by reason (plateau, spike).
    pub inner_lr_changes: Family<ReasonLabel, Counter>,
    /// Bytes received by how the sender was reached.
    pub bytes_in_by_connection: Family<ConnectionLabel, Counter>,
    /// Hole punches by outcome (direct, failed).
    pub hole_punches: Family<OutcomeLabel, Counter>,
    /// 1 for what the node waits for now, 0 for the rest.
    pub waiting: Family<WaitLabel, Gauge>,
    /// Seconds the local phase in training has run (0 when none is).
    pub phase_seconds: Gauge<f64, AtomicU64>,
    /// Seconds up but not training, by the engine's reason.
    pub idle_seconds: Family<ReasonLabel, Counter<f64, AtomicU64>>,
}

impl NodeMetrics {
    /// Registers our metrics under `ragtag_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            rounds: Counter::default(),
            steps: Counter::default(),
            samples: Counter::default(),
            published: Counter::default(),
            applied: Counter::default(),
            outer_rounds: Counter::default(),
            rejected: Family::default(),
            staleness: Histogram::new([0.5, 1.5, 2.5, 3.5, 4.5, 8.5, 16.5, 64.5]),
            train_loss: Gauge::default(),
            eval_loss: Gauge::default(),
            connected_peers: Gauge::default(),
            live_nodes: Gauge::default(),
            utilisation: Gauge::default(),
            speed: Gauge::default(),
            bytes_out: Family::default(),
            bytes_in: Family::default(),
            ledger_records: Counter::default(),
            anchors_averaged: Counter::default(),
            state_refused: Family::default(),
            late_updates: Counter::default(),
            updates_replayed: Counter::default(),
            sums: Family::default(),
            dial_failures: Counter::default(),
            consensus_distance: Gauge::default(),
            consensus_distance_rounds: Gauge::default(),
            inner_lr_scale: Gauge::default(),
            inner_lr_changes: Family::default(),
            bytes_in_by_connection: Family::default(),
            hole_punches: Family::default(),
            waiting: Family::default(),
            phase_seconds: Gauge::default(),
            idle_seconds: Family::default(),
        };
        m.inner_lr_scale.set(1.0);
        let r = registry.sub_registry_with_prefix("ragtag");
        r.register("rounds", "Local phases completed", m.rounds.clone());
        r.register("steps", "Inner steps taken", m.steps.clone());
        r.register("samples", "Samples processed", m.samples.clone());
        r.register("updates_published", "Updates published", m.published.clone());
        r.register("updates_applied", "Updates applied to this replica", m.applied.clone());
        r.register("outer_rounds", "Outer rounds closed", m.outer_rounds.clone());
        r.register("rejected", "Inputs rejected or updates dropped, by reason", m.rejected.clone());
        r.register("staleness", "Staleness of applied updates", m.staleness.clone());
        r.register("train_loss", "Mean training loss of the last round", m.train_loss.clone());
        r.register("eval_loss", "Latest held-out loss of this replica", m.eval_loss.clone());
        r.register("connected_peers", "Connected libp2p peers", m.connected_peers.clone());
        r.register("live_nodes", "Live members of the run, this node included", m.live_nodes.clone());
        r.register("utilisation", "Fraction of the time spent training", m.utilisation.clone());
        r.register("speed_steps_per_second", "Inner steps per second", m.speed.clone());
        r.register("message_bytes_out", "Bytes of messages sent, by kind", m.bytes_out.clone());
        r.register("message_bytes_in", "Bytes of messages received, by kind", m.bytes_in.clone());
        r.register("ledger_records", "Ledger records written", m.ledger_records.clone());
        r.register("anchors_averaged", "Anchor averages by anti-entropy", m.anchors_averaged.clone());
        r.register(
            "state_refused",
            "Peers' replica states not used (anti-entropy or a join), by reason",
            m.state_refused.clone(),
        );
        r.register(
            "late_updates",
            "Updates applied one batch later than on replicas that had them in time",
            m.late_updates.clone(),
        );
        r.register(
            "updates_replayed",
            "Late updates put back into their own tick, the ticks since recomputed, as on replicas that had them in time",
            m.updates_replayed.clone(),
        );
        r.register("dial_failures", "Dials that failed", m.dial_failures.clone());
        r.register(
            "sums",
            "Quorum sums published, received, applied after their tick closed, and offers declined (aggregated dissemination)",
            m.sums.clone(),
        );
        r.register(
            "consensus_distance",
            "Estimated relative distance to a peer's replica",
            m.consensus_distance.clone(),
        );
        r.register(
            "consensus_distance_rounds",
            "The distance to a peer's replica in rounds of this anchor's recent movement",
            m.consensus_distance_rounds.clone(),
        );
        r.register(
            "inner_lr_scale",
            "The scale of the manifest's inner learning rate this node trains at (plateaus and cooldown)",
            m.inner_lr_scale.clone(),
        );
        r.register(
            "inner_lr_changes",
            "Changes of the inner learning rate, by reason (plateau, spike)",
            m.inner_lr_changes.clone(),
        );
        r.register(
            "bytes_in_by_connection",
            "Bytes received (gossip, payloads) by how the sender was reached",
            m.bytes_in_by_connection.clone(),
        );
        r.register(
            "waiting",
            "What the node waits for (1) now: next_round, trainer_queue, training",
            m.waiting.clone(),
        );
        r.register("phase_seconds", "Seconds the local phase in training has run", m.phase_seconds.clone());
        r.register(
            "idle_seconds",
            "Seconds up but not training, by reason (startup, barrier, exchange, tick_rest, short_tick)",
            m.idle_seconds.clone(),
        );
        r.register("hole_punches", "Hole punches (DCUtR) with relayed peers, by outcome", m.hole_punches.clone());
        m
    }

    /// Raises the idle counters to the engine's totals.
    pub fn set_idle(&self, idle: &ragtag_protocol::engine::IdleTimes) {
        for r in ragtag_protocol::engine::IdleReason::ALL {
            let c = self.idle_seconds.get_or_create(&ReasonLabel { reason: r.name().to_string() });
            let more = idle.get(r).as_secs_f64() - c.get();
            if more > 0.0 {
                c.inc_by(more);
            }
        }
    }

    /// Counts a rejection.
    pub fn reject(&self, reason: &str) {
        self.rejected.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc();
    }
}

/// What the HTTP endpoint serves.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The registry (ours and libp2p's).
    pub registry: Arc<Mutex<Registry>>,
    /// The latest status.
    pub status: Arc<RwLock<Status>>,
}

/// Serves `/` (the status page), `/metrics` (Prometheus text) and
/// `/status` (JSON) on `addr`;
/// returns the bound address.
pub async fn serve(addr: SocketAddr, endpoint: Endpoint) -> std::io::Result<SocketAddr> {
    use axum::{Json, Router, extract::State, http::header, response::IntoResponse, routing::get};
    async fn metrics(State(e): State<Endpoint>) -> impl IntoResponse {
        let mut text = String::new();
        let reg = e.registry.lock().expect("registry lock");
        let _ = prometheus_client::encoding::text::encode(&mut text, &reg);
        ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
    }
    async fn status(State(e): State<Endpoint>) -> Json<Status> {
        Json(e.status.read().expect("status lock").clone())
    }
    async fn page(State(e): State<Endpoint>) -> axum::response::Html<String> {
        axum::response::Html(crate::status_page::html(&e.status.read().expect("status lock")))
    }
    let app = Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(endpoint);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("metrics endpoint stopped: {e}");
        }
    });
    Ok(bound)
}
