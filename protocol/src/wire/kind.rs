//! The message kinds: the kind byte after the version, each kind's size
//! limit (checked before decoding) and its name in metrics.

use super::{MAX_CHUNK_BYTES, MAX_GOSSIP_BYTES, MAX_MANIFEST_BYTES, WIRE_VERSION};

/// The kinds of [`Message`](super::Message), in wire order (the kind byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageKind {
    /// See [`Message::Announce`](super::Message::Announce).
    Announce = 0,
    /// See [`Message::Receipt`](super::Message::Receipt).
    Receipt = 1,
    /// See [`Message::Heartbeat`](super::Message::Heartbeat).
    Heartbeat = 2,
    /// See [`Message::Have`](super::Message::Have).
    Have = 3,
    /// See [`Message::PayloadRequest`](super::Message::PayloadRequest).
    PayloadRequest = 4,
    /// See [`Message::AnnouncementRequest`](super::Message::AnnouncementRequest).
    AnnouncementRequest = 5,
    /// See [`Message::PayloadChunk`](super::Message::PayloadChunk).
    PayloadChunk = 6,
    /// See [`Message::StateRequest`](super::Message::StateRequest).
    StateRequest = 7,
    /// See [`Message::StateChunk`](super::Message::StateChunk).
    StateChunk = 8,
    /// See [`Message::Digest`](super::Message::Digest).
    Digest = 9,
    /// See [`Message::ManifestRequest`](super::Message::ManifestRequest).
    ManifestRequest = 10,
    /// See [`Message::Manifest`](super::Message::Manifest).
    Manifest = 11,
    /// See [`Message::Error`](super::Message::Error).
    Error = 12,
    /// See [`Message::Probe`](super::Message::Probe).
    Probe = 13,
    /// See [`Message::ProbeReply`](super::Message::ProbeReply).
    ProbeReply = 14,
    /// See [`Message::Update`](super::Message::Update).
    Update = 15,
    /// See [`Message::Receipts`](super::Message::Receipts).
    Receipts = 16,
    /// See [`Message::AggregateAnnounce`](super::Message::AggregateAnnounce).
    AggregateAnnounce = 17,
    /// See [`Message::AggregateRequest`](super::Message::AggregateRequest).
    AggregateRequest = 18,
    /// See [`Message::AggregateChunk`](super::Message::AggregateChunk).
    AggregateChunk = 19,
    /// See [`Message::AggregateOffer`](super::Message::AggregateOffer).
    AggregateOffer = 20,
    /// See [`Message::Ack`](super::Message::Ack).
    Ack = 21,
}

impl MessageKind {
    /// All kinds.
    pub const ALL: [MessageKind; 22] = [
        MessageKind::Announce,
        MessageKind::Receipt,
        MessageKind::Heartbeat,
        MessageKind::Have,
        MessageKind::PayloadRequest,
        MessageKind::AnnouncementRequest,
        MessageKind::PayloadChunk,
        MessageKind::StateRequest,
        MessageKind::StateChunk,
        MessageKind::Digest,
        MessageKind::ManifestRequest,
        MessageKind::Manifest,
        MessageKind::Error,
        MessageKind::Probe,
        MessageKind::ProbeReply,
        MessageKind::Update,
        MessageKind::Receipts,
        MessageKind::AggregateAnnounce,
        MessageKind::AggregateRequest,
        MessageKind::AggregateChunk,
        MessageKind::AggregateOffer,
        MessageKind::Ack,
    ];

    pub(super) fn from_byte(b: u8) -> Option<Self> {
        Self::ALL.get(b as usize).copied()
    }

    /// The kind an encoded message declares in its first two bytes
    /// (version, kind), when both are ours: a reader can size its buffer
    /// and its limit before the rest arrives.
    pub fn of_encoded(head: &[u8]) -> Option<Self> {
        match head {
            [WIRE_VERSION, kind, ..] => Self::from_byte(*kind),
            _ => None,
        }
    }

    /// The largest encoded message of this kind, version byte included.
    pub fn max_len(self) -> usize {
        match self {
            MessageKind::Announce => MAX_GOSSIP_BYTES,
            MessageKind::Receipt => 2 * 1024,
            MessageKind::Heartbeat => 1024,
            MessageKind::Have => 256,
            MessageKind::PayloadRequest | MessageKind::AnnouncementRequest => 256,
            MessageKind::StateRequest | MessageKind::ManifestRequest => 256,
            MessageKind::PayloadChunk | MessageKind::StateChunk | MessageKind::AggregateChunk => MAX_CHUNK_BYTES + 256,
            MessageKind::AggregateAnnounce => 1024,
            MessageKind::AggregateRequest | MessageKind::AggregateOffer => 256,
            MessageKind::Ack => 16,
            MessageKind::Digest => 512 * 1024,
            MessageKind::Manifest => MAX_MANIFEST_BYTES + 16,
            MessageKind::Error => 16,
            MessageKind::Probe => 16,
            MessageKind::ProbeReply => MAX_CHUNK_BYTES + 16,
            MessageKind::Update | MessageKind::Receipts => MAX_GOSSIP_BYTES,
        }
    }

    /// A short name for metrics.
    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Announce => "announce",
            MessageKind::Receipt => "receipt",
            MessageKind::Heartbeat => "heartbeat",
            MessageKind::Have => "have",
            MessageKind::PayloadRequest => "payload_request",
            MessageKind::AnnouncementRequest => "announcement_request",
            MessageKind::PayloadChunk => "payload_chunk",
            MessageKind::StateRequest => "state_request",
            MessageKind::StateChunk => "state_chunk",
            MessageKind::Digest => "digest",
            MessageKind::ManifestRequest => "manifest_request",
            MessageKind::Manifest => "manifest",
            MessageKind::Error => "error",
            MessageKind::Probe => "probe",
            MessageKind::ProbeReply => "probe_reply",
            MessageKind::Update => "update",
            MessageKind::Receipts => "receipts",
            MessageKind::AggregateAnnounce => "aggregate_announce",
            MessageKind::AggregateRequest => "aggregate_request",
            MessageKind::AggregateChunk => "aggregate_chunk",
            MessageKind::AggregateOffer => "aggregate_offer",
            MessageKind::Ack => "ack",
        }
    }
}

/// The largest message of any kind.
pub fn max_message_len() -> usize {
    MessageKind::ALL.iter().map(|k| k.max_len()).max().unwrap_or(0)
}
