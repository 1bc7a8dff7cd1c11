//! Aggregated dissemination in the engine ([`crate::aggregate`]): a
//! source sends its update to its group's designated aggregators only;
//! they sum the group when it is complete (or one grace after the
//! tick) and announce the sum's hash; a replica fetches a group's sum once
//! a quorum of designated aggregators signed the same hash (from its
//! parent in the group's fan-out tree, which serves it once it holds it,
//! so no node serves more than a few copies), and applies
//! the tick's sums in group order, so replicas that apply the same sums
//! stay bit-identical. A group without a quorum sum is applied by nobody
//! who lacks one: its updates count as missed, never half-applied.

mod apply;
mod intake;
mod replay;
mod shared_sums;

pub use shared_sums::SharedSums;

#[cfg(test)]
pub(super) use replay::REPLAY_TICKS as REPLAY_TICKS_FOR_TESTS;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use super::{Engine, EngineEvent, Output, config::Schedule, staleness::staleness_weight};
use crate::{
    aggregate::{Aggregate, AggregateAnnouncement, AggregateMember, Ranking, group_of, tree_parent},
    codec::Payload,
    ids::{Hash32, NodeId},
    time::Micros,
    validate::RejectReason,
};

/// Aggregators sum their group at the latest one grace after the tick;
/// receivers wait two (the exchange wait in tick mode), so the sum still
/// reaches them.
const PUBLISH_SHARE_OF_GRACE: f64 = 1.0;

/// Graces the exchange waits in aggregation mode: one hop from sources to
/// aggregators, one for the sums to everyone.
pub(super) const EXCHANGE_GRACES: u64 = 2;

type GroupKey = (u64, u32);
/// A body that came before its quorum, and its hash.
type EarlyBody = (Hash32, Arc<Vec<u8>>);

/// One body hash and the designated aggregators that signed it.
#[derive(Clone, Debug)]
struct Vote {
    hash: Hash32,
    len: u64,
    members: u32,
    signers: Vec<NodeId>,
}

/// A quorum body being fetched.
#[derive(Clone, Debug)]
struct Fetch {
    /// Not asked yet: our parent in the tree should push it by then.
    due: Option<Micros>,
    hash: Hash32,
    len: u64,
    members: u32,
    sources: Vec<NodeId>,
}

/// One tick's roles, per group, in this node's view of the live set.
#[derive(Debug, Default)]
struct Roles {
    /// The designated aggregators.
    designated: Arc<Vec<Vec<NodeId>>>,
    /// The node this one takes the sum from (`None`: it aggregates, or
    /// is not on the roster).
    parent: Vec<Option<NodeId>>,
    /// The nodes this one passes the sum on to.
    children: Vec<Vec<NodeId>>,
    /// The membership generation whose live set they were worked out
    /// from (no roster yet), or `None`: from the roster.
    view: Option<u64>,
}

/// What a replica knows about the sums of open ticks.
#[derive(Debug, Default)]
pub(super) struct AggregationState {
    /// Each tick's roles, from the view when first needed.
    roles: BTreeMap<u64, Arc<Roles>>,
    /// Bodies that arrived before their quorum (pushed down the tree), at
    /// most `aggregators` per group.
    early: BTreeMap<GroupKey, Vec<EarlyBody>>,
    /// Groups whose sum this node passed on to its children.
    pushed: BTreeSet<GroupKey>,
    /// Groups expected in a tick (some live, recently contributing member).
    expected: BTreeMap<u64, Arc<BTreeSet<u32>>>,
    /// Groups this node summed (or found empty), and the sums it built.
    summed: BTreeSet<GroupKey>,
    own: BTreeMap<GroupKey, (Hash32, Arc<Aggregate>)>,
    votes: BTreeMap<GroupKey, Vec<Vote>>,
    fetching: BTreeMap<GroupKey, Fetch>,
    /// Quorum sums held, ready to apply.
    held: BTreeMap<GroupKey, Arc<Aggregate>>,
    /// Groups whose sum this replica applied.
    applied: BTreeSet<GroupKey>,
    /// When this node must sum a group it is designated for.
    pub(super) wake_at: Option<Micros>,
    /// The last closed ticks and the state before them, for late sums.
    pub(super) replay: replay::ReplayLog,
    /// Decoded sums shared with the other engines of this process, if any.
    pub(super) shared: Option<SharedSums>,
}

impl AggregationState {
    /// Ticks whose bookkeeping is kept (bounded by the staleness window).
    #[cfg(test)]
    pub(super) fn ticks_kept(&self) -> usize {
        self.roles.len().max(self.expected.len())
    }

    /// Forgets every tick before `key`.
    fn forget_before(&mut self, key: u64) {
        let keep = |k: &GroupKey| k.0 >= key;
        self.roles.retain(|k, _| *k >= key);
        self.early.retain(|k, _| keep(k));
        self.pushed.retain(keep);
        self.expected.retain(|k, _| *k >= key);
        self.summed.retain(keep);
        self.own.retain(|k, _| keep(k));
        self.votes.retain(|k, _| keep(k));
        self.fetching.retain(|k, _| keep(k));
        self.held.retain(|k, _| keep(k));
        self.applied.retain(keep);
    }
}

impl Engine {
    /// Shares decoded sums with the other engines given a clone of
    /// `shared` (the simulator's replicas): one allocation per sum instead
    /// of one per replica. What the engine applies does not change.
    pub fn share_decoded_sums(&mut self, shared: SharedSums) {
        self.aggregation.shared = Some(shared);
    }

    /// The designated aggregators of each group of tick `key`.
    pub(super) fn designated(&mut self, key: u64) -> Arc<Vec<Vec<NodeId>>> {
        self.roles(key).designated.clone()
    }

    /// Our parent in group `group`'s tree of tick `key`: the one node
    /// whose offer of that sum a shell takes (others ask a signer).
    /// `None` outside the ticks whose sums are still taken (roles of far
    /// ticks are not worked out, or kept, for a peer's say-so).
    pub fn sum_parent(&mut self, key: u64, group: u32) -> Option<NodeId> {
        let (open, slack) = (self.first_open_key(), u64::from(self.cfg.staleness.tau_max));
        if key.saturating_add(slack) < open || key > open.saturating_add(slack + super::FUTURE_TICK_SLACK) {
            return None;
        }
        self.roles(key).parent.get(group as usize).copied().flatten()
    }

    /// Tick `key`'s roles ([`Roles`]): from the roster, worked out once;
    /// before the roster names anyone (a run's first sums), from our view
    /// of the live set, worked out again when it changes or the roster
    /// comes to name nodes for the tick (see also the quorum in `vote`). A node alone
    /// that fixed a tick's roles before its first peers joined refused
    /// their quorum sums of that tick as not its aggregators' and was a
    /// sum apart from them from then on.
    fn roles(&mut self, key: u64) -> Arc<Roles> {
        let Some(cfg) = self.cfg.aggregation else {
            return Arc::default();
        };
        let generation = self.membership.generation();
        if let Some(r) = self.aggregation.roles.get(&key) {
            // From the view: kept while the live set is the same and the
            // roster still names no one for this tick.
            let current = r.view.is_none_or(|g| g == generation && self.roster.eligible(key).next().is_none());
            if current {
                return r.clone();
            }
        }
        let me = self.me;
        // The roster, the same at every replica that applied the same
        // sums; our view of the live set only before any tick settled.
        // Both in id order, as the ranking takes them.
        let mut eligible: Vec<NodeId> = self.roster.eligible(key).collect();
        let view = eligible.is_empty().then_some(generation);
        if view.is_some() {
            eligible = self.live_ids().collect();
            eligible.sort_unstable();
        }
        let (mut roles, mut designated) = (Roles { view, ..Roles::default() }, Vec::new());
        let (r, fanout) = (cfg.aggregators as usize, cfg.fanout as usize);
        for g in 0..cfg.groups {
            let mut ranking = Ranking::new(key, g, &eligible);
            // Not on the roster (a joiner): no role, sums fetched from signers.
            let at = ranking.position(&me);
            let parent = at.and_then(|at| tree_parent(at, cfg.aggregators, cfg.fanout));
            roles.parent.push(parent.and_then(|p| ranking.span(p..p + 1).first().copied()));
            // The positions whose parent is ours (see `tree_parent`).
            let children = at.map_or_else(Vec::new, |at| {
                let first = r + at * fanout;
                ranking.span(first..first + fanout)
            });
            roles.children.push(children);
            designated.push(ranking.span(0..r));
        }
        roles.designated = Arc::new(designated);
        let roles = Arc::new(roles);
        self.aggregation.roles.insert(key, roles.clone());
        roles
    }

    /// The live set in our view, us included.
    fn live_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.membership.peers().map(|(id, _)| *id).chain(std::iter::once(self.me))
    }

    /// Where our own update of batch `key` goes: its group's aggregators
    /// (empty without aggregation: everyone).
    pub(super) fn publish_targets(&mut self, key: u64) -> Vec<NodeId> {
        let Some(cfg) = self.cfg.aggregation else {
            return Vec::new();
        };
        let g = group_of(key, &self.me, cfg.groups);
        let me = self.me;
        self.designated(key)[g as usize].iter().copied().filter(|n| *n != me).collect()
    }

    /// The live nodes expected to contribute to tick `key`: those that
    /// contributed in the tick before or later, or never yet (as the
    /// exchange wait counts), and us if our last round was of `key`. One
    /// pass over the live set and the contributions, both in id order:
    /// every tick of every replica asks this of the whole swarm.
    fn expected_ids(&self, key: u64) -> impl Iterator<Item = NodeId> + '_ {
        let mut last = self.last_tick_of.iter().peekable();
        let peers = self.membership.peers().map(|(id, _)| *id).filter(move |id| {
            while last.next_if(|(n, _)| *n < id).is_some() {}
            last.peek().filter(|(n, _)| *n == id).is_none_or(|(_, t)| **t + 1 >= key)
        });
        peers.chain((self.last_base_tick == Some(key)).then_some(self.me))
    }

    /// The groups of tick `key` with an expected member.
    fn expected_groups(&mut self, key: u64) -> Arc<BTreeSet<u32>> {
        let Some(cfg) = self.cfg.aggregation else {
            return Arc::default();
        };
        if let Some(e) = self.aggregation.expected.get(&key) {
            return e.clone();
        }
        let groups: BTreeSet<u32> = self.expected_ids(key).map(|n| group_of(key, &n, cfg.groups)).collect();
        let groups = Arc::new(groups);
        self.aggregation.expected.insert(key, groups.clone());
        groups
    }

    /// The exchange wait: every expected group of tick `key` has its quorum sum.
    pub(super) fn aggregates_complete(&mut self, key: u64) -> bool {
        let expected = self.expected_groups(key);
        expected.iter().all(|g| self.aggregation.held.contains_key(&(key, *g)))
    }

    /// Pending updates of tick `key` in group `group`, in id order.
    fn group_members(&self, key: u64, group: u32) -> Vec<usize> {
        let Some(cfg) = self.cfg.aggregation else {
            return Vec::new();
        };
        let mut idx: Vec<usize> = (0..self.pending.len())
            .filter(|i| {
                let a = &self.pending[*i].announcement;
                self.batch_key(a) == key && group_of(key, &a.id.src, cfg.groups) == group
            })
            .collect();
        idx.sort_by_key(|i| self.pending[*i].announcement.id);
        idx
    }

    /// Every expected member of the group has its update here.
    fn group_complete(&self, key: u64, group: u32, have: usize) -> bool {
        let Some(cfg) = self.cfg.aggregation else {
            return false;
        };
        let expected = self.expected_ids(key).filter(|n| group_of(key, n, cfg.groups) == group).count();
        have >= expected
    }

    /// Sums the groups this node is designated for whose tick has ended,
    /// once complete or at the publish deadline; sets the wake-up for the rest.
    pub(super) fn publish_due_aggregates(&mut self, now: Micros) {
        let (Some(_), Schedule::Tick { grace, .. }) = (self.cfg.aggregation, self.cfg.schedule) else {
            return;
        };
        let Some(clock) = self.clock.clone() else {
            return;
        };
        let tick = clock.tick(now);
        let period = clock.period().as_secs_f64();
        let deadline_of =
            |k: u64| clock.boundary(k + 1) + Micros::from_secs_f64(period * grace as f64 * PUBLISH_SHARE_OF_GRACE);
        // Not the ticks before our first round: a joiner holds their
        // updates from the state it took, but its holder and the others
        // settled those ticks' sums (or their lack) without it; a sum of
        // ours would arrive after they closed them.
        let first = self.first_base_tick.unwrap_or(tick).max(self.first_open_key());
        let keys: BTreeSet<u64> =
            self.pending.iter().map(|p| self.batch_key(&p.announcement)).filter(|k| *k < tick && *k >= first).collect();
        let mut wake: Option<Micros> = None;
        for key in keys {
            let deadline = deadline_of(key);
            let designated = self.designated(key);
            for (g, aggregators) in designated.iter().enumerate() {
                let g = g as u32;
                if !aggregators.contains(&self.me) || self.aggregation.summed.contains(&(key, g)) {
                    continue;
                }
                let members = self.group_members(key, g);
                if members.is_empty() {
                    continue;
                }
                if now >= deadline || self.group_complete(key, g, members.len()) {
                    self.sum_group(now, key, g, &members);
                } else {
                    wake = Some(wake.map_or(deadline, |w| w.min(deadline)));
                }
            }
        }
        let fetch_due = self.ask_overdue(now);
        self.aggregation.wake_at = match (wake, fetch_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Builds, records and publishes the sum of `members` (pending indices).
    fn sum_group(&mut self, now: Micros, key: u64, group: u32, members: &[usize]) {
        self.aggregation.summed.insert((key, group));
        let n = self.anchor.len();
        let live = self.membership.live_count();
        let mut parts = Vec::with_capacity(members.len());
        for &i in members {
            let a = &self.pending[i].announcement;
            let tau = self.staleness(a, Some(key));
            if tau > self.cfg.staleness.tau_max as u64 {
                continue;
            }
            let Ok(payload) = Payload::parse(self.cfg.codec, n, &self.pending[i].bytes) else {
                continue; // another codec: checked on arrival, never summed
            };
            let member = AggregateMember {
                id: a.id,
                base_tick: a.base_tick,
                publish_tick: a.publish_tick,
                samples: a.samples,
                staleness: tau.min(u32::MAX as u64) as u32,
                loss: a.loss,
                weight: staleness_weight(&self.cfg.staleness, tau, live),
                payload_hash: a.payload_hash,
            };
            parts.push((member, payload));
        }
        if parts.is_empty() {
            return;
        }
        let aggregate = Aggregate::build(parts, self.cfg.codec, n);
        let body = aggregate.encode();
        let hash = Hash32::of(&body);
        let announcement = AggregateAnnouncement {
            run_id: self.run_id,
            key,
            group,
            aggregator: self.me,
            members: aggregate.members.len() as u32,
            body_len: body.len() as u64,
            body_hash: hash,
        };
        self.aggregation.own.insert((key, group), (hash, Arc::new(aggregate)));
        let body = Arc::new(body);
        self.emit(Output::PublishAggregate { announcement: announcement.clone(), body: body.clone() });
        self.push_down((key, group), hash, body);
        let me = self.me;
        self.vote(now, &announcement, me);
    }

    fn refuse_aggregate(&mut self, key: u64, group: u32, from: NodeId, reason: RejectReason) {
        *self.stats.dropped.entry(reason).or_insert(0) += 1;
        self.event(EngineEvent::AggregateRefused { key, group, from, reason });
    }
}
