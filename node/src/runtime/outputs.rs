//! Acting on the engine's outputs.

use std::sync::Arc;

use ragtag_protocol::{
    Signed,
    engine::{EngineEvent, Output},
    ledger::RecordKind,
    wire::{Have, MAX_INLINE_PAYLOAD, Message},
};

use super::{Internal, Node, fetch};
use crate::{payload_store::StoredUpdate, trainer_thread::TrainerCommand};

impl Node {
    /// Handles every pending engine output, then writes (and announces)
    /// the ledger records they produced.
    pub(crate) async fn drain(&mut self) {
        while let Some(out) = self.engine.poll_output() {
            self.act(out).await;
        }
        self.flush_records().await;
    }

    async fn gossip(&mut self, m: &Message) {
        let bytes = m.encode();
        self.bytes_out += bytes.len() as u64;
        self.metrics
            .bytes_out
            .get_or_create(&crate::metrics::KindLabel { kind: m.kind().name().into() })
            .inc_by(bytes.len() as u64);
        if let Err(e) = self.net.publish(bytes).await {
            tracing::warn!("gossip: {e}");
        }
    }

    async fn act(&mut self, out: Output) {
        match out {
            Output::StartLocalPhase(p) => {
                if let Err(e) = self.trainer.send(TrainerCommand::Phase(p)) {
                    tracing::error!("{e}");
                }
            }
            Output::Publish(p) => {
                self.metrics.published.inc();
                let signed = Signed::sign(&p.announcement, &self.opts.key);
                let id = p.announcement.id;
                self.store.insert(id, StoredUpdate { announcement: signed.clone(), payload: p.payload.clone() });
                let m = if p.payload.len() <= MAX_INLINE_PAYLOAD {
                    Message::Update { announcement: signed, payload: p.payload.as_ref().clone() }
                } else {
                    Message::Announce(signed)
                };
                self.gossip(&m).await;
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
                    let _ = tx.send(Internal::Announcement { from, result }).await;
                });
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
                let (net, tx, run) = (self.net.clone(), self.internal_tx.clone(), self.engine.run_id());
                tokio::spawn(async move {
                    let result = fetch::state(&net, p, run).await;
                    let _ = tx.send(Internal::Anchor { from, result }).await;
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
            Output::Event(ev) => self.on_engine_event(ev),
        }
    }

    fn on_engine_event(&mut self, ev: EngineEvent) {
        match ev {
            EngineEvent::Applied { staleness, .. } => {
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
            EngineEvent::LateUpdate { id, key, applied_in } => {
                self.metrics.late_updates.inc();
                tracing::debug!("{id} arrived after batch {key} closed: applied in batch {applied_in}");
            }
            EngineEvent::AnchorAverageSkipped { peer } => {
                tracing::debug!("{peer:?}'s anchor arrived after the sets moved on: not averaged");
            }
            EngineEvent::ConsensusDistance { peer, distance } => {
                self.metrics.consensus_distance.set(distance as f64);
                tracing::debug!("consensus distance to {peer:?}: {distance:.2e}");
            }
            EngineEvent::PeerJoined(p) => tracing::info!("{p:?} joined the run ({} live)", self.engine.live_nodes()),
            EngineEvent::PeerLeft(p) => tracing::info!("{p:?} left the run ({} live)", self.engine.live_nodes()),
            EngineEvent::FetchAbandoned { id } => tracing::debug!("gave up fetching {id}"),
            EngineEvent::RoundStarted { .. } => {}
        }
    }

    /// Appends pending records, flushes once, then gossips the receipts:
    /// nothing is announced before it is durable.
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
        for r in records {
            if let Ok(body) = r.decode_unverified()
                && matches!(body.kind, RecordKind::Receipt { .. })
            {
                self.gossip(&Message::Receipt(r)).await;
            }
        }
    }

    /// After storing a payload we fetched: tell peers we can serve it.
    pub(crate) async fn announce_have(
        &mut self,
        id: ragtag_protocol::ids::UpdateId,
        hash: ragtag_protocol::ids::Hash32,
    ) {
        let m = Message::Have(Have { run_id: self.engine.run_id(), id, payload_hash: hash });
        self.gossip(&m).await;
    }

    /// The replica-state snapshot a joiner reads in chunks: a new one for a
    /// new transfer (at most every few seconds), the same one while a
    /// transfer goes on (`None` once it has been replaced).
    pub(crate) fn state_blob(
        &mut self,
        requested: ragtag_protocol::ids::Hash32,
    ) -> Option<(ragtag_protocol::ids::Hash32, Arc<Vec<u8>>)> {
        let fresh = |(_, _, taken): &(ragtag_protocol::ids::Hash32, Arc<Vec<u8>>, std::time::Instant)| {
            taken.elapsed() < std::time::Duration::from_secs(5)
        };
        if requested != ragtag_protocol::ids::Hash32::default() {
            return self.state_snapshot.as_ref().filter(|(h, _, _)| *h == requested).map(|(h, b, _)| (*h, b.clone()));
        }
        if let Some(s) = self.state_snapshot.as_ref().filter(|s| fresh(s)) {
            return Some((s.0, s.1.clone()));
        }
        let bytes =
            Arc::new(postcard::to_allocvec(&self.engine.replica_state()).expect("encoding to a Vec cannot fail"));
        let hash = ragtag_protocol::ids::Hash32::of(&bytes);
        self.state_snapshot = Some((hash, bytes.clone(), std::time::Instant::now()));
        Some((hash, bytes))
    }
}
