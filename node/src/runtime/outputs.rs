//! Acting on the engine's outputs.

use std::{collections::BTreeMap, sync::Arc};

use ragtag_protocol::{
    Signed,
    engine::{EngineEvent, Input, Output, inner_lr::LrChange, state_transfer, trust::StateRefusal},
    ids::{Hash32, NodeId},
    ledger::{RecordKind, SignedRecord},
    wire::{Have, MAX_INLINE_PAYLOAD, MAX_RECEIPTS_PER_MESSAGE, Message, MessageKind},
};

use super::{Internal, Node, fetch, now};
use crate::{metrics::ReasonLabel, payload_store::StoredUpdate};

impl Node {
    /// Handles every pending engine output, then writes (and announces)
    /// the ledger records they produced.
    pub(crate) async fn drain(&mut self) {
        while let Some(out) = self.engine.poll_output() {
            self.act(out).await;
        }
        self.flush_records().await;
    }

    /// Counts `n` bytes of a message of `kind` sent, in the status and the metrics.
    pub(crate) fn count_sent(&mut self, kind: MessageKind, n: usize) {
        self.bytes_out += n as u64;
        self.metrics.bytes_out.get_or_create(&crate::metrics::KindLabel { kind: kind.name().into() }).inc_by(n as u64);
    }

    pub(crate) async fn gossip(&mut self, m: &Message) {
        let bytes = m.encode();
        self.count_sent(m.kind(), bytes.len());
        if let Err(e) = self.net.publish(bytes).await {
            tracing::warn!("gossip: {e}");
        }
    }

    async fn act(&mut self, out: Output) {
        match out {
            Output::StartLocalPhase(p) => {
                self.phase.start(p, self.engine.speed());
                self.send_phase();
            }
            Output::Publish(p) => {
                self.metrics.published.inc();
                let signed = Signed::sign(&p.announcement, &self.opts.key);
                let id = p.announcement.id;
                let payload_hash = p.announcement.payload_hash;
                self.store.insert(
                    id,
                    StoredUpdate { announcement: signed.clone(), payload: p.payload.clone(), payload_hash },
                );
                let m = if p.payload.len() <= MAX_INLINE_PAYLOAD {
                    Message::Update { announcement: signed, payload: p.payload.as_ref().clone() }
                } else {
                    Message::Announce(signed)
                };
                if p.to.is_empty() {
                    self.gossip(&m).await;
                } else {
                    // Aggregated: to its group's aggregators only.
                    self.send_to(&p.to, m);
                }
            }
            Output::FetchPayload { id, from, len, .. } => {
                let Some(peer) = Self::peer_of(&from) else { return };
                let (net, tx) = (self.net.clone(), self.internal_tx.clone());
                tokio::spawn(async move {
                    let result = fetch::payload(&net, peer, id, len).await;
                    let _ = tx.send(Internal::Payload { id, from, result }).await;
                });
            }
            Output::FetchAnnouncement { id, from } => {
                let Some(peer) = Self::peer_of(&from) else { return };
                let (net, tx) = (self.net.clone(), self.internal_tx.clone());
                tokio::spawn(async move {
                    let result = fetch::announcement(&net, peer, id).await;
                    let _ = tx.send(Internal::Announcement { id, from, result }).await;
                });
            }
            Output::AnnounceHeld { id, hash } => {
                self.gossip(&Message::Have(Have { run_id: self.engine.run_id(), id, payload_hash: hash })).await;
            }
            Output::SendHeartbeat(hb) => {
                let m = Message::Heartbeat(Signed::sign(&hb, &self.opts.key));
                self.gossip(&m).await;
            }
            Output::AntiEntropy { peer, digest } => {
                let Some(p) = Self::peer_of(&peer) else { return };
                let (net, tx) = (self.net.clone(), self.internal_tx.clone());
                tokio::spawn(async move {
                    let result = fetch::digest(&net, p, digest).await;
                    let _ = tx.send(Internal::Digest { from: peer, result }).await;
                });
            }
            Output::FetchAnchor { from } => {
                let Some(p) = Self::peer_of(&from) else { return };
                self.anchor_pulls += 1;
                let pull = self.anchor_pulls;
                if self.bulk_waits.contains(&p) {
                    // Not pulled: the engine asks again at a later digest,
                    // by when the punch may have come.
                    tracing::debug!("{p}'s replica state not pulled now: a relay would carry it");
                    self.engine.handle(now(), Input::AnchorUnavailable { from });
                    return;
                }
                let (net, tx, run) = (self.net.clone(), self.internal_tx.clone(), self.engine.run_id());
                tokio::spawn(async move {
                    let result = fetch::state(&net, p, run).await;
                    let result = result.map(|(state, bytes)| (Box::new(state), bytes));
                    let _ = tx.send(Internal::Anchor { from, pull, result }).await;
                });
            }
            Output::Record(kind) => {
                let kind = match kind {
                    RecordKind::Join { speed, .. } => {
                        RecordKind::Join { speed, device: self.trainer.info.device.clone() }
                    }
                    other => other,
                };
                self.record(kind);
            }
            Output::PublishAggregate { announcement, body } => self.publish_sum(announcement, body).await,
            Output::SendAggregate { key, group, hash, to, body } => self.offer_sum((key, group), hash, &to, body),
            Output::FetchAggregate { key, group, from, len, hash } => self.fetch_sum((key, group), from, hash, len),
            Output::Event(ev) => self.on_engine_event(ev),
        }
    }

    fn on_engine_event(&mut self, ev: EngineEvent) {
        match ev {
            EngineEvent::Applied { id, staleness, .. } => {
                if let Some(p) = Self::peer_of(&id.src) {
                    self.peer_table.applied(p, staleness);
                }
                self.metrics.applied.inc();
                self.metrics.staleness.observe(staleness as f64);
            }
            EngineEvent::Dropped { id, reason } => {
                self.metrics.reject(reason.name());
                *self.rejected.entry(reason.name().to_string()).or_insert(0) += 1;
                tracing::debug!("dropped {id}: {reason}");
            }
            EngineEvent::OuterRound { .. } => {
                self.metrics.outer_rounds.inc();
            }
            EngineEvent::AnchorsAveraged { peer } => {
                self.metrics.anchors_averaged.inc();
                tracing::info!("averaged our replica with {peer:?}'s (anti-entropy)");
            }
            EngineEvent::FarReplicaTaken { peer, rounds } => tracing::warn!(
                "took {peer:?}'s replica whole: it lay {rounds:.1} rounds of movement from ours, no other \
                 contributor shared ours, and ours, young, was the one to yield (we trained apart before we met)"
            ),
            EngineEvent::LateUpdate { id, key, applied_in } => {
                self.metrics.late_updates.inc();
                tracing::debug!("{id} arrived after batch {key} closed: applied in batch {applied_in}");
            }
            EngineEvent::UpdateReplayed { id, key, ticks } => {
                self.metrics.updates_replayed.inc();
                tracing::debug!("{id} arrived after tick {key} closed: put back into it, {ticks} ticks recomputed");
            }
            EngineEvent::AnchorRefused { peer, reason } => {
                self.metrics.state_refused.get_or_create(&ReasonLabel { reason: reason.name().into() }).inc();
                *self.rejected.entry(format!("state_{}", reason.name())).or_insert(0) += 1;
                // Anti-entropy asks again every few seconds: a peer whose
                // state stays refused is said once at warn, then counted.
                let first = self.logged_states.len() < super::MAX_LOGGED_REJECTIONS
                    && self.logged_states.insert((peer, reason.name()));
                match reason {
                    StateRefusal::TooFar { .. } | StateRefusal::TooFarBySketch { .. } if first => tracing::warn!(
                        "{peer:?}'s replica state refused: {reason} (further refusals are counted in \
                         ragtag_state_refused_total, not logged)"
                    ),
                    StateRefusal::TooFar { .. } | StateRefusal::TooFarBySketch { .. } => {
                        tracing::debug!("{peer:?}'s replica state refused: {reason}")
                    }
                    _ => tracing::info!("{peer:?}'s replica state not used: {reason}"),
                }
            }
            EngineEvent::AnchorAverageSkipped { peer } => {
                tracing::debug!("{peer:?}'s anchor arrived after the sets moved on: not averaged");
            }
            EngineEvent::ReplicaKept { peer } => {
                tracing::debug!("{peer:?}'s replica is within the threshold of ours, and ours is the one kept");
            }
            EngineEvent::ConsensusDistance { peer, distance, rounds } => {
                self.metrics.consensus_distance.set(distance as f64);
                if let Some(r) = rounds {
                    self.metrics.consensus_distance_rounds.set(r as f64);
                }
                tracing::debug!("consensus distance to {peer:?}: {distance:.2e} ({rounds:?} rounds of movement)");
            }
            EngineEvent::PeerJoined(p) => tracing::info!("{p:?} joined the run ({} live)", self.engine.live_nodes()),
            EngineEvent::PeerLeft(p) => tracing::info!("{p:?} left the run ({} live)", self.engine.live_nodes()),
            EngineEvent::FetchAbandoned { id } => tracing::debug!("gave up fetching {id}"),
            EngineEvent::RoundStarted { .. } => {}
            EngineEvent::AggregateRefused { key, group, from, reason } => {
                self.metrics.reject(reason.name());
                tracing::debug!("aggregate of tick {key} group {group} from {from:?} refused: {reason}");
            }
            EngineEvent::LateAggregate { key, group, applied_in } => {
                self.metrics.sums.get_or_create(&crate::metrics::OutcomeLabel { outcome: "late".into() }).inc();
                tracing::debug!("sum of tick {key} group {group} arrived late: applied in {applied_in}");
            }
            EngineEvent::AggregateReplayed { key, group, ticks } => {
                self.metrics.sums.get_or_create(&crate::metrics::OutcomeLabel { outcome: "replayed".into() }).inc();
                tracing::debug!(
                    "sum of tick {key} group {group} arrived late: put back into its tick, {ticks} recomputed"
                );
            }
            EngineEvent::AggregateMissed { key, group } => {
                tracing::debug!("no quorum sum for tick {key} group {group}");
            }
            EngineEvent::InnerLrChanged { scale, change } => {
                self.metrics.inner_lr_changes.get_or_create(&ReasonLabel { reason: change.name().into() }).inc();
                match change {
                    LrChange::Spike => tracing::warn!(
                        "the swarm's training loss spiked: outer momentum dropped, inner learning rate now {scale} x the manifest's"
                    ),
                    LrChange::Plateau => tracing::info!(
                        "the swarm's training loss stopped falling: inner learning rate now {scale} x the manifest's"
                    ),
                }
            }
        }
    }

    /// Appends pending records, flushes once, then sends the receipts to
    /// the authors of the updates they are about: nothing is announced
    /// before it is durable. Only an update's author keeps a receipt (its
    /// proof of credit), so a receipt goes to that author alone, by
    /// request-response, in batches; gossiped, every node received every
    /// receipt, N² a round per node (most of a 16-node aggregated swarm's
    /// traffic, BENCHMARKS.md "Traffic per node"). An author we are not
    /// connected to gets its receipts by gossip, as before.
    pub(crate) async fn flush_records(&mut self) {
        if self.pending_records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.pending_records);
        if let Err(e) = self.ledger.append_unflushed(&records).and_then(|_| self.ledger.flush()) {
            tracing::error!("ledger write failed: {e}");
            return;
        }
        self.ledger_records += records.len() as u64;
        self.metrics.ledger_records.inc_by(records.len() as u64);
        let mut by_author: BTreeMap<NodeId, Vec<SignedRecord>> = BTreeMap::new();
        for r in records {
            if let Ok(RecordKind::Receipt { update, .. }) = r.decode_unverified().map(|b| b.kind) {
                by_author.entry(update.src).or_default().push(r);
            }
        }
        let mut gossiped = Vec::new();
        for (author, receipts) in by_author {
            if author == self.me {
                continue;
            }
            let direct = Self::peer_of(&author).is_some_and(|p| self.connected.contains(&p));
            if !direct {
                gossiped.extend(receipts);
                continue;
            }
            for batch in receipts.chunks(MAX_RECEIPTS_PER_MESSAGE) {
                self.send_to(&[author], Message::Receipts(batch.to_vec()));
            }
        }
        for batch in gossiped.chunks(MAX_RECEIPTS_PER_MESSAGE) {
            self.gossip(&Message::Receipts(batch.to_vec())).await;
        }
    }

    /// The replica-state object a peer reads in chunks (see
    /// [`ragtag_protocol::engine::state_transfer`]): for a new transfer
    /// (`requested` zero) the head of the current replica (an anti-entropy
    /// peer averages it against the digest it just compared, so it must
    /// not be older); else the head or shared part of that hash while we
    /// keep it (`None` once it has been replaced).
    pub(crate) fn state_blob(&mut self, requested: Hash32) -> Option<(Hash32, Arc<Vec<u8>>)> {
        if requested != Hash32::default() {
            return self.state_snapshots.iter().find_map(|s| {
                if s.head_hash == requested {
                    Some((s.head_hash, s.head.clone()))
                } else if s.shared_hash == requested {
                    Some((s.shared_hash, s.shared.clone()))
                } else {
                    None
                }
            });
        }
        let stats = self.engine.stats();
        let stamp = (self.engine.version().total(), stats.anchors_averaged, stats.rounds, self.engine.round());
        if let Some(s) = self.state_snapshots.back().filter(|s| s.stamp == stamp) {
            return Some((s.head_hash, s.head.clone()));
        }
        let (head, shared) = state_transfer::split(self.engine.replica_state());
        let (head_hash, shared_hash) = (Hash32::of(&head), Hash32::of(&shared));
        // Rounds pass without a batch applied: the shared part is then the
        // same, and kept once.
        let shared = match self.state_snapshots.back().filter(|s| s.shared_hash == shared_hash) {
            Some(s) => s.shared.clone(),
            None => Arc::new(shared),
        };
        let head = Arc::new(head);
        self.state_snapshots.push_back(StateSnapshot { head_hash, head: head.clone(), shared_hash, shared, stamp });
        if self.state_snapshots.len() > STATE_SNAPSHOTS {
            self.state_snapshots.pop_front();
        }
        Some((head_hash, head))
    }
}

/// Snapshots kept at once: those slow transfers may still be reading, and
/// the newest.
const STATE_SNAPSHOTS: usize = 3;

/// An encoded replica state (head and shared part), and what the replica
/// had done when it was taken.
#[derive(Debug)]
pub(crate) struct StateSnapshot {
    head_hash: Hash32,
    head: Arc<Vec<u8>>,
    shared_hash: Hash32,
    shared: Arc<Vec<u8>>,
    /// Applied updates, anchor averages, rounds and round: unchanged means
    /// the replica is unchanged.
    stamp: (u64, u64, u64, u64),
}
