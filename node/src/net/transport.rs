//! Building the swarm: TCP + noise + yamux (+ QUIC) for public swarms; for
//! private swarms TCP only, wrapped in pnet before noise (QUIC cannot carry
//! pnet, and would accept peers without the key).

use libp2p::{Swarm, SwarmBuilder, Transport, core::upgrade::Version, noise, pnet::PnetConfig, tcp, yamux};

use super::{Config, IDLE_TIMEOUT, NodeBehaviour, behaviour};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Builds the swarm for `cfg`, registering libp2p's bandwidth metrics and
/// gossipsub's.
pub(crate) fn build_swarm(
    cfg: &Config,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<Swarm<NodeBehaviour>, BoxError> {
    let tcp_config = tcp::Config::default().nodelay(true);
    let swarm_config = |c: libp2p::swarm::Config| c.with_idle_connection_timeout(IDLE_TIMEOUT);
    let behaviour_cfg = cfg.clone();
    let swarm = match cfg.swarm_key {
        Some(psk) => SwarmBuilder::with_existing_identity(cfg.keypair.clone())
            .with_tokio()
            .with_other_transport(move |key| -> Result<_, BoxError> {
                let noise_config = noise::Config::new(key)?;
                Ok(libp2p::tcp::tokio::Transport::new(tcp_config)
                    .and_then(move |socket, _| PnetConfig::new(psk).handshake(socket))
                    .upgrade(Version::V1Lazy)
                    .authenticate(noise_config)
                    .multiplex(yamux::Config::default())
                    .timeout(std::time::Duration::from_secs(5)))
            })?
            .with_relay_client(noise::Config::new, yamux::Config::default)?
            .with_bandwidth_metrics(registry)
            .with_behaviour(move |key, relay| behaviour::build(key, relay, &behaviour_cfg, registry))?
            .with_swarm_config(swarm_config)
            .build(),
        None if cfg.quic => SwarmBuilder::with_existing_identity(cfg.keypair.clone())
            .with_tokio()
            .with_tcp(tcp_config, noise::Config::new, yamux::Config::default)?
            .with_quic()
            .with_relay_client(noise::Config::new, yamux::Config::default)?
            .with_bandwidth_metrics(registry)
            .with_behaviour(move |key, relay| behaviour::build(key, relay, &behaviour_cfg, registry))?
            .with_swarm_config(swarm_config)
            .build(),
        None => SwarmBuilder::with_existing_identity(cfg.keypair.clone())
            .with_tokio()
            .with_tcp(tcp_config, noise::Config::new, yamux::Config::default)?
            .with_relay_client(noise::Config::new, yamux::Config::default)?
            .with_bandwidth_metrics(registry)
            .with_behaviour(move |key, relay| behaviour::build(key, relay, &behaviour_cfg, registry))?
            .with_swarm_config(swarm_config)
            .build(),
    };
    Ok(swarm)
}
