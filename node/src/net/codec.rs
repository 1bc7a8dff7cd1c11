//! The request-response codec: one ragtag wire message per stream, its
//! size limit checked while reading, decoded without panicking.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::{StreamProtocol, request_response};
use ragtag_protocol::wire::{Message, max_message_len};

/// Our wire messages over request-response.
#[derive(Debug, Clone, Default)]
pub struct WireCodec;

async fn read_message<T: AsyncRead + Unpin + Send>(io: &mut T) -> std::io::Result<Message> {
    let limit = max_message_len() as u64;
    let mut buf = Vec::new();
    io.take(limit + 1).read_to_end(&mut buf).await?;
    if buf.len() as u64 > limit {
        return Err(std::io::Error::other(format!("message over the {limit}-byte limit")));
    }
    Message::decode(&buf).map_err(std::io::Error::other)
}

async fn write_message<T: AsyncWrite + Unpin + Send>(io: &mut T, m: &Message) -> std::io::Result<()> {
    io.write_all(&m.encode()).await?;
    io.close().await
}

impl request_response::Codec for WireCodec {
    type Protocol = StreamProtocol;
    type Request = Message;
    type Response = Message;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> std::io::Result<Message>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_message(io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> std::io::Result<Message>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_message(io).await
    }

    async fn write_request<T>(&mut self, _: &StreamProtocol, io: &mut T, req: Message) -> std::io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_message(io, &req).await
    }

    async fn write_response<T>(&mut self, _: &StreamProtocol, io: &mut T, res: Message) -> std::io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_message(io, &res).await
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
            let mut c = WireCodec;
            let m = Message::ManifestRequest(RunId::default());
            let mut out = Vec::new();
            c.write_request(&proto, &mut out, m.clone()).await.unwrap();
            let back = c.read_request(&proto, &mut Cursor::new(out)).await.unwrap();
            assert_eq!(back, m);
            let mut huge = vec![1u8, MessageKind::PayloadChunk as u8];
            huge.resize(max_message_len() + 10, 0);
            assert!(c.read_response(&proto, &mut Cursor::new(huge)).await.is_err());
            assert!(c.read_response(&proto, &mut Cursor::new(vec![7u8; 40])).await.is_err());
        });
    }
}
