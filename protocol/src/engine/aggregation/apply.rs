//! Closing ticks with sums: each tick's quorum sums in group order, late
//! sums put back into their tick (or, beyond the ticks kept, folded into
//! the next one), and what no sum covered counted.

use std::{collections::BTreeSet, sync::Arc};

use super::{
    GroupKey,
    replay::{Pass, TickSums},
};
use crate::{
    aggregate::{Aggregate, AggregateMember},
    codec::Payload,
    engine::{
        Engine, EngineEvent,
        receive::Applied,
        roster::{SETTLE_TICKS, WINDOW_TICKS},
        sum_guard::SumGuard,
    },
    ids::NodeId,
    validate::RejectReason,
};

impl Engine {
    /// Closes the ticks before `upto` (all when `None`): each tick's quorum
    /// sums in group order, one outer round per tick. A sum that arrived
    /// after its tick closed here is put back into its tick while that is
    /// kept ([`super::replay`]); an older one joins the first tick closed
    /// now, as a late update does. Pending updates of closed ticks leave the queue
    /// (counted as missed until a sum brings them).
    pub(in crate::engine) fn apply_aggregates(&mut self, upto: Option<u64>) {
        let Some(cfg) = self.cfg.aggregation else {
            return;
        };
        let before = |k: u64| upto.is_none_or(|u| k < u);
        let open = self.first_open_key();
        let mut keys: BTreeSet<u64> =
            self.aggregation.held.keys().map(|(k, _)| *k).filter(|k| before(*k) && *k >= open).collect();
        keys.extend(self.aggregation.expected.keys().copied().filter(|k| before(*k) && *k >= open));
        let late: Vec<GroupKey> = self.aggregation.held.keys().copied().filter(|(k, _)| *k < open).collect();
        let mut late = self.replay_late(late);
        for key in keys {
            let expected = self.expected_groups(key);
            let mut sums = Vec::new();
            for (k, g) in std::mem::take(&mut late) {
                self.event(EngineEvent::LateAggregate { key: k, group: g, applied_in: key });
                sums.extend(self.take_held((k, g)).map(|a| ((k, g), a)));
            }
            for g in 0..cfg.groups {
                match self.take_held((key, g)) {
                    Some(a) => sums.push(((key, g), a)),
                    None if expected.contains(&g) => self.event(EngineEvent::AggregateMissed { key, group: g }),
                    None => {}
                }
            }
            self.apply_sums(key, sums);
        }
        // Every tick before `upto` is closed now, with sums or without: the
        // first open tick follows the clock even while no quorum forms (a
        // node alone, a group of one), so that what is too stale, what a
        // state a joiner takes leaves out and what is forgotten are the same
        // at every replica in step. A sum of a tick closed empty that comes
        // later joins the next tick, as a late sum does.
        if let Some(u) = upto.filter(|u| *u > 0) {
            self.last_closed_key = self.last_closed_key.max(Some(u - 1));
        }
        // Nobody sums these any more here; a late sum may still bring them.
        let (closed, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| before(self.batch_key(&p.announcement)));
        self.pending = later;
        self.index_pending();
        let missed: Vec<_> = closed.iter().map(|p| p.announcement.id).filter(|id| !self.applied.contains(id)).collect();
        for id in missed {
            *self.stats.dropped.entry(RejectReason::MissedAggregate).or_insert(0) += 1;
            self.event(EngineEvent::Dropped { id, reason: RejectReason::MissedAggregate });
        }
        // Late sums are taken within the staleness bound.
        let keep_from = self.first_open_key().saturating_sub(u64::from(self.cfg.staleness.tau_max) + 1);
        self.aggregation.forget_before(keep_from);
        self.roster.forget_before(keep_from.saturating_sub(SETTLE_TICKS + WINDOW_TICKS));
    }

    /// The sums the norm guard admits, in order, each recorded as it is
    /// admitted; the others refused (`NormTooLarge`, from their first
    /// signer, reported once: when their tick closes or they come late),
    /// their members never applied.
    fn guard_sums(&mut self, sums: &TickSums, pass: Pass) -> Vec<Arc<Aggregate>> {
        let n = self.anchor.len();
        let mut admitted = Vec::with_capacity(sums.len());
        for (k, sum) in sums {
            let (k, sum) = (*k, sum.clone());
            let payload = Payload::parse(self.cfg.codec, n, &sum.payload).expect("checked on arrival");
            let Some(norm) = SumGuard::scaled_norm(&sum, payload.finite_and_norm_sq().1) else {
                admitted.push(sum);
                continue;
            };
            if self.sum_guard.admits(norm) {
                self.sum_guard.record(norm);
                admitted.push(sum);
            } else if pass == Pass::Live || (pass == Pass::Replay && self.aggregation.replay.put_back(k)) {
                let signer = self.aggregation.votes.get(&k).and_then(|v| v.iter().max_by_key(|v| v.signers.len()));
                let from = signer.and_then(|v| v.signers.first().copied()).unwrap_or(self.me);
                self.refuse_aggregate(k.0, k.1, from, RejectReason::NormTooLarge);
            }
        }
        admitted
    }

    /// Removes a held sum to apply it; its group is never fetched again.
    pub(super) fn take_held(&mut self, k: GroupKey) -> Option<Arc<Aggregate>> {
        let sum = self.aggregation.held.remove(&k)?;
        self.aggregation.applied.insert(k);
        Some(sum)
    }

    /// Closes tick `key` with its sums, and keeps them so that a late sum
    /// of this tick can still be put back into it.
    fn apply_sums(&mut self, key: u64, sums: TickSums) {
        self.before_tick(key);
        self.outer_round_of_sums(key, &sums, Pass::Live);
        self.last_closed_key = Some(key);
        self.after_tick(key, sums);
    }

    /// One tick's outer round: the sums the norm guard admits into the
    /// anchor, their members into the roster and the swarm's loss, and the
    /// books `pass` keeps.
    pub(super) fn outer_round_of_sums(&mut self, key: u64, sums: &TickSums, pass: Pass) {
        let sums = self.guard_sums(sums, pass);
        let members: Vec<&AggregateMember> = sums.iter().flat_map(|a| &a.members).collect();
        if members.is_empty() {
            return;
        }
        let total = members.len();
        let n = total as u32;
        let outer_cfg = self.cfg.outer;
        for sum in &sums {
            let payload = Payload::parse(self.cfg.codec, self.anchor.len(), &sum.payload).expect("checked on arrival");
            let anchor = Arc::make_mut(&mut self.anchor);
            self.outer.accumulate(&outer_cfg, anchor, &payload, 1.0, n);
        }
        let new = self.book_members(key, &members, pass);
        for (m, new) in members.into_iter().zip(new) {
            if !new {
                self.inner_lr.observe(m.loss, m.samples);
                continue;
            }
            let applied = Applied { id: m.id, payload_hash: m.payload_hash, samples: m.samples, loss: m.loss };
            self.count_booked(applied, m.weight, u64::from(m.staleness), total);
        }
        self.close_outer_round(n, pass == Pass::Live);
    }

    /// Books a tick's members in the replica's per-node maps, one pass per
    /// map in id order: each in the roster; on a live pass, each not yet
    /// applied in the applied set, the version vector and the live
    /// contributors' last ticks. Says which were new, in `members`' order
    /// (as booking them one by one in that order would).
    fn book_members(&mut self, key: u64, members: &[&AggregateMember], pass: Pass) -> Vec<bool> {
        // The key beside the index, so that sorting reads no member; each
        // sum is in id order already, so this merges runs. Stable: a
        // source's updates keep their order.
        let mut order: Vec<(NodeId, usize)> = members.iter().enumerate().map(|(i, m)| (m.id.src, i)).collect();
        order.sort_by_key(|a| a.0);
        let ticks: Vec<(NodeId, u64)> = order
            .iter()
            .map(|&(src, i)| (src, self.tick_batch(members[i].base_tick, members[i].publish_tick)))
            .collect();
        self.roster.record_sorted(&ticks);
        let mut new = vec![false; members.len()];
        if pass == Pass::Slide {
            return new;
        }
        let ids: Vec<(NodeId, (u64, usize))> = order.iter().map(|&(src, i)| (src, (members[i].id.round, i))).collect();
        self.applied.insert_new_sorted(&ids, |i| new[i] = true);
        let sources: Vec<(NodeId, ())> = order.iter().filter(|(_, i)| new[*i]).map(|&(src, _)| (src, ())).collect();
        self.version.increment_sorted(&sources);
        let mut once = sources;
        once.dedup_by_key(|(src, ())| *src);
        self.note_contributions_sorted(&once, key);
        new
    }
}
