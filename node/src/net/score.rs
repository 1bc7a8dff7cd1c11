//! Gossipsub peer-score parameters tuned for ragtag's traffic.
//!
//! libp2p's defaults suit chatty topics: a 1 ms time-in-mesh quantum earns
//! a peer +3600 within seconds and invalid messages are forgotten at 30% a
//! second, so a peer spraying garbage never scores below zero. Our topic is
//! quiet (one update per node per round) and a single invalid message is a
//! strong signal, so time in mesh earns slowly and misbehaviour is
//! remembered for minutes.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use libp2p::gossipsub::{PeerScoreParams, PeerScoreThresholds, TopicHash, TopicScoreParams};

/// Peers on one IP address before the colocation penalty (P6) starts.
/// libp2p's default of 10 graylisted every node of a 16-node swarm on one
/// machine (−5 × (16 − 10)² = −180 < −80), and volunteers behind one NAT
/// (a lab, a campus) are many more than ten.
const COLOCATED_PEERS: f64 = 64.0;

/// Peer-score parameters for the run's one topic.
pub(super) fn params(topic: TopicHash) -> PeerScoreParams {
    let mut params = PeerScoreParams::default();
    params.topics.insert(topic, topic_params());
    params.ip_colocation_factor_threshold = COLOCATED_PEERS;
    // Nodes on this machine are not a Sybil attack.
    params
        .ip_colocation_factor_whitelist
        .extend([IpAddr::from(Ipv4Addr::LOCALHOST), IpAddr::from(Ipv6Addr::LOCALHOST)]);
    params
}

/// The default thresholds: gossip −10, publish −50, graylist −80.
pub(super) fn thresholds() -> PeerScoreThresholds {
    PeerScoreThresholds::default()
}

fn topic_params() -> TopicScoreParams {
    TopicScoreParams {
        topic_weight: 1.0,
        // P1: +0.01 a second in the mesh, at most +36 after an hour.
        time_in_mesh_weight: 0.01,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 3600.0,
        // P2: first deliveries count, remembered for about ten seconds.
        first_message_deliveries_weight: 1.0,
        first_message_deliveries_decay: 0.9,
        first_message_deliveries_cap: 50.0,
        // P3/P3b off: a quiet node (a slow laptop between rounds) would look
        // like one withholding messages.
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        // P4: −100 × count²; one invalid message costs more than an hour of
        // good behaviour earns, a burst graylists for minutes (decay 0.995 a
        // second).
        invalid_message_deliveries_weight: -100.0,
        invalid_message_deliveries_decay: 0.995,
        ..TopicScoreParams::default()
    }
}

#[cfg(test)]
mod tests {
    use libp2p::gossipsub::IdentTopic;

    use super::*;

    #[test]
    fn parameters_are_accepted_by_gossipsub() {
        let p = params(IdentTopic::new("t").hash());
        p.validate().unwrap();
        thresholds().validate().unwrap();
    }

    /// P6 alone: `weight × (peers on the address − threshold)²`.
    fn colocation_score(p: &PeerScoreParams, peers: f64) -> f64 {
        let over = (peers - p.ip_colocation_factor_threshold).max(0.0);
        p.ip_colocation_factor_weight * over * over
    }

    #[test]
    fn many_honest_peers_on_one_address_are_not_graylisted() {
        let p = params(IdentTopic::new("t").hash());
        assert!(p.ip_colocation_factor_whitelist.contains(&IpAddr::from(Ipv4Addr::LOCALHOST)));
        // Forty volunteers behind one NAT keep a neutral score; with the
        // default threshold they were graylisted.
        assert!(colocation_score(&p, 40.0) > thresholds().gossip_threshold);
        let default = PeerScoreParams::default();
        assert!(colocation_score(&default, 16.0) < thresholds().graylist_threshold);
    }

    #[test]
    fn one_invalid_message_stops_gossip_even_after_an_hour_in_the_mesh() {
        let t = topic_params();
        let best_honest = t.time_in_mesh_weight * t.time_in_mesh_cap
            + t.first_message_deliveries_weight * t.first_message_deliveries_cap;
        assert!(best_honest + t.invalid_message_deliveries_weight < thresholds().gossip_threshold);
    }
}
