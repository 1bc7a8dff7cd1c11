//! A group's rendezvous order for one tick, read a few positions at a
//! time: a node needs its own position, its parent's, its children's and
//! the first `r`, never the whole order. Every engine works out every
//! group's roles each tick, so a full sort of the roster per group was a
//! tenth of a 1,000-node simulation; selecting the few positions needed
//! costs a few passes over the scores instead.

use std::ops::Range;

use super::{head, mix};
use crate::ids::NodeId;

/// The order of `nodes` for group `group` of tick `key`: rendezvous
/// scores, lowest first, equal scores in id order. The first `r` are the
/// group's designated aggregators, and the node at position `i >= r` takes
/// the sum from the one at [`super::tree_parent`]`(i)`. A view that differs
/// by a node or two mostly agrees on both.
#[derive(Debug)]
pub struct Ranking<'a> {
    key: u64,
    group: u32,
    nodes: &'a [NodeId],
    /// Score in the high 64 bits, index into `nodes` in the low: ordering
    /// the integers orders by score, then by id (as `nodes` is sorted).
    keys: Vec<u128>,
}

impl<'a> Ranking<'a> {
    /// `nodes` must be in id order without repeats (a roster's order):
    /// ties of score are broken by position in it.
    pub fn new(key: u64, group: u32, nodes: &'a [NodeId]) -> Self {
        debug_assert!(nodes.windows(2).all(|w| w[0] < w[1]), "nodes in id order, no repeats");
        let keys =
            nodes.iter().enumerate().map(|(i, node)| (u128::from(score(key, group, node)) << 64) | i as u128).collect();
        Self { key, group, nodes, keys }
    }

    /// `node`'s position in the order (`None`: not ranked).
    pub fn position(&self, node: &NodeId) -> Option<usize> {
        let i = self.nodes.binary_search(node).ok()?;
        let own = (u128::from(score(self.key, self.group, node)) << 64) | i as u128;
        Some(self.keys.iter().filter(|k| **k < own).count())
    }

    /// The nodes at positions `range` (clipped to the order), in order.
    pub fn span(&mut self, range: Range<usize>) -> Vec<NodeId> {
        let end = range.end.min(self.keys.len());
        let start = range.start.min(end);
        if start == end {
            return Vec::new();
        }
        // Position `start` in place, everything after it larger; then the
        // `end - start` smallest of those at the front, in order.
        self.keys.select_nth_unstable(start);
        let tail = &mut self.keys[start..];
        let want = end - start;
        if want < tail.len() {
            tail.select_nth_unstable(want - 1);
        }
        tail[..want].sort_unstable();
        tail[..want].iter().map(|k| self.nodes[(*k as u64) as usize]).collect()
    }
}

/// A node's rendezvous score in group `group` of tick `key`.
fn score(key: u64, group: u32, node: &NodeId) -> u64 {
    mix(&[2, key, u64::from(group), head(node)])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The order by definition: every node sorted by (score, id).
    fn sorted(key: u64, group: u32, nodes: &[NodeId]) -> Vec<NodeId> {
        let mut scored: Vec<(u64, NodeId)> = nodes.iter().map(|n| (score(key, group, n), *n)).collect();
        scored.sort_unstable();
        scored.into_iter().map(|(_, n)| n).collect()
    }

    fn nodes(heads: &[u64]) -> Vec<NodeId> {
        let mut out: Vec<NodeId> = heads
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let mut b = [0u8; 32];
                b[..8].copy_from_slice(&h.to_le_bytes());
                b[8..16].copy_from_slice(&(i as u64).to_le_bytes());
                NodeId(b)
            })
            .collect();
        out.sort_unstable();
        out
    }

    proptest! {
        /// Positions, spans read in any sequence and the whole order agree
        /// with a full sort, ties of score (equal heads) included.
        #[test]
        fn spans_and_positions_agree_with_a_full_sort(
            heads in proptest::collection::vec(0u64..40, 0..120),
            key in 0u64..1_000,
            group in 0u32..8,
            spans in proptest::collection::vec((0usize..130, 0usize..12), 0..6),
        ) {
            let nodes = nodes(&heads);
            let order = sorted(key, group, &nodes);
            let mut ranking = Ranking::new(key, group, &nodes);
            for (at, n) in order.iter().enumerate() {
                prop_assert_eq!(ranking.position(n), Some(at));
            }
            for (start, len) in spans {
                let end = (start + len).min(order.len());
                let want = order.get(start.min(end)..end).unwrap_or(&[]).to_vec();
                prop_assert_eq!(ranking.span(start..start + len), want);
            }
            prop_assert_eq!(ranking.span(0..usize::MAX), order);
        }
    }

    #[test]
    fn a_node_not_ranked_has_no_position() {
        let all = nodes(&[1, 2, 3]);
        let ranking = Ranking::new(5, 0, &all[..2]);
        assert_eq!(ranking.position(&all[2]), None);
        assert_eq!(Ranking::new(5, 0, &[]).span(0..3), Vec::new());
    }
}
