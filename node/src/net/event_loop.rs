//! The network task: owns the swarm, serves commands, forwards events.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use futures::StreamExt;
use libp2p::{
    Multiaddr, PeerId, Swarm, autonat,
    core::{ConnectedPoint, transport::PortUse},
    gossipsub::{self, IdentTopic},
    identify, kad, mdns,
    metrics::{Metrics, Recorder},
    multiaddr::Protocol,
    relay, request_response,
    swarm::SwarmEvent,
};
use ragtag_protocol::wire::{ErrorReply, Message};
use tokio::sync::{mpsc, oneshot};

use super::{
    COMMAND_CAPACITY, Client, Command, Config, EVENT_CAPACITY, Event, NetError, NetInfo, NodeBehaviour,
    NodeBehaviourEvent, connections::Connections, lan_dials::LanDials,
};

/// Inbound requests awaiting our response at most.
const MAX_PENDING_RESPONSES: usize = 1024;
/// Outbound requests in flight at most.
const MAX_INFLIGHT_REQUESTS: usize = 1024;
/// Peers we dial on our own (discovery) at most.
const MAX_DIALED_PEERS: usize = 64;
/// Provider lookups in flight at most.
const MAX_PROVIDER_QUERIES: usize = 16;
/// How often we announce ourselves again as a provider (records live
/// [`PROVIDER_TTL`], so a node that left drops out of lookups soon).
const PROVIDE_INTERVAL: Duration = Duration::from_secs(120);
/// How long others keep our provider record.
pub(crate) const PROVIDER_TTL: Duration = Duration::from_secs(600);

/// Least time between two announcements prompted by new peers.
const REANNOUNCE_MIN_GAP: Duration = Duration::from_secs(5);
/// How long a provider lookup that holds only our own store's records
/// waits for a peer's answer (below `run_lookup::HOLDERS_TIMEOUT`).
const PROVIDERS_STALL: Duration = Duration::from_secs(6);
/// How long after a new relay reservation we look up peers again. Peers
/// behind NATs are dialed through their circuits, which the DHT knows only
/// once their reservations are made; theirs are made when ours is (AutoNAT
/// decides for all of us at about the same time), so a lookup a moment
/// later finds them, instead of the next periodic one up to 30 s later.
const LOOKUP_AFTER_RESERVATION: Duration = Duration::from_secs(2);

/// Our provider announcement: the key, when it last reached a peer, and
/// when we last tried.
#[derive(Debug)]
struct Providing {
    key: kad::RecordKey,
    published: Option<Instant>,
    attempted: Option<Instant>,
    in_flight: bool,
}

/// A provider lookup under way.
struct ProviderQuery {
    reply: oneshot::Sender<Vec<PeerId>>,
    found: Vec<PeerId>,
    started: Instant,
}

/// Starts the network task.
pub fn spawn(
    cfg: Config,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<(Client, mpsc::Receiver<Event>, tokio::task::JoinHandle<()>), NetError> {
    let mut swarm = super::transport::build_swarm(&cfg, registry).map_err(NetError::Build)?;
    let metrics = Metrics::new(registry);
    for addr in &cfg.listen {
        swarm.listen_on(addr.clone()).map_err(|source| NetError::Listen { addr: addr.clone(), source })?;
    }
    for addr in &cfg.bootstrap {
        if let Some(peer) = peer_of(addr) {
            swarm.behaviour_mut().kad.add_address(&peer, addr.clone());
        }
        if let Err(e) = swarm.dial(addr.clone()) {
            tracing::warn!("cannot dial bootstrap {addr}: {e}");
        }
    }
    let local = *swarm.local_peer_id();
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_CAPACITY);
    let (ev_tx, ev_rx) = mpsc::channel(EVENT_CAPACITY);
    let topic = IdentTopic::new(cfg.topic.clone());
    let task = EventLoop {
        swarm,
        cfg,
        topic,
        metrics,
        commands: cmd_rx,
        events: ev_tx,
        inbound: HashMap::new(),
        outbound: HashMap::new(),
        next_inbound: 0,
        penalties: BTreeMap::new(),
        listen: Vec::new(),
        connections: Connections::new(local),
        lan_dials: LanDials::new(local),
        providing: None,
        provider_queries: HashMap::new(),
        lookup_soon: false,
    };
    let handle = tokio::spawn(task.run());
    Ok((Client { tx: cmd_tx, local }, ev_rx, handle))
}

/// The /p2p/ peer id at the end of an address.
pub fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| if let Protocol::P2p(id) = p { Some(id) } else { None })
}

fn is_loopback(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| match p {
        Protocol::Ip4(ip) => ip.is_loopback(),
        Protocol::Ip6(ip) => ip.is_loopback(),
        _ => false,
    })
}

/// Is this our AutoNAT server's dial-back to a peer we are already
/// connected to? Only that dial asks for a new port (to prove the peer is
/// reachable from a fresh one); every other dial of ours reuses the port.
fn is_probe_dial_back(endpoint: &ConnectedPoint, num_established: u32) -> bool {
    num_established > 1 && matches!(endpoint, ConnectedPoint::Dialer { port_use: PortUse::New, .. })
}

struct EventLoop {
    swarm: Swarm<NodeBehaviour>,
    cfg: Config,
    topic: IdentTopic,
    metrics: Metrics,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    inbound: HashMap<u64, request_response::ResponseChannel<Message>>,
    outbound: HashMap<request_response::OutboundRequestId, oneshot::Sender<Result<Message, NetError>>>,
    next_inbound: u64,
    penalties: BTreeMap<PeerId, u32>,
    listen: Vec<Multiaddr>,
    /// How each peer is reached; relayed connections to retire, hole
    /// punches to offer again.
    connections: Connections,
    /// Dials of peers mDNS found that we hold back for them to dial first.
    lan_dials: LanDials,
    providing: Option<Providing>,
    /// Provider lookups: who waits for them and what they found so far.
    provider_queries: HashMap<kad::QueryId, ProviderQuery>,
    /// A relay reservation was just made: look up peers again soon.
    lookup_soon: bool,
}

impl EventLoop {
    async fn run(mut self) {
        let mut bootstrap = tokio::time::interval(std::time::Duration::from_secs(30));
        let mut housekeeping = tokio::time::interval(std::time::Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = housekeeping.tick() => self.housekeeping(),
                ev = self.swarm.select_next_some() => self.on_swarm_event(ev),
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Shutdown) | None => break,
                    Some(c) => self.on_command(c),
                },
                _ = bootstrap.tick() => {
                    if self.swarm.connected_peers().next().is_some() {
                        let _ = self.swarm.behaviour_mut().kad.bootstrap();
                        self.announce(false);
                    }
                }
            }
            if std::mem::take(&mut self.lookup_soon) {
                bootstrap.reset_after(LOOKUP_AFTER_RESERVATION);
            }
        }
    }

    /// Closes relayed connections a direct one made redundant, dials a
    /// relayed-only peer's circuit again so it tries another hole punch,
    /// and dials the LAN peers whose dial we held back if they did not dial
    /// us meanwhile.
    fn housekeeping(&mut self) {
        let now = Instant::now();
        // Holders our own store named, while no peer has answered: the
        // caller's wait ends sooner than kad's query timeout.
        let stalled: Vec<kad::QueryId> = self
            .provider_queries
            .iter()
            .filter(|(_, q)| !q.found.is_empty() && now.duration_since(q.started) >= PROVIDERS_STALL)
            .map(|(id, _)| *id)
            .collect();
        for id in stalled {
            self.answer_providers(id, false);
        }
        for peer in self.lan_dials.due(now) {
            self.dial_lan_peer(peer);
        }
        let due = self.connections.due(now);
        for id in due.close {
            self.swarm.close_connection(id);
        }
        for (peer, circuit, n) in due.redial {
            tracing::info!("{peer} is reached only through a relay: new hole punch, attempt {n}");
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                .addresses(vec![circuit])
                .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                tracing::debug!("dialing {peer}'s circuit again: {e}");
            }
        }
    }

    /// Publishes our provider record when due (`now`: new peers arrived,
    /// so the record may belong on them).
    fn announce(&mut self, now: bool) {
        let Some(p) = self.providing.as_mut() else { return };
        let due = p.published.is_none_or(|t| t.elapsed() >= PROVIDE_INTERVAL);
        // New peers arrive in bursts: at most one extra announcement per
        // few seconds.
        let recent = p.attempted.is_some_and(|t| t.elapsed() < REANNOUNCE_MIN_GAP);
        if p.in_flight || !(due || (now && !recent)) {
            return;
        }
        p.attempted = Some(Instant::now());
        match self.swarm.behaviour_mut().kad.start_providing(p.key.clone()) {
            Ok(_) => p.in_flight = true,
            Err(e) => tracing::warn!("cannot announce the run in the DHT: {e}"),
        }
    }

    /// A provider lookup found `found`: dial them (kad knows their
    /// addresses while the query runs) and answer with the first peer's
    /// list (every peer that keeps the record keeps all of its providers),
    /// or with none once the lookup is over. `asked` is false for kad's
    /// first step from our own store, which holds only the records peers
    /// sent us: a node a holder announced itself to was told of that one
    /// holder and, answered from it, named one holder of a run that
    /// several held; that list is kept and the first peer's added to it.
    fn on_providers(&mut self, id: kad::QueryId, found: Vec<PeerId>, asked: bool, last: bool) {
        let me = *self.swarm.local_peer_id();
        let allowed = |p: &PeerId| self.cfg.allow.is_empty() || self.cfg.allow.contains(p);
        let found: Vec<PeerId> = found.into_iter().filter(|p| *p != me && allowed(p)).collect();
        let mut dial = Vec::new();
        let Some(ProviderQuery { found: so_far, .. }) = self.provider_queries.get_mut(&id) else { return };
        for p in found {
            if !so_far.contains(&p) && so_far.len() < super::MAX_PROVIDERS {
                so_far.push(p);
                dial.push(p);
            }
        }
        let answer = last || (asked && !so_far.is_empty());
        for p in dial {
            if !self.swarm.is_connected(&p)
                && !self.lan_dials.is_held(&p)
                && self.swarm.connected_peers().count() < MAX_DIALED_PEERS
            {
                let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(p)
                    .condition(libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing)
                    .build();
                // An error here (no address known, say) comes with no
                // connection event: start-up must still hear of it.
                match self.swarm.dial(opts) {
                    Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {}
                    Err(e) => self.emit(Event::DialFailed { peer: Some(p), error: e.to_string() }),
                }
            }
        }
        if answer {
            self.answer_providers(id, last);
        }
    }

    /// Ends a provider lookup and replies with the holders it found.
    fn answer_providers(&mut self, id: kad::QueryId, over: bool) {
        if !over && let Some(mut q) = self.swarm.behaviour_mut().kad.query_mut(&id) {
            q.finish();
        }
        if let Some(q) = self.provider_queries.remove(&id) {
            let _ = q.reply.send(q.found);
        }
    }

    fn on_kad(&mut self, e: kad::Event) {
        match e {
            kad::Event::OutboundQueryProgressed { id, result, step, stats } => match result {
                kad::QueryResult::GetProviders(Ok(kad::GetProvidersOk::FoundProviders { providers, .. })) => {
                    let asked = stats.num_requests() > 0;
                    self.on_providers(id, providers.into_iter().collect(), asked, step.last);
                }
                kad::QueryResult::GetProviders(_) => self.on_providers(id, Vec::new(), true, true),
                kad::QueryResult::StartProviding(r) => {
                    if let Some(p) = self.providing.as_mut() {
                        p.in_flight = false;
                        match r {
                            Ok(_) => p.published = Some(Instant::now()),
                            Err(e) => tracing::debug!("announcing the run in the DHT: {e}"),
                        }
                    }
                }
                _ => {}
            },
            kad::Event::RoutingUpdated { peer, addresses, is_new_peer, .. } => {
                // Announced here, not when the connection comes up: kad
                // adds a peer to its table only once it has confirmed the
                // protocol, so an announcement then missed the newcomer.
                if is_new_peer {
                    self.announce(true);
                }
                if !self.swarm.is_connected(&peer)
                    && !self.lan_dials.is_held(&peer)
                    && self.swarm.connected_peers().count() < MAX_DIALED_PEERS
                    && (self.cfg.allow.is_empty() || self.cfg.allow.contains(&peer))
                {
                    let addrs: Vec<Multiaddr> = addresses.iter().filter(|a| self.may_dial(a)).cloned().collect();
                    if !addrs.is_empty() {
                        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer).addresses(addrs).build();
                        let _ = self.swarm.dial(opts);
                    }
                }
            }
            _ => {}
        }
    }

    /// Dials a peer mDNS found, at the addresses mDNS and the DHT know,
    /// unless a connection to it is up or being dialed.
    fn dial_lan_peer(&mut self, peer: PeerId) {
        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
            .condition(libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing)
            .build();
        if let Err(e) = self.swarm.dial(opts) {
            tracing::debug!("dialing {peer} on the LAN: {e}");
        }
    }

    fn emit(&self, ev: Event) {
        if let Err(e) = self.events.try_send(ev) {
            tracing::warn!("node event queue full, dropping an event: {e}");
        }
    }

    /// Addresses peers report are dialed only on loopback, unless the user
    /// opted into real networks (`--listen` beyond loopback, `--mdns`).
    fn may_dial(&self, addr: &Multiaddr) -> bool {
        self.cfg.dial_remote || is_loopback(addr)
    }

    fn on_command(&mut self, c: Command) {
        let b = self.swarm.behaviour_mut();
        match c {
            Command::Publish(data) => {
                if let Err(e) = b.gossipsub.publish(self.topic.clone(), data) {
                    // Alone in the swarm is normal at start; anything else is worth a line.
                    if !matches!(e, gossipsub::PublishError::NoPeersSubscribedToTopic) {
                        tracing::debug!("gossip publish: {e}");
                    }
                }
            }
            Command::Request { peer, message, reply } => {
                if self.outbound.len() >= MAX_INFLIGHT_REQUESTS {
                    let _ = reply.send(Err(NetError::TooManyRequests));
                    return;
                }
                let id = b.rr.send_request(&peer, message);
                self.outbound.insert(id, reply);
            }
            Command::Respond { id, message } => {
                if let Some(ch) = self.inbound.remove(&id) {
                    let _ = b.rr.send_response(ch, message);
                }
            }
            Command::Report { message_id, source, acceptance } => {
                b.gossipsub.report_message_validation_result(&message_id, &source, acceptance);
            }
            Command::Penalize { peer } => {
                let n = self.penalties.entry(peer).or_insert(0);
                *n += 1;
                b.gossipsub.set_application_score(&peer, -10.0 * *n as f64);
            }
            Command::Dial(addr) => {
                if let Err(e) = self.swarm.dial(addr.clone()) {
                    self.emit(Event::DialFailed { peer: peer_of(&addr), error: e.to_string() });
                }
            }
            Command::ListenRelay(addr) => {
                if let Err(e) = self.swarm.listen_on(addr.clone().with(Protocol::P2pCircuit)) {
                    tracing::warn!("cannot listen via relay {addr}: {e}");
                }
            }
            Command::Provide(key) => {
                self.providing = Some(Providing { key, published: None, attempted: None, in_flight: false });
                if self.swarm.connected_peers().next().is_some() {
                    self.announce(true);
                }
            }
            Command::FindProviders { key, reply } => {
                if self.provider_queries.len() >= MAX_PROVIDER_QUERIES {
                    let _ = reply.send(Vec::new());
                    return;
                }
                let id = self.swarm.behaviour_mut().kad.get_providers(key);
                self.provider_queries.insert(id, ProviderQuery { reply, found: Vec::new(), started: Instant::now() });
            }
            Command::Info(reply) => {
                let connected: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                let gs = &self.swarm.behaviour().gossipsub;
                let scores = connected.iter().filter_map(|p| gs.peer_score(p).map(|s| (*p, s))).collect();
                let mesh = gs.mesh_peers(&self.topic.hash()).count();
                let topic = self.topic.hash();
                let subscribed =
                    gs.all_peers().filter(|(_, topics)| topics.contains(&&topic)).map(|(p, _)| *p).collect();
                let connections = self.swarm.network_info().connection_counters().num_established() as usize;
                let kinds = connected.iter().filter_map(|p| self.connections.kind(p).map(|k| (*p, k))).collect();
                let now = std::time::Instant::now();
                let bulk_waits = connected.iter().filter(|p| self.connections.bulk_waits(p, now)).copied().collect();
                let listen = self.listen.clone();
                let _ =
                    reply.send(NetInfo { connected, connections, listen, scores, mesh, subscribed, kinds, bulk_waits });
            }
            Command::Shutdown => {}
        }
    }

    fn on_swarm_event(&mut self, ev: SwarmEvent<NodeBehaviourEvent>) {
        self.metrics.record(&ev);
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                // A relay hands its external addresses to every reservation
                // (none: the client rejects it). An address the operator
                // chose to listen on is one they expect peers to dial.
                if self.cfg.relay_server
                    && !address.iter().any(|p| matches!(p, Protocol::Ip4(ip) if ip.is_unspecified()))
                {
                    self.swarm.add_external_address(address.clone());
                }
                let me = *self.swarm.local_peer_id();
                // A relayed address already ends with our id.
                let full = if address.iter().last() == Some(Protocol::P2p(me)) {
                    address
                } else {
                    address.with(Protocol::P2p(me))
                };
                if self.listen.contains(&full) {
                    return;
                }
                self.listen.push(full.clone());
                self.emit(Event::Listening(full));
            }
            SwarmEvent::ConnectionEstablished { peer_id, connection_id, num_established, endpoint, .. } => {
                if !self.cfg.allow.is_empty() && !self.cfg.allow.contains(&peer_id) {
                    let _ = self.swarm.disconnect_peer_id(peer_id);
                    self.emit(Event::NotAllowed(peer_id));
                    return;
                }
                if is_probe_dial_back(&endpoint, num_established.get()) {
                    // AutoNAT has its answer the moment this connection is up
                    // (the reply travels on the peer's own connection). Left
                    // open, gossipsub's mesh keeps it alive for good: each
                    // probe added a connection, and its buffers, for the
                    // process's lifetime.
                    self.swarm.close_connection(connection_id);
                    return;
                }
                self.connections.established(peer_id, connection_id, &endpoint, Instant::now());
                if num_established.get() == 1 {
                    // Ask the newcomer (and everyone) for peers right away,
                    // rather than at the next periodic bootstrap.
                    let _ = self.swarm.behaviour_mut().kad.bootstrap();
                    self.emit(Event::Connected(peer_id));
                }
            }
            SwarmEvent::ConnectionClosed { peer_id, connection_id, num_established, .. } => {
                self.connections.closed(peer_id, connection_id, Instant::now());
                if num_established == 0 {
                    self.emit(Event::Disconnected(peer_id));
                }
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                let mut error = error.to_string();
                if let Some(psk) = self.cfg.swarm_key {
                    error = format!(
                        "{error} (this is a private swarm: a peer with another swarm key cannot complete the handshake; our key's fingerprint is {})",
                        psk.fingerprint()
                    );
                }
                self.emit(Event::DialFailed { peer: peer_id, error });
            }
            SwarmEvent::IncomingConnectionError { error, send_back_addr, .. } => {
                tracing::debug!("incoming connection from {send_back_addr} failed: {error}");
            }
            SwarmEvent::Behaviour(b) => self.on_behaviour_event(b),
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, ev: NodeBehaviourEvent) {
        match ev {
            NodeBehaviourEvent::Gossipsub(e) => {
                self.metrics.record(&e);
                if let gossipsub::Event::Subscribed { peer_id, topic } = &e
                    && *topic == self.topic.hash()
                {
                    self.emit(Event::Subscribed(*peer_id));
                }
                if let gossipsub::Event::Message { propagation_source, message_id, message } = e {
                    if self.events.capacity() == 0 {
                        self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                            &message_id,
                            &propagation_source,
                            gossipsub::MessageAcceptance::Ignore,
                        );
                        return;
                    }
                    self.emit(Event::Gossip {
                        propagation_source,
                        message_id,
                        author: message.source,
                        data: message.data,
                    });
                }
            }
            NodeBehaviourEvent::Rr(e) => self.on_request_response(e),
            NodeBehaviourEvent::Identify(e) => {
                self.metrics.record(&e);
                if let identify::Event::Received { peer_id, info, .. } = e {
                    for addr in info.listen_addrs {
                        if self.may_dial(&addr) {
                            self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                        }
                    }
                }
            }
            NodeBehaviourEvent::Kad(e) => {
                self.metrics.record(&e);
                self.on_kad(e);
            }
            NodeBehaviourEvent::Mdns(mdns::Event::Discovered(found)) => {
                let now = Instant::now();
                for (peer, addr) in found {
                    // Held dials too: the DHT then knows where to dial it.
                    self.swarm.behaviour_mut().kad.add_address(&peer, addr);
                    if self.lan_dials.found(peer, now) {
                        self.dial_lan_peer(peer);
                    }
                }
            }
            NodeBehaviourEvent::Ping(e) => self.metrics.record(&e),
            NodeBehaviourEvent::Dcutr(e) => {
                // The direct connection's arrival retires the relayed ones
                // (see `Connections`).
                self.metrics.record(&e);
                self.emit(Event::HolePunch {
                    peer: e.remote_peer_id,
                    error: e.result.err().map(|err| err.to_string()),
                });
            }
            NodeBehaviourEvent::Relay(e) => self.metrics.record(&e),
            NodeBehaviourEvent::RelayClient(relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                renewal,
                ..
            }) => {
                self.lookup_soon |= !renewal;
                self.emit(Event::RelayReserved(relay_peer_id));
            }
            NodeBehaviourEvent::Autonat(autonat::Event::StatusChanged { new, .. }) => {
                let s = match new {
                    autonat::NatStatus::Public(_) => "public",
                    autonat::NatStatus::Private => "private",
                    autonat::NatStatus::Unknown => "unknown",
                };
                self.emit(Event::Reachability(s.into()));
            }
            _ => {}
        }
    }

    fn on_request_response(&mut self, e: request_response::Event<Message, Message>) {
        match e {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request { request, channel, .. } => {
                    if self.inbound.len() >= MAX_PENDING_RESPONSES || self.events.capacity() == 0 {
                        let _ = self
                            .swarm
                            .behaviour_mut()
                            .rr
                            .send_response(channel, Message::Error(ErrorReply::BadRequest));
                        return;
                    }
                    self.next_inbound += 1;
                    let id = self.next_inbound;
                    self.inbound.insert(id, channel);
                    self.emit(Event::Request { peer, id, message: request });
                }
                request_response::Message::Response { request_id, response } => {
                    if let Some(reply) = self.outbound.remove(&request_id) {
                        let _ = reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure { request_id, error, .. } => {
                if let Some(reply) = self.outbound.remove(&request_id) {
                    let _ = reply.send(Err(error.into()));
                }
            }
            request_response::Event::InboundFailure { peer, error, .. } => {
                if let request_response::InboundFailure::Io(e) = error {
                    self.emit(Event::BadRequest { peer, error: e.to_string() });
                }
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use libp2p::core::Endpoint;

    use super::*;

    #[test]
    fn addresses_are_classified() {
        let a: Multiaddr =
            "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA".parse().unwrap();
        assert!(is_loopback(&a));
        assert!(peer_of(&a).is_some());
        let b: Multiaddr = "/ip4/10.1.2.3/tcp/1".parse().unwrap();
        assert!(!is_loopback(&b));
        assert!(peer_of(&b).is_none());
    }

    #[test]
    fn only_a_second_connection_on_a_new_port_is_a_probe_dial_back() {
        let address: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().unwrap();
        let dialer =
            |port_use| ConnectedPoint::Dialer { address: address.clone(), role_override: Endpoint::Dialer, port_use };
        assert!(is_probe_dial_back(&dialer(PortUse::New), 2));
        assert!(!is_probe_dial_back(&dialer(PortUse::New), 1), "the only connection is kept");
        assert!(!is_probe_dial_back(&dialer(PortUse::Reuse), 2), "our own dials reuse the port");
        let listener = ConnectedPoint::Listener { local_addr: address.clone(), send_back_addr: address.clone() };
        assert!(!is_probe_dial_back(&listener, 2));
    }
}
