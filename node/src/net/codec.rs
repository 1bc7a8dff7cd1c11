//! The request-response codec: one ragtag wire message per stream, its
//! size limit checked while reading, decoded without panicking, its bytes
//! counted by kind.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::{StreamProtocol, request_response};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use ragtag_protocol::wire::{MAX_SPLIT_HEAD, Message, MessageKind, max_message_len, parse_split_head};

/// Which way a message went, and its kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabel {
    /// The message kind, snake_case.
    pub kind: &'static str,
    /// "in" or "out".
    pub direction: &'static str,
}

/// Our wire messages over request-response. Counts the bytes of every
/// message it reads or writes, by kind: requests and responses of every
/// kind pass here, so the counts say what of a node's transport traffic
/// is ours.
#[derive(Debug, Clone, Default)]
pub struct WireCodec {
    bytes: Family<StreamLabel, Counter>,
}

impl WireCodec {
    /// A codec whose byte counts are `bytes`.
    pub fn counting(bytes: Family<StreamLabel, Counter>) -> Self {
        Self { bytes }
    }

    fn count(&self, m: &Message, direction: &'static str, n: usize) {
        self.bytes.get_or_create(&StreamLabel { kind: m.kind().name(), direction }).inc_by(n as u64);
    }

    async fn read<T: AsyncRead + Unpin + Send>(&self, io: &mut T) -> std::io::Result<Message> {
        let (m, n) = read_message(io).await?;
        self.count(&m, "in", n);
        Ok(m)
    }

    async fn write<T: AsyncWrite + Unpin + Send>(&self, io: &mut T, m: Message) -> std::io::Result<()> {
        let n = write_message(io, &m).await?;
        self.count(&m, "out", n);
        Ok(())
    }
}

/// Reads one message. Its first bytes name its kind, which sets the limit
/// for the rest (checked while reading). A bulk message (a chunk, a probe
/// reply) is read as its head, which says how many bytes follow, then those
/// bytes straight into a buffer of exactly their size: a megabyte chunk is
/// not copied out of a message buffer into a chunk of its own.
async fn read_message<T: AsyncRead + Unpin + Send>(io: &mut T) -> std::io::Result<(Message, usize)> {
    // One byte more than is read, so that reading to the limit does not
    // grow the buffer.
    let mut first = Vec::with_capacity(MAX_SPLIT_HEAD + 1);
    io.take(MAX_SPLIT_HEAD as u64).read_to_end(&mut first).await?;
    if let Some(head) = parse_split_head(&first).map_err(std::io::Error::other)? {
        let (h, t) = (head.head_len(), head.tail_len());
        if first.len() > h + t {
            return Err(std::io::Error::other(format!("{} bytes after the message", first.len() - h - t)));
        }
        // `t` is within the kind's limit (checked with the head); one byte
        // more lets the read see the end without growing the buffer.
        let mut tail = Vec::with_capacity(t + 1);
        tail.extend_from_slice(&first[h..]);
        io.take((t - tail.len()) as u64 + 1).read_to_end(&mut tail).await?;
        let message = head.into_message(tail).map_err(std::io::Error::other)?;
        return Ok((message, h + t));
    }
    let limit = MessageKind::of_encoded(&first).map_or(max_message_len(), MessageKind::max_len) as u64;
    let mut buf = first;
    io.take((limit + 1).saturating_sub(buf.len() as u64)).read_to_end(&mut buf).await?;
    if buf.len() as u64 > limit {
        return Err(std::io::Error::other(format!("message over the {limit}-byte limit")));
    }
    Ok((Message::decode(&buf).map_err(std::io::Error::other)?, buf.len()))
}

/// Writes one message; a bulk message's bytes go from where they lie.
async fn write_message<T: AsyncWrite + Unpin + Send>(io: &mut T, m: &Message) -> std::io::Result<usize> {
    let (head, tail) = m.encode_split();
    io.write_all(&head).await?;
    io.write_all(tail).await?;
    io.close().await?;
    Ok(head.len() + tail.len())
}

impl request_response::Codec for WireCodec {
    type Protocol = StreamProtocol;
    type Request = Message;
    type Response = Message;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> std::io::Result<Message>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read(io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> std::io::Result<Message>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read(io).await
    }

    async fn write_request<T>(&mut self, _: &StreamProtocol, io: &mut T, req: Message) -> std::io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        self.write(io, req).await
    }

    async fn write_response<T>(&mut self, _: &StreamProtocol, io: &mut T, res: Message) -> std::io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        self.write(io, res).await
    }
}

#[cfg(test)]
mod tests {
    use futures::io::Cursor;
    use libp2p::request_response::Codec;
    use ragtag_protocol::{ids::RunId, wire::MessageKind};

    use super::*;

    #[test]
    fn round_trip_and_limits() {
        futures::executor::block_on(async {
            let proto = StreamProtocol::new("/t");
            let mut c = WireCodec::default();
            let m = Message::ManifestRequest(RunId::default());
            let mut out = Vec::new();
            c.write_request(&proto, &mut out, m.clone()).await.unwrap();
            let back = c.read_request(&proto, &mut Cursor::new(out)).await.unwrap();
            assert_eq!(back, m);
            let mut huge = vec![1u8, MessageKind::PayloadChunk as u8];
            huge.resize(max_message_len() + 10, 0);
            assert!(c.read_response(&proto, &mut Cursor::new(huge)).await.is_err());
            assert!(c.read_response(&proto, &mut Cursor::new(vec![7u8; 40])).await.is_err());
            assert!(c.read_response(&proto, &mut Cursor::new(Vec::new())).await.is_err(), "an empty stream");
        });
    }

    /// Every message read or written is counted, by kind and direction,
    /// with its encoded length; a message refused while reading is not.
    #[test]
    fn bytes_are_counted_by_kind_and_direction() {
        futures::executor::block_on(async {
            let proto = StreamProtocol::new("/t");
            let bytes = Family::default();
            let mut c = WireCodec::counting(bytes.clone());
            let m = Message::ManifestRequest(RunId::default());
            let len = m.encode().len() as u64;
            let mut out = Vec::new();
            c.write_request(&proto, &mut out, m.clone()).await.unwrap();
            c.read_response(&proto, &mut Cursor::new(out)).await.unwrap();
            let count = |direction| bytes.get_or_create(&StreamLabel { kind: "manifest_request", direction }).get();
            assert_eq!((count("out"), count("in")), (len, len));
            assert!(c.read_request(&proto, &mut Cursor::new(vec![7u8; 40])).await.is_err());
            assert_eq!(count("in"), len, "a refused message counts nothing");
        });
    }

    /// The kind's own limit applies while reading: a small kind padded far
    /// past it is cut off at its limit, not at the largest kind's.
    #[test]
    fn a_kind_is_held_to_its_own_limit_and_a_full_chunk_reads_whole() {
        futures::executor::block_on(async {
            let proto = StreamProtocol::new("/t");
            let mut c = WireCodec::default();
            let mut have = vec![1u8, MessageKind::Have as u8];
            have.resize(MessageKind::Have.max_len() + 1, 0);
            let err = c.read_request(&proto, &mut Cursor::new(have)).await.unwrap_err();
            assert!(err.to_string().contains(&format!("{}-byte limit", MessageKind::Have.max_len())), "{err}");
            let chunk = Message::PayloadChunk(ragtag_protocol::wire::Chunk {
                total_len: 5 << 20,
                offset: 1 << 20,
                hash: Default::default(),
                bytes: vec![3; ragtag_protocol::wire::MAX_CHUNK_BYTES],
            });
            let mut out = Vec::new();
            c.write_response(&proto, &mut out, chunk.clone()).await.unwrap();
            assert_eq!(c.read_response(&proto, &mut Cursor::new(out)).await.unwrap(), chunk);
        });
    }

    /// A chunk read by its head: its bytes cut short, or followed by more,
    /// refuse the message as a whole decode would; whole, it reads back.
    #[test]
    fn a_bulk_message_cut_short_or_run_long_is_refused() {
        futures::executor::block_on(async {
            let proto = StreamProtocol::new("/t");
            let mut c = WireCodec::default();
            for len in [0, 10, 100_000] {
                let chunk = Message::StateChunk(ragtag_protocol::wire::Chunk {
                    total_len: 1 << 30,
                    offset: 7,
                    hash: Default::default(),
                    bytes: vec![5; len],
                });
                let whole = chunk.encode();
                assert_eq!(c.read_response(&proto, &mut Cursor::new(whole.clone())).await.unwrap(), chunk);
                let short = whole[..whole.len() - 1].to_vec();
                assert!(c.read_response(&proto, &mut Cursor::new(short)).await.is_err(), "cut short, {len} bytes");
                let long = [whole, vec![0]].concat();
                assert!(c.read_response(&proto, &mut Cursor::new(long)).await.is_err(), "run long, {len} bytes");
            }
        });
    }
}
