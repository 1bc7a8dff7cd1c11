//! Networking: one task owns the libp2p swarm; the rest of the node talks
//! to it through a cloneable [`Client`] (bounded command channel) and
//! receives [`Event`]s (bounded event channel), as in rust-libp2p's
//! file-sharing example.

mod behaviour;
mod codec;
mod connections;
mod event_loop;
mod lan_dials;
mod score;
mod transport;

use std::time::Duration;

pub use behaviour::{NodeBehaviour, NodeBehaviourEvent};
pub use codec::WireCodec;
pub use event_loop::{peer_of, spawn};

/// The DHT key under which the nodes of a run announce themselves as its
/// providers: a joiner who knows only the run id finds holders of the
/// manifest and the replica state through it.
pub fn run_key(run: &ragtag_protocol::ids::RunId) -> libp2p::kad::RecordKey {
    libp2p::kad::RecordKey::new(&format!("/ragtag/run/{run}"))
}

/// Whether we leave the first move to `peer` when both of us would make it
/// at once (dial each other on finding each other, offer a new hole punch
/// on the circuits both dialed): two moves at once collide, so the smaller
/// id moves first (the larger one dials a LAN peer later, if still
/// needed, and offers no punch while the peer's circuit is open).
fn yields_to(me: &PeerId, peer: &PeerId) -> bool {
    me > peer
}

/// Providers one lookup collects at most.
pub const MAX_PROVIDERS: usize = 16;

/// Whether `addr` is a QUIC address: listening on or dialing one needs the
/// QUIC transport (public swarms only).
pub fn is_quic(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, libp2p::multiaddr::Protocol::QuicV1))
}
use libp2p::{
    Multiaddr, PeerId, TransportError, gossipsub::MessageAcceptance, pnet::PreSharedKey,
    request_response::OutboundFailure,
};
use ragtag_protocol::wire::Message;
use tokio::sync::{mpsc, oneshot};

/// Commands queued for the network task at most.
pub const COMMAND_CAPACITY: usize = 1024;
/// Events queued for the node at most.
pub const EVENT_CAPACITY: usize = 4096;
/// Request-response timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections kept open while idle (request-response only connections
/// would otherwise close after 10 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// The protocol version identify advertises.
pub const PROTOCOL_VERSION: &str = "/ragtag/1.0.0";
/// The request-response protocol.
pub const REQUEST_PROTOCOL: &str = "/ragtag/req/1.0.0";
/// The Kademlia protocol of ragtag swarms.
pub const KAD_PROTOCOL: &str = "/ragtag/kad/1.0.0";

/// How the network is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Our identity.
    pub keypair: libp2p::identity::Keypair,
    /// The gossip topic (named by the run id).
    pub topic: String,
    /// Addresses to listen on.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start (full multiaddrs with /p2p/).
    pub bootstrap: Vec<Multiaddr>,
    /// Private swarm key: TCP only, wrapped in pnet.
    pub swarm_key: Option<PreSharedKey>,
    /// Peers allowed to stay connected (private swarms); empty = anyone.
    pub allow: Vec<PeerId>,
    /// Discover peers on the LAN with mDNS.
    pub mdns: bool,
    /// Add the QUIC transport (public swarms only).
    pub quic: bool,
    /// Dial addresses peers report that are not loopback (opt-in, like listening beyond loopback).
    pub dial_remote: bool,
    /// Serve as a relay (bootstrap nodes).
    pub relay_server: bool,
}

impl Config {
    /// A short-lived client on loopback with the default protocols and no
    /// optional behaviour (the doctor, fetching a manifest from peers).
    pub fn loopback_client(
        keypair: libp2p::identity::Keypair,
        topic: &str,
        bootstrap: Vec<Multiaddr>,
        swarm_key: Option<PreSharedKey>,
    ) -> Self {
        Self {
            keypair,
            topic: topic.into(),
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("valid address")],
            bootstrap,
            swarm_key,
            allow: Vec::new(),
            mdns: false,
            quic: false,
            dial_remote: false,
            relay_server: false,
        }
    }
}

/// What the network tells the node.
#[derive(Debug)]
pub enum Event {
    /// A gossip message on our topic; report its validation with [`Client::report`].
    Gossip {
        /// The peer that forwarded it.
        propagation_source: PeerId,
        /// The peer that published it (signed by gossipsub).
        author: Option<PeerId>,
        /// Its gossipsub id.
        message_id: libp2p::gossipsub::MessageId,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A request from a peer; answer with [`Client::respond`].
    Request {
        /// Who asks.
        peer: PeerId,
        /// Handle for the response.
        id: u64,
        /// The decoded request.
        message: Message,
    },
    /// Now listening on this address (with our /p2p/ appended).
    Listening(Multiaddr),
    /// A connection to a peer opened (first one).
    Connected(PeerId),
    /// The last connection to a peer closed.
    Disconnected(PeerId),
    /// A dial failed.
    DialFailed {
        /// The peer, when known.
        peer: Option<PeerId>,
        /// What went wrong.
        error: String,
    },
    /// AutoNAT's view of our reachability changed ("public", "private", "unknown").
    Reachability(String),
    /// A relay accepted our reservation.
    RelayReserved(PeerId),
    /// A hole punch (DCUtR) with a peer reached through a relay ended.
    HolePunch {
        /// The peer.
        peer: PeerId,
        /// Why no direct connection was made; `None`: one was.
        error: Option<String>,
    },
    /// A peer that is not on the allowlist was disconnected.
    NotAllowed(PeerId),
    /// A peer subscribed to our run's topic: it takes part in the run (a
    /// bootstrap node does not).
    Subscribed(PeerId),
    /// A request we received could not be decoded (size, format).
    BadRequest {
        /// Who sent it.
        peer: PeerId,
        /// Why.
        error: String,
    },
}

/// Why the network could not start or serve a command: callers log it or
/// try another peer.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The swarm (transports, behaviours) could not be built.
    #[error("building the swarm: {0}")]
    Build(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A listen address was refused.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: Multiaddr,
        /// The transport's reason.
        source: TransportError<std::io::Error>,
    },
    /// The network task has ended.
    #[error("the network task stopped")]
    Stopped,
    /// The network task ended before answering a request.
    #[error("the network task dropped the request")]
    RequestDropped,
    /// The limit on outbound requests in flight was reached.
    #[error("too many requests in flight")]
    TooManyRequests,
    /// The request failed on the way out or back.
    #[error(transparent)]
    Outbound(#[from] OutboundFailure),
}

#[derive(Debug)]
pub(crate) enum Command {
    Publish(Vec<u8>),
    Request { peer: PeerId, message: Message, reply: oneshot::Sender<Result<Message, NetError>> },
    Respond { id: u64, message: Message },
    Report { message_id: libp2p::gossipsub::MessageId, source: PeerId, acceptance: MessageAcceptance },
    Dial(Multiaddr),
    Penalize { peer: PeerId },
    ListenRelay(Multiaddr),
    Provide(libp2p::kad::RecordKey),
    FindProviders { key: libp2p::kad::RecordKey, reply: oneshot::Sender<Vec<PeerId>> },
    Info(oneshot::Sender<NetInfo>),
    Shutdown,
}

/// A snapshot of the network.
#[derive(Debug, Clone, Default)]
pub struct NetInfo {
    /// Connected peers.
    pub connected: Vec<PeerId>,
    /// Established connections, to all peers: above `connected.len()` when
    /// some peer holds more than one.
    pub connections: usize,
    /// Our listen addresses.
    pub listen: Vec<Multiaddr>,
    /// Gossipsub scores of connected peers.
    pub scores: Vec<(PeerId, f64)>,
    /// Peers in our gossip mesh.
    pub mesh: usize,
    /// Connected peers subscribed to the run's topic: nodes of the run,
    /// training or still starting.
    pub subscribed: Vec<PeerId>,
    /// How each connected peer is reached: direct, relayed or quic.
    pub kinds: Vec<(PeerId, &'static str)>,
    /// Peers with whom bulk transfers wait: reached only through a relay
    /// while a hole punch may still come, or punched with the relayed
    /// connection not yet closed (`Connections::bulk_waits`).
    pub bulk_waits: Vec<PeerId>,
}

/// A cloneable handle to the network task.
#[derive(Debug, Clone)]
pub struct Client {
    tx: mpsc::Sender<Command>,
    local: PeerId,
}

impl Client {
    /// Our PeerId.
    pub fn local_peer_id(&self) -> PeerId {
        self.local
    }

    async fn send(&self, c: Command) -> Result<(), NetError> {
        self.tx.send(c).await.map_err(|_| NetError::Stopped)
    }

    /// Gossips `data` on the run's topic.
    pub async fn publish(&self, data: Vec<u8>) -> Result<(), NetError> {
        self.send(Command::Publish(data)).await
    }

    /// Sends a request and waits for the response.
    pub async fn request(&self, peer: PeerId, message: Message) -> Result<Message, NetError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Request { peer, message, reply }).await?;
        rx.await.map_err(|_| NetError::RequestDropped)?
    }

    /// Answers request `id`.
    pub async fn respond(&self, id: u64, message: Message) -> Result<(), NetError> {
        self.send(Command::Respond { id, message }).await
    }

    /// Reports a gossip message's validation (feeds peer scoring).
    pub async fn report(
        &self,
        message_id: libp2p::gossipsub::MessageId,
        source: PeerId,
        acceptance: MessageAcceptance,
    ) {
        let _ = self.send(Command::Report { message_id, source, acceptance }).await;
    }

    /// Lowers a peer's application score (misbehaviour seen outside gossip).
    pub async fn penalize(&self, peer: PeerId) {
        let _ = self.send(Command::Penalize { peer }).await;
    }

    /// Dials an address.
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), NetError> {
        self.send(Command::Dial(addr)).await
    }

    /// Listens through a relay (reservation) at `relay` (with /p2p/).
    pub async fn listen_via_relay(&self, relay: Multiaddr) -> Result<(), NetError> {
        self.send(Command::ListenRelay(relay)).await
    }

    /// Announces in the DHT that we hold `key` (a run: see [`run_key`]),
    /// again whenever new peers arrive and every few minutes.
    pub async fn provide(&self, key: libp2p::kad::RecordKey) -> Result<(), NetError> {
        self.send(Command::Provide(key)).await
    }

    /// The peers the DHT names as providers of `key` (at most
    /// [`MAX_PROVIDERS`]), each dialed as it is found; empty when none are
    /// known. Bounded by the DHT's query timeout.
    pub async fn find_providers(&self, key: libp2p::kad::RecordKey) -> Result<Vec<PeerId>, NetError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::FindProviders { key, reply }).await?;
        rx.await.map_err(|_| NetError::RequestDropped)
    }

    /// A snapshot of the network.
    pub async fn info(&self) -> Result<NetInfo, NetError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Info(tx)).await?;
        rx.await.map_err(|_| NetError::Stopped)
    }

    /// Stops the network task.
    pub async fn shutdown(&self) {
        let _ = self.send(Command::Shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use libp2p::PeerId;

    /// A node's id (`PeerId::random` has another format, below every
    /// real id).
    pub(crate) fn node_id() -> PeerId {
        libp2p::identity::Keypair::generate_ed25519().public().to_peer_id()
    }
}
