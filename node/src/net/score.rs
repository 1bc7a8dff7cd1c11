//! Gossipsub peer-score parameters tuned for ragtag's traffic.
//!
//! libp2p's defaults suit chatty topics: a 1 ms time-in-mesh quantum earns
//! a peer +3600 within seconds and invalid messages are forgotten at 30% a
//! second, so a peer spraying garbage never scores below zero. Our topic is
//! quiet (one update per node per round) and a single invalid message is a
//! strong signal, so time in mesh earns slowly and misbehaviour is
//! remembered for minutes.

use std::time::Duration;

use libp2p::gossipsub::{PeerScoreParams, PeerScoreThresholds, TopicHash, TopicScoreParams};

/// Peer-score parameters for the run's one topic.
pub(super) fn params(topic: TopicHash) -> PeerScoreParams {
    let mut params = PeerScoreParams::default();
    params.topics.insert(topic, topic_params());
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

    #[test]
    fn one_invalid_message_stops_gossip_even_after_an_hour_in_the_mesh() {
        let t = topic_params();
        let best_honest = t.time_in_mesh_weight * t.time_in_mesh_cap
            + t.first_message_deliveries_weight * t.first_message_deliveries_cap;
        assert!(best_honest + t.invalid_message_deliveries_weight < thresholds().gossip_threshold);
    }
}
