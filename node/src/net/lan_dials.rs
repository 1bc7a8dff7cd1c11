//! Who dials first when two peers find each other at once on a LAN.
//!
//! mDNS tells both peers about each other in the same moment, and our dials
//! reuse the listening port (hole punching needs the NAT mapping of that
//! port). Two such dials at once are one TCP simultaneous open: a single
//! connection whose two ends both believe they dialed, so the handshake
//! fails on both ("input error"), and nobody dials again until the next DHT
//! refresh. So the smaller id dials at once, and the larger one holds its
//! dial back a moment, dialing only if no connection came by then.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use libp2p::PeerId;

use super::yields_to;

/// How long the larger id holds back its dial of a peer mDNS found, at
/// least (the dial goes out at the next housekeeping tick after it, 2 s
/// apart: 3-5 s after the discovery).
pub(crate) const LAN_DIAL_HOLD: Duration = Duration::from_secs(3);
/// Dials held at most; a LAN with more new peers at once gets the rest
/// dialed at once (a collision costs a dial, not correctness).
const MAX_HELD: usize = 256;

/// The dials of peers found on the LAN that we hold back.
#[derive(Debug)]
pub(crate) struct LanDials {
    me: PeerId,
    held: HashMap<PeerId, Instant>,
}

impl LanDials {
    pub(crate) fn new(me: PeerId) -> Self {
        Self { me, held: HashMap::new() }
    }

    /// mDNS found `peer` at `now`: whether to dial it at once (else the dial
    /// is held until [`LanDials::due`] hands it out).
    pub(crate) fn found(&mut self, peer: PeerId, now: Instant) -> bool {
        if !yields_to(&self.me, &peer) || self.held.len() >= MAX_HELD && !self.held.contains_key(&peer) {
            return true;
        }
        self.held.entry(peer).or_insert(now + LAN_DIAL_HOLD);
        false
    }

    /// Whether our dial of `peer` is held back (other discovery paths, such
    /// as the DHT learning the address mDNS found, must not dial it either).
    pub(crate) fn is_held(&self, peer: &PeerId) -> bool {
        self.held.contains_key(peer)
    }

    /// Takes the held dials whose time has come; the caller dials those it
    /// is still not connected to.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<PeerId> {
        let due: Vec<PeerId> = self.held.iter().filter(|(_, t)| **t <= now).map(|(p, _)| *p).collect();
        for p in &due {
            self.held.remove(p);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::tests::node_id;

    fn ordered() -> (PeerId, PeerId) {
        let (a, b) = (node_id(), node_id());
        if a < b { (a, b) } else { (b, a) }
    }

    #[test]
    fn exactly_one_of_two_peers_dials_at_once() {
        let (small, large) = ordered();
        let t0 = Instant::now();
        let mut s = LanDials::new(small);
        let mut l = LanDials::new(large);
        assert!(s.found(large, t0), "the smaller id dials at once");
        assert!(!s.is_held(&large));
        assert!(!l.found(small, t0), "the larger id holds its dial back");
        assert!(l.is_held(&small));
    }

    #[test]
    fn a_held_dial_comes_due_once_after_the_hold() {
        let (small, large) = ordered();
        let t0 = Instant::now();
        let mut l = LanDials::new(large);
        assert!(!l.found(small, t0));
        assert!(l.due(t0 + LAN_DIAL_HOLD - Duration::from_millis(1)).is_empty());
        assert!(!l.found(small, t0 + Duration::from_secs(1)), "found again: the first hold stands");
        assert_eq!(l.due(t0 + LAN_DIAL_HOLD), vec![small]);
        assert!(!l.is_held(&small));
        assert!(l.due(t0 + LAN_DIAL_HOLD * 2).is_empty(), "handed out once");
    }

    #[test]
    fn holds_are_bounded() {
        let mut ids: Vec<PeerId> = std::iter::repeat_with(node_id).take(MAX_HELD + 11).collect();
        ids.sort();
        let me = ids.pop().unwrap();
        let mut d = LanDials::new(me);
        let t0 = Instant::now();
        let at_once = ids.iter().filter(|p| d.found(**p, t0)).count();
        assert_eq!(at_once, 10, "past the bound, dials go out at once");
        assert_eq!(d.due(t0 + LAN_DIAL_HOLD).len(), MAX_HELD);
    }
}
