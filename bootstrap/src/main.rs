//! `ragtag-bootstrap`: a long-running rendezvous node. It serves Kademlia,
//! identify, ping, AutoNAT and a relay, so volunteers can find each other
//! and reach each other from behind NAT. It never trains, but it finds a
//! run's manifest among its peers for a joiner that knows only the run id.

mod run_lookup;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex, RwLock},
};

use anyhow::{Context, Result};
use clap::Parser;
use libp2p::{Multiaddr, PeerId};
use ragtag_node::{
    identity,
    metrics::{Endpoint, serve},
    net,
    status::Status,
    swarm_key,
};
use ragtag_protocol::wire::{ErrorReply, MAX_CHUNK_BYTES, Message};

/// A ragtag rendezvous and relay node.
#[derive(Parser, Debug)]
#[command(name = "ragtag-bootstrap", version, about)]
struct Args {
    /// Addresses to listen on (default: 127.0.0.1, a random port).
    #[arg(long)]
    listen: Vec<String>,
    /// Identity file (created on first start).
    #[arg(long, default_value = "bootstrap.key")]
    key: PathBuf,
    /// Pre-shared key of a private swarm (TCP only).
    #[arg(long)]
    swarm_key: Option<PathBuf>,
    /// Serve Prometheus metrics and /status here.
    #[arg(long)]
    metrics: Option<SocketAddr>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,libp2p_kad=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let key = identity::load_or_create(&args.key)?;
    let keypair = identity::libp2p_keypair(&key);
    let peer_id = PeerId::from(keypair.public());
    let swarm_key = args.swarm_key.as_deref().map(swarm_key::load).transpose()?;
    let mut listen: Vec<Multiaddr> = args
        .listen
        .iter()
        .map(|s| s.parse().with_context(|| format!("invalid --listen {s:?}")))
        .collect::<Result<_>>()?;
    if listen.is_empty() {
        listen.push("/ip4/127.0.0.1/tcp/0".parse()?);
    }
    let beyond_loopback = listen.iter().any(|a| !a.to_string().starts_with("/ip4/127."));
    if swarm_key.is_some() && listen.iter().any(net::is_quic) {
        anyhow::bail!("a private swarm (--swarm-key) runs over TCP only: QUIC cannot carry its key");
    }
    // QUIC when a listen address asks for it.
    let quic = listen.iter().any(net::is_quic);
    let cfg = net::Config {
        keypair,
        topic: "ragtag/bootstrap".into(),
        listen,
        bootstrap: Vec::new(),
        swarm_key,
        allow: Vec::new(),
        mdns: false,
        quic,
        dial_remote: beyond_loopback,
        relay_server: true,
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let (client, mut events, task) = net::spawn(cfg, &mut registry).map_err(anyhow::Error::msg)?;
    let status = Arc::new(RwLock::new(Status {
        version: env!("CARGO_PKG_VERSION").into(),
        peer_id: peer_id.to_string(),
        node_id: key.node_id().to_hex(),
        state: "bootstrap".into(),
        ..Status::default()
    }));
    if let Some(addr) = args.metrics {
        let bound = serve(addr, Endpoint { registry: Arc::new(Mutex::new(registry)), status: status.clone() }).await?;
        tracing::info!("metrics on http://{bound}/metrics");
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut manifests = run_lookup::ManifestCache::default();
    let (found_tx, mut found_rx) = tokio::sync::mpsc::channel(16);
    let started = std::time::Instant::now();
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { break };
                match ev {
                    net::Event::Listening(a) => {
                        println!("{a}");
                        status.write().expect("status lock").listen_addrs.push(a.to_string());
                    }
                    net::Event::Connected(_) | net::Event::Disconnected(_) => {
                        let n = client.info().await.map(|i| i.connected.len()).unwrap_or(0);
                        let mut s = status.write().expect("status lock");
                        s.connected_peers = n;
                        s.uptime_s = started.elapsed().as_secs_f64();
                    }
                    net::Event::Request { id, message: Message::ManifestRequest(run), peer } => {
                        if let Some(bytes) = manifests.get(run) {
                            let _ = client.respond(id, Message::Manifest(bytes)).await;
                            continue;
                        }
                        // Asking peers takes a round trip: not on this loop.
                        let (client, found_tx) = (client.clone(), found_tx.clone());
                        tokio::spawn(async move {
                            let peers: Vec<PeerId> = client.info().await.map(|i| i.connected).unwrap_or_default();
                            let others: Vec<PeerId> = peers.into_iter().filter(|p| *p != peer).collect();
                            let reply = match ragtag_node::run_lookup::manifest(&client, run, &others).await {
                                Some(m) => {
                                    let bytes = m.canonical_bytes();
                                    let _ = found_tx.send((run, bytes.clone())).await;
                                    Message::Manifest(bytes)
                                }
                                None => Message::Error(ErrorReply::NotFound),
                            };
                            let _ = client.respond(id, reply).await;
                        });
                    }
                    net::Event::Request { id, message, .. } => {
                        let reply = match message {
                            Message::Probe(n) => Message::ProbeReply(vec![0; (n as usize).min(MAX_CHUNK_BYTES)]),
                            _ => Message::Error(ErrorReply::NotFound),
                        };
                        let _ = client.respond(id, reply).await;
                    }
                    net::Event::Reachability(r) => status.write().expect("status lock").reachability = r,
                    _ => {}
                }
            }
            Some((run, bytes)) = found_rx.recv() => {
                tracing::info!("found the manifest of run {run} at its holders");
                manifests.insert(run, bytes);
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    tracing::info!("shutting down");
    client.shutdown().await;
    let _ = task.await;
    Ok(())
}
