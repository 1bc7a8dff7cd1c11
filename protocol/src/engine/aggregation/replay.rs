//! Late sums put back into their own tick. A replica keeps its replicated
//! state from before its last few closed ticks and the sums each of them
//! applied; a sum that arrives after its tick closed here is inserted where
//! the replicas that had it in time applied it, and those ticks are
//! recomputed. The replica then ends bit-identical to them, instead of one
//! normaliser and one momentum step apart: a drift that anti-entropy's
//! pairwise averaging narrows but never closes, so it kept fetching whole
//! replica states every round.

use std::{collections::VecDeque, sync::Arc};

use super::GroupKey;
use crate::{
    aggregate::Aggregate,
    engine::{
        Engine, EngineEvent,
        inner_lr::InnerLrState,
        outer::OuterState,
        roster::{Roster, SETTLE_TICKS, WINDOW_TICKS},
        sum_guard::SumGuard,
    },
};

/// Most closed ticks a late sum can still be put back into. Within it,
/// every tick whose late sums are still taken (the staleness bound) is
/// kept: a sum folded into a later tick instead sets this replica apart
/// for good, as anti-entropy's averages never make replicas one again.
/// Each tick kept holds its sums; one state copy (anchor and outer
/// vectors) is kept whatever the window.
pub(in crate::engine) const REPLAY_TICKS: usize = 8;
/// Most bytes of sums kept for it: a large model keeps fewer ticks (at a
/// byte a parameter and 8 groups, 8 ticks of a 4M-parameter model).
const REPLAY_BYTES: usize = 256 << 20;

/// One tick's sums, in the order its outer round applied them.
pub(super) type TickSums = Vec<(GroupKey, Arc<Aggregate>)>;

/// The state an outer round changes, the same at every replica that
/// applied the same sums.
#[derive(Clone, Debug)]
struct Replicated {
    anchor: Arc<Vec<f32>>,
    outer: OuterState,
    inner_lr: InnerLrState,
    roster: Roster,
    sum_guard: SumGuard,
}

/// The closed ticks a late sum can join, and the state before them.
#[derive(Debug)]
pub(in crate::engine) struct ReplayLog {
    /// Ticks kept (0: late sums join the next tick instead).
    window: usize,
    /// The replicated state before the first kept tick.
    base: Option<Replicated>,
    /// The first tick the base precedes: later sums can be put back.
    base_key: u64,
    /// The ticks closed since the base, each with its sums.
    ticks: VecDeque<(u64, TickSums)>,
    /// The late sums being put back (while their ticks are recomputed).
    putting_back: Vec<GroupKey>,
}

impl Default for ReplayLog {
    fn default() -> Self {
        Self { window: REPLAY_TICKS, base: None, base_key: 0, ticks: VecDeque::new(), putting_back: Vec::new() }
    }
}

impl ReplayLog {
    /// Whether a late sum of tick `key` can be put back into its tick.
    fn covers(&self, key: u64) -> bool {
        self.base.is_some() && key >= self.base_key
    }

    /// Whether `k` is a late sum being put back now (its refusal, if the
    /// guard refuses it, is reported; the others' were when their tick
    /// closed).
    pub(super) fn put_back(&self, k: GroupKey) -> bool {
        self.putting_back.contains(&k)
    }

    /// Forgets everything: the state changed outside the outer rounds (an
    /// anchor averaged with a peer's, a replica state taken).
    pub(in crate::engine) fn clear(&mut self) {
        self.base = None;
        self.ticks.clear();
    }

    /// Sums kept for the closed ticks.
    #[cfg(test)]
    pub(in crate::engine) fn kept_sums(&self) -> usize {
        self.ticks.iter().map(|(_, sums)| sums.len()).sum()
    }

    #[cfg(test)]
    pub(in crate::engine) fn set_window(&mut self, ticks: usize) {
        self.window = ticks;
        self.clear();
    }
}

/// Which books a tick's outer round keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// Closing the tick: every member booked, every event.
    Live,
    /// Recomputing kept ticks after a late sum: members booked only if not
    /// yet applied (the late sum's), no outer-round events.
    Replay,
    /// Moving the base past its first tick: nothing booked, no events.
    Slide,
}

impl Engine {
    fn replicated(&self) -> Replicated {
        Replicated {
            anchor: self.anchor.clone(),
            outer: self.outer.clone(),
            inner_lr: self.inner_lr.clone(),
            roster: self.roster.clone(),
            sum_guard: self.sum_guard.clone(),
        }
    }

    fn swap_replicated(&mut self, r: &mut Replicated) {
        std::mem::swap(&mut self.anchor, &mut r.anchor);
        std::mem::swap(&mut self.outer, &mut r.outer);
        std::mem::swap(&mut self.inner_lr, &mut r.inner_lr);
        std::mem::swap(&mut self.roster, &mut r.roster);
        std::mem::swap(&mut self.sum_guard, &mut r.sum_guard);
    }

    /// Splits `late` sums (tick closed here) into those put back into
    /// their tick now, and the rest (returned), which join the next tick.
    pub(super) fn replay_late(&mut self, late: Vec<GroupKey>) -> Vec<GroupKey> {
        let (back, rest): (Vec<_>, Vec<_>) = late.into_iter().partition(|k| self.aggregation.replay.covers(k.0));
        for k in back {
            let Some(sum) = self.take_held(k) else { continue };
            let ticks = &mut self.aggregation.replay.ticks;
            let at = ticks.partition_point(|(t, _)| *t < k.0);
            if ticks.get(at).is_none_or(|(t, _)| *t != k.0) {
                ticks.insert(at, (k.0, Vec::new()));
            }
            let sums = &mut ticks[at].1;
            let pos = sums.partition_point(|(g, _)| *g < k);
            sums.insert(pos, (k, sum));
            let recomputed = (ticks.len() - at) as u64;
            self.event(EngineEvent::AggregateReplayed { key: k.0, group: k.1, ticks: recomputed });
            self.aggregation.replay.putting_back.push(k);
        }
        if !self.aggregation.replay.putting_back.is_empty() {
            self.recompute_kept_ticks();
            self.aggregation.replay.putting_back.clear();
        }
        rest
    }

    /// Restores the base and runs every kept tick's outer round again.
    fn recompute_kept_ticks(&mut self) {
        let Some(mut state) = self.aggregation.replay.base.clone() else {
            return;
        };
        self.swap_replicated(&mut state);
        let ticks: Vec<(u64, TickSums)> = self.aggregation.replay.ticks.iter().cloned().collect();
        for (key, sums) in ticks {
            self.outer_round_of_sums(key, &sums, Pass::Replay);
        }
    }

    /// Before tick `key` closes: takes the base when no tick is kept yet.
    pub(super) fn before_tick(&mut self, key: u64) {
        if self.aggregation.replay.window == 0 || self.aggregation.replay.base.is_some() {
            return;
        }
        let base = self.replicated();
        let log = &mut self.aggregation.replay;
        log.base = Some(base);
        log.base_key = key;
    }

    /// Keeps a closed tick's sums, and moves the base past the ticks whose
    /// late sums are no longer taken.
    pub(super) fn after_tick(&mut self, key: u64, sums: TickSums) {
        if self.aggregation.replay.base.is_none() {
            return;
        }
        self.aggregation.replay.ticks.push_back((key, sums));
        let span = (u64::from(self.cfg.staleness.tau_max) + 1).min(self.aggregation.replay.window as u64);
        let log = &self.aggregation.replay;
        let mut bytes: usize = log.ticks.iter().flat_map(|(_, s)| s).map(|(_, a)| a.payload.len()).sum();
        while let Some((k, sums)) = self.aggregation.replay.ticks.front()
            && (k + span <= key || bytes > REPLAY_BYTES)
        {
            bytes -= sums.iter().map(|(_, a)| a.payload.len()).sum::<usize>();
            let Some((first, sums)) = self.aggregation.replay.ticks.pop_front() else { break };
            let Some(mut base) = self.aggregation.replay.base.take() else { break };
            self.swap_replicated(&mut base);
            self.outer_round_of_sums(first, &sums, Pass::Slide);
            self.swap_replicated(&mut base);
            // As the live roster is pruned (`apply_aggregates`), at most as
            // far back.
            let slack = u64::from(self.cfg.staleness.tau_max) + 1 + SETTLE_TICKS + WINDOW_TICKS;
            base.roster.forget_before(first.saturating_sub(slack));
            let log = &mut self.aggregation.replay;
            log.base = Some(base);
            log.base_key = first + 1;
        }
    }
}
