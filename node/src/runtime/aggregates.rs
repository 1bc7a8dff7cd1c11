//! Aggregated dissemination on the wire. The engine decides who sends what
//! to whom (an update to its group's aggregators, a sum's signed hash to
//! everyone, its body down the group's tree or to whoever asks a signer);
//! this moves the bytes, keeps the sums it may be asked for and checks what
//! arrives before the engine sees it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use libp2p::{PeerId, gossipsub::MessageAcceptance};
use ragtag_protocol::{
    NodeId, Signed,
    aggregate::{Aggregate, AggregateAnnouncement},
    engine::Input,
    ids::Hash32,
    validate::RejectReason,
    wire::{AggregateOffer, AggregateRequest, ErrorReply, Message},
};

use super::{Internal, Node, fetch, now};

/// Sums kept to serve at most, by count.
const MAX_HELD_SUMS: usize = 256;
/// ... and by bytes.
const MAX_HELD_BYTES: usize = 256 << 20;
/// Offered sums pulled at once at most: more offers are declined (the
/// engine then asks a signer for what it still lacks).
pub(crate) const MAX_OFFERS_IN_FLIGHT: usize = 32;
/// Longest pull of one sum, all its chunks: a holder that trickles bytes
/// must not hold a pull (and its slot) for ever.
const SUM_PULL_TIMEOUT: Duration = Duration::from_secs(30);

/// What became of a sum, for `ragtag status` and `ragtag_sums_total`.
#[derive(Clone, Copy, Debug)]
enum SumEvent {
    /// We signed and published it as an aggregator.
    Published,
    /// Its body arrived from a peer.
    Received,
    /// Its offer was declined: too many pulls under way.
    Declined,
}

/// The sums this node can serve: its own and those the engine passed on
/// (it passes on only bodies whose hash a designated aggregator signed),
/// the oldest tick's dropped first, so a sum that arrives late for an old
/// tick never pushes out a newer one (our own included) still being asked
/// for.
#[derive(Debug, Default)]
pub(crate) struct SumStore {
    by_hash: BTreeMap<Hash32, Arc<Vec<u8>>>,
    by_tick: BTreeSet<(u64, Hash32)>,
    bytes: usize,
}

impl SumStore {
    /// Keeps `body`, a sum of tick `key`, under `hash` (already checked by
    /// the engine).
    pub(crate) fn insert(&mut self, key: u64, hash: Hash32, body: Arc<Vec<u8>>) {
        if self.by_hash.contains_key(&hash) {
            return;
        }
        self.bytes += body.len();
        self.by_hash.insert(hash, body);
        self.by_tick.insert((key, hash));
        while self.by_tick.len() > MAX_HELD_SUMS || (self.bytes > MAX_HELD_BYTES && self.by_tick.len() > 1) {
            let Some((_, old)) = self.by_tick.pop_first() else { break };
            if let Some(b) = self.by_hash.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }

    /// The body with this hash, if held.
    pub(crate) fn get(&self, hash: &Hash32) -> Option<&Arc<Vec<u8>>> {
        self.by_hash.get(hash)
    }
}

impl Node {
    /// Signs and gossips our sum's hash; keeps the body for fetchers.
    pub(crate) async fn publish_sum(&mut self, announcement: AggregateAnnouncement, body: Arc<Vec<u8>>) {
        self.sums.insert(announcement.key, announcement.body_hash, body);
        self.count_sum(SumEvent::Published);
        let m = Message::AggregateAnnounce(Signed::sign(&announcement, &self.opts.key));
        self.gossip(&m).await;
    }

    /// Offers a sum to our children in its group's tree; each pulls it.
    pub(crate) fn offer_sum(&mut self, (key, group): (u64, u32), hash: Hash32, to: &[NodeId], body: Arc<Vec<u8>>) {
        let offer = AggregateOffer { run_id: self.engine.run_id(), key, group, hash, len: body.len() as u64 };
        self.sums.insert(key, hash, body);
        self.send_to(to, Message::AggregateOffer(offer));
    }

    /// Sends `m` to each of `to` by request-response (not ourselves);
    /// a push that fails is logged: the engine has other paths (a signer
    /// is asked for a sum our child lacks, anti-entropy for an update).
    pub(crate) fn send_to(&mut self, to: &[NodeId], m: Message) {
        let len = m.encoded_len();
        let me = self.me;
        for node in to.iter().filter(|n| **n != me) {
            let Some(peer) = Self::peer_of(node) else { continue };
            self.count_sent(m.kind(), len);
            let (net, m) = (self.net.clone(), m.clone());
            tokio::spawn(async move {
                match net.request(peer, m).await {
                    Ok(Message::Ack) => {}
                    Ok(other) => tracing::debug!("{peer} answered a push with a {}", other.kind().name()),
                    Err(e) => tracing::debug!("push to {peer} failed: {e}"),
                }
            });
        }
    }

    /// Fetches a sum the engine asked for from a holder.
    pub(crate) fn fetch_sum(&mut self, k: (u64, u32), from: NodeId, hash: Hash32, len: u64) {
        let Some(peer) = Self::peer_of(&from) else {
            self.engine.handle(now(), Input::AggregateFetchFailed { key: k.0, group: k.1, from });
            return;
        };
        self.spawn_sum_fetch(k, from, peer, hash, len, true);
    }

    fn spawn_sum_fetch(&mut self, k: (u64, u32), from: NodeId, peer: PeerId, hash: Hash32, len: u64, asked: bool) {
        let (net, tx, run) = (self.net.clone(), self.internal_tx.clone(), self.engine.run_id());
        tokio::spawn(async move {
            let pull = fetch::aggregate(&net, peer, run, k, hash, len);
            let result = tokio::time::timeout(SUM_PULL_TIMEOUT, pull).await.unwrap_or(Err(fetch::FetchError::TimedOut));
            let _ = tx.send(Internal::Sum { key: k.0, group: k.1, from, hash, asked, result }).await;
        });
    }

    /// A fetched sum: to the engine, which checks its hash against the
    /// signed ones and decodes it within its limit.
    pub(crate) fn on_sum_fetched(
        &mut self,
        (key, group): (u64, u32),
        (from, hash): (NodeId, Hash32),
        asked: bool,
        result: Result<Vec<u8>, fetch::FetchError>,
    ) {
        if !asked {
            self.offers_pulling.remove(&hash);
        }
        match result {
            Ok(bytes) => {
                self.received(Self::peer_of(&from), bytes.len());
                self.count_sum(SumEvent::Received);
                self.engine.handle(now(), Input::AggregateBody { key, group, from, bytes: Arc::new(bytes) });
            }
            Err(e) => {
                tracing::debug!("sum of tick {key} group {group} from {from:?}: {e}");
                if asked {
                    self.engine.handle(now(), Input::AggregateFetchFailed { key, group, from });
                }
            }
        }
    }

    /// Counts a sum published, received or declined, in the status and the metrics.
    fn count_sum(&mut self, event: SumEvent) {
        let (outcome, count) = match event {
            SumEvent::Published => ("published", &mut self.sum_counts.published),
            SumEvent::Received => ("received", &mut self.sum_counts.received),
            SumEvent::Declined => ("declined", &mut self.sum_counts.declined),
        };
        *count += 1;
        self.metrics.sums.get_or_create(&crate::metrics::OutcomeLabel { outcome: outcome.into() }).inc();
    }

    /// A gossiped sum hash: its signature and signer are checked here, the
    /// rest (designated aggregator, tick, size) by the engine before gossip
    /// passes it on.
    pub(crate) fn on_sum_announcement(
        &mut self,
        from: PeerId,
        signed: Signed<AggregateAnnouncement>,
    ) -> MessageAcceptance {
        match signed.open() {
            Ok(a) if a.run_id != self.engine.run_id() => {
                self.reject(Some(from), RejectReason::WrongRun, "a sum's hash");
                MessageAcceptance::Reject
            }
            Ok(a) if !self.validator.is_allowed(&a.aggregator) => {
                self.reject(Some(from), RejectReason::NotAllowed, "a sum's hash");
                MessageAcceptance::Reject
            }
            Ok(a) => match self.engine.aggregate_announcement_verdict(now(), &a) {
                // Not passed on: no replica in step would count it.
                Some(r) => {
                    self.reject(Some(from), r, "a sum's hash");
                    super::inbound::acceptance(r)
                }
                None => {
                    let aggregator = a.aggregator;
                    self.engine.handle(now(), Input::AggregateAnnouncement { announcement: a, from: aggregator });
                    MessageAcceptance::Accept
                }
            },
            Err(_) => {
                self.reject(Some(from), RejectReason::BadSignature, "a sum's hash");
                MessageAcceptance::Reject
            }
        }
    }

    /// Serves a chunk of a sum we hold.
    pub(crate) fn serve_sum(&self, r: &AggregateRequest) -> Message {
        if r.run_id != self.engine.run_id() {
            return Message::Error(ErrorReply::WrongRun);
        }
        match self.sums.get(&r.hash) {
            Some(body) => fetch::chunk_of(body, r.hash, r.offset, r.max_len)
                .map_or(Message::Error(ErrorReply::BadRequest), Message::AggregateChunk),
            None => Message::Error(ErrorReply::NotFound),
        }
    }

    /// Our parent in a group's tree offers its sum: pulled from it unless
    /// held or being pulled. Refused from any other node (the engine asks
    /// a signer for what no parent brought), over the size a sum of this
    /// model can have, or beyond [`MAX_OFFERS_IN_FLIGHT`] pulls at once.
    pub(crate) fn on_sum_offer(&mut self, peer: PeerId, o: AggregateOffer) -> Message {
        if o.run_id != self.engine.run_id() {
            self.reject(Some(peer), RejectReason::WrongRun, "a sum offer");
            return Message::Error(ErrorReply::WrongRun);
        }
        let max = Aggregate::max_len(self.engine.config().codec, self.engine.anchor().len()) as u64;
        if o.len > max {
            self.reject(Some(peer), RejectReason::TooLarge, "a sum offer");
            return Message::Error(ErrorReply::BadRequest);
        }
        let from = Self::node_of(&peer);
        let Some(from) = from.filter(|f| self.engine.sum_parent(o.key, o.group) == Some(*f)) else {
            self.reject(Some(peer), RejectReason::AggregateMismatch, "a sum offer from a node not our parent");
            return Message::Error(ErrorReply::BadRequest);
        };
        if self.sums.get(&o.hash).is_some() || self.offers_pulling.contains(&o.hash) {
            return Message::Ack;
        }
        if self.offers_pulling.len() >= MAX_OFFERS_IN_FLIGHT {
            tracing::debug!(
                "declined {peer}'s sum of tick {} group {}: {MAX_OFFERS_IN_FLIGHT} pulls in flight",
                o.key,
                o.group
            );
            self.count_sum(SumEvent::Declined);
            return Message::Error(ErrorReply::BadRequest);
        }
        self.offers_pulling.insert(o.hash);
        self.spawn_sum_fetch((o.key, o.group), from, peer, o.hash, o.len, false);
        Message::Ack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_store_drops_the_oldest_ticks_beyond_its_bounds() {
        let mut s = SumStore::default();
        let h = |i: u32| Hash32::of(&i.to_le_bytes());
        for i in 0..(MAX_HELD_SUMS + 10) as u32 {
            s.insert(u64::from(i) + 100, h(i), Arc::new(vec![0; 8]));
        }
        assert_eq!(s.by_tick.len(), MAX_HELD_SUMS);
        assert!(s.get(&h(0)).is_none(), "the oldest went first");
        assert!(s.get(&h(MAX_HELD_SUMS as u32 + 9)).is_some());
        // A sum of an older tick that arrives late goes before newer ones.
        let oldest_held = *s.by_tick.iter().next().unwrap();
        s.insert(1, Hash32([7; 32]), Arc::new(vec![0; 8]));
        assert!(s.get(&Hash32([7; 32])).is_none(), "the late, oldest sum went");
        assert!(s.get(&oldest_held.1).is_some(), "no newer sum went for it");
        let big = MAX_HELD_BYTES / 2 + 1;
        s.insert(1_000, Hash32([1; 32]), Arc::new(vec![0; big]));
        s.insert(1_001, Hash32([2; 32]), Arc::new(vec![0; big]));
        assert!(s.bytes <= MAX_HELD_BYTES, "{} bytes held", s.bytes);
        assert!(s.get(&Hash32([2; 32])).is_some() && s.get(&Hash32([1; 32])).is_none());
        s.insert(1_001, Hash32([2; 32]), Arc::new(vec![0; big]));
        assert_eq!(
            s.by_tick.iter().filter(|(_, h)| *h == Hash32([2; 32])).count(),
            1,
            "a second copy is not kept twice"
        );
        assert!(s.bytes <= MAX_HELD_BYTES, "{} bytes held after a second copy", s.bytes);
    }
}
