//! One connection per peer.
//!
//! Two nodes that learn of each other at the same moment both dial, and each
//! ends up with two or more connections to the other (loopback soak: 14 to
//! 29 connections per process for 14 peers). Every connection holds its own
//! encryption buffers, multiplexer and protocol handlers, so duplicates cost
//! memory that grows as each of them carries a large transfer.
//!
//! Only the side with the lower peer id closes duplicates, so the two sides
//! never close different connections and leave none. It keeps the oldest
//! direct connection, or the oldest relayed one when none is direct, so a
//! hole-punched connection replaces the relayed one it was punched through.

use std::collections::HashMap;

use libp2p::{PeerId, swarm::ConnectionId};

/// Established connections per peer, in the order they were established.
#[derive(Debug)]
pub(crate) struct PeerConnections {
    local: PeerId,
    by_peer: HashMap<PeerId, Vec<Connection>>,
}

#[derive(Debug, Clone, Copy)]
struct Connection {
    id: ConnectionId,
    relayed: bool,
}

impl PeerConnections {
    /// Connections of the node `local`.
    pub(crate) fn new(local: PeerId) -> Self {
        Self { local, by_peer: HashMap::new() }
    }

    /// Records an established connection and returns those to close: none
    /// unless we hold more than one to `peer` and our id is the lower.
    pub(crate) fn established(&mut self, peer: PeerId, id: ConnectionId, relayed: bool) -> Vec<ConnectionId> {
        let conns = self.by_peer.entry(peer).or_default();
        conns.push(Connection { id, relayed });
        if self.local >= peer || conns.len() < 2 {
            return Vec::new();
        }
        let keep = conns.iter().find(|c| !c.relayed).unwrap_or(&conns[0]).id;
        conns.iter().map(|c| c.id).filter(|&c| c != keep).collect()
    }

    /// Forgets a closed connection.
    pub(crate) fn closed(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(conns) = self.by_peer.get_mut(&peer) {
            conns.retain(|c| c.id != id);
            if conns.is_empty() {
                self.by_peer.remove(&peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered_pair() -> (PeerId, PeerId) {
        let (a, b) = (PeerId::random(), PeerId::random());
        if a < b { (a, b) } else { (b, a) }
    }

    fn conn(n: usize) -> ConnectionId {
        ConnectionId::new_unchecked(n)
    }

    #[test]
    fn the_lower_id_closes_every_duplicate_and_keeps_the_oldest() {
        let (low, high) = ordered_pair();
        let mut at_low = PeerConnections::new(low);
        assert!(at_low.established(high, conn(1), false).is_empty());
        assert_eq!(at_low.established(high, conn(2), false), vec![conn(2)]);
        assert_eq!(at_low.established(high, conn(3), false), vec![conn(2), conn(3)]);
        at_low.closed(high, conn(2));
        at_low.closed(high, conn(3));
        // Closing the kept one leaves the peer disconnected; a new one is kept.
        at_low.closed(high, conn(1));
        assert_eq!(at_low.by_peer.len(), 0);
        assert!(at_low.established(high, conn(4), false).is_empty());
        assert_eq!(at_low.by_peer.len(), 1);
    }

    #[test]
    fn the_higher_id_never_closes() {
        let (low, high) = ordered_pair();
        let mut at_high = PeerConnections::new(high);
        for n in 1..5 {
            assert!(at_high.established(low, conn(n), false).is_empty());
        }
    }

    #[test]
    fn a_direct_connection_replaces_a_relayed_one() {
        let (low, high) = ordered_pair();
        let mut at_low = PeerConnections::new(low);
        assert!(at_low.established(high, conn(1), true).is_empty());
        assert_eq!(at_low.established(high, conn(2), false), vec![conn(1)]);
        at_low.closed(high, conn(1));
        // A later relayed connection is the one closed.
        assert_eq!(at_low.established(high, conn(3), true), vec![conn(3)]);
    }

    #[test]
    fn peers_are_tracked_separately() {
        let (low, high) = ordered_pair();
        let other = loop {
            let p = PeerId::random();
            if p > low {
                break p;
            }
        };
        let mut at_low = PeerConnections::new(low);
        assert!(at_low.established(high, conn(1), false).is_empty());
        assert!(at_low.established(other, conn(2), false).is_empty());
        assert_eq!(at_low.by_peer.len(), 2);
        at_low.closed(other, conn(9));
        assert_eq!(at_low.by_peer.len(), 2);
    }
}
