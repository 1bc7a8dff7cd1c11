//! A bulk message (a chunk, a probe reply) as a small head and its bytes,
//! so that a stream writes the bytes from where they lie and reads them
//! straight into a buffer of their own: a megabyte chunk is not copied
//! into one message buffer on its way out, nor out of one on its way in.
//! `head ++ bytes` is exactly what [`Message::encode`] writes, and a
//! message read this way is exactly what [`Message::decode`] returns.

use super::{Chunk, DecodeError, Message, MessageKind};
use crate::ids::Hash32;

/// The most bytes a bulk message's head takes: the version and kind bytes,
/// a chunk's two u64 varints, its hash (a length varint and 32 bytes) and
/// the length varint of its bytes, each varint at its longest (postcard
/// reads padded varints too). A reader that has this many bytes (or the
/// whole message, if shorter) can parse the head.
pub const MAX_SPLIT_HEAD: usize = 2 + 10 + 10 + (10 + 32) + 10;

/// What comes before a chunk's bytes.
type ChunkHead = (u64, u64, Hash32);

/// Which bulk message a head starts, with what precedes its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bulk {
    Payload(ChunkHead),
    State(ChunkHead),
    Aggregate(ChunkHead),
    Probe,
}

/// A bulk message's head, parsed: what the message is, less its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitHead {
    bulk: Bulk,
    head_len: usize,
    tail_len: usize,
}

impl SplitHead {
    /// Bytes of the head.
    pub fn head_len(&self) -> usize {
        self.head_len
    }

    /// Bytes that follow the head: the message's bytes, whole.
    pub fn tail_len(&self) -> usize {
        self.tail_len
    }

    /// The message, given its bytes (exactly [`Self::tail_len`] of them).
    pub fn into_message(self, tail: Vec<u8>) -> Result<Message, DecodeError> {
        if tail.len() != self.tail_len {
            return Err(DecodeError::Malformed(format!("{} bytes where the head says {}", tail.len(), self.tail_len)));
        }
        let chunk = |(total_len, offset, hash): ChunkHead, bytes| Chunk { total_len, offset, hash, bytes };
        Ok(match self.bulk {
            Bulk::Payload(c) => Message::PayloadChunk(chunk(c, tail)),
            Bulk::State(c) => Message::StateChunk(chunk(c, tail)),
            Bulk::Aggregate(c) => Message::AggregateChunk(chunk(c, tail)),
            Bulk::Probe => Message::ProbeReply(tail),
        })
    }
}

fn malformed(e: postcard::Error) -> DecodeError {
    DecodeError::Malformed(e.to_string())
}

/// Parses a bulk message's head from the start of `bytes` (at least
/// [`MAX_SPLIT_HEAD`] bytes of the message, or all of it). `Ok(None)` for
/// messages of other kinds, which are decoded whole. Refuses, as
/// [`Message::decode`] would, a head whose message would pass its kind's
/// limit: a reader learns the size before it reserves room for the bytes.
pub fn parse_split_head(bytes: &[u8]) -> Result<Option<SplitHead>, DecodeError> {
    let kind = Message::kind_of(bytes)?;
    let rest = &bytes[2..];
    let chunk = |rest| postcard::take_from_bytes::<ChunkHead>(rest).map_err(malformed);
    let (bulk, rest) = match kind {
        MessageKind::PayloadChunk => chunk(rest).map(|(c, rest)| (Bulk::Payload(c), rest))?,
        MessageKind::StateChunk => chunk(rest).map(|(c, rest)| (Bulk::State(c), rest))?,
        MessageKind::AggregateChunk => chunk(rest).map(|(c, rest)| (Bulk::Aggregate(c), rest))?,
        MessageKind::ProbeReply => (Bulk::Probe, rest),
        _ => return Ok(None),
    };
    // postcard reads a usize as a varint of up to 10 bytes, as it reads a
    // byte string's length on 64-bit targets (the ones we build for); on a
    // 32-bit one the two would differ on padded varints of 6-10 bytes.
    let (tail_len, rest) = postcard::take_from_bytes::<usize>(rest).map_err(malformed)?;
    let head_len = bytes.len() - rest.len();
    let len = head_len.saturating_add(tail_len);
    if len > kind.max_len() {
        return Err(DecodeError::TooLarge { kind: Some(kind), len, max: kind.max_len() });
    }
    Ok(Some(SplitHead { bulk, head_len, tail_len }))
}

impl Message {
    /// The encoding as a head and a tail borrowed from the message: the
    /// bytes of a chunk or a probe reply, empty for every other kind.
    /// `[head, tail].concat() == self.encode()`.
    pub fn encode_split(&self) -> (Vec<u8>, &[u8]) {
        let emptied = |c: &Chunk| Chunk { total_len: c.total_len, offset: c.offset, hash: c.hash, bytes: Vec::new() };
        let (head_only, tail) = match self {
            Message::PayloadChunk(c) => (Message::PayloadChunk(emptied(c)), &c.bytes[..]),
            Message::StateChunk(c) => (Message::StateChunk(emptied(c)), &c.bytes[..]),
            Message::AggregateChunk(c) => (Message::AggregateChunk(emptied(c)), &c.bytes[..]),
            Message::ProbeReply(b) => (Message::ProbeReply(Vec::new()), &b[..]),
            _ => return (self.encode(), &[]),
        };
        let mut head = head_only.encode();
        // The emptied bytes' length is the last byte (a varint 0); the
        // real length goes in its place.
        head.pop();
        head = postcard::to_extend(&tail.len(), head).expect("encoding to a Vec cannot fail");
        (head, tail)
    }

    /// The length of [`Self::encode`]'s output, found without copying a
    /// bulk message's bytes (a node counts every chunk it serves).
    pub fn encoded_len(&self) -> usize {
        let (head, tail) = self.encode_split();
        head.len() + tail.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bulk(kind: u8, bytes: Vec<u8>, total_len: u64, offset: u64) -> Message {
        let c = Chunk { total_len, offset, hash: Hash32([kind; 32]), bytes };
        match kind % 4 {
            0 => Message::PayloadChunk(c),
            1 => Message::StateChunk(c),
            2 => Message::AggregateChunk(c),
            _ => Message::ProbeReply(c.bytes),
        }
    }

    /// Reads `bytes` the way the stream codec does: the head from the first
    /// bytes, then the rest as the tail; other kinds decoded whole.
    fn read_split(bytes: &[u8]) -> Result<Message, DecodeError> {
        match parse_split_head(&bytes[..bytes.len().min(MAX_SPLIT_HEAD)])? {
            None => Message::decode(bytes),
            Some(h) if bytes.len() != h.head_len() + h.tail_len() => Err(DecodeError::Malformed("length".into())),
            Some(h) => {
                let tail = bytes[h.head_len()..].to_vec();
                h.into_message(tail)
            }
        }
    }

    /// Head and tail make the whole encoding, for every bulk kind and
    /// lengths across the varint widths, up to a full chunk; the split
    /// read gives back the message.
    #[test]
    fn head_and_tail_are_the_encoding() {
        for kind in 0..4u8 {
            for len in [0, 1, 127, 128, 16_383, 16_384, 1 << 20] {
                let m = bulk(kind, vec![kind; len], u64::MAX, 1 << 40);
                let (head, tail) = m.encode_split();
                assert!(head.len() <= MAX_SPLIT_HEAD);
                assert_eq!(m.encoded_len(), m.encode().len());
                assert_eq!([head, tail.to_vec()].concat(), m.encode());
                assert_eq!(read_split(&m.encode()), Ok(m));
            }
        }
        let other = Message::Probe(7);
        assert_eq!(other.encode_split(), (other.encode(), &[][..]));
        assert_eq!(other.encoded_len(), other.encode().len());
    }

    /// A head whose message would pass its kind's limit is refused before
    /// any room is reserved for its bytes.
    #[test]
    fn an_oversized_head_is_refused() {
        let m = bulk(0, vec![1; 10], 10, 0);
        let (mut head, _) = m.encode_split();
        head.pop();
        head = postcard::to_extend(&(MessageKind::PayloadChunk.max_len()), head).unwrap();
        assert!(matches!(parse_split_head(&head), Err(DecodeError::TooLarge { .. })));
    }

    /// Every varint of a head at its longest (padded with continuation
    /// bytes, which postcard reads) still fits in [`MAX_SPLIT_HEAD`].
    #[test]
    fn a_head_of_padded_varints_fits() {
        let padded = |v: u64| {
            let mut out: Vec<u8> = (0..9).map(|i| ((v >> (7 * i)) as u8 & 0x7f) | 0x80).collect();
            out.push((v >> 63) as u8);
            out
        };
        let tail = vec![5u8; 3];
        let bytes = [
            vec![super::super::WIRE_VERSION, MessageKind::PayloadChunk as u8],
            padded(u64::MAX),
            padded(1),
            padded(32),
            vec![7; 32],
            padded(tail.len() as u64),
            tail.clone(),
        ]
        .concat();
        assert_eq!(bytes.len() - tail.len(), MAX_SPLIT_HEAD);
        let whole = Message::decode(&bytes);
        assert!(whole.is_ok(), "postcard reads padded varints: {whole:?}");
        assert_eq!(read_split(&bytes), whole);
    }

    proptest! {
        /// Any bytes read split decode to exactly what a whole decode
        /// gives: the same message (compared by encoding: a NaN in a
        /// digest's sketch is not equal to itself), or an error for both.
        #[test]
        fn split_reading_agrees_with_decode(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            prop_assert_eq!(read_split(&bytes).ok().map(|m| m.encode()), Message::decode(&bytes).ok().map(|m| m.encode()));
        }

        /// Bulk messages with their bytes changed or cut agree too.
        #[test]
        fn mangled_bulk_messages_agree(kind in 0..4u8, len in 0..300usize, cut in 0..400usize, flip in 0..400usize) {
            let mut bytes = bulk(kind, vec![9; len], len as u64, 0).encode();
            if let Some(b) = bytes.get_mut(flip) {
                *b ^= 0x81;
            }
            bytes.truncate(cut);
            prop_assert_eq!(read_split(&bytes).ok().map(|m| m.encode()), Message::decode(&bytes).ok().map(|m| m.encode()));
        }
    }
}
