//! The wire: one versioned message enum, one canonical encoding, hard size
//! limits checked before decoding.
//!
//! Encoding: a version byte, then the message in postcard. We chose postcard
//! because its format is specified and stable (1.x), compact (varints, no
//! field names), deterministic for a given value (so hashes of encodings are
//! well defined), works through serde, and decodes from a slice without
//! panicking. Signed parts ([`crate::Signed`]) keep their exact bytes, so a
//! signature never depends on re-encoding.
//!
//! Decoding checks, in order: total length against the channel limit, the
//! version byte, the message kind byte against its own limit, then the body.

use serde::{Deserialize, Serialize};

mod kind;
mod split;
pub use kind::{MessageKind, max_message_len};
pub use split::{MAX_SPLIT_HEAD, SplitHead, parse_split_head};

use crate::{
    aggregate::AggregateAnnouncement,
    codec::CodecKind,
    identity::{Signable, Signed},
    ids::{Hash32, NodeId, RunId, UpdateId},
    ledger::SignedRecord,
    version::{AppliedSet, VersionVector},
};

/// The version byte every message starts with.
pub const WIRE_VERSION: u8 = 1;
/// Largest payload or state chunk.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;
/// Largest gossip message: gossipsub's frame limit (64 KiB) minus its own overhead.
pub const MAX_GOSSIP_BYTES: usize = 60 * 1024;
/// Largest anchor sketch (values) in a replica digest.
pub const MAX_SKETCH_VALUES: usize = 4096;
/// Most missing ids listed in one anti-entropy reply.
pub const MAX_MISSING_IDS: usize = 256;
/// Largest manifest we accept from a peer (bytes, canonical encoding).
pub const MAX_MANIFEST_BYTES: usize = 16 * 1024;

/// "I finished a round; here is what my update is and where to get it."
/// Gossiped; small; signed by its source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateAnnouncement {
    /// The run.
    pub run_id: RunId,
    /// Source and round.
    pub id: UpdateId,
    /// `|B|`: updates applied to the base the round started from.
    pub base_total: u64,
    /// The base version vector itself, sent only when receivers measure
    /// staleness themselves (it grows with the swarm; the other measures
    /// need only the numbers carried here).
    pub base: Option<VersionVector>,
    /// The tick the round started in (tick mode).
    pub base_tick: u64,
    /// The tick it was published in (tick mode).
    pub publish_tick: u64,
    /// Updates the sender applied between base and publish.
    pub sender_staleness: u32,
    /// Inner steps taken.
    pub steps: u32,
    /// Samples processed.
    pub samples: u64,
    /// Sender's speed estimate (steps/s).
    pub speed: f32,
    /// Mean training loss of the round.
    pub loss: f32,
    /// Payload codec.
    pub codec: CodecKind,
    /// Values in the payload (= parameters of the model).
    pub num_values: u64,
    /// Payload size in bytes.
    pub payload_len: u64,
    /// blake3 of the payload.
    pub payload_hash: Hash32,
}

impl Signable for UpdateAnnouncement {
    const DOMAIN: &'static [u8] = b"ragtag/v1/update";
    const MAX_BODY: usize = MAX_GOSSIP_BYTES - 128;
    fn signer(&self) -> NodeId {
        self.id.src
    }
}

/// Liveness and speed, gossiped periodically; signed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The run.
    pub run_id: RunId,
    /// Who.
    pub src: NodeId,
    /// Increases with every heartbeat of this node.
    pub seq: u64,
    /// Steps per second.
    pub speed: f32,
    /// The round it trains.
    pub round: u64,
    /// The first round it took part in.
    pub first_round: u64,
    /// `|V|` of its replica.
    pub applied_total: u64,
    /// Leaving the swarm (clean shutdown).
    pub leaving: bool,
    /// Its newest tick-clock stretch (tick mode): followers adopt the
    /// clock leader's.
    pub clock: Option<crate::time::ClockSegment>,
}

impl Signable for Heartbeat {
    const DOMAIN: &'static [u8] = b"ragtag/v1/heartbeat";
    const MAX_BODY: usize = 512;
    fn signer(&self) -> NodeId {
        self.src
    }
}

/// "I hold this payload": lets peers pull from more than the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    /// The run.
    pub run_id: RunId,
    /// The update.
    pub id: UpdateId,
    /// Its payload hash.
    pub payload_hash: Hash32,
}

/// A request for part of a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadRequest {
    /// The update.
    pub id: UpdateId,
    /// First byte wanted.
    pub offset: u64,
    /// Most bytes wanted (at most [`MAX_CHUNK_BYTES`]).
    pub max_len: u32,
}

/// Part of a payload or of a state blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Total bytes of the whole object.
    pub total_len: u64,
    /// Where this chunk starts.
    pub offset: u64,
    /// blake3 of the whole object.
    pub hash: Hash32,
    /// The bytes.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// A request for part of a quorum's sum (aggregated dissemination), by
/// the hash its signers announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateRequest {
    /// The run.
    pub run_id: RunId,
    /// The sum's tick.
    pub key: u64,
    /// The sum's group.
    pub group: u32,
    /// blake3 of the encoded sum.
    pub hash: Hash32,
    /// First byte wanted.
    pub offset: u64,
    /// Most bytes wanted (at most [`MAX_CHUNK_BYTES`]).
    pub max_len: u32,
}

/// "I hold this sum: fetch it from me." A node passes a sum down its
/// group's tree with this small push; the child pulls the body in chunks,
/// so a sum of any size travels the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateOffer {
    /// The run.
    pub run_id: RunId,
    /// The sum's tick.
    pub key: u64,
    /// The sum's group.
    pub group: u32,
    /// blake3 of the encoded sum.
    pub hash: Hash32,
    /// Its size in bytes.
    pub len: u64,
}

/// A joiner's request for the replica state (anchor, outer state, versions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRequest {
    /// The run.
    pub run_id: RunId,
    /// First byte wanted.
    pub offset: u64,
    /// Most bytes wanted.
    pub max_len: u32,
    /// The state snapshot being read (zero: take a new one).
    pub snapshot: Hash32,
}

/// A summary of a replica for anti-entropy: what it applied and a sketch of
/// its anchor, from which the distance between replicas is estimated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaDigest {
    /// The run.
    pub run_id: RunId,
    /// Its version vector.
    pub version: VersionVector,
    /// The updates it applied (within the window).
    pub applied: AppliedSet,
    /// Anchor values at fixed strided positions.
    pub sketch: Vec<f32>,
}

/// Why a request could not be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorReply {
    /// We do not hold it.
    NotFound,
    /// The request is for another run.
    WrongRun,
    /// The request is malformed or over a limit.
    BadRequest,
}

/// Every message, gossip or request/response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// An update announcement (gossip).
    Announce(Signed<UpdateAnnouncement>),
    /// A ledger receipt (gossip).
    Receipt(SignedRecord),
    /// A heartbeat (gossip).
    Heartbeat(Signed<Heartbeat>),
    /// A payload holder (gossip).
    Have(Have),
    /// Request part of a payload.
    PayloadRequest(PayloadRequest),
    /// Request an announcement we missed.
    AnnouncementRequest(UpdateId),
    /// Part of a payload (response).
    PayloadChunk(Chunk),
    /// Request the replica state (joiners, anti-entropy).
    StateRequest(StateRequest),
    /// Part of the replica state (response).
    StateChunk(Chunk),
    /// Anti-entropy: my digest (request) or yours (response).
    Digest(ReplicaDigest),
    /// Request the manifest of a run.
    ManifestRequest(RunId),
    /// The manifest's canonical bytes (response).
    Manifest(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A request failed.
    Error(ErrorReply),
    /// Ask for `bytes` of filler (round-trip and bandwidth checks).
    Probe(u32),
    /// The filler asked for.
    ProbeReply(#[serde(with = "serde_bytes")] Vec<u8>),
    /// An announcement with its payload inline (gossip; small models).
    Update {
        /// The signed announcement.
        announcement: Signed<UpdateAnnouncement>,
        /// The payload it announces.
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    /// The receipts of one applied batch (gossip): one message per batch
    /// instead of one per update, at most [`MAX_RECEIPTS_PER_MESSAGE`].
    Receipts(Vec<SignedRecord>),
    /// An aggregator's signed hash of its group's sum (gossip).
    AggregateAnnounce(Signed<AggregateAnnouncement>),
    /// Request part of a sum.
    AggregateRequest(AggregateRequest),
    /// Part of a sum (response).
    AggregateChunk(Chunk),
    /// A sum passed down the group's tree (request, answered [`Message::Ack`]).
    AggregateOffer(AggregateOffer),
    /// A push was taken (response to an offer or to an update sent to
    /// its group's aggregators).
    Ack,
}

/// Receipts in one [`Message::Receipts`]: this many receipts of the
/// largest size fit in one gossip message (tested).
pub const MAX_RECEIPTS_PER_MESSAGE: usize = 128;

/// Payloads up to this size travel inline with their announcement in one
/// gossip message; larger ones are pulled by request-response.
pub const MAX_INLINE_PAYLOAD: usize = MAX_GOSSIP_BYTES - 4 * 1024;

impl Message {
    /// This message's kind.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Announce(_) => MessageKind::Announce,
            Message::Receipt(_) => MessageKind::Receipt,
            Message::Heartbeat(_) => MessageKind::Heartbeat,
            Message::Have(_) => MessageKind::Have,
            Message::PayloadRequest(_) => MessageKind::PayloadRequest,
            Message::AnnouncementRequest(_) => MessageKind::AnnouncementRequest,
            Message::PayloadChunk(_) => MessageKind::PayloadChunk,
            Message::StateRequest(_) => MessageKind::StateRequest,
            Message::StateChunk(_) => MessageKind::StateChunk,
            Message::Digest(_) => MessageKind::Digest,
            Message::ManifestRequest(_) => MessageKind::ManifestRequest,
            Message::Manifest(_) => MessageKind::Manifest,
            Message::Error(_) => MessageKind::Error,
            Message::Probe(_) => MessageKind::Probe,
            Message::ProbeReply(_) => MessageKind::ProbeReply,
            Message::Update { .. } => MessageKind::Update,
            Message::Receipts(_) => MessageKind::Receipts,
            Message::AggregateAnnounce(_) => MessageKind::AggregateAnnounce,
            Message::AggregateRequest(_) => MessageKind::AggregateRequest,
            Message::AggregateChunk(_) => MessageKind::AggregateChunk,
            Message::AggregateOffer(_) => MessageKind::AggregateOffer,
            Message::Ack => MessageKind::Ack,
        }
    }

    /// The canonical encoding: version byte, then postcard.
    pub fn encode(&self) -> Vec<u8> {
        let out = vec![WIRE_VERSION];
        postcard::to_extend(self, out).expect("encoding to a Vec cannot fail")
    }

    /// The kind an encoding's first two bytes name, after its version.
    pub(crate) fn kind_of(bytes: &[u8]) -> Result<MessageKind, DecodeError> {
        let (&version, rest) = bytes.split_first().ok_or(DecodeError::Empty)?;
        if version != WIRE_VERSION {
            return Err(DecodeError::Version(version));
        }
        let &kind_byte = rest.first().ok_or(DecodeError::Empty)?;
        MessageKind::from_byte(kind_byte).ok_or(DecodeError::UnknownKind(kind_byte))
    }

    /// Decodes, checking limits first. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        if bytes.len() > max_message_len() {
            return Err(DecodeError::TooLarge { kind: None, len: bytes.len(), max: max_message_len() });
        }
        let kind = Self::kind_of(bytes)?;
        let rest = &bytes[1..];
        if bytes.len() > kind.max_len() {
            return Err(DecodeError::TooLarge { kind: Some(kind), len: bytes.len(), max: kind.max_len() });
        }
        let (msg, trailing) =
            postcard::take_from_bytes::<Message>(rest).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        if !trailing.is_empty() {
            return Err(DecodeError::Malformed(format!("{} trailing bytes", trailing.len())));
        }
        Ok(msg)
    }
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// No bytes.
    #[error("empty message")]
    Empty,
    /// Over the limit of the channel or kind.
    #[error("message of {len} bytes over the limit of {max} ({kind:?})")]
    TooLarge {
        /// The kind, when known.
        kind: Option<MessageKind>,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Another protocol version.
    #[error("unsupported wire version {0}")]
    Version(u8),
    /// An unknown kind byte.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// Not a valid body.
    #[error("malformed message: {0}")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{
        identity::Keypair,
        ledger::{LedgerWriter, RecordKind},
    };

    fn sample_announcement(k: &Keypair) -> UpdateAnnouncement {
        let mut base = VersionVector::new();
        base.increment(k.node_id());
        UpdateAnnouncement {
            run_id: RunId(Hash32([7; 32])),
            id: UpdateId { src: k.node_id(), round: 3 },
            base_total: base.total(),
            base: Some(base),
            base_tick: 2,
            publish_tick: 3,
            sender_staleness: 1,
            steps: 50,
            samples: 1600,
            speed: 12.5,
            loss: 1.25,
            codec: CodecKind::Int8 { block: 256 },
            num_values: 1000,
            payload_len: 1016,
            payload_hash: Hash32([1; 32]),
        }
    }

    /// An aggregate announcement with every field at its largest.
    fn sample_aggregate_announcement(k: &Keypair) -> AggregateAnnouncement {
        AggregateAnnouncement {
            run_id: RunId(Hash32([0xff; 32])),
            key: u64::MAX,
            group: u32::MAX,
            aggregator: k.node_id(),
            members: u32::MAX,
            body_len: u64::MAX,
            body_hash: Hash32([0xff; 32]),
        }
    }

    pub(crate) fn every_kind_of_message() -> Vec<Message> {
        let k = Keypair::deterministic(5, 0);
        let run_id = RunId(Hash32([7; 32]));
        let mut ledger = LedgerWriter::new(k.clone(), run_id);
        let receipt = ledger.next(5, RecordKind::Leave { round: 1, reason: "bye".into() });
        vec![
            Message::Announce(Signed::sign(&sample_announcement(&k), &k)),
            Message::Receipt(receipt.clone()),
            Message::Heartbeat(Signed::sign(
                &Heartbeat {
                    run_id,
                    src: k.node_id(),
                    seq: 1,
                    speed: 3.0,
                    round: 4,
                    first_round: 0,
                    applied_total: 9,
                    leaving: false,
                    clock: None,
                },
                &k,
            )),
            Message::Have(Have { run_id, id: UpdateId { src: k.node_id(), round: 1 }, payload_hash: Hash32([2; 32]) }),
            Message::PayloadRequest(PayloadRequest {
                id: UpdateId { src: k.node_id(), round: 1 },
                offset: 10,
                max_len: 1000,
            }),
            Message::AnnouncementRequest(UpdateId { src: k.node_id(), round: 1 }),
            Message::PayloadChunk(Chunk { total_len: 10, offset: 0, hash: Hash32([3; 32]), bytes: vec![1, 2, 3] }),
            Message::StateRequest(StateRequest { run_id, offset: 0, max_len: 4096, snapshot: Hash32::default() }),
            Message::StateChunk(Chunk { total_len: 3, offset: 0, hash: Hash32([4; 32]), bytes: vec![9, 9, 9] }),
            Message::Digest(ReplicaDigest {
                run_id,
                version: VersionVector::new(),
                applied: AppliedSet::new(),
                sketch: vec![1.0, 2.0],
            }),
            Message::ManifestRequest(run_id),
            Message::Manifest(vec![1, 2, 3]),
            Message::Error(ErrorReply::NotFound),
            Message::Probe(1000),
            Message::ProbeReply(vec![0; 1000]),
            Message::Update { announcement: Signed::sign(&sample_announcement(&k), &k), payload: vec![1; 100] },
            Message::Receipts(vec![receipt.clone(), receipt]),
            Message::AggregateAnnounce(Signed::sign(&sample_aggregate_announcement(&k), &k)),
            Message::AggregateRequest(AggregateRequest {
                run_id,
                key: 9,
                group: 2,
                hash: Hash32([5; 32]),
                offset: 0,
                max_len: 1 << 20,
            }),
            Message::AggregateChunk(Chunk { total_len: 3, offset: 0, hash: Hash32([5; 32]), bytes: vec![4, 4, 4] }),
            Message::AggregateOffer(AggregateOffer { run_id, key: 9, group: 2, hash: Hash32([5; 32]), len: 3 }),
            Message::Ack,
        ]
    }

    #[test]
    fn every_kind_round_trips_and_kind_byte_matches() {
        let msgs = every_kind_of_message();
        assert_eq!(msgs.len(), MessageKind::ALL.len());
        for m in msgs {
            let bytes = m.encode();
            assert_eq!(bytes[0], WIRE_VERSION);
            assert_eq!(bytes[1], m.kind() as u8, "{:?}", m.kind());
            assert!(bytes.len() <= m.kind().max_len());
            assert_eq!(Message::decode(&bytes).unwrap(), m);
        }
    }

    #[test]
    fn a_full_batch_of_receipts_fits_one_gossip_message() {
        let k = Keypair::deterministic(5, 0);
        let mut ledger = LedgerWriter::new(k.clone(), RunId(Hash32([7; 32])));
        let receipts = (0..MAX_RECEIPTS_PER_MESSAGE as u64)
            .map(|i| {
                let kind = RecordKind::Receipt {
                    update: UpdateId { src: NodeId([0xff; 32]), round: u64::MAX - i },
                    payload_hash: Hash32([0xff; 32]),
                    samples: u64::MAX,
                    outcome: crate::ledger::ReceiptOutcome::Accepted { weight: 1.0, staleness: u32::MAX },
                };
                ledger.next(u64::MAX, kind)
            })
            .collect();
        let m = Message::Receipts(receipts);
        let bytes = m.encode();
        assert!(bytes.len() <= MessageKind::Receipts.max_len(), "{} bytes", bytes.len());
        assert_eq!(Message::decode(&bytes).unwrap(), m);
    }

    #[test]
    fn limits_are_checked_before_decoding() {
        let mut big = vec![WIRE_VERSION, MessageKind::Heartbeat as u8];
        big.resize(2000, 0);
        assert!(matches!(Message::decode(&big), Err(DecodeError::TooLarge { kind: Some(MessageKind::Heartbeat), .. })));
        assert_eq!(Message::decode(&[]), Err(DecodeError::Empty));
        assert_eq!(Message::decode(&[9, 0]), Err(DecodeError::Version(9)));
        assert_eq!(Message::decode(&[WIRE_VERSION, 200]), Err(DecodeError::UnknownKind(200)));
        let huge = vec![WIRE_VERSION; max_message_len() + 1];
        assert!(matches!(Message::decode(&huge), Err(DecodeError::TooLarge { kind: None, .. })));
    }

    #[test]
    fn signed_announcement_opens_and_detects_forgery() {
        let k = Keypair::deterministic(5, 1);
        let a = sample_announcement(&k);
        let s = Signed::sign(&a, &k);
        assert_eq!(s.open().unwrap(), a);
        let other = Keypair::deterministic(5, 2);
        let forged = Signed::<UpdateAnnouncement>::from_parts(
            s.body().to_vec(),
            other.sign(UpdateAnnouncement::DOMAIN, s.body()),
        );
        assert!(forged.open().is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = Message::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_valid_prefix(kind in 0u8..MessageKind::ALL.len() as u8 + 1, tail in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut bytes = vec![WIRE_VERSION, kind];
            bytes.extend(tail);
            if let Ok(m) = Message::decode(&bytes) {
                // Whatever decodes re-encodes within its limit.
                prop_assert!(m.encode().len() <= m.kind().max_len());
            }
        }

        #[test]
        fn mutated_valid_messages_never_panic(index in 0usize..MessageKind::ALL.len(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let msgs = every_kind_of_message();
            let mut bytes = msgs[index].encode();
            let i = pos.index(bytes.len());
            bytes[i] = byte;
            match Message::decode(&bytes) {
                Ok(Message::Announce(s)) => { let _ = s.open(); }
                Ok(Message::AggregateAnnounce(s)) => { let _ = s.open(); }
                _ => {}
            }
        }
    }
}
