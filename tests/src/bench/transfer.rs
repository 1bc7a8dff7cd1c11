//! Payload transfer over libp2p on loopback (the node's own payload fetch:
//! request-response in 1 MiB chunks, several in flight) against a raw TCP
//! transfer of the same bytes in the same run, against TCP carrying the same
//! encryption as noise (the floor any encrypted transport has on this CPU),
//! and against the same fetch with one chunk in flight (how nodes fetched
//! before).

use std::time::Instant;

use ragtag_node::{identity, net};
use ragtag_protocol::{
    ids::{Hash32, UpdateId},
    wire::{Chunk, Message},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Figure, median};

fn config(name: &str) -> net::Config {
    let keypair = identity::libp2p_keypair(&identity::generate().expect("randomness"));
    net::Config::loopback_client(keypair, &format!("ragtag/bench/{name}"), Vec::new(), None)
}

/// Median seconds to fetch `bytes` with the node's payload fetch, for each
/// of `in_flight` (chunk requests at once), over one connection.
async fn libp2p_transfer(bytes: std::sync::Arc<Vec<u8>>, reps: usize, in_flight: &[usize]) -> Vec<f64> {
    let mut reg = prometheus_client::registry::Registry::default();
    let (server, mut server_events, _t1) = net::spawn(config("server"), &mut reg).expect("server");
    let addr = loop {
        if let Some(net::Event::Listening(a)) = server_events.recv().await {
            break a;
        }
    };
    let hash = Hash32::of(&bytes);
    let serving = bytes.clone();
    let responder = server.clone();
    tokio::spawn(async move {
        while let Some(ev) = server_events.recv().await {
            if let net::Event::Request { id, message: Message::PayloadRequest(r), .. } = ev {
                let start = r.offset as usize;
                let end = (start + r.max_len as usize).min(serving.len());
                let chunk = Chunk {
                    total_len: serving.len() as u64,
                    offset: r.offset,
                    hash,
                    bytes: serving[start..end].to_vec(),
                };
                let _ = responder.respond(id, Message::PayloadChunk(chunk)).await;
            }
        }
    });
    let mut cfg = config("client");
    cfg.bootstrap = vec![addr];
    let (client, mut client_events, _t2) = net::spawn(cfg, &mut reg).expect("client");
    loop {
        if let Some(net::Event::Connected(_)) = client_events.recv().await {
            break;
        }
    }
    let peer = server.local_peer_id();
    let id = UpdateId { src: ragtag_protocol::NodeId([0; 32]), round: 0 };
    let mut medians = Vec::new();
    for &k in in_flight {
        let mut times = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            let got = ragtag_node::runtime::fetch_payload_pipelined(&client, peer, id, bytes.len() as u64, k)
                .await
                .expect("payload fetch");
            assert_eq!(got.len(), bytes.len());
            times.push(t.elapsed().as_secs_f64());
        }
        medians.push(median(times.into_iter()));
    }
    medians
}

async fn tcp_transfer(bytes: std::sync::Arc<Vec<u8>>, reps: usize) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = bytes.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let b = serving.clone();
            tokio::spawn(async move {
                let _ = s.write_all(&b).await;
            });
        }
    });
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut buf = Vec::with_capacity(bytes.len());
        s.read_to_end(&mut buf).await.expect("read");
        assert_eq!(buf.len(), bytes.len());
        times.push(t.elapsed().as_secs_f64());
    }
    median(times.into_iter())
}

/// Noise's largest message: 65,535 bytes, 16 of them the tag.
const NOISE_PLAINTEXT: usize = 65_535 - 16;

/// A ChaCha20-Poly1305 key of zeros and noise's nonce (a counter).
fn sealing_key() -> ring::aead::LessSafeKey {
    let key = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &[0; 32]).expect("a 32-byte key");
    ring::aead::LessSafeKey::new(key)
}

fn nonce(n: u64) -> ring::aead::Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    ring::aead::Nonce::assume_unique_for_key(b)
}

/// Median seconds to move `bytes` over TCP in noise-sized frames, each
/// sealed with ChaCha20-Poly1305 (ring's, as noise uses) by the sender and
/// opened by the receiver, both in this runtime: the encryption's share of
/// what libp2p spends, with no multiplexing or messages on top.
async fn sealed_tcp_transfer(bytes: std::sync::Arc<Vec<u8>>, reps: usize) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = bytes.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let b = serving.clone();
            tokio::spawn(async move {
                let key = sealing_key();
                let mut s = tokio::io::BufWriter::with_capacity(1 << 17, s);
                let mut frame = Vec::with_capacity(65_535);
                for (n, part) in b.chunks(NOISE_PLAINTEXT).enumerate() {
                    frame.clear();
                    frame.extend_from_slice(part);
                    key.seal_in_place_append_tag(nonce(n as u64), ring::aead::Aad::empty(), &mut frame)
                        .expect("sealing");
                    let len = u16::try_from(frame.len()).expect("a noise frame");
                    if s.write_all(&len.to_be_bytes()).await.is_err() || s.write_all(&frame).await.is_err() {
                        return;
                    }
                }
                let _ = s.flush().await;
            });
        }
    });
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut s = tokio::io::BufReader::with_capacity(1 << 17, s);
        let key = sealing_key();
        let mut out = Vec::with_capacity(bytes.len());
        let mut frame = vec![0u8; 65_535];
        let mut n = 0u64;
        while out.len() < bytes.len() {
            let len = usize::from(s.read_u16().await.expect("a frame length"));
            let f = &mut frame[..len];
            s.read_exact(f).await.expect("a frame");
            let plain = key.open_in_place(nonce(n), ring::aead::Aad::empty(), f).expect("a frame that opens");
            out.extend_from_slice(plain);
            n += 1;
        }
        assert_eq!(out, *bytes);
        times.push(t.elapsed().as_secs_f64());
    }
    median(times.into_iter())
}

/// Transfers `mib` MiB `reps` times each way.
pub fn run(mib: usize, reps: usize) -> Vec<Figure> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let bytes = std::sync::Arc::new(vec![7u8; mib << 20]);
    let tcp = rt.block_on(tcp_transfer(bytes.clone(), reps));
    let sealed = rt.block_on(sealed_tcp_transfer(bytes.clone(), reps));
    let k = ragtag_node::runtime::PAYLOAD_CHUNKS_IN_FLIGHT;
    let lp = rt.block_on(libp2p_transfer(bytes.clone(), reps, &[1, k]));
    let mb = (mib << 20) as f64 / 1e6;
    let fetch = |in_flight: usize, secs: f64| {
        Figure::new(
            "transfer",
            &format!(
                "libp2p request-response (noise + yamux), {mib} MiB in 1 MiB chunks, {in_flight} in flight{}",
                if in_flight == k { " (the node's fetch)" } else { "" }
            ),
            mb / secs,
            "MB/s",
        )
        .with_ratio(tcp / secs, "x raw TCP throughput")
    };
    vec![
        Figure::new("transfer", &format!("raw TCP, {mib} MiB on loopback (baseline)"), mb / tcp, "MB/s"),
        Figure::new(
            "transfer",
            &format!("TCP in noise-sized frames sealed and opened with ChaCha20-Poly1305 (ring), {mib} MiB"),
            mb / sealed,
            "MB/s",
        )
        .with_ratio(tcp / sealed, "x raw TCP throughput"),
        fetch(1, lp[0]),
        fetch(k, lp[1]),
        Figure::new(
            "transfer",
            &format!("the node's fetch ({k} in flight) against the sealed TCP above"),
            mb / lp[1],
            "MB/s",
        )
        .with_ratio(sealed / lp[1], "x sealed TCP throughput"),
    ]
}
