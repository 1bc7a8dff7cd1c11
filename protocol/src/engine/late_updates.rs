//! Late updates put back into their own tick (full dissemination). A
//! replica keeps its replicated state (anchor, outer state, inner-rate
//! schedule) from before its last few closed ticks, and the updates each of
//! them applied with their weights; an update that arrives after its tick
//! closed here is inserted where the replicas that had it in time applied
//! it, and those ticks are recomputed. The replica then ends bit-identical
//! to them. Folded into the next open tick instead, it left the replica one
//! normaliser and one momentum step apart from them for good: at 16
//! processes on two cores the replicas drifted several rounds of movement
//! apart, past what anti-entropy's averages may repair. Aggregated
//! dissemination does the same for sums (`aggregation::replay`).

use std::{
    collections::{BTreeSet, VecDeque},
    sync::Arc,
};

use super::{
    Engine, EngineEvent, Pending, config::StalenessMeasure, inner_lr::InnerLrState, outer::OuterState, receive::Applied,
};
use crate::{codec::Payload, ids::UpdateId, wire::UpdateAnnouncement};

/// Most closed ticks kept; within it, as many as late updates are still
/// taken (the staleness bound).
const KEPT_TICKS: usize = 8;
/// Most payload bytes kept for it: a large model keeps fewer ticks.
const KEPT_BYTES: usize = 256 << 20;

/// An update as a closed tick applied it.
#[derive(Clone, Debug)]
pub(super) struct KeptUpdate {
    pub(super) announcement: UpdateAnnouncement,
    pub(super) bytes: Arc<Vec<u8>>,
    pub(super) weight: f32,
}

/// A closed tick: its key, its group size N, and its updates in the
/// canonical order it applied them.
#[derive(Clone, Debug)]
struct KeptTick {
    key: u64,
    n: u32,
    updates: Vec<KeptUpdate>,
}

/// The state an outer round changes.
#[derive(Clone, Debug)]
struct Base {
    anchor: Arc<Vec<f32>>,
    outer: OuterState,
    inner_lr: InnerLrState,
}

/// The closed ticks a late update can join, and the state before them.
#[derive(Debug)]
pub(super) struct LateUpdateLog {
    /// Ticks kept at most (0: late updates join the next tick instead).
    window: usize,
    base: Option<Base>,
    /// The first tick the base precedes.
    base_key: u64,
    ticks: VecDeque<KeptTick>,
}

impl Default for LateUpdateLog {
    fn default() -> Self {
        Self { window: KEPT_TICKS, base: None, base_key: 0, ticks: VecDeque::new() }
    }
}

impl LateUpdateLog {
    #[cfg(test)]
    pub(super) fn set_window(&mut self, ticks: usize) {
        self.window = ticks;
        self.clear();
    }

    /// Forgets everything: the state changed outside the outer rounds (an
    /// average with a peer's anchor, a replica state taken).
    pub(super) fn clear(&mut self) {
        self.base = None;
        self.ticks.clear();
    }

    /// Whether a late update of tick `key` can be put back into its tick.
    pub(super) fn covers(&self, key: u64) -> bool {
        self.base.is_some() && key >= self.base_key
    }

    fn bytes(&self) -> usize {
        self.ticks.iter().flat_map(|t| &t.updates).map(|u| u.bytes.len()).sum()
    }
}

impl Engine {
    /// Whether every replica would weigh an update put back as those that
    /// had it in time did: canonical tick batches, and a weight that depends
    /// on the update and its tick alone (not on the receiver's version
    /// vector, nor on its view of the live nodes).
    fn late_updates_kept(&self) -> bool {
        let st = &self.cfg.staleness;
        self.cfg.canonical_batches
            && matches!(self.cfg.schedule, super::config::Schedule::Tick { .. })
            && st.measure != StalenessMeasure::Receiver
            && !st.normalize_by_nodes
    }

    /// The tick a late update of `a` goes back into: its own, when that
    /// closed here and is still kept.
    pub(super) fn put_back_key(&self, a: &UpdateAnnouncement) -> Option<u64> {
        let key = self.batch_key(a);
        (key < self.first_open_key() && self.late_updates.covers(key)).then_some(key)
    }

    fn swap_base(&mut self, b: &mut Base) {
        std::mem::swap(&mut self.anchor, &mut b.anchor);
        std::mem::swap(&mut self.outer, &mut b.outer);
        std::mem::swap(&mut self.inner_lr, &mut b.inner_lr);
    }

    /// Before tick `key`'s outer round closes live: takes the base when no
    /// tick is kept yet.
    pub(super) fn before_full_tick(&mut self, key: u64) {
        if !self.late_updates_kept() || self.late_updates.window == 0 || self.late_updates.base.is_some() {
            return;
        }
        let base = Base { anchor: self.anchor.clone(), outer: self.outer.clone(), inner_lr: self.inner_lr.clone() };
        self.late_updates.base = Some(base);
        self.late_updates.base_key = key;
    }

    /// Keeps a tick closed live, and moves the base past the ticks whose
    /// late updates are no longer taken.
    pub(super) fn after_full_tick(&mut self, key: u64, n: u32, updates: Vec<KeptUpdate>) {
        if self.late_updates.base.is_none() {
            return;
        }
        if updates.iter().map(|u| u.bytes.len()).sum::<usize>() > KEPT_BYTES {
            // One tick alone is over the cap (a large model, many nodes):
            // nothing could be kept, so stop keeping for the run.
            self.late_updates.clear();
            self.late_updates.window = 0;
            return;
        }
        self.late_updates.ticks.push_back(KeptTick { key, n, updates });
        let span = (u64::from(self.cfg.staleness.tau_max) + 1).min(self.late_updates.window as u64);
        while let Some(first) = self.late_updates.ticks.front()
            && (first.key + span <= key || self.late_updates.bytes() > KEPT_BYTES)
        {
            let Some(first) = self.late_updates.ticks.pop_front() else { break };
            let Some(mut base) = self.late_updates.base.take() else { break };
            self.swap_base(&mut base);
            self.outer_round_of_kept(&first, &BTreeSet::new());
            self.swap_base(&mut base);
            self.late_updates.base = Some(base);
            self.late_updates.base_key = first.key + 1;
        }
    }

    /// Puts `late` updates (their own tick closed here, and kept) back into
    /// their ticks with their weights, and recomputes the kept ticks.
    pub(super) fn put_back_late(&mut self, late: Vec<(u64, KeptUpdate)>) {
        if late.is_empty() {
            return;
        }
        let Some(mut state) = self.late_updates.base.clone() else {
            // `covers` found a base: none now means they wait in the queue
            // and join the next open tick instead.
            for (_, u) in late {
                self.pending.push(Pending { announcement: u.announcement, bytes: u.bytes });
            }
            self.index_pending();
            return;
        };
        let mut back = BTreeSet::new();
        for (key, u) in late {
            let id = u.announcement.id;
            let at = self.late_updates.ticks.partition_point(|t| t.key < key);
            if self.late_updates.ticks.get(at).is_none_or(|t| t.key != key) {
                self.late_updates.ticks.insert(at, KeptTick { key, n: 0, updates: Vec::new() });
            }
            // The canonical order a tick applies its updates in (batch key,
            // then id: one folded in from an older tick first), so the tick
            // sums as on the replicas that had this update in time.
            let pos = self.late_updates.ticks[at]
                .updates
                .partition_point(|k| (self.batch_key(&k.announcement), k.announcement.id) < (key, id));
            let ticks = &mut self.late_updates.ticks;
            let tick = &mut ticks[at];
            tick.updates.insert(pos, u);
            tick.n += 1;
            let recomputed = (ticks.len() - at) as u64;
            self.event(EngineEvent::UpdateReplayed { id, key, ticks: recomputed });
            back.insert(id);
        }
        self.swap_base(&mut state);
        let ticks = std::mem::take(&mut self.late_updates.ticks);
        for tick in &ticks {
            self.outer_round_of_kept(tick, &back);
        }
        self.late_updates.ticks = ticks;
    }

    /// One kept tick's outer round again, in the order it was applied;
    /// books the updates in `booked` (those put back), no others.
    fn outer_round_of_kept(&mut self, tick: &KeptTick, booked: &BTreeSet<UpdateId>) {
        for u in &tick.updates {
            let a = &u.announcement;
            let Ok(payload) = Payload::parse(a.codec, self.anchor.len(), &u.bytes) else {
                // Checked on arrival: a kept payload always parses.
                continue;
            };
            let anchor = Arc::make_mut(&mut self.anchor);
            self.outer.accumulate(&self.cfg.outer, anchor, &payload, u.weight, tick.n);
            let applied = Applied { id: a.id, payload_hash: a.payload_hash, samples: a.samples, loss: a.loss };
            if booked.contains(&a.id) {
                let tau = self.staleness(a, Some(tick.key));
                self.count_applied(applied, u.weight, tau, tick.n as usize);
            } else {
                self.inner_lr.observe(applied.loss, applied.samples);
            }
        }
        self.close_outer_round(tick.n, false);
    }
}
