//! Receiving sums: aggregators' signed hashes (votes), bodies pushed down
//! the group's tree or fetched from a signer, and the quorum that makes a
//! body usable.

use std::sync::Arc;

use super::{Fetch, GroupKey, Vote};
use crate::{
    aggregate::{Aggregate, AggregateAnnouncement, AggregateError, group_of},
    engine::{Engine, Output, config::Schedule},
    ids::{Hash32, NodeId},
    time::Micros,
    validate::RejectReason,
};

impl Engine {
    pub(in crate::engine) fn on_aggregate_announcement(&mut self, now: Micros, a: AggregateAnnouncement, from: NodeId) {
        if self.cfg.aggregation.is_none() {
            return;
        }
        match self.aggregate_announcement_verdict(now, &a) {
            Some(r) => self.refuse_aggregate(a.key, a.group, from, r),
            None => self.vote(now, &a, a.aggregator),
        }
    }

    /// Why this replica would refuse a sum's signed hash now, or `None`:
    /// the checks made on arrival, so that a shell can tell its gossip layer
    /// not to pass on a hash that no replica in step would count (and to
    /// lower the sender's score where the refusal is misbehaviour).
    pub fn aggregate_announcement_verdict(&mut self, now: Micros, a: &AggregateAnnouncement) -> Option<RejectReason> {
        let Some(cfg) = self.cfg.aggregation else {
            return Some(RejectReason::AggregateMismatch);
        };
        let (key, group) = (a.key, a.group);
        if a.run_id != self.run_id {
            Some(RejectReason::WrongRun)
        } else if group >= cfg.groups || a.members == 0 {
            Some(RejectReason::AggregateMismatch)
        } else if a.body_len > Aggregate::max_len(self.cfg.codec, self.anchor.len()) as u64 {
            Some(RejectReason::TooLarge)
        } else if key.saturating_add(u64::from(self.cfg.staleness.tau_max)) < self.first_open_key() {
            Some(RejectReason::TooStale)
        } else if self.clock.as_ref().is_some_and(|c| key > c.tick(now) + crate::engine::FUTURE_TICK_SLACK) {
            Some(RejectReason::FromTheFuture)
        } else if !self.designated(key)[group as usize].contains(&a.aggregator) {
            Some(RejectReason::NotAnAggregator)
        } else {
            None
        }
    }

    /// Counts `signer`'s signature on `a`'s body (one per signer and
    /// group: a second, different body from the same signer is ignored),
    /// and fetches the body once a quorum agrees.
    pub(super) fn vote(&mut self, now: Micros, a: &AggregateAnnouncement, signer: NodeId) {
        let Some(cfg) = self.cfg.aggregation else {
            return;
        };
        let k = (a.key, a.group);
        let votes = self.aggregation.votes.entry(k).or_default();
        if votes.iter().any(|v| v.signers.contains(&signer)) {
            return;
        }
        let at = match votes.iter().position(|v| (v.hash, v.len, v.members) == (a.body_hash, a.body_len, a.members)) {
            Some(i) => i,
            None => {
                votes.push(Vote { hash: a.body_hash, len: a.body_len, members: a.members, signers: Vec::new() });
                votes.len() - 1
            }
        };
        votes[at].signers.push(signer);
        let vote = votes[at].clone();
        // A body that came down the tree before this vote passes on now.
        let early = self.early_body(k, &vote.hash);
        if let Some(bytes) = &early {
            self.push_down(k, vote.hash, bytes.clone());
        }
        // Signers the tick's roles name now: roles worked out from the live
        // view change with it (no roster yet), and a quorum must not mix
        // signers of two views.
        let designated = self.designated(a.key);
        let named = vote.signers.iter().filter(|s| designated[a.group as usize].contains(s)).count();
        if named < cfg.quorum as usize
            || self.aggregation.applied.contains(&k)
            || self.aggregation.held.contains_key(&k)
            || self.aggregation.fetching.contains_key(&k)
        {
            return;
        }
        if let Some((hash, own)) = self.aggregation.own.get(&k)
            && *hash == vote.hash
        {
            let own = own.clone();
            self.aggregation.held.insert(k, own);
            self.aggregation.early.remove(&k);
            return;
        }
        if let Some(bytes) = early {
            self.take_body(k, vote.members, signer, vote.hash, &bytes);
            return;
        }
        // Our parent in the group's tree pushes it down unasked; the
        // signers are asked only if it has not come a grace later.
        let me = self.me;
        let sources: Vec<NodeId> = vote.signers.iter().copied().filter(|s| *s != me).collect();
        let has_parent = self.roles(a.key).parent.get(a.group as usize).copied().flatten().is_some();
        let due = has_parent.then(|| now + self.grace_time());
        let fetch = Fetch { due, hash: vote.hash, len: vote.len, members: vote.members, sources };
        self.aggregation.fetching.insert(k, fetch);
        if due.is_none() {
            self.ask_next_source(k);
        }
    }

    /// One grace of the tick clock (the wait for a hop).
    pub(in crate::engine) fn grace_time(&self) -> Micros {
        match (self.cfg.schedule, self.clock.as_ref()) {
            (Schedule::Tick { grace, .. }, Some(c)) => Micros::from_secs_f64(c.period().as_secs_f64() * grace as f64),
            _ => Micros::ZERO,
        }
    }

    /// Asks the first remaining source of a fetch; gives it up when none is left.
    fn ask_next_source(&mut self, k: GroupKey) {
        let Some(f) = self.aggregation.fetching.get_mut(&k) else {
            return;
        };
        f.due = None;
        match f.sources.first() {
            Some(&from) => {
                let (len, hash) = (f.len, f.hash);
                self.emit(Output::FetchAggregate { key: k.0, group: k.1, from, len, hash });
            }
            None => {
                self.aggregation.fetching.remove(&k);
            }
        }
    }

    /// Asks for the sums our parent has not pushed in time; the next such time.
    pub(super) fn ask_overdue(&mut self, now: Micros) -> Option<Micros> {
        let overdue: Vec<GroupKey> = self
            .aggregation
            .fetching
            .iter()
            .filter(|(_, f)| f.due.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for k in overdue {
            self.ask_next_source(k);
        }
        self.aggregation.fetching.values().filter_map(|f| f.due).min()
    }

    /// A body with hash `hash` that arrived before its quorum.
    fn early_body(&self, k: GroupKey, hash: &Hash32) -> Option<Arc<Vec<u8>>> {
        self.aggregation.early.get(&k)?.iter().find(|(h, _)| h == hash).map(|(_, b)| b.clone())
    }

    /// Passes a sum on to this node's children in its group's tree, once:
    /// only sums a designated aggregator signed (or our own) travel.
    pub(super) fn push_down(&mut self, k: GroupKey, hash: Hash32, body: Arc<Vec<u8>>) {
        if !self.aggregation.pushed.insert(k) {
            return;
        }
        let to = self.roles(k.0).children.get(k.1 as usize).cloned().unwrap_or_default();
        if !to.is_empty() {
            self.emit(Output::SendAggregate { key: k.0, group: k.1, hash, to, body });
        }
    }

    /// Asks the next source after `from` failed; gives the group up when none is left.
    pub(in crate::engine) fn next_aggregate_source(&mut self, key: u64, group: u32, from: NodeId) {
        let Some(f) = self.aggregation.fetching.get_mut(&(key, group)) else {
            return;
        };
        if f.due.is_some() {
            return; // not asked yet: a failure from an earlier ask
        }
        f.sources.retain(|s| *s != from);
        self.ask_next_source((key, group));
    }

    /// A body fetched from `from`, or pushed by it down the group's tree.
    pub(in crate::engine) fn on_aggregate_body(&mut self, key: u64, group: u32, from: NodeId, bytes: Arc<Vec<u8>>) {
        let Some(cfg) = self.cfg.aggregation else {
            return;
        };
        let k = (key, group);
        if group >= cfg.groups || self.aggregation.applied.contains(&k) || self.aggregation.held.contains_key(&k) {
            return;
        }
        let hash = Hash32::of(&bytes);
        if let Some(f) = self.aggregation.fetching.get(&k) {
            if bytes.len() as u64 == f.len && hash == f.hash {
                let members = f.members;
                self.aggregation.fetching.remove(&k);
                self.push_down(k, hash, bytes.clone());
                self.take_body(k, members, from, hash, &bytes);
                return;
            }
            if f.due.is_none() && f.sources.first() == Some(&from) {
                // The holder we asked sent another body; another may not.
                self.refuse_aggregate(key, group, from, RejectReason::HashMismatch);
                self.next_aggregate_source(key, group, from);
                return;
            }
        }
        // Pushed before its quorum: kept (a few per group, for open ticks
        // only), passed on once a designated aggregator signed its hash.
        let open = self.first_open_key();
        let slack = u64::from(self.cfg.staleness.tau_max);
        let max = Aggregate::max_len(self.cfg.codec, self.anchor.len());
        let refused = if key.saturating_add(slack) < open {
            Some(RejectReason::TooStale)
        } else if key > open.saturating_add(slack + crate::engine::FUTURE_TICK_SLACK) {
            Some(RejectReason::FromTheFuture)
        } else if bytes.len() > max {
            Some(RejectReason::TooLarge)
        } else {
            None
        };
        if let Some(reason) = refused {
            self.refuse_aggregate(key, group, from, reason);
            return;
        }
        let early = self.aggregation.early.entry(k).or_default();
        if early.iter().any(|(h, _)| *h == hash) {
            return; // a second copy
        }
        if early.len() >= cfg.aggregators as usize {
            // More distinct bodies than aggregators: someone is making them up.
            self.refuse_aggregate(key, group, from, RejectReason::AggregateMismatch);
            return;
        }
        early.push((hash, bytes.clone()));
        let vote = self.aggregation.votes.get(&k).and_then(|v| v.iter().find(|v| v.hash == hash)).cloned();
        if let Some(vote) = vote {
            self.push_down(k, hash, bytes.clone());
            if vote.signers.len() >= cfg.quorum as usize {
                self.take_body(k, vote.members, from, hash, &bytes);
            }
        }
    }

    /// Decodes a body whose hash (`hash`, computed here) a quorum signed
    /// and holds it for its tick.
    fn take_body(&mut self, k: GroupKey, members: u32, from: NodeId, hash: Hash32, bytes: &[u8]) {
        let (key, group) = k;
        let (codec, n) = (self.cfg.codec, self.anchor.len());
        let decoded = match &self.aggregation.shared {
            Some(shared) => shared.decode(hash, bytes, codec, n),
            None => Aggregate::decode(bytes, codec, n).map(Arc::new),
        };
        // The quorum signed these very bytes: if they are unusable, no
        // other holder has better ones.
        let aggregate = match decoded {
            Ok(a) => a,
            Err(e) => {
                let reason = match e {
                    AggregateError::TooLarge { .. } => RejectReason::TooLarge,
                    AggregateError::Payload(_) => RejectReason::ShapeMismatch,
                    AggregateError::Member(_) | AggregateError::NonFinite => RejectReason::NonFinite,
                    AggregateError::Malformed(_) | AggregateError::Members => RejectReason::Malformed,
                };
                self.refuse_aggregate(key, group, from, reason);
                return;
            }
        };
        if !self.members_belong(key, group, members, &aggregate) {
            self.refuse_aggregate(key, group, from, RejectReason::AggregateMismatch);
            return;
        }
        self.aggregation.held.insert(k, aggregate);
        self.aggregation.early.remove(&k);
    }

    /// The members are as many as announced, all of this group and tick,
    /// and none applied or given up here.
    fn members_belong(&self, key: u64, group: u32, count: u32, aggregate: &Aggregate) -> bool {
        let Some(cfg) = self.cfg.aggregation else {
            return false;
        };
        if aggregate.members.len() != count as usize
            || !aggregate.members.iter().all(|m| {
                self.tick_batch(m.base_tick, m.publish_tick) == key && group_of(key, &m.id.src, cfg.groups) == group
            })
        {
            return false;
        }
        // Decoding checked that the members are in id order.
        let ids: Vec<(NodeId, u64)> = aggregate.members.iter().map(|m| (m.id.src, m.id.round)).collect();
        !self.applied.contains_any_sorted(&ids) && !self.given_up.contains_any_sorted(&ids)
    }
}
