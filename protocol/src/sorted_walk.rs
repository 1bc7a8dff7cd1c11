//! An ordered map walked together with a batch of keys in the same order.
//!
//! A tick's outer round books each of its members (up to the whole swarm)
//! in per-node maps that hold about as many nodes. One search per member
//! and map was about a fifth of the 1,000-node simulator's samples; one
//! pass over both sequences touches each entry once. Small batches still
//! search: a pass would read the whole map for them.

use std::collections::BTreeMap;

/// A batch this many times smaller than the map is searched key by key.
const SEARCH_BELOW: usize = 16;

/// Visits, for each item of `batch` (keys ascending, repeats allowed), the
/// value `map` holds for its key: `f` gets `Some(value)` to update in place,
/// or `None` where the map lacks the key, and a value it returns then is
/// inserted. Items of one key are visited in batch order, so the result is
/// the same as visiting the items one by one in batch order.
pub(crate) fn update_sorted<K: Ord + Copy, V, T: Copy>(
    map: &mut BTreeMap<K, V>,
    batch: &[(K, T)],
    mut f: impl FnMut(Option<&mut V>, T) -> Option<V>,
) {
    debug_assert!(batch.windows(2).all(|w| w[0].0 <= w[1].0), "batch not in key order");
    let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
        return;
    };
    let mut missing = Vec::new();
    if batch.len().saturating_mul(SEARCH_BELOW) < map.len() {
        missing.extend_from_slice(batch);
    } else {
        let mut entries = map.range_mut(first.0..=last.0).peekable();
        for &(k, t) in batch {
            while entries.next_if(|(mk, _)| **mk < k).is_some() {}
            match entries.peek_mut() {
                Some((mk, v)) if **mk == k => {
                    f(Some(v), t);
                }
                _ => missing.push((k, t)),
            }
        }
    }
    for (k, t) in missing {
        match map.get_mut(&k) {
            Some(v) => {
                f(Some(v), t);
            }
            None => {
                if let Some(v) = f(None, t) {
                    map.insert(k, v);
                }
            }
        }
    }
}

/// Calls `f` with each item of `batch` (keys ascending, repeats allowed)
/// and the value `map` holds for its key, if any, in batch order.
pub(crate) fn join_sorted<'a, K: Ord, V, T: Copy>(
    map: &'a BTreeMap<K, V>,
    batch: &[(K, T)],
    mut f: impl FnMut(&K, T, Option<&'a V>),
) {
    debug_assert!(batch.windows(2).all(|w| w[0].0 <= w[1].0), "batch not in key order");
    let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
        return;
    };
    if batch.len().saturating_mul(SEARCH_BELOW) < map.len() {
        for (k, t) in batch {
            f(k, *t, map.get(k));
        }
        return;
    }
    let mut entries = map.range(&first.0..=&last.0).peekable();
    for (k, t) in batch {
        while entries.next_if(|(mk, _)| *mk < k).is_some() {}
        f(k, *t, entries.peek().filter(|(mk, _)| *mk == k).map(|(_, v)| *v));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Adds the item to the value, or inserts it where the item is odd,
    /// and logs each visit: an order-dependent update.
    fn visit(log: &mut Vec<(u8, Option<u32>)>, v: Option<&mut u32>, t: u8) -> Option<u32> {
        log.push((t, v.as_deref().copied()));
        match v {
            Some(v) => {
                *v = v.wrapping_mul(3).wrapping_add(u32::from(t));
                None
            }
            None => (t % 2 == 1).then_some(u32::from(t)),
        }
    }

    proptest! {
        /// One pass gives the map and, key by key, the visits that one
        /// update per item in batch order gives; maps much larger than the
        /// batch (searched) included.
        #[test]
        fn a_pass_matches_one_update_per_item(
            map in prop::collection::btree_map(0u16..300, any::<u32>(), 0..200),
            mut batch in prop::collection::vec((0u16..300, any::<u8>()), 0..40),
        ) {
            batch.sort_by_key(|(k, _)| *k);
            let mut expected = map.clone();
            let mut expected_log: BTreeMap<u16, Vec<_>> = BTreeMap::new();
            for &(k, t) in &batch {
                let log = expected_log.entry(k).or_default();
                match expected.get_mut(&k) {
                    Some(v) => { visit(log, Some(v), t); }
                    None => if let Some(v) = visit(log, None, t) { expected.insert(k, v); },
                }
            }
            let mut got = map;
            let mut got_log: BTreeMap<u16, Vec<_>> = BTreeMap::new();
            // Each item carries its key, so that visits, which need not
            // come in batch order across keys, are logged under it.
            let keyed: Vec<(u16, (u16, u8))> = batch.iter().map(|&(k, t)| (k, (k, t))).collect();
            update_sorted(&mut got, &keyed, |v, (k, t)| visit(got_log.entry(k).or_default(), v, t));
            prop_assert_eq!(got, expected);
            prop_assert_eq!(got_log, expected_log);
        }

        /// A join finds what a search per item finds, in batch order.
        #[test]
        fn a_join_matches_one_search_per_item(
            map in prop::collection::btree_map(0u16..300, any::<u32>(), 0..200),
            mut batch in prop::collection::vec((0u16..300, any::<u8>()), 0..40),
        ) {
            batch.sort_by_key(|(k, _)| *k);
            let expected: Vec<_> = batch.iter().map(|(k, t)| (*t, map.get(k).copied())).collect();
            let mut got = Vec::new();
            join_sorted(&map, &batch, |_, t, v| got.push((t, v.copied())));
            prop_assert_eq!(got, expected);
        }
    }
}
