//! Who is alive and how fast they are: the live count N and the reference
//! speed v_ref come from here.

use std::collections::{BTreeMap, BTreeSet};

use crate::{ids::NodeId, sorted_walk, time::Micros};

/// What we know of a peer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeerInfo {
    /// Advertised inner steps per second.
    pub speed: f32,
    /// When we last heard from it.
    pub last_seen: Micros,
    /// The first round it takes part in (barrier schedules wait only for
    /// members that have started).
    pub first_round: u64,
    /// The round it is training.
    pub round: u64,
}

/// The membership table: peers heard from within the timeout, plus us.
#[derive(Clone, Debug)]
pub struct Membership {
    me: NodeId,
    my_speed: f32,
    peers: BTreeMap<NodeId, PeerInfo>,
    /// `(last_seen, peer)`, so expiry costs O(log N), not O(N).
    by_last_seen: BTreeSet<(Micros, NodeId)>,
    timeout: Micros,
    max_peers: usize,
    /// v_ref, recomputed only after a speed changed.
    reference: std::cell::Cell<Option<f32>>,
    /// Bumped whenever a peer joins or leaves the table.
    generation: u64,
}

/// What changed after an update to the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// A peer we did not know.
    Joined,
    /// A known peer, refreshed.
    Refreshed,
    /// The table is full; the peer was not added.
    Full,
}

impl Membership {
    /// A table holding only us.
    pub fn new(me: NodeId, my_speed: f32, timeout: Micros, max_peers: usize) -> Self {
        Self {
            me,
            my_speed,
            peers: BTreeMap::new(),
            by_last_seen: BTreeSet::new(),
            timeout,
            max_peers,
            reference: std::cell::Cell::new(None),
            generation: 0,
        }
    }

    /// Changes with the set of live peers (not with their refreshes): what
    /// was worked out from one view of the live set is stale once it moves.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Our own id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// Sets our own speed estimate.
    pub fn set_my_speed(&mut self, speed: f32) {
        self.my_speed = speed;
        self.reference.set(None);
    }

    /// Our own speed estimate.
    pub fn my_speed(&self) -> f32 {
        self.my_speed
    }

    /// Records a sign of life from `peer`.
    pub fn heard(&mut self, peer: NodeId, info: PeerInfo) -> MembershipChange {
        if peer == self.me {
            return MembershipChange::Refreshed;
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            self.by_last_seen.remove(&(p.last_seen, peer));
            if p.speed != info.speed {
                self.reference.set(None);
            }
            p.speed = info.speed;
            p.last_seen = p.last_seen.max(info.last_seen);
            p.round = p.round.max(info.round);
            p.first_round = p.first_round.min(info.first_round);
            self.by_last_seen.insert((p.last_seen, peer));
            return MembershipChange::Refreshed;
        }
        if self.peers.len() >= self.max_peers {
            return MembershipChange::Full;
        }
        self.by_last_seen.insert((info.last_seen, peer));
        self.peers.insert(peer, info);
        self.reference.set(None);
        self.generation += 1;
        MembershipChange::Joined
    }

    /// Removes `peer` (it left or disconnected). Returns whether it was known.
    pub fn remove(&mut self, peer: &NodeId) -> bool {
        match self.peers.remove(peer) {
            Some(p) => {
                self.by_last_seen.remove(&(p.last_seen, *peer));
                self.reference.set(None);
                self.generation += 1;
                true
            }
            None => false,
        }
    }

    /// Removes peers silent for longer than the timeout; returns them.
    pub fn expire(&mut self, now: Micros) -> Vec<NodeId> {
        let mut dead = Vec::new();
        while let Some(&(seen, id)) = self.by_last_seen.first() {
            if now.saturating_sub(seen) <= self.timeout {
                break;
            }
            self.by_last_seen.pop_first();
            self.peers.remove(&id);
            self.reference.set(None);
            self.generation += 1;
            dead.push(id);
        }
        dead
    }

    /// When the next peer would expire, if any.
    pub fn next_expiry(&self) -> Option<Micros> {
        self.by_last_seen.first().map(|(seen, _)| *seen + self.timeout + Micros(1))
    }

    /// N: live peers plus us.
    pub fn live_count(&self) -> usize {
        self.peers.len() + 1
    }

    /// Whether `peer` is live.
    pub fn is_live(&self, peer: &NodeId) -> bool {
        *peer == self.me || self.peers.contains_key(peer)
    }

    /// A live peer's info.
    pub fn peer(&self, peer: &NodeId) -> Option<&PeerInfo> {
        self.peers.get(peer)
    }

    /// Live peers (not us), in id order.
    pub fn peers(&self) -> impl Iterator<Item = (&NodeId, &PeerInfo)> {
        self.peers.iter()
    }

    /// [`Membership::is_live`] for each node of `batch` (in id order), in
    /// one pass over the live set: `f` gets the node, its tag and whether
    /// it is live.
    pub fn live_sorted<T: Copy>(&self, batch: &[(NodeId, T)], mut f: impl FnMut(&NodeId, T, bool)) {
        sorted_walk::join_sorted(&self.peers, batch, |id, t, peer| f(id, t, *id == self.me || peer.is_some()));
    }

    /// v_ref: the 90th percentile of live speeds, us included (nearest
    /// rank). Cached until a speed or the live set changes.
    pub fn reference_speed(&self) -> f32 {
        if let Some(v) = self.reference.get() {
            return v;
        }
        let v = self.compute_reference_speed();
        self.reference.set(Some(v));
        v
    }

    fn compute_reference_speed(&self) -> f32 {
        let mut speeds: Vec<f32> = self.peers.values().map(|p| p.speed).filter(|s| s.is_finite() && *s > 0.0).collect();
        speeds.push(self.my_speed);
        speeds.sort_by(f32::total_cmp);
        let rank = ((0.9 * speeds.len() as f64).ceil() as usize).clamp(1, speeds.len());
        speeds[rank - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    fn info(speed: f32, t: u64) -> PeerInfo {
        PeerInfo { speed, last_seen: Micros(t), first_round: 0, round: 0 }
    }

    #[test]
    fn reference_speed_is_the_90th_percentile() {
        let mut m = Membership::new(id(0), 1.0, Micros(10), 100);
        for (i, s) in [1.0, 2.0, 4.0].into_iter().enumerate() {
            m.heard(id(i as u8 + 1), info(s, 0));
        }
        // speeds 1,1,2,4: rank ceil(3.6)=4 -> 4.
        assert_eq!(m.reference_speed(), 4.0);
        for i in 0..16u8 {
            m.heard(id(10 + i), info(1.0 + i as f32 * 0.5, 0));
        }
        // 20 speeds; rank 18.
        let mut all: Vec<f32> = vec![1.0, 1.0, 2.0, 4.0];
        all.extend((0..16).map(|i| 1.0 + i as f32 * 0.5));
        all.sort_by(f32::total_cmp);
        assert_eq!(m.reference_speed(), all[17]);
    }

    #[test]
    fn silent_peers_expire_and_table_is_bounded() {
        let mut m = Membership::new(id(0), 1.0, Micros(10), 2);
        assert_eq!(m.heard(id(1), info(1.0, 0)), MembershipChange::Joined);
        assert_eq!(m.heard(id(2), info(1.0, 5)), MembershipChange::Joined);
        assert_eq!(m.heard(id(3), info(1.0, 5)), MembershipChange::Full);
        assert_eq!(m.live_count(), 3);
        assert_eq!(m.expire(Micros(11)), vec![id(1)]);
        assert_eq!(m.live_count(), 2);
        assert_eq!(m.next_expiry(), Some(Micros(16)));
    }
}
