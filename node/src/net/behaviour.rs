//! The libp2p behaviours a node runs.

use std::time::Duration;

use libp2p::{
    StreamProtocol, autonat, dcutr,
    gossipsub::{self, IdentTopic, MessageAuthenticity, ValidationMode},
    identify, kad, mdns, ping, relay, request_response,
    swarm::{NetworkBehaviour, behaviour::toggle::Toggle},
};
use prometheus_client::metrics::family::Family;

use super::{Config, KAD_PROTOCOL, PROTOCOL_VERSION, REQUEST_PROTOCOL, REQUEST_TIMEOUT, WireCodec};

/// Every behaviour of a ragtag node.
#[derive(NetworkBehaviour)]
pub struct NodeBehaviour {
    /// Announcements, heartbeats, receipts.
    pub gossipsub: gossipsub::Behaviour,
    /// Peer discovery.
    pub kad: kad::Behaviour<kad::store::MemoryStore>,
    /// Addresses and protocols of peers (standard config).
    pub identify: identify::Behaviour,
    /// Liveness.
    pub ping: ping::Behaviour,
    /// Payloads, state, manifests, anti-entropy.
    pub rr: request_response::Behaviour<WireCodec>,
    /// LAN discovery (opt-in).
    pub mdns: Toggle<mdns::tokio::Behaviour>,
    /// Reservations and circuits through relays.
    pub relay_client: relay::client::Behaviour,
    /// Serving as a relay (bootstrap nodes).
    pub relay: Toggle<relay::Behaviour>,
    /// Hole punching.
    pub dcutr: dcutr::Behaviour,
    /// Are we publicly reachable?
    pub autonat: autonat::Behaviour,
}

impl std::fmt::Debug for NodeBehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBehaviour").field("mdns", &self.mdns.is_enabled()).finish_non_exhaustive()
    }
}

/// Gossip message ids hash the publisher and the bytes: two holders'
/// identical "have" messages are two messages (with the bytes alone, every
/// holder after the first was refused as a duplicate), while one message
/// forwarded along several paths is still one.
fn message_id(m: &gossipsub::Message) -> gossipsub::MessageId {
    let mut h = blake3::Hasher::new();
    if let Some(p) = &m.source {
        h.update(&p.to_bytes());
    }
    h.update(&m.data);
    gossipsub::MessageId::from(h.finalize().as_bytes().to_vec())
}

/// Gossip messages queued per peer before new ones are dropped. libp2p's
/// 5,000 let a slow peer pin ~5,000 inline updates of memory per connection
/// (a 16-node soak on two cores grew to 186 MiB per process); a dropped
/// update is repaired by anti-entropy.
const SEND_QUEUE: usize = 256;

/// gossipsub's frame limit: every node of a run must use the same one.
pub(crate) const GOSSIP_MAX_TRANSMIT: usize = 64 * 1024;

/// Builds every behaviour; gossipsub's own counters (duplicates, control
/// traffic, mesh) go into `registry`, under `gossipsub_`.
pub(crate) fn build(
    key: &libp2p::identity::Keypair,
    relay_client: relay::client::Behaviour,
    cfg: &Config,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<NodeBehaviour, Box<dyn std::error::Error + Send + Sync>> {
    let peer_id = key.public().to_peer_id();
    let gs_config = gossipsub::ConfigBuilder::default()
        .validation_mode(ValidationMode::Strict)
        .validate_messages()
        .max_transmit_size(GOSSIP_MAX_TRANSMIT)
        .heartbeat_interval(Duration::from_secs(1))
        .connection_handler_queue_len(SEND_QUEUE)
        .message_id_fn(message_id)
        .build()?;
    let mut metrics_config = gossipsub::MetricsConfig::default();
    metrics_config.buckets_using_scoring_thresholds(&super::score::thresholds());
    let mut gossipsub = gossipsub::Behaviour::new(MessageAuthenticity::Signed(key.clone()), gs_config)?
        .with_metrics(registry.sub_registry_with_prefix("gossipsub"), metrics_config);
    let topic = IdentTopic::new(cfg.topic.clone());
    gossipsub.with_peer_score(super::score::params(topic.hash()), super::score::thresholds())?;
    gossipsub.subscribe(&topic)?;

    let mut kad_config = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
    kad_config.set_query_timeout(Duration::from_secs(30));
    kad_config.set_provider_record_ttl(Some(super::event_loop::PROVIDER_TTL));
    // We announce again ourselves (event_loop::PROVIDE_INTERVAL).
    kad_config.set_provider_publication_interval(None);
    let mut kad = kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), kad_config);
    // Loopback and LAN swarms never get a "confirmed external address":
    // serve Kademlia anyway so peers can find each other.
    kad.set_mode(Some(kad::Mode::Server));

    let identify = identify::Behaviour::new(
        identify::Config::new(PROTOCOL_VERSION.to_string(), key.public())
            .with_agent_version(format!("ragtag/{}", env!("CARGO_PKG_VERSION")))
            // A node behind NAT gains its relayed address only after its
            // reservation: pushed at once, peers (and the bootstrap's DHT)
            // learn it now instead of at identify's next 5-minute interval.
            .with_push_listen_addr_updates(true),
    );
    let rr_bytes = Family::default();
    registry.sub_registry_with_prefix("ragtag").register(
        "request_response_bytes",
        "Bytes of request-response messages read and written, by kind and direction",
        rr_bytes.clone(),
    );
    let rr = request_response::Behaviour::with_codec(
        WireCodec::counting(rr_bytes),
        [(StreamProtocol::new(REQUEST_PROTOCOL), request_response::ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT).with_max_concurrent_streams(256),
    );
    let mdns = if cfg.mdns { Some(mdns::tokio::Behaviour::new(mdns::Config::default(), peer_id)?) } else { None };
    let relay = cfg.relay_server.then(|| {
        // Sane limits for training traffic: circuits carry payloads until
        // hole punching (DCUtR) replaces them with direct connections.
        let limits = relay::Config {
            max_reservations: 1024,
            max_reservations_per_peer: 4,
            max_circuits: 256,
            max_circuits_per_peer: 16,
            max_circuit_duration: Duration::from_secs(30 * 60),
            max_circuit_bytes: 1 << 30,
            ..relay::Config::default()
        };
        let mut r = relay::Behaviour::new(peer_id, limits);
        r.set_status(Some(relay::Status::Enable));
        r
    });
    Ok(NodeBehaviour {
        gossipsub,
        kad,
        identify,
        ping: ping::Behaviour::new(ping::Config::new().with_interval(Duration::from_secs(15))),
        rr,
        mdns: Toggle::from(mdns),
        relay_client,
        relay: Toggle::from(relay),
        dcutr: dcutr::Behaviour::new(peer_id),
        autonat: autonat::Behaviour::new(
            peer_id,
            // Re-probe within 15 s (libp2p: 90 s) while the verdict is
            // unknown: a first probe made before any peer was connected
            // would otherwise leave a short-lived node unaware it is behind
            // NAT, so it never asks a relay for a reservation.
            autonat::Config {
                only_global_ips: false,
                boot_delay: Duration::from_secs(2),
                retry_interval: Duration::from_secs(15),
                throttle_server_period: Duration::from_secs(15),
                ..Default::default()
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use libp2p::{PeerId, gossipsub::TopicHash};

    use super::*;

    fn msg(source: Option<PeerId>, data: &[u8]) -> gossipsub::Message {
        gossipsub::Message { source, data: data.to_vec(), sequence_number: None, topic: TopicHash::from_raw("t") }
    }

    #[test]
    fn message_ids_tell_publishers_apart() {
        let (a, b) = (PeerId::random(), PeerId::random());
        assert_eq!(message_id(&msg(Some(a), b"have")), message_id(&msg(Some(a), b"have")));
        assert_ne!(message_id(&msg(Some(a), b"have")), message_id(&msg(Some(b), b"have")));
        assert_ne!(message_id(&msg(Some(a), b"have")), message_id(&msg(Some(a), b"have2")));
    }
}
