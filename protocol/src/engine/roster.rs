//! Who may hold a role in a tick's sums (aggregated dissemination): the
//! nodes whose updates this replica applied in the settled ticks just
//! before it. It is a function of applied state, so every replica that
//! applied the same sums ranks the same nodes, a joiner included (it
//! receives the roster with the replica state), where views of the live
//! set differ for seconds whenever a node joins or leaves. A joiner takes
//! no role until a sum with its update has settled; a node that stops
//! contributing keeps its roles for [`WINDOW_TICKS`] ticks (the quorum
//! covers one silent aggregator of a group).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{ids::NodeId, sorted_walk};

/// Ticks from a tick back to the newest tick whose contributors count for
/// its roles: a tick's sums are applied one tick later, so by then every
/// replica has closed it.
pub const SETTLE_TICKS: u64 = 2;
/// How many settled ticks count.
pub const WINDOW_TICKS: u64 = 3;
/// Ticks a contribution is remembered (the bit mask's width).
const MASK_TICKS: u64 = 64;

/// Recent contributors, each with the ticks it contributed to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roster {
    recent: BTreeMap<NodeId, Recent>,
}

/// A node's contributions: bit `i` of `mask` is tick `newest - i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Recent {
    newest: u64,
    mask: u64,
}

impl Recent {
    /// Notes a contribution to tick `key`.
    fn add(&mut self, key: u64) {
        if key > self.newest {
            let shift = key - self.newest;
            self.mask = if shift >= MASK_TICKS { 0 } else { self.mask << shift };
            self.newest = key;
        }
        if self.newest - key < MASK_TICKS {
            self.mask |= 1 << (self.newest - key);
        }
    }

    fn has(&self, key: u64) -> bool {
        key <= self.newest && self.newest - key < MASK_TICKS && self.mask & (1 << (self.newest - key)) != 0
    }
}

impl Roster {
    /// Records that an applied sum held `node`'s update of tick `key`.
    pub fn record(&mut self, node: NodeId, key: u64) {
        self.recent.entry(node).or_insert(Recent { newest: key, mask: 0 }).add(key);
    }

    /// [`Roster::record`] for each `(node, key)` of `batch`, in node order.
    pub fn record_sorted(&mut self, batch: &[(NodeId, u64)]) {
        sorted_walk::update_sorted(&mut self.recent, batch, |r, key| match r {
            Some(r) => {
                r.add(key);
                None
            }
            None => Some(Recent { newest: key, mask: 1 }),
        });
    }

    /// The nodes eligible for roles in tick `key`, in id order: those with
    /// an update in one of the [`WINDOW_TICKS`] ticks ending
    /// [`SETTLE_TICKS`] before it. Empty until such ticks are closed.
    pub fn eligible(&self, key: u64) -> impl Iterator<Item = NodeId> + '_ {
        let hi = key.checked_sub(SETTLE_TICKS);
        let lo = key.saturating_sub(SETTLE_TICKS + WINDOW_TICKS - 1);
        self.recent.iter().filter(move |(_, r)| hi.is_some_and(|hi| (lo..=hi).any(|k| r.has(k)))).map(|(id, _)| *id)
    }

    /// Forgets nodes with no contribution at or after tick `key`.
    pub fn forget_before(&mut self, key: u64) {
        self.recent.retain(|_, r| r.newest >= key);
    }

    /// The newest tick recorded (a state's roster cannot be newer than its
    /// closed ticks).
    pub fn newest(&self) -> Option<u64> {
        self.recent.values().map(|r| r.newest).max()
    }

    /// Nodes remembered.
    pub fn len(&self) -> usize {
        self.recent.len()
    }

    /// No node remembered.
    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn id(b: u8) -> NodeId {
        NodeId([b; 32])
    }

    #[test]
    fn a_node_is_eligible_from_two_ticks_after_its_first_sum_for_three_ticks() {
        let mut r = Roster::default();
        r.record(id(1), 10);
        let at = |k| r.eligible(k).collect::<Vec<_>>();
        assert!(at(11).is_empty());
        assert_eq!(at(12), vec![id(1)]);
        assert_eq!(at(14), vec![id(1)]);
        assert!(at(15).is_empty(), "a node silent for the window loses its roles");
        assert!(at(0).is_empty());
    }

    #[test]
    fn out_of_order_records_and_gaps_are_kept() {
        let mut r = Roster::default();
        r.record(id(1), 20);
        r.record(id(1), 17);
        r.record(id(2), 5);
        r.record(id(2), 100);
        assert_eq!(r.eligible(19).collect::<Vec<_>>(), vec![id(1)]);
        assert_eq!(r.eligible(22).collect::<Vec<_>>(), vec![id(1)]);
        assert_eq!(r.eligible(102).collect::<Vec<_>>(), vec![id(2)]);
        assert!(r.eligible(7).next().is_none(), "a tick 95 back fell out of the mask");
        r.forget_before(21);
        assert_eq!(r.len(), 1);
        assert_eq!(r.newest(), Some(100));
    }

    proptest! {
        #[test]
        fn eligibility_is_exactly_a_record_in_the_window(
            keys in proptest::collection::vec(0u64..200, 0..40),
            at in 0u64..220,
        ) {
            let mut r = Roster::default();
            for k in &keys {
                r.record(id(7), *k);
            }
            let newest = keys.iter().max().copied().unwrap_or(0);
            let in_window = keys.iter().any(|k| {
                *k + SETTLE_TICKS <= at && *k + SETTLE_TICKS + WINDOW_TICKS > at && newest - k < MASK_TICKS
            });
            prop_assert_eq!(r.eligible(at).next().is_some(), in_window);
        }

        /// Recording a batch in one pass leaves the roster that recording
        /// each item in turn leaves, ticks in any order and beyond the
        /// mask's reach included.
        #[test]
        fn recording_in_one_pass_matches_one_at_a_time(
            before in prop::collection::vec((0u8..6, 0u64..200), 0..20),
            batch in prop::collection::vec((0u8..6, 0u64..200), 0..30),
        ) {
            let mut r = Roster::default();
            for (b, key) in before {
                r.record(id(b), key);
            }
            let mut items: Vec<(NodeId, u64)> = batch.iter().map(|(b, key)| (id(*b), *key)).collect();
            items.sort_by_key(|(node, _)| *node);
            let mut one = r.clone();
            for &(node, key) in &items {
                one.record(node, key);
            }
            r.record_sorted(&items);
            prop_assert_eq!(r, one);
        }
    }
}
