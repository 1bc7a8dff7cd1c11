//! Closing ticks with sums: each tick's quorum sums in group order, late
//! sums put back into their tick (or, beyond the ticks kept, folded into
//! the next one), and what no sum covered counted.

use std::{collections::BTreeSet, sync::Arc};

use super::{
    GroupKey,
    replay::{Pass, TickSums},
};
use crate::{
    aggregate::Aggregate,
    codec::Payload,
    engine::{
        Engine, EngineEvent,
        receive::Applied,
        roster::{SETTLE_TICKS, WINDOW_TICKS},
        sum_guard::SumGuard,
    },
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
        let total: usize = sums.iter().map(|a| a.members.len()).sum();
        if total == 0 {
            return;
        }
        let n = total as u32;
        let outer_cfg = self.cfg.outer;
        for sum in &sums {
            let payload = Payload::parse(self.cfg.codec, self.anchor.len(), &sum.payload).expect("checked on arrival");
            let anchor = Arc::make_mut(&mut self.anchor);
            self.outer.accumulate(&outer_cfg, anchor, &payload, 1.0, n);
            for m in &sum.members {
                self.roster.record(m.id.src, self.tick_batch(m.base_tick, m.publish_tick));
                if pass == Pass::Slide || self.applied.contains(&m.id) {
                    self.inner_lr.observe(m.loss, m.samples);
                    continue;
                }
                self.note_contribution(m.id.src, key);
                let applied = Applied { id: m.id, payload_hash: m.payload_hash, samples: m.samples, loss: m.loss };
                self.count_applied(applied, m.weight, u64::from(m.staleness), total);
            }
        }
        self.close_outer_round(n, pass == Pass::Live);
    }
}
