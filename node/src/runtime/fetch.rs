//! Pulling things from peers by request-response: payloads and replica
//! state in chunks (each checked against its hash), missed
//! announcements, anti-entropy digests (manifests: [`crate::run_lookup`]).

use libp2p::PeerId;
use ragtag_protocol::{
    chunks::{ChunkError, Reassembly},
    engine::ReplicaState,
    identity::Signed,
    ids::{Hash32, RunId, UpdateId},
    wire::{
        Chunk, ErrorReply, MAX_CHUNK_BYTES, Message, MessageKind, PayloadRequest, ReplicaDigest, StateRequest,
        UpdateAnnouncement,
    },
};

use crate::net::{Client, NetError};

/// Largest replica state we accept (anchor, momentum, buffers of a 5M
/// parameter model fit comfortably).
pub(crate) const MAX_STATE_BYTES: u64 = 1 << 30;

/// Why a fetch from a peer failed: the caller logs it or asks another peer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// The request did not get an answer.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The peer answered with an error.
    #[error("peer answered {0:?}")]
    Refused(ErrorReply),
    /// The peer answered with the wrong kind of message.
    #[error("unexpected answer {0:?}")]
    Unexpected(MessageKind),
    /// The chunks do not make up the object.
    #[error(transparent)]
    Chunks(#[from] ChunkError),
    /// The reassembled state is not a replica state.
    #[error("state does not decode: {0}")]
    StateDecode(#[source] postcard::Error),
}

fn unexpected(m: &Message) -> FetchError {
    match m {
        Message::Error(e) => FetchError::Refused(*e),
        other => FetchError::Unexpected(other.kind()),
    }
}

/// Reassembles a chunked object from `peer` (see [`Reassembly`]).
async fn fetch_chunked(
    net: &Client,
    peer: PeerId,
    max_total: u64,
    mut request: impl FnMut(u64, Hash32) -> Message,
    extract: impl Fn(Message) -> Result<Chunk, FetchError>,
) -> Result<(Vec<u8>, Hash32), FetchError> {
    let mut object = Reassembly::new(max_total);
    loop {
        let chunk = extract(net.request(peer, request(object.offset(), object.hash())).await?)?;
        if let Some(done) = object.push(chunk)? {
            return Ok(done);
        }
    }
}

/// A payload of `len` bytes from `peer`.
pub(crate) async fn payload(net: &Client, peer: PeerId, id: UpdateId, len: u64) -> Result<Vec<u8>, FetchError> {
    let (bytes, _) = fetch_chunked(
        net,
        peer,
        len,
        |offset, _| Message::PayloadRequest(PayloadRequest { id, offset, max_len: MAX_CHUNK_BYTES as u32 }),
        |m| match m {
            Message::PayloadChunk(c) => Ok(c),
            other => Err(unexpected(&other)),
        },
    )
    .await?;
    Ok(bytes)
}

/// A peer's replica state, decoded (the caller verifies it against the manifest).
pub(crate) async fn state(net: &Client, peer: PeerId, run_id: RunId) -> Result<ReplicaState, FetchError> {
    let (bytes, _) = fetch_chunked(
        net,
        peer,
        MAX_STATE_BYTES,
        |offset, snapshot| {
            Message::StateRequest(StateRequest { run_id, offset, max_len: MAX_CHUNK_BYTES as u32, snapshot })
        },
        |m| match m {
            Message::StateChunk(c) => Ok(c),
            other => Err(unexpected(&other)),
        },
    )
    .await?;
    postcard::from_bytes(&bytes).map_err(FetchError::StateDecode)
}

/// An announcement we missed; `None` when the peer no longer holds it.
pub(crate) async fn announcement(
    net: &Client,
    peer: PeerId,
    id: UpdateId,
) -> Result<Option<Signed<UpdateAnnouncement>>, FetchError> {
    match net.request(peer, Message::AnnouncementRequest(id)).await? {
        Message::Announce(s) => Ok(Some(s)),
        Message::Error(ErrorReply::NotFound) => Ok(None),
        other => Err(unexpected(&other)),
    }
}

/// Exchanges anti-entropy digests.
pub(crate) async fn digest(net: &Client, peer: PeerId, mine: ReplicaDigest) -> Result<ReplicaDigest, FetchError> {
    match net.request(peer, Message::Digest(mine)).await? {
        Message::Digest(d) => Ok(d),
        other => Err(unexpected(&other)),
    }
}

/// The chunk of `bytes` starting at `offset`.
pub(crate) fn chunk_of(bytes: &[u8], hash: Hash32, offset: u64, max_len: u32) -> Option<Chunk> {
    let start = usize::try_from(offset).ok().filter(|s| *s <= bytes.len())?;
    let len = (max_len as usize).min(MAX_CHUNK_BYTES).min(bytes.len() - start);
    Some(Chunk { total_len: bytes.len() as u64, offset, hash, bytes: bytes[start..start + len].to_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_object() {
        let data: Vec<u8> = (0..2_500_000u32).map(|i| i as u8).collect();
        let h = Hash32::of(&data);
        let mut got = Vec::new();
        while let Some(c) = chunk_of(&data, h, got.len() as u64, u32::MAX) {
            if c.bytes.is_empty() {
                break;
            }
            got.extend(c.bytes);
        }
        assert_eq!(got, data);
        assert!(chunk_of(&data, h, data.len() as u64 + 1, 10).is_none());
    }
}
