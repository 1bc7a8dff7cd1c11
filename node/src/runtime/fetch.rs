//! Pulling things from peers by request-response: payloads and replica
//! state in chunks (each checked against its hash), missed
//! announcements, anti-entropy digests (manifests: [`crate::run_lookup`]).

use libp2p::PeerId;
use ragtag_protocol::{
    chunks::{ChunkError, Reassembly},
    engine::{
        ReplicaState,
        state_transfer::{self, StateHead},
    },
    identity::Signed,
    ids::{Hash32, RunId, UpdateId},
    wire::{
        AggregateRequest, Chunk, ErrorReply, MAX_CHUNK_BYTES, Message, MessageKind, PayloadRequest, ReplicaDigest,
        StateRequest, UpdateAnnouncement,
    },
};

use crate::net::{Client, NetError};

/// Largest replica state we accept (anchor, momentum, buffers of a 5M
/// parameter model fit comfortably).
pub(crate) const MAX_STATE_BYTES: u64 = 1 << 30;

/// Why a fetch from a peer failed: the caller logs it or asks another peer.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
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
    /// The state's parts do not decode or do not fit together.
    #[error("replica state: {0}")]
    State(#[from] state_transfer::TransferError),
    /// A state larger than we accept.
    #[error("a replica state of {0} bytes is over the limit")]
    TooLarge(u64),
    /// No holder left to ask.
    #[error("no holder left to serve the state")]
    NoHolders,
    /// The peer did not answer in time.
    #[error("no answer in time")]
    TimedOut,
    /// A chunk of a shared state or a sum that is not the one asked for.
    #[error("a chunk that is not the one asked for")]
    BadChunk,
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

/// Payload chunk requests in flight at once: the holder encodes and
/// encrypts the next chunk while we decrypt this one, and a long path's
/// round trip is paid once per window rather than once per chunk.
pub const PAYLOAD_CHUNKS_IN_FLIGHT: usize = 4;

/// A payload of `len` bytes (as announced) from `peer`, with
/// [`PAYLOAD_CHUNKS_IN_FLIGHT`] chunk requests in flight.
pub async fn payload(net: &Client, peer: PeerId, id: UpdateId, len: u64) -> Result<Vec<u8>, FetchError> {
    payload_pipelined(net, peer, id, len, PAYLOAD_CHUNKS_IN_FLIGHT).await
}

/// [`payload`] with `in_flight` chunk requests at once (at least one); the
/// chunks are checked in order as they complete (an out-of-order one waits,
/// at most `in_flight` of them).
pub async fn payload_pipelined(
    net: &Client,
    peer: PeerId,
    id: UpdateId,
    len: u64,
    in_flight: usize,
) -> Result<Vec<u8>, FetchError> {
    let chunk = MAX_CHUNK_BYTES as u64;
    let n = len.div_ceil(chunk).max(1);
    let ask = |i: u64| async move {
        let request = PayloadRequest { id, offset: i * chunk, max_len: MAX_CHUNK_BYTES as u32 };
        (i, net.request(peer, Message::PayloadRequest(request)).await)
    };
    let mut object = Reassembly::new(len);
    let mut pending = futures::stream::FuturesUnordered::new();
    let mut arrived = std::collections::BTreeMap::new();
    let (mut next, mut pushed) = (0u64, 0u64);
    loop {
        // A sliding window: chunk `next` is asked for only while fewer
        // than `in_flight` chunks are asked for and not yet taken in
        // order, so a slow first chunk holds back at most that many.
        while next < n && next < pushed + in_flight.max(1) as u64 {
            pending.push(ask(next));
            next += 1;
        }
        let Some((i, answer)) = futures::StreamExt::next(&mut pending).await else {
            // Every chunk the length allows was pushed and the object is
            // still short: the holder's chunks do not add up to it.
            return Err(ChunkError::Stalled.into());
        };
        match answer? {
            Message::PayloadChunk(c) => arrived.insert(i, c),
            other => return Err(unexpected(&other)),
        };
        while let Some(c) = arrived.remove(&pushed) {
            pushed += 1;
            if let Some((bytes, _)) = object.push(c)? {
                return Ok(bytes);
            }
        }
    }
}

/// A quorum's sum of `len` bytes (as its signers announced, or as the
/// offering parent said) from `peer`, in chunks; a body whose chunks name
/// another hash is refused before it is put together.
pub(crate) async fn aggregate(
    net: &Client,
    peer: PeerId,
    run_id: RunId,
    (key, group): (u64, u32),
    hash: Hash32,
    len: u64,
) -> Result<Vec<u8>, FetchError> {
    let request = |offset, _| {
        Message::AggregateRequest(AggregateRequest {
            run_id,
            key,
            group,
            hash,
            offset,
            max_len: MAX_CHUNK_BYTES as u32,
        })
    };
    let extract = |m| match m {
        Message::AggregateChunk(c) if c.hash == hash && c.total_len == len => Ok(c),
        Message::AggregateChunk(_) => Err(FetchError::BadChunk),
        other => Err(unexpected(&other)),
    };
    Ok(fetch_chunked(net, peer, len, request, extract).await?.0)
}

/// A peer's replica state, head and shared part both from it (the caller
/// verifies it against the manifest), and the bytes it took.
pub(crate) async fn state(net: &Client, peer: PeerId, run_id: RunId) -> Result<(ReplicaState, usize), FetchError> {
    let head_bytes = state_head_bytes(net, peer, run_id).await?;
    let head = state_transfer::decode_head(&head_bytes)?;
    let shared = shared_state(net, &[peer], run_id, &head, |_, _| {}).await?;
    let bytes = head_bytes.len() + shared.bytes.len();
    Ok((state_transfer::assemble(head, &shared.bytes)?, bytes))
}

/// The head of a peer's current replica state: its own part, naming the
/// shared part by hash.
pub(crate) async fn state_head(net: &Client, peer: PeerId, run_id: RunId) -> Result<StateHead, FetchError> {
    Ok(state_transfer::decode_head(&state_head_bytes(net, peer, run_id).await?)?)
}

async fn state_head_bytes(net: &Client, peer: PeerId, run_id: RunId) -> Result<Vec<u8>, FetchError> {
    let (bytes, _) = fetch_chunked(
        net,
        peer,
        state_transfer::MAX_HEAD_BYTES as u64,
        |offset, snapshot| {
            Message::StateRequest(StateRequest { run_id, offset, max_len: MAX_CHUNK_BYTES as u32, snapshot })
        },
        |m| match m {
            Message::StateChunk(c) => Ok(c),
            other => Err(unexpected(&other)),
        },
    )
    .await?;
    Ok(bytes)
}

/// Smallest chunk a shared-state transfer asks for (a small state comes in
/// fewer chunks than it has holders).
const MIN_STATE_CHUNK: u64 = 16 * 1024;
/// Chunk requests in flight per holder.
const CHUNKS_IN_FLIGHT_PER_HOLDER: usize = 2;

/// A shared state part and how many of its chunks each holder served.
#[derive(Debug)]
pub(crate) struct SharedFetch {
    /// The bytes, checked against the head's hash.
    pub bytes: Vec<u8>,
    /// Chunks served, by holder (in the order given).
    pub per_holder: Vec<usize>,
}

/// The shared part `head` names, in chunks from all of `holders` at once:
/// each holder has up to [`CHUNKS_IN_FLIGHT_PER_HOLDER`] chunks in flight
/// and takes the next one as it delivers, so fast holders serve more; a
/// holder that fails a chunk (no answer, an error, a chunk that is not the
/// one asked for) is dropped and its chunks go to the others.
/// `progress(done, total)` is called as bytes arrive. The whole is checked
/// against the head's hash at the end: a holder that served wrong bytes
/// makes it fail, and the caller then asks each holder alone.
pub(crate) async fn shared_state(
    net: &Client,
    holders: &[PeerId],
    run_id: RunId,
    head: &StateHead,
    mut progress: impl FnMut(u64, u64),
) -> Result<SharedFetch, FetchError> {
    let (len, hash) = (head.shared_len, head.shared_hash);
    if len > MAX_STATE_BYTES {
        return Err(FetchError::TooLarge(len));
    }
    if holders.is_empty() {
        return Err(FetchError::NoHolders);
    }
    let k = holders.len();
    let chunk = (len / (4 * k as u64)).clamp(MIN_STATE_CHUNK, MAX_CHUNK_BYTES as u64);
    let n = len.div_ceil(chunk) as usize;
    let ask = |i: usize, h: usize| async move {
        let offset = i as u64 * chunk;
        let want = chunk.min(len - offset);
        let request = StateRequest { run_id, offset, max_len: want as u32, snapshot: hash };
        let result = match net.request(holders[h], Message::StateRequest(request)).await {
            Ok(Message::StateChunk(c))
                if c.hash == hash && c.total_len == len && c.offset == offset && c.bytes.len() as u64 == want =>
            {
                Ok(c.bytes)
            }
            Ok(Message::StateChunk(_)) => Err(FetchError::BadChunk),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(e.into()),
        };
        (i, h, result)
    };
    let mut parts: Vec<Option<Vec<u8>>> = vec![None; n];
    let mut todo: std::collections::VecDeque<usize> = (0..n).collect();
    let mut alive = vec![true; k];
    let mut busy = vec![0usize; k];
    let mut per_holder = vec![0usize; k];
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut last_error = None;
    let mut done = 0u64;
    loop {
        // Every live holder with a free slot takes the next chunk to do.
        for h in (0..k).cycle().take(k * CHUNKS_IN_FLIGHT_PER_HOLDER) {
            if alive[h]
                && busy[h] < CHUNKS_IN_FLIGHT_PER_HOLDER
                && let Some(i) = todo.pop_front()
            {
                busy[h] += 1;
                in_flight.push(ask(i, h));
            }
        }
        let Some((i, h, result)) = futures::StreamExt::next(&mut in_flight).await else { break };
        busy[h] -= 1;
        match result {
            Ok(bytes) => {
                done += bytes.len() as u64;
                parts[i] = Some(bytes);
                per_holder[h] += 1;
                progress(done, len);
            }
            Err(e) => {
                alive[h] = false;
                todo.push_back(i);
                last_error = Some(e);
            }
        }
    }
    if !todo.is_empty() {
        return Err(last_error.unwrap_or(FetchError::NoHolders));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    for part in parts.iter().flatten() {
        bytes.extend_from_slice(part);
    }
    if bytes.len() as u64 != len || Hash32::of(&bytes) != hash {
        return Err(state_transfer::TransferError::Mismatch.into());
    }
    Ok(SharedFetch { bytes, per_holder })
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
