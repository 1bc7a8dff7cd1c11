//! What arrives from the network: gossip (validated before the engine sees
//! it), requests (served from the engine and the payload store), and the
//! results of our own fetches.

use std::sync::Arc;

use libp2p::{
    PeerId,
    gossipsub::MessageAcceptance::{self, Accept},
};
use ragtag_protocol::{
    Signed,
    engine::Input,
    ids::Hash32,
    ledger::{LedgerStore, RecordKind},
    validate::RejectReason,
    wire::{ErrorReply, MAX_RECEIPTS_PER_MESSAGE, Message, MessageKind, UpdateAnnouncement},
};

use super::{Internal, MAX_ANNOUNCED, MAX_UNREACHABLE_LOGGED, Node, fetch, now};
use crate::{net, payload_store::StoredUpdate};

impl Node {
    pub(crate) async fn on_net_event(&mut self, ev: net::Event) {
        match ev {
            net::Event::Gossip { propagation_source, message_id, author, data } => {
                let acceptance = self.on_gossip(propagation_source, author, data).await;
                self.net.report(message_id, propagation_source, acceptance).await;
            }
            net::Event::Request { peer, id, message } => {
                if self.defers(peer, &message) {
                    self.deferred_states.push_back((std::time::Instant::now(), id, peer, message));
                    return;
                }
                self.answer(id, peer, message).await;
            }
            net::Event::Listening(a) => self.listen.push(a),
            net::Event::Connected(p) => {
                self.connected.insert(p);
                self.unreachable.remove(&p);
            }
            net::Event::Disconnected(p) => {
                self.connected.remove(&p);
            }
            net::Event::DialFailed { peer, error } => {
                // A peer that left is dialled again by every fetch and
                // query that still names it: say so once until it is back.
                self.metrics.dial_failures.inc();
                let first =
                    peer.is_none_or(|p| self.unreachable.len() < MAX_UNREACHABLE_LOGGED && self.unreachable.insert(p));
                let who = peer.map_or("a peer".into(), |p| p.to_string());
                if first {
                    tracing::warn!("cannot reach {who}: {error}");
                } else {
                    tracing::debug!("cannot reach {who}: {error}");
                }
            }
            net::Event::Reachability(r) => {
                tracing::info!("reachability: {r}");
                if r == "private" && !self.reachability.through_relay() {
                    // Not dialable from outside: take a reservation at every
                    // bootstrap node (they relay), so peers can reach us.
                    for addr in self.opts.net.bootstrap.clone() {
                        tracing::info!("asking {addr} for a relay reservation");
                        let _ = self.net.listen_via_relay(addr).await;
                    }
                }
                self.reachability.autonat(&r);
            }
            net::Event::RelayReserved(p) => {
                tracing::info!("reservation accepted by relay {p}");
                self.reachability.relay_reserved();
            }
            net::Event::HolePunch { peer, error } => self.on_hole_punch(peer, error),
            net::Event::NotAllowed(p) => self.reject(Some(p), RejectReason::NotAllowed, "a connection"),
            net::Event::Subscribed(p) => tracing::debug!("{p} takes part in the run"),
            net::Event::BadRequest { peer, error } => {
                let reason = if error.contains("limit") { RejectReason::TooLarge } else { RejectReason::Malformed };
                self.reject(Some(peer), reason, &format!("a request ({error})"));
                self.net.penalize(peer).await;
            }
        }
    }

    /// A DCUtR attempt ended: reported in the log, the metrics and the
    /// status, so an operator can tell a relayed node from a hole-punched one.
    fn on_hole_punch(&mut self, peer: PeerId, error: Option<String>) {
        let outcome = match &error {
            None => {
                tracing::info!("hole punched: direct connection to {peer}");
                self.hole_punch.succeeded += 1;
                self.reachability.hole_punched();
                format!("direct connection to {peer}")
            }
            Some(e) => {
                tracing::warn!("hole punch with {peer} failed, traffic stays relayed: {e}");
                self.hole_punch.failed += 1;
                format!("with {peer} failed: {e}")
            }
        };
        let label = if error.is_none() { "direct" } else { "failed" };
        self.metrics.hole_punches.get_or_create(&crate::metrics::OutcomeLabel { outcome: label.into() }).inc();
        self.hole_punch.last = Some(outcome);
    }

    /// Validates a gossip message and hands what is valid to the engine.
    async fn on_gossip(&mut self, from: PeerId, author: Option<PeerId>, data: Vec<u8>) -> MessageAcceptance {
        self.received(Some(from), data.len());
        let msg = match Message::decode(&data) {
            Ok(m) => m,
            Err(e) => {
                let reason = if matches!(e, ragtag_protocol::wire::DecodeError::TooLarge { .. }) {
                    RejectReason::TooLarge
                } else {
                    RejectReason::Malformed
                };
                self.reject(Some(from), reason, "a gossip message");
                return MessageAcceptance::Reject;
            }
        };
        self.metrics
            .bytes_in
            .get_or_create(&crate::metrics::KindLabel { kind: msg.kind().name().into() })
            .inc_by(data.len() as u64);
        match msg {
            Message::Announce(signed) => self.take_announcement(from, signed).map_or_else(acceptance, |()| Accept),
            Message::Update { announcement, payload } => {
                self.take_update(from, announcement, payload).map_or_else(acceptance, |()| Accept)
            }
            Message::AggregateAnnounce(signed) => self.on_sum_announcement(from, signed),
            Message::Heartbeat(signed) => match signed.open() {
                Ok(hb) if hb.run_id != self.engine.run_id() => {
                    self.reject(Some(from), RejectReason::WrongRun, "a heartbeat");
                    MessageAcceptance::Reject
                }
                Ok(hb) if !self.validator.is_allowed(&hb.src) => {
                    self.reject(Some(from), RejectReason::NotAllowed, "a heartbeat");
                    MessageAcceptance::Reject
                }
                Ok(hb) => {
                    self.engine.handle(now(), Input::Heartbeat(hb));
                    MessageAcceptance::Accept
                }
                Err(_) => {
                    self.reject(Some(from), RejectReason::BadSignature, "a heartbeat");
                    MessageAcceptance::Reject
                }
            },
            Message::Receipt(record) => self.on_receipts(from, std::slice::from_ref(&record)),
            Message::Receipts(records) if records.len() > MAX_RECEIPTS_PER_MESSAGE => {
                self.reject(Some(from), RejectReason::TooLarge, "a receipt batch");
                MessageAcceptance::Reject
            }
            Message::Receipts(records) => self.on_receipts(from, &records),
            Message::Have(h) if h.run_id == self.engine.run_id() => {
                // The holder is who published it, not who forwarded it.
                if let Some(node) = author.as_ref().and_then(Self::node_of) {
                    self.engine.handle(now(), Input::PayloadSource { id: h.id, from: node });
                }
                MessageAcceptance::Accept
            }
            Message::Have(_) => {
                self.reject(Some(from), RejectReason::WrongRun, "a have");
                MessageAcceptance::Reject
            }
            other => {
                self.reject(Some(from), RejectReason::Malformed, &format!("a {} on gossip", other.kind().name()));
                MessageAcceptance::Reject
            }
        }
    }

    /// An announcement (gossiped, or sent to us as one of its group's
    /// aggregators): validated, then to the engine, which fetches its payload.
    fn take_announcement(&mut self, from: PeerId, signed: Signed<UpdateAnnouncement>) -> Result<(), RejectReason> {
        let reason = match self.validator.check_announcement(&signed) {
            Ok(a) if self.engine.has_applied(&a.id) => RejectReason::Replay,
            Ok(a) => {
                let src = a.id.src;
                self.engine.handle(now(), Input::Announcement { announcement: a.clone(), from: src });
                self.remember(a, signed);
                return Ok(());
            }
            Err(r) => r,
        };
        self.reject(Some(from), reason, "an announcement");
        Err(reason)
    }

    /// An update with its payload inline (gossiped, or sent to us as one of
    /// its group's aggregators): validated, stored, then to the engine.
    fn take_update(
        &mut self,
        from: PeerId,
        announcement: Signed<UpdateAnnouncement>,
        payload: Vec<u8>,
    ) -> Result<(), RejectReason> {
        let checked = self.validator.check_announcement(&announcement).and_then(|a| {
            let norm = self.validator.check_payload(&a, &payload)?;
            if self.engine.has_applied(&a.id) { Err(RejectReason::Replay) } else { Ok((a, norm)) }
        });
        let (a, norm) = match checked {
            Ok(ok) => ok,
            Err(r) => {
                self.reject(Some(from), r, "an update");
                return Err(r);
            }
        };
        if self.store.get(&a.id).is_some() {
            // A second copy (pushed again by request, where gossip's
            // message ids do not dedupe): its norm must not count twice.
            return Ok(());
        }
        self.validator.record_accepted_norm(norm);
        let payload = Arc::new(payload);
        self.store.insert(a.id, StoredUpdate { announcement, payload: payload.clone(), payload_hash: a.payload_hash });
        let src = a.id.src;
        self.engine.handle(now(), Input::Update { announcement: a, from: src, payload });
        Ok(())
    }

    /// Receipts: all verified before any is kept (one bad signature or
    /// foreign run rejects the message); those for our updates go to the
    /// ledger as proof of credit.
    fn on_receipts(&mut self, from: PeerId, records: &[ragtag_protocol::ledger::SignedRecord]) -> MessageAcceptance {
        let mut ours = Vec::new();
        for record in records {
            match record.open() {
                Ok(body) if body.run_id != self.engine.run_id() => {
                    self.reject(Some(from), RejectReason::WrongRun, "a receipt");
                    return MessageAcceptance::Reject;
                }
                // A private swarm's credit comes from its members only.
                Ok(body) if self.opts.allow.as_ref().is_some_and(|a| !a.contains(&body.signer)) => {
                    self.reject(Some(from), RejectReason::NotAllowed, "a receipt signed outside the allowlist");
                    return MessageAcceptance::Reject;
                }
                Ok(body) => {
                    if let RecordKind::Receipt { update, .. } = &body.kind
                        && update.src == self.me
                        && body.signer != self.me
                    {
                        ours.push(record);
                    }
                }
                Err(_) => {
                    self.reject(Some(from), RejectReason::BadSignature, "a receipt");
                    return MessageAcceptance::Reject;
                }
            }
        }
        for record in ours {
            if let Err(e) = self.ledger.keep_receipt(record) {
                tracing::warn!("cannot keep a receipt: {e}");
            }
        }
        MessageAcceptance::Accept
    }

    /// Keeps a validated announcement while the engine fetches its payload:
    /// a fetched payload is checked against it and stored with it. Entries
    /// leave when the payload is stored; those the engine gave up on leave
    /// when the map fills, so it holds in-flight fetches only.
    fn remember(&mut self, a: UpdateAnnouncement, signed: ragtag_protocol::Signed<UpdateAnnouncement>) {
        if !self.engine.is_fetching(&a.id) {
            return;
        }
        if self.announced.len() >= MAX_ANNOUNCED {
            let engine = &self.engine;
            self.announced.retain(|id, _| engine.is_fetching(id));
        }
        self.announced.insert(a.id, (a, signed));
    }

    async fn answer(&mut self, id: u64, peer: PeerId, message: Message) {
        let reply = self.on_request(peer, message);
        self.bytes_out += reply.encoded_len() as u64;
        let _ = self.net.respond(id, reply).await;
    }

    /// A request of an allowed peer for a new replica state of our run
    /// waits while the last tick's sums are still being announced (see
    /// `Engine::state_ready_at`): a joiner given that state would miss
    /// them. At most [`MAX_DEFERRED_STATES`] wait, each at most
    /// [`MAX_STATE_DEFER`]; more are answered at once.
    fn defers(&self, peer: PeerId, m: &Message) -> bool {
        let allowed = Self::node_of(&peer).is_some_and(|n| self.validator.is_allowed(&n));
        matches!(m, Message::StateRequest(r) if r.snapshot == Hash32::default() && r.run_id == self.engine.run_id())
            && allowed
            && self.deferred_states.len() < MAX_DEFERRED_STATES
            && self.engine.state_ready_at(now()).is_some()
    }

    /// Answers the held state requests once the state is fit to give, or
    /// once they waited [`MAX_STATE_DEFER`] (a tick without sums leaves it
    /// unfit until the next one closes; the joiner checks what it gets).
    pub(crate) async fn answer_deferred_states(&mut self) {
        let ready = self.engine.state_ready_at(now()).is_none();
        while let Some((since, ..)) = self.deferred_states.front() {
            if !ready && since.elapsed() < MAX_STATE_DEFER {
                break;
            }
            let (_, id, peer, message) = self.deferred_states.pop_front().expect("checked");
            self.answer(id, peer, message).await;
        }
    }

    /// Serves a request.
    fn on_request(&mut self, peer: PeerId, msg: Message) -> Message {
        let run = self.engine.run_id();
        if let Some(n) = Self::node_of(&peer)
            && !self.validator.is_allowed(&n)
        {
            self.reject(Some(peer), RejectReason::NotAllowed, "a request");
            return Message::Error(ErrorReply::BadRequest);
        }
        match msg {
            Message::PayloadRequest(r) => match self.store.get(&r.id) {
                Some(u) => fetch::chunk_of(&u.payload, u.payload_hash, r.offset, r.max_len)
                    .map_or(Message::Error(ErrorReply::BadRequest), Message::PayloadChunk),
                None => Message::Error(ErrorReply::NotFound),
            },
            Message::AnnouncementRequest(id) => match self.store.get(&id) {
                Some(u) => Message::Announce(u.announcement.clone()),
                None => Message::Error(ErrorReply::NotFound),
            },
            Message::StateRequest(r) if r.run_id == run => match self.state_blob(r.snapshot) {
                Some((hash, bytes)) => fetch::chunk_of(&bytes, hash, r.offset, r.max_len)
                    .map_or(Message::Error(ErrorReply::BadRequest), Message::StateChunk),
                None => Message::Error(ErrorReply::NotFound),
            },
            Message::ManifestRequest(r) if r == run => Message::Manifest(self.opts.manifest.canonical_bytes()),
            Message::StateRequest(_) | Message::ManifestRequest(_) => Message::Error(ErrorReply::WrongRun),
            Message::Digest(d) if d.run_id == run => {
                if let Some(from) = Self::node_of(&peer) {
                    self.engine.handle(now(), Input::PeerDigest { from, digest: d });
                }
                Message::Digest(self.engine.digest())
            }
            Message::Digest(_) => Message::Error(ErrorReply::WrongRun),
            Message::Probe(n) => Message::ProbeReply(vec![0; (n as usize).min(ragtag_protocol::wire::MAX_CHUNK_BYTES)]),
            Message::AggregateRequest(r) => self.serve_sum(&r),
            Message::AggregateOffer(o) => self.on_sum_offer(peer, o),
            // An update sent to us as one of its group's aggregators.
            Message::Announce(signed) => {
                self.take_announcement(peer, signed).map_or(Message::Error(ErrorReply::BadRequest), |()| Message::Ack)
            }
            Message::Update { announcement, payload } => self
                .take_update(peer, announcement, payload)
                .map_or(Message::Error(ErrorReply::BadRequest), |()| Message::Ack),
            // Receipts for our updates, sent to us as their author.
            Message::Receipts(records) if records.len() > MAX_RECEIPTS_PER_MESSAGE => {
                self.reject(Some(peer), RejectReason::TooLarge, "a receipt batch");
                Message::Error(ErrorReply::BadRequest)
            }
            Message::Receipts(records) => match self.on_receipts(peer, &records) {
                MessageAcceptance::Accept => Message::Ack,
                _ => Message::Error(ErrorReply::BadRequest),
            },
            other => {
                let kind = other.kind();
                if kind != MessageKind::Error {
                    self.reject(Some(peer), RejectReason::Malformed, &format!("a {} request", kind.name()));
                }
                Message::Error(ErrorReply::BadRequest)
            }
        }
    }

    /// Results of background fetches.
    pub(crate) async fn on_internal(&mut self, i: Internal) {
        match i {
            Internal::Payload { id, from, result } => {
                let Some((a, _)) = self.announced.get(&id) else {
                    self.engine.handle(now(), Input::FetchFailed { id, from, reason: None });
                    return;
                };
                match result.map_err(|e| (None, e.to_string())).and_then(|bytes| {
                    match self.validator.check_payload(a, &bytes) {
                        Ok(norm) => Ok((bytes, norm)),
                        Err(r) => Err((Some(r), r.to_string())),
                    }
                }) {
                    Ok((bytes, norm)) => {
                        self.received(Self::peer_of(&from), bytes.len());
                        self.validator.record_accepted_norm(norm);
                        let payload = Arc::new(bytes);
                        if let Some((a, signed)) = self.announced.remove(&id) {
                            let stored = StoredUpdate {
                                announcement: signed,
                                payload: payload.clone(),
                                payload_hash: a.payload_hash,
                            };
                            self.store.insert(id, stored);
                        }
                        self.engine.handle(now(), Input::Payload { id, bytes: payload });
                    }
                    Err((reason, e)) => {
                        if let Some(r) = reason {
                            let peer = Self::peer_of(&from);
                            self.reject(peer, r, "a payload");
                            if let Some(p) = peer {
                                self.net.penalize(p).await;
                            }
                        } else {
                            tracing::debug!("fetching {id} from {from:?} failed: {e}");
                        }
                        self.engine.handle(now(), Input::FetchFailed { id, from, reason });
                    }
                }
            }
            Internal::Announcement { id, from, result } => match result {
                Ok(None) => self.engine.handle(now(), Input::AnnouncementGone(id)),
                Ok(Some(signed)) => match self.validator.check_announcement(&signed) {
                    Ok(a) => {
                        self.engine.handle(now(), Input::Announcement { announcement: a.clone(), from });
                        self.remember(a, signed);
                    }
                    Err(r) => self.reject(Self::peer_of(&from), r, "a fetched announcement"),
                },
                Err(e) => tracing::debug!("announcement fetch from {from:?} failed: {e}"),
            },
            Internal::Digest { from, result } => match result {
                Ok(d) => self.engine.handle(now(), Input::PeerDigest { from, digest: d }),
                Err(e) => tracing::debug!("anti-entropy with {from:?} failed: {e}"),
            },
            // The engine checks the state (`ReplicaState::verify`) and
            // refuses a bad one with its reason, which `outputs` counts and logs.
            Internal::Sum { key, group, from, hash, asked, result } => {
                self.on_sum_fetched((key, group), (from, hash), asked, result)
            }
            Internal::Anchor { from, pull, result } => match result {
                Ok((state, bytes)) => {
                    self.received(Self::peer_of(&from), bytes);
                    self.engine.handle(now(), Input::PeerAnchor { from, state });
                }
                Err(e) => {
                    tracing::debug!("state fetch from {from:?} failed: {e}");
                    if pull == self.anchor_pulls {
                        self.engine.handle(now(), Input::AnchorUnavailable { from });
                    }
                }
            },
        }
    }
}

/// State requests held at once at most (see `Node::defers`).
const MAX_DEFERRED_STATES: usize = 64;
/// Longest a state request is held: well under a joiner's wait for a
/// state head (10 s).
const MAX_STATE_DEFER: std::time::Duration = std::time::Duration::from_secs(3);

/// How gossipsub should treat a message rejected for `r`: misbehaviour
/// lowers the sender's score, bad luck (too stale) is only ignored.
pub(super) fn acceptance(r: RejectReason) -> MessageAcceptance {
    if r.is_misbehaviour() { MessageAcceptance::Reject } else { MessageAcceptance::Ignore }
}
