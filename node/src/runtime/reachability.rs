//! How peers can reach this node, as the status reports it: derived from
//! what the node has observed (AutoNAT's verdict, a relay reservation, a
//! successful hole punch) rather than overwritten by whichever event came
//! last, so the order in which those events arrive does not change the
//! answer (a peer's hole punch can complete before our own reservation is
//! acknowledged).

/// What the node knows about its own reachability.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reachability {
    /// AutoNAT's latest verdict: "public", "private" or "unknown"; `None`
    /// before the first.
    autonat: Option<String>,
    /// A relay accepted a reservation for us.
    relayed: bool,
    /// A hole punch gave us a direct connection to a peer.
    punched: bool,
}

impl Reachability {
    /// AutoNAT's verdict changed.
    pub(crate) fn autonat(&mut self, verdict: &str) {
        self.autonat = Some(verdict.to_owned());
    }

    /// A relay accepted our reservation.
    pub(crate) fn relay_reserved(&mut self) {
        self.relayed = true;
    }

    /// A hole punch succeeded.
    pub(crate) fn hole_punched(&mut self) {
        self.punched = true;
    }

    /// Whether peers reach us through a relay (or a hole punched from one),
    /// so that a new "private" verdict needs no new reservation.
    pub(crate) fn through_relay(&self) -> bool {
        self.relayed || self.punched
    }

    /// The status label: "public" when AutoNAT says so; otherwise "hole
    /// punched" once a punch succeeded, "relayed" with a reservation, else
    /// AutoNAT's verdict ("unknown" before it has one).
    pub(crate) fn label(&self) -> &str {
        match self.autonat.as_deref() {
            Some("public") => "public",
            _ if self.punched => "hole punched",
            _ if self.relayed => "relayed",
            Some(v) => v,
            None => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(events: &[&str]) -> String {
        let mut r = Reachability::default();
        for e in events {
            match *e {
                "reserved" => r.relay_reserved(),
                "punched" => r.hole_punched(),
                v => r.autonat(v),
            }
        }
        r.label().to_owned()
    }

    #[test]
    fn a_punch_is_reported_whether_the_reservation_came_before_or_after_it() {
        // The order a NAT test saw: the peer's punch completed before our
        // own reservation was acknowledged, and the status said "relayed".
        assert_eq!(after(&["private", "punched", "reserved"]), "hole punched");
        assert_eq!(after(&["private", "reserved", "punched"]), "hole punched");
        assert_eq!(after(&["private", "reserved"]), "relayed");
    }

    #[test]
    fn autonat_decides_until_a_relay_or_punch_is_seen_and_public_always_wins() {
        assert_eq!(after(&[]), "unknown");
        assert_eq!(after(&["private"]), "private");
        assert_eq!(after(&["private", "reserved", "unknown"]), "relayed");
        assert_eq!(after(&["private", "reserved", "punched", "public"]), "public");
        let mut r = Reachability::default();
        assert!(!r.through_relay());
        r.hole_punched();
        assert!(r.through_relay());
    }
}
