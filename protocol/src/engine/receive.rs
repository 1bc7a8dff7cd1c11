//! The receive rule (DESIGN §2.3): deduplicate, measure staleness, drop
//! beyond `tau_max`, fetch the payload, weight it, apply it with the outer
//! optimiser, advance the version vector.

use std::sync::Arc;

use super::{
    ANNOUNCE_HELD_BELOW, ARRIVAL_HISTORY, Awaiting, Engine, EngineEvent, FETCH_TIMEOUT, FUTURE_TICK_SLACK,
    MAX_AWAITING, MAX_PENDING, Output, Pending,
    config::{Schedule, StalenessMeasure},
    inner_lr::LrChange,
    late_updates::KeptUpdate,
    staleness::staleness_weight,
};
use crate::{
    codec::Payload,
    ids::{Hash32, NodeId, UpdateId},
    ledger::{ReceiptOutcome, RecordKind},
    time::Micros,
    validate::RejectReason,
    wire::UpdateAnnouncement,
};

impl Engine {
    /// The first batch key this replica has not closed yet: where a late
    /// update of an already closed key is applied.
    pub(super) fn first_open_key(&self) -> u64 {
        self.last_closed_key.map_or(0, |c| c + 1)
    }

    /// Staleness of `a` if applied in batch `applied_key` (default: the
    /// first open batch, the earliest it can still be applied in).
    ///
    /// Tick measure: the ticks between the update's base and the batch that
    /// applies it, `applied_key - base_tick`, and at least
    /// `publish_tick - base_tick` for a round that overran its tick. Every
    /// replica that applies the update in the same batch weighs it the
    /// same; an update that missed its tick counts as late however it was
    /// cut.
    pub(super) fn staleness(&self, a: &UpdateAnnouncement, applied_key: Option<u64>) -> u64 {
        match self.cfg.staleness.measure {
            StalenessMeasure::Tick => {
                // Batch keys are ticks only in tick mode; elsewhere they are
                // rounds, and the update's own ticks are all there is.
                let key = match self.cfg.schedule {
                    Schedule::Tick { .. } => applied_key.unwrap_or_else(|| self.first_open_key()),
                    _ => 0,
                };
                key.max(a.publish_tick).saturating_sub(a.base_tick)
            }
            StalenessMeasure::Sender => a.sender_staleness as u64,
            StalenessMeasure::Receiver => match &a.base {
                Some(base) => self.version.staleness_since(base),
                // Without the vector, fall back to the totals (an upper bound).
                None => self.version.total().saturating_sub(a.base_total),
            },
        }
    }

    /// One of our own updates that we published and then lost with the
    /// process (the checkpoint we resumed from predates it): the swarm
    /// applied it, so our replica must too.
    fn lost_own_update(&self, id: &UpdateId) -> bool {
        id.round < self.round && !self.applied.contains(id) && !self.given_up.contains(id) && !self.is_known(id)
    }

    pub(super) fn is_known(&self, id: &UpdateId) -> bool {
        self.awaiting.contains_key(id) || self.pending_ids.contains(id)
    }

    /// Tick mode: `a` names a base or publish tick more than
    /// [`FUTURE_TICK_SLACK`] ticks after ours at `now`.
    fn names_a_future_tick(&self, a: &UpdateAnnouncement, now: Micros) -> bool {
        let Some(clock) = self.clock.as_ref().filter(|_| matches!(self.cfg.schedule, Schedule::Tick { .. })) else {
            return false;
        };
        let limit = clock.tick(now).saturating_add(FUTURE_TICK_SLACK);
        a.base_tick > limit || a.publish_tick > limit
    }

    /// Tick mode with canonical batches: an update of `a`'s source and base
    /// tick is already pending.
    fn second_in_tick(&self, a: &UpdateAnnouncement) -> bool {
        matches!(self.cfg.schedule, Schedule::Tick { .. })
            && self.cfg.canonical_batches
            && self.pending_ticks.contains(&(a.id.src, a.base_tick))
    }

    /// Checks a new announcement: not ours, not seen, not from the future,
    /// not a second in its tick, not too stale. Returns true when its payload is wanted.
    /// Known-but-pending updates record `from` as another source.
    fn admit(&mut self, now: Micros, a: &UpdateAnnouncement, from: NodeId) -> bool {
        if a.run_id != self.run_id || a.num_values as usize != self.anchor.len() {
            return false; // the shell's validator refuses these before us
        }
        if a.id.src == self.me && !self.lost_own_update(&a.id) {
            return false; // our own, echoed back
        }
        if self.applied.contains(&a.id) || self.given_up.contains(&a.id) {
            *self.stats.dropped.entry(RejectReason::Replay).or_insert(0) += 1;
            self.event(EngineEvent::Dropped { id: a.id, reason: RejectReason::Replay });
            return false;
        }
        if let Some(w) = self.awaiting.get_mut(&a.id) {
            w.add_source(from);
            return false;
        }
        if self.pending_ids.contains(&a.id) {
            return false; // known: not awaited (checked above), so pending
        }
        if self.names_a_future_tick(a, now) {
            // Not given up: the same update is admitted if it comes again
            // once our clock has caught up (anti-entropy offers it again).
            *self.stats.dropped.entry(RejectReason::FromTheFuture).or_insert(0) += 1;
            self.event(EngineEvent::Dropped { id: a.id, reason: RejectReason::FromTheFuture });
            return false;
        }
        if self.second_in_tick(a) {
            // Refused before its payload is fetched; `accept_payload` checks
            // again for one whose first arrived while it was fetched.
            self.drop_update(a, RejectReason::SecondInTick, false);
            return false;
        }
        // A late update whose own tick is still kept goes back into it
        // (`late_updates`), so it is as stale as it is there.
        let tau = self.staleness(a, self.put_back_key(a));
        if tau > self.cfg.staleness.tau_max as u64 {
            self.drop_update(a, RejectReason::TooStale, true);
            return false;
        }
        true
    }

    pub(super) fn on_announcement(&mut self, now: Micros, a: UpdateAnnouncement, from: NodeId) {
        if !self.admit(now, &a, from) {
            return;
        }
        if self.awaiting.len() >= MAX_AWAITING
            && let Some(oldest) = self.awaiting.iter().min_by_key(|(_, w)| w.since).map(|(id, _)| *id)
        {
            self.awaiting.remove(&oldest);
            self.event(EngineEvent::FetchAbandoned { id: oldest });
        }
        self.emit(Output::FetchPayload { id: a.id, from, len: a.payload_len, hash: a.payload_hash });
        self.awaiting.insert(a.id, Awaiting { announcement: a, sources: vec![from], tried: 1, since: now });
    }

    /// An announcement that arrived with its (validated) payload inline:
    /// small models' updates fit in one gossip message.
    pub(super) fn on_update(&mut self, now: Micros, a: UpdateAnnouncement, from: NodeId, bytes: Arc<Vec<u8>>) {
        if !self.admit(now, &a, from) {
            return;
        }
        if bytes.len() as u64 != a.payload_len || Payload::parse(a.codec, self.anchor.len(), &bytes).is_err() {
            self.drop_update(&a, RejectReason::ShapeMismatch, false);
            return;
        }
        self.accept_payload(a, bytes);
    }

    pub(super) fn on_payload_source(&mut self, id: UpdateId, from: NodeId) {
        if let Some(w) = self.awaiting.get_mut(&id) {
            w.add_source(from);
        }
    }

    pub(super) fn on_fetch_failed(&mut self, id: UpdateId, from: NodeId, reason: Option<RejectReason>) {
        let Some(w) = self.awaiting.get_mut(&id) else {
            return;
        };
        w.sources.retain(|s| *s != from);
        // A payload refused for its content (hash-verified) is the source's
        // fault: no other holder can have a better one. A hash mismatch or a
        // transport failure may be the holder's: try another.
        let refused = reason.filter(|r| *r != RejectReason::HashMismatch);
        if let Some(reason) = refused {
            let a = self.awaiting.remove(&id).expect("checked above").announcement;
            self.drop_update(&a, reason, false);
            return;
        }
        if let Some(&next) = w.sources.first() {
            w.tried += 1;
            let (len, hash) = (w.announcement.payload_len, w.announcement.payload_hash);
            self.emit(Output::FetchPayload { id, from: next, len, hash });
        } else {
            self.awaiting.remove(&id);
            self.event(EngineEvent::FetchAbandoned { id });
        }
    }

    pub(super) fn expire_fetches(&mut self, now: Micros) {
        let expired: Vec<UpdateId> = self
            .awaiting
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.since) > FETCH_TIMEOUT)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.awaiting.remove(&id);
            self.event(EngineEvent::FetchAbandoned { id });
        }
    }

    pub(super) fn on_payload(&mut self, id: UpdateId, bytes: Arc<Vec<u8>>) {
        let Some(w) = self.awaiting.remove(&id) else {
            return;
        };
        let a = w.announcement;
        if bytes.len() as u64 != a.payload_len || Payload::parse(a.codec, self.anchor.len(), &bytes).is_err() {
            self.drop_update(&a, RejectReason::ShapeMismatch, false);
            return;
        }
        // Aggregated, the only fetchers of a payload are its group's few
        // aggregators, who had it from its source.
        if w.sources.len() < ANNOUNCE_HELD_BELOW && self.cfg.aggregation.is_none() {
            self.emit(Output::AnnounceHeld { id, hash: a.payload_hash });
        }
        self.accept_payload(a, bytes);
    }

    /// A structurally valid update: apply it now, or queue it for the next
    /// canonical batch.
    pub(super) fn accept_payload(&mut self, a: UpdateAnnouncement, bytes: Arc<Vec<u8>>) {
        if self.second_in_tick(&a) {
            self.drop_update(&a, RejectReason::SecondInTick, false);
            return;
        }
        if matches!(self.cfg.schedule, Schedule::Tick { .. }) {
            // Arrivals count for the batch the update joins, which the
            // exchange wait of the next tick waits for.
            let key = self.batch_key(&a);
            self.tick_arrivals.entry(key).or_default().insert(a.id.src);
            self.note_contribution(a.id.src, key);
            let newest = self.tick_arrivals.keys().next_back().copied().unwrap_or(0);
            while self.tick_arrivals.first_key_value().is_some_and(|(k, _)| k + ARRIVAL_HISTORY < newest) {
                self.tick_arrivals.pop_first();
            }
        }
        if self.cfg.canonical_batches {
            if self.pending.len() >= MAX_PENDING {
                self.apply_pending(None);
            }
            self.pending_ids.insert(a.id);
            self.pending_ticks.insert((a.id.src, a.base_tick));
            self.pending.push(Pending { announcement: a, bytes });
        } else {
            self.apply_one(&a, &bytes, None, None);
        }
    }

    /// The batch an update belongs to. Tick mode: the tick it was
    /// published in, which is its base tick for a round cut at its deadline
    /// and a later tick for a round that overran (fixed work), so every
    /// replica puts it in the same batch however late its round ran, as long
    /// as it arrives within that tick's grace. (Keyed by base tick, an
    /// overrunning update landed in whichever batch each replica had open
    /// when it arrived, and replicas drifted apart.) A publish tick more
    /// than `tau_max` past the base counts as `tau_max + 1`: such an update
    /// is dropped as too stale when its batch closes, not kept waiting for a
    /// tick its sender named. Barrier mode: its round; free-running modes
    /// have one batch.
    pub(super) fn batch_key(&self, a: &UpdateAnnouncement) -> u64 {
        match self.cfg.schedule {
            Schedule::Tick { .. } => self.tick_batch(a.base_tick, a.publish_tick),
            Schedule::Barrier => a.id.round,
            Schedule::FreeRunning => 0,
        }
    }

    /// Tick mode's batch for an update of these ticks (see [`Engine::batch_key`]).
    pub(super) fn tick_batch(&self, base_tick: u64, publish_tick: u64) -> u64 {
        let cap = base_tick.saturating_add(u64::from(self.cfg.staleness.tau_max) + 1);
        base_tick.max(publish_tick.min(cap))
    }

    /// Rebuilds the indexes of the pending queue.
    pub(super) fn index_pending(&mut self) {
        self.pending_ids = self.pending.iter().map(|p| p.announcement.id).collect();
        self.pending_ticks = self.pending.iter().map(|p| (p.announcement.id.src, p.announcement.base_tick)).collect();
    }

    /// Applies the queued updates of batches before `upto` (all when
    /// `None`) in canonical order (batch, source, round), so replicas given
    /// the same batches end bit-identical whatever the arrival order; then
    /// closes one outer round. Updates of later batches (a fast peer's next
    /// round) stay queued.
    pub(super) fn apply_pending(&mut self, upto: Option<u64>) {
        if self.cfg.aggregation.is_some() {
            return self.apply_aggregates(upto);
        }
        if self.pending.is_empty() {
            return;
        }
        let (mut batch, later): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| upto.is_none_or(|u| self.batch_key(&p.announcement) < u));
        self.pending = later;
        self.index_pending();
        if batch.is_empty() {
            return;
        }
        batch.sort_by_key(|p| (self.batch_key(&p.announcement), p.announcement.id));
        // One outer round per batch key (tick or round): replicas close
        // rounds at the same points whether they absorb one tick at a time
        // or several at once. A late update (its key already closed here) is
        // put back into its key while that is kept (`late_updates`), else
        // folded into the next open key, so every replica closes the same
        // number of rounds whatever arrived late; folded, it is a source of
        // drift anti-entropy must repair.
        let first_open = self.first_open_key();
        let keys: Vec<u64> = batch.iter().map(|p| self.batch_key(&p.announcement).max(first_open)).collect();
        let mut kept = Vec::with_capacity(batch.len());
        let mut kept_keys = Vec::with_capacity(batch.len());
        let mut put_back = Vec::new();
        for (p, key) in batch.into_iter().zip(keys) {
            let a = &p.announcement;
            let original = self.batch_key(a);
            // Late, and its own tick is still kept here: it goes back there,
            // where the replicas that had it in time applied it.
            if let Some(own) = self.put_back_key(a)
                && !self.applied.contains(&a.id)
            {
                let tau = self.staleness(a, Some(own));
                if tau <= self.cfg.staleness.tau_max as u64 {
                    let weight = staleness_weight(&self.cfg.staleness, tau, self.membership.live_count());
                    put_back.push((own, KeptUpdate { announcement: p.announcement, bytes: p.bytes, weight }));
                    continue;
                }
            }
            if upto.is_some_and(|u| key >= u) {
                // Late, and the open batch it would join is not due yet:
                // closing it now would put this replica a tick ahead.
                self.pending_ids.insert(a.id);
                self.pending_ticks.insert((a.id.src, a.base_tick));
                self.pending.push(p);
                continue;
            }
            // Dropped before the group is counted, so N is what is applied.
            if self.staleness(a, Some(key)) > self.cfg.staleness.tau_max as u64 {
                self.drop_update(a, RejectReason::TooStale, a.id.src != self.me);
                continue;
            }
            if original < key {
                self.event(EngineEvent::LateUpdate { id: a.id, key: original, applied_in: key });
            }
            kept.push(p);
            kept_keys.push(key);
        }
        let (batch, keys) = (kept, kept_keys);
        // Their ticks precede every tick closed below.
        self.put_back_late(put_back);
        let mut start = 0;
        while start < batch.len() {
            let key = keys[start];
            let end = start + keys[start..].iter().take_while(|k| **k == key).count();
            // N of this outer round: the updates in its group. Replicas with
            // the same batches agree on it even while their views of the
            // membership differ (joins, silent crashes not yet timed out).
            let n = (end - start) as u32;
            self.before_full_tick(key);
            let mut applied = Vec::with_capacity(end - start);
            for p in &batch[start..end] {
                if let Some(weight) = self.apply_one(&p.announcement, &p.bytes, Some(n), Some(key)) {
                    applied.push(KeptUpdate { announcement: p.announcement.clone(), bytes: p.bytes.clone(), weight });
                }
            }
            self.close_outer_round(n, true);
            self.last_closed_key = Some(key);
            self.after_full_tick(key, n, applied);
            start = end;
        }
    }

    /// Closes the outer round of `n` arrivals; `events`: reported (not
    /// when a late sum's ticks are recomputed).
    pub(super) fn close_outer_round(&mut self, n: u32, events: bool) {
        let mut outer = self.cfg.outer;
        if let Some(b) = outer.beta_early
            && self.inner_lr.scale >= 1.0
        {
            outer.beta = b;
        }
        let anchor = Arc::make_mut(&mut self.anchor);
        if self.outer.close_round(&outer, anchor, n) {
            let outer_rounds = self.outer.outer_rounds;
            if events {
                self.event(EngineEvent::OuterRound { outer_rounds });
            }
            self.close_inner_lr_round(events);
        }
    }

    /// Feeds the closed outer round's training losses to the inner-rate
    /// schedule; a divergence also drops the outer momentum, which carried
    /// the anchor into it.
    fn close_inner_lr_round(&mut self, events: bool) {
        let Some(change) = self.inner_lr.close_round(&self.cfg.inner_lr) else {
            return;
        };
        if change == LrChange::Spike {
            self.outer.momentum.iter_mut().for_each(|m| *m = 0.0);
            self.outer.restarts += 1;
        }
        let scale = self.inner_lr.scale;
        if events {
            self.event(EngineEvent::InnerLrChanged { scale, change });
        }
    }

    /// Applies one update; `group` is the size of its canonical batch group
    /// and `key` that batch's key (`None` on arrival: the live node count
    /// stands in for N).
    /// Returns the weight it was applied with (`None`: not applied).
    fn apply_one(&mut self, a: &UpdateAnnouncement, bytes: &[u8], group: Option<u32>, key: Option<u64>) -> Option<f32> {
        if self.applied.contains(&a.id) {
            return None;
        }
        let tau = self.staleness(a, key);
        if tau > self.cfg.staleness.tau_max as u64 {
            self.drop_update(a, RejectReason::TooStale, a.id.src != self.me);
            return None;
        }
        let n = group.map_or(self.membership.live_count(), |g| g as usize);
        let w = staleness_weight(&self.cfg.staleness, tau, self.membership.live_count());
        let payload = Payload::parse(a.codec, self.anchor.len(), bytes).expect("checked on arrival");
        let anchor = Arc::make_mut(&mut self.anchor);
        let closed = if self.cfg.canonical_batches {
            self.outer.accumulate(&self.cfg.outer, anchor, &payload, w, n as u32);
            false
        } else {
            self.outer.apply(&self.cfg.outer, anchor, &payload, w, n as u32)
        };
        let applied = Applied { id: a.id, payload_hash: a.payload_hash, samples: a.samples, loss: a.loss };
        self.count_applied(applied, w, tau, n);
        if closed {
            let outer_rounds = self.outer.outer_rounds;
            self.event(EngineEvent::OuterRound { outer_rounds });
            self.close_inner_lr_round(true);
        }
        Some(w)
    }

    /// Books an update whose values are in the anchor (alone or in a sum):
    /// version vector, applied set, the swarm's loss, counters, the ledger's
    /// receipt and the event.
    pub(super) fn count_applied(&mut self, a: Applied, weight: f32, tau: u64, nodes: usize) {
        self.version.increment(a.id.src);
        self.applied.insert(a.id);
        self.count_booked(a, weight, tau, nodes);
    }

    /// [`Engine::count_applied`] for an update already booked in the
    /// version vector and the applied set (with the rest of its tick).
    pub(super) fn count_booked(&mut self, a: Applied, weight: f32, tau: u64, nodes: usize) {
        self.inner_lr.observe(a.loss, a.samples);
        self.stats.applied += 1;
        self.stats.staleness_histogram[(tau as usize).min(7)] += 1;
        if a.id.src != self.me {
            self.emit(Output::Record(RecordKind::Receipt {
                update: a.id,
                payload_hash: a.payload_hash,
                samples: a.samples,
                outcome: ReceiptOutcome::Accepted { weight, staleness: tau.min(u32::MAX as u64) as u32 },
            }));
        }
        self.event(EngineEvent::Applied { id: a.id, staleness: tau, weight, nodes });
    }
}

/// What the books need of an applied update.
pub(super) struct Applied {
    /// Source and round.
    pub(super) id: UpdateId,
    /// Its payload hash, for the receipt.
    pub(super) payload_hash: Hash32,
    /// Samples it processed.
    pub(super) samples: u64,
    /// Its round's training loss.
    pub(super) loss: f32,
}
