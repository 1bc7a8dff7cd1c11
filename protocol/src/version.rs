//! Version vectors and the set of applied updates: what a replica has
//! absorbed, so staleness can be measured and no update applies twice.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    ids::{NodeId, UpdateId},
    sorted_walk,
};

/// `V[j]` = how many of node j's updates this replica has applied. Encoded
/// compactly: entries sorted by node, zero entries omitted, varint counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionVector(BTreeMap<NodeId, u64>);

impl VersionVector {
    /// The empty vector.
    pub fn new() -> Self {
        Self::default()
    }

    /// `V[node]`.
    pub fn get(&self, node: &NodeId) -> u64 {
        self.0.get(node).copied().unwrap_or(0)
    }

    /// Counts one more applied update from `node`.
    pub fn increment(&mut self, node: NodeId) {
        *self.0.entry(node).or_insert(0) += 1;
    }

    /// [`VersionVector::increment`] for each node of `batch`, in node
    /// order (a node once per update).
    pub fn increment_sorted(&mut self, batch: &[(NodeId, ())]) {
        sorted_walk::update_sorted(&mut self.0, batch, |v, ()| match v {
            Some(v) => {
                *v += 1;
                None
            }
            None => Some(1),
        });
    }

    /// `|V|`: all updates applied.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Receiver-measured staleness of an update based on `base`:
    /// `sum_j max(0, self[j] - base[j])`.
    pub fn staleness_since(&self, base: &VersionVector) -> u64 {
        self.0.iter().map(|(j, v)| v.saturating_sub(base.get(j))).sum()
    }

    /// Entry-wise maximum (after anchors are merged).
    pub fn merge_max(&mut self, other: &VersionVector) {
        for (j, v) in &other.0 {
            let e = self.0.entry(*j).or_insert(0);
            *e = (*e).max(*v);
        }
    }

    /// True when every entry of `self` is at least the one in `other`.
    pub fn dominates(&self, other: &VersionVector) -> bool {
        other.0.iter().all(|(j, v)| self.get(j) >= *v)
    }

    /// The number of nodes with an entry.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when nothing was applied.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entries in node order.
    pub fn iter(&self) -> impl Iterator<Item = (&NodeId, &u64)> {
        self.0.iter()
    }
}

/// Rounds per source remembered exactly; anything older counts as applied.
pub const APPLIED_WINDOW: u64 = 64;

/// Which of one source's rounds were applied: the highest, and a bitmap of
/// the `APPLIED_WINDOW` rounds below it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRounds {
    /// Highest round applied.
    pub max_round: u64,
    /// Bit i set: round `max_round - i` applied (bit 0 is `max_round`).
    pub bits: u64,
}

impl AppliedRounds {
    fn contains(&self, round: u64) -> bool {
        if round > self.max_round {
            return false;
        }
        let age = self.max_round - round;
        age >= APPLIED_WINDOW || self.bits & (1 << age) != 0
    }

    fn insert(&mut self, round: u64) {
        if self.bits == 0 {
            self.max_round = round;
            self.bits = 1;
        } else if round > self.max_round {
            let shift = round - self.max_round;
            self.bits = if shift >= APPLIED_WINDOW { 0 } else { self.bits << shift };
            self.bits |= 1;
            self.max_round = round;
        } else if self.max_round - round < APPLIED_WINDOW {
            self.bits |= 1 << (self.max_round - round);
        }
    }

    fn union(&mut self, other: &AppliedRounds) {
        for age in 0..APPLIED_WINDOW {
            if other.bits & (1 << age) != 0 && other.max_round >= age {
                self.insert(other.max_round - age);
            }
        }
    }
}

/// The updates a replica has applied (exactly within a window per source;
/// older rounds count as applied, so a replay can never slip through).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedSet(BTreeMap<NodeId, AppliedRounds>);

impl AppliedSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `id` was applied (or is older than the window).
    pub fn contains(&self, id: &UpdateId) -> bool {
        self.0.get(&id.src).is_some_and(|r| r.contains(id.round))
    }

    /// Whether any `(source, round)` of `ids` (in source order) is
    /// [`AppliedSet::contains`]ed: one pass over the set.
    pub fn contains_any_sorted(&self, ids: &[(NodeId, u64)]) -> bool {
        let mut any = false;
        sorted_walk::join_sorted(&self.0, ids, |_, round, r| any |= r.is_some_and(|r| r.contains(round)));
        any
    }

    /// Records `id` as applied.
    pub fn insert(&mut self, id: UpdateId) {
        self.0.entry(id.src).or_default().insert(id.round);
    }

    /// For each `(source, (round, tag))` of `batch`, in source order:
    /// records the update unless [`AppliedSet::contains`] it, and calls
    /// `new` with the tag of each it recorded (as a check and an insert
    /// per update, in batch order, would).
    pub fn insert_new_sorted<T: Copy>(&mut self, batch: &[(NodeId, (u64, T))], mut new: impl FnMut(T)) {
        sorted_walk::update_sorted(&mut self.0, batch, |r, (round, tag)| match r {
            Some(r) if r.contains(round) => None,
            Some(r) => {
                r.insert(round);
                new(tag);
                None
            }
            None => {
                let mut r = AppliedRounds::default();
                r.insert(round);
                new(tag);
                Some(r)
            }
        });
    }

    /// Adds everything `other` applied.
    pub fn union(&mut self, other: &AppliedSet) {
        for (src, r) in &other.0 {
            self.0.entry(*src).or_default().union(r);
        }
    }

    /// Ids in `self` that `other` lacks, within the window.
    pub fn missing_from(&self, other: &AppliedSet) -> Vec<UpdateId> {
        let mut out = Vec::new();
        for (src, r) in &self.0 {
            for age in 0..APPLIED_WINDOW.min(r.max_round + 1) {
                if r.bits & (1 << age) != 0 {
                    let id = UpdateId { src: *src, round: r.max_round - age };
                    if !other.contains(&id) {
                        out.push(id);
                    }
                }
            }
        }
        out
    }

    /// The highest round of `src` applied, if any.
    pub fn max_round(&self, src: &NodeId) -> Option<u64> {
        self.0.get(src).filter(|r| r.bits != 0).map(|r| r.max_round)
    }

    /// How many of `src`'s updates within the window were applied.
    pub fn recent_count(&self, src: &NodeId) -> u32 {
        self.0.get(src).map_or(0, |r| r.bits.count_ones())
    }

    /// Sources with an entry.
    pub fn sources(&self) -> usize {
        self.0.len()
    }

    /// Each source with its count of updates applied within the window.
    pub fn recent_counts(&self) -> impl Iterator<Item = (&NodeId, u32)> {
        self.0.iter().map(|(id, r)| (id, r.bits.count_ones()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    #[test]
    fn staleness_is_exact_on_hand_made_vectors() {
        let mut base = VersionVector::new();
        base.increment(n(1));
        base.increment(n(2));
        let mut now = base.clone();
        now.increment(n(1));
        now.increment(n(1));
        now.increment(n(3));
        assert_eq!(now.staleness_since(&base), 3);
        assert_eq!(base.staleness_since(&now), 0);
        assert!(now.dominates(&base));
        assert!(!base.dominates(&now));
        assert_eq!(now.total(), 5);
    }

    #[test]
    fn applied_set_window_and_replays() {
        let mut s = AppliedSet::new();
        let id = |r| UpdateId { src: n(1), round: r };
        s.insert(id(5));
        s.insert(id(3));
        assert!(s.contains(&id(5)) && s.contains(&id(3)));
        assert!(!s.contains(&id(4)) && !s.contains(&id(6)));
        s.insert(id(200));
        // Older than the window: counts as applied (never re-applied).
        assert!(s.contains(&id(5)));
        assert!(s.contains(&id(200)));
        assert!(!s.contains(&id(199)));
    }

    #[test]
    fn union_and_missing() {
        let mut a = AppliedSet::new();
        let mut b = AppliedSet::new();
        a.insert(UpdateId { src: n(1), round: 1 });
        a.insert(UpdateId { src: n(2), round: 4 });
        b.insert(UpdateId { src: n(1), round: 1 });
        assert_eq!(a.missing_from(&b), vec![UpdateId { src: n(2), round: 4 }]);
        b.union(&a);
        assert!(a.missing_from(&b).is_empty());
    }

    proptest::proptest! {
        /// A pass books the same set and vector, and calls the same
        /// updates new, as a check, an insert and an increment per update
        /// in batch order; and it finds an update applied where a search
        /// does. Repeated sources, rounds out of order and rounds beyond
        /// the window included.
        #[test]
        fn booking_in_one_pass_matches_one_update_at_a_time(
            before in proptest::collection::vec((0u8..6, 0u64..200), 0..30),
            batch in proptest::collection::vec((0u8..6, 0u64..200), 0..30),
        ) {
            let mut set = AppliedSet::new();
            for (src, round) in before {
                set.insert(UpdateId { src: n(src), round });
            }
            let mut items: Vec<(NodeId, (u64, usize))> =
                batch.iter().enumerate().map(|(i, (src, round))| (n(*src), (*round, i))).collect();
            items.sort_by_key(|(src, _)| *src);
            let original = set.clone();
            let (mut one_set, mut one_version, mut one_new) = (set.clone(), VersionVector::new(), Vec::new());
            for &(src, (round, i)) in &items {
                let id = UpdateId { src, round };
                if !one_set.contains(&id) {
                    one_set.insert(id);
                    one_version.increment(src);
                    one_new.push(i);
                }
            }
            let mut new = Vec::new();
            set.insert_new_sorted(&items, |i| new.push(i));
            new.sort_unstable();
            one_new.sort_unstable();
            let sources: Vec<(NodeId, ())> = items.iter().filter(|(_, (_, i))| new.contains(i)).map(|(s, _)| (*s, ())).collect();
            let mut version = VersionVector::new();
            version.increment_sorted(&sources);
            proptest::prop_assert_eq!(&new, &one_new);
            proptest::prop_assert_eq!(set, one_set);
            proptest::prop_assert_eq!(version, one_version);
            let ids: Vec<(NodeId, u64)> = items.iter().map(|(s, (r, _))| (*s, *r)).collect();
            let any = ids.iter().any(|(src, round)| original.contains(&UpdateId { src: *src, round: *round }));
            proptest::prop_assert_eq!(original.contains_any_sorted(&ids), any);
        }
    }
}
