//! Rounds: when a local phase starts, how many steps it gets, and what
//! happens when it ends (delta, compression, publish, own receive).

use std::sync::Arc;

use super::{
    Engine, EngineEvent, LocalPhase, LocalResult, Output, Phase, Publication, Training,
    config::{LocalMode, MIN_PARTIAL_STEP, PARTIAL_STEP_SLACK, Schedule, StalenessMeasure, Work},
    idle::IdleReason,
    tick::TickClock,
};
use crate::{ids::Hash32, ids::UpdateId, ledger::RecordKind, time::Micros, wire::UpdateAnnouncement};

/// Ticks between speed probes of a node whose estimate is below h_min.
const PROBE_EVERY_TICKS: u64 = 8;

impl Engine {
    /// Starts the next round if the schedule allows it now; otherwise sets
    /// the wake-up time.
    pub(super) fn try_start_round(&mut self, now: Micros) {
        if !matches!(self.phase, Phase::Waiting) {
            return;
        }
        if self.startup_until.is_some_and(|t| now < t) && !self.expected_peers_heard() {
            self.wait(now, IdleReason::Startup);
            return;
        }
        self.startup_until = None;
        self.startup_expects.clear();
        self.wake_at = None;
        let (steps, partial) = match self.cfg.schedule {
            Schedule::FreeRunning => (self.proportional_steps(), 0.0),
            Schedule::Barrier => {
                if self.round > self.first_round && !self.barrier_complete(self.round - 1) {
                    self.wait(now, IdleReason::Barrier);
                    return; // re-checked on every arrival and membership change
                }
                (self.proportional_steps(), 0.0)
            }
            Schedule::Tick { .. } => {
                let Some(work) = self.tick_round_steps(now) else {
                    return;
                };
                work
            }
        };
        self.start_round(now, steps, partial);
    }

    /// Whether every peer the shell knows takes part has been heard (none
    /// known: not yet, the whole wait runs).
    fn expected_peers_heard(&self) -> bool {
        !self.startup_expects.is_empty() && self.startup_expects.iter().all(|p| self.membership.is_live(p))
    }

    /// `clamp(floor(H v_i / v_ref), H_min, H)`, or H for fixed work.
    fn proportional_steps(&self) -> u32 {
        match self.cfg.work {
            Work::Fixed => self.cfg.h,
            Work::ProportionalToSpeed => {
                let v_ref = self.membership.reference_speed().max(1e-9);
                let raw = (self.cfg.h as f64 * self.membership.my_speed() as f64 / v_ref as f64).floor();
                (raw as u32).clamp(self.cfg.h_min, self.cfg.h)
            }
        }
    }

    fn wanted_tick_period(&self, period_ms: Option<u32>) -> Micros {
        match period_ms {
            Some(ms) => Micros(ms as u64 * 1000),
            None => {
                let v_ref = self.membership.reference_speed().max(1e-9) as f64;
                let floor = self.cfg.aggregation.map_or(0, |a| u64::from(a.min_tick_ms) * 1000);
                Micros::from_secs_f64(self.cfg.h as f64 / v_ref).max(Micros(floor))
            }
        }
    }

    /// Tick mode: the whole steps of a round starting now and the batch
    /// fraction of a last, partial step (0 for none), or `None` after
    /// setting when to look again.
    fn tick_round_steps(&mut self, now: Micros) -> Option<(u32, f32)> {
        let Schedule::Tick { grace, margin, period_ms, overlap, partial_step, lead } = self.cfg.schedule else {
            return None;
        };
        if self.clock.is_none() {
            self.clock = Some(TickClock::new(self.t0, self.wanted_tick_period(period_ms)));
        }
        let clock = self.clock.as_ref().expect("set above");
        let k = clock.tick(now);
        let (this_tick, next, period) = (clock.boundary(k), clock.boundary(k + 1), clock.period());
        if self.last_base_tick.is_some_and(|last| last >= k) {
            // Already trained in this tick: next tick.
            self.wake_at = Some(next);
            self.wait(now, IdleReason::TickRest);
            return None;
        }
        // Aggregated, the exchange takes two hops (sources to aggregators,
        // sums to everyone): a grace for each.
        let hops = if self.cfg.aggregation.is_some() { super::aggregation::EXCHANGE_GRACES as f64 } else { 1.0 };
        let deadline = this_tick + Micros::from_secs_f64(period.as_secs_f64() * grace as f64 * hops);
        // Overlapped, the last tick's updates are applied a tick later:
        // nothing to wait for.
        if !overlap && now < deadline && k > 0 && !self.batch_arrived(k - 1) {
            if lead && self.try_lead(now, k, deadline) {
                return None;
            }
            self.wake_at = Some(deadline);
            self.wait(now, IdleReason::Exchange);
            return None;
        }
        let reserve = Micros::from_secs_f64(period.as_secs_f64() * margin as f64);
        let usable = next.saturating_sub(now).saturating_sub(reserve).as_secs_f64();
        let (mut steps, mut partial) = match self.cfg.work {
            Work::Fixed => (self.cfg.h, 0.0),
            Work::ProportionalToSpeed => {
                let fit = usable * self.membership.my_speed() as f64;
                let rest = (fit - fit.floor()) as f32 - PARTIAL_STEP_SLACK;
                (fit.floor() as u32, if partial_step && rest >= MIN_PARTIAL_STEP { rest } else { 0.0 })
            }
        };
        // The speed estimate only changes when a phase completes: if one bad
        // measurement (a loaded machine, a stale checkpoint) puts it below
        // h_min per tick, the node would never train again. Early in a tick,
        // probe with h_min steps now and then; the deadline still ends the
        // phase on time and its measurement corrects the estimate.
        let early = usable >= 0.5 * period.as_secs_f64();
        if steps < self.cfg.h_min && early && self.last_probe_tick.is_none_or(|p| k >= p + PROBE_EVERY_TICKS) {
            self.last_probe_tick = Some(k);
            steps = self.cfg.h_min;
            partial = 0.0;
        }
        // The period follows v_ref; the clock leader decides, a change takes
        // effect at a later tick boundary, and followers adopt it from the
        // leader's heartbeats.
        if self.clock_leader() == self.me {
            let proposed = self.wanted_tick_period(period_ms);
            if let Some(c) = self.clock.as_mut() {
                c.propose_period(now, proposed);
            }
        }
        let led = self.lead.as_ref().map_or(0, |l| l.steps_in(k));
        if steps + led < self.cfg.h_min {
            // Too little of this tick left to train: still absorb the last
            // tick's updates (once), so this replica keeps up while it waits.
            if self.last_batch_tick != Some(k) {
                self.apply_pending(Some(self.batch_bound(k)));
                self.last_batch_tick = Some(k);
            }
            self.wake_at = Some(next);
            self.wait(now, IdleReason::ShortTick);
            return None;
        }
        Some((steps, partial))
    }

    /// The batch a round of tick `k` starts from applies the ticks before
    /// this one: `k`, or `k - 1` when the exchange overlaps compute (tick
    /// `k - 1`'s updates are still arriving while tick `k` trains).
    fn batch_bound(&self, k: u64) -> u64 {
        match self.cfg.schedule {
            Schedule::Tick { overlap: true, .. } => k.saturating_sub(1),
            _ => k,
        }
    }

    /// True when every live member we expect has delivered its update for
    /// tick `k`. Expected: members that contributed in tick `k - 1` or
    /// later, and members that never contributed yet (starting up). We do
    /// not wait for stragglers that already missed a tick. O(log N): every
    /// peer that delivered for `k` is itself expected, so counting suffices.
    pub(super) fn tick_complete(&self, k: u64) -> bool {
        let arrived = self.tick_arrivals.get(&k);
        let me_in = arrived.is_some_and(|a| a.contains(&self.me));
        // Our own round of tick k is published (in k, or later if it
        // overran: then it joins a later batch and is not waited for here).
        let mine_published = self.tick_arrivals.range(k..).any(|(_, a)| a.contains(&self.me));
        if self.last_base_tick == Some(k) && !mine_published {
            return false;
        }
        let arrived_peers = arrived.map_or(0, |a| a.len() - usize::from(me_in));
        let never_contributed =
            self.membership.live_count() - 1 - self.last_tick_of.len().min(self.membership.live_count() - 1);
        let recent: u32 = self.last_tick_counts.range(k.saturating_sub(1)..).map(|(_, c)| *c).sum();
        arrived_peers >= never_contributed + recent as usize
    }

    /// The exchange wait is over for tick `k`: its updates arrived, or,
    /// aggregated, its groups' quorum sums.
    fn batch_arrived(&mut self, k: u64) -> bool {
        if self.cfg.aggregation.is_some() { self.aggregates_complete(k) } else { self.tick_complete(k) }
    }

    /// True when every live member that takes part in `round` has its
    /// update for it applied or pending.
    pub(super) fn barrier_complete(&self, round: u64) -> bool {
        let done = |src| {
            let id = UpdateId { src, round };
            self.applied.contains(&id) || self.given_up.contains(&id) || self.pending_ids.contains(&id)
        };
        done(self.me) && self.membership.peers().all(|(id, info)| info.first_round > round || done(*id))
    }

    /// The scale of the manifest's inner rate a round started at `now`
    /// trains at: the swarm's plateau schedule times the cooldown.
    pub fn lr_scale(&self, now: Micros) -> f32 {
        self.inner_lr.scale * self.cfg.cooldown.map_or(1.0, |c| c.factor(now.saturating_sub(self.t0)))
    }

    /// Not training from `now`, for `reason`.
    fn wait(&mut self, now: Micros, reason: IdleReason) {
        self.idle.enter(now, reason, &mut self.stats.idle);
    }

    fn start_round(&mut self, now: Micros, steps: u32, partial: f32) {
        self.idle.leave(now, &mut self.stats.idle);
        let base_tick = self.clock.as_ref().map_or(0, |c| c.tick(now));
        let upto = match self.cfg.schedule {
            Schedule::Tick { .. } => Some(self.batch_bound(base_tick)),
            Schedule::Barrier => Some(self.round),
            Schedule::FreeRunning => None,
        };
        self.apply_pending(upto);
        if matches!(self.cfg.schedule, Schedule::Tick { .. }) {
            self.last_base_tick = Some(base_tick);
            self.first_base_tick.get_or_insert(base_tick);
            self.last_batch_tick = Some(base_tick);
        }
        let round = self.round;
        let base = self.anchor.clone();
        let (start, lead) = self.carry_lead(base_tick);
        if let Some(previous) = self.last_base.replace(base.clone())
            && !self.averaged_this_round
            && !Arc::ptr_eq(&base, &previous)
        {
            self.movement.record(super::trust::distance(&base, &previous));
        }
        self.averaged_this_round = false;
        self.phase = Phase::Training(Training {
            round,
            started: now,
            base,
            base_version: (self.cfg.staleness.measure == StalenessMeasure::Receiver).then(|| self.version.clone()),
            base_applied_total: self.version.total(),
            base_tick,
            lead,
            leading: false,
        });
        let seed = self.rng.next_u64();
        // Tick mode: a round sized to the tick must end by the next tick,
        // whatever the speed estimate says; a real trainer stops early at
        // this deadline. Fixed work means H steps however long they take
        // (the round may publish ticks late; its staleness then counts).
        let deadline = match (self.cfg.schedule, &self.clock) {
            (Schedule::Tick { margin, .. }, Some(c)) if self.cfg.work == Work::ProportionalToSpeed => {
                let reserve = Micros::from_secs_f64(c.period().as_secs_f64() * margin as f64);
                Some(c.boundary(base_tick + 1).saturating_sub(reserve))
            }
            _ => None,
        };
        self.emit(Output::StartLocalPhase(LocalPhase {
            round,
            anchor: start,
            steps,
            partial,
            lr_scale: self.lr_scale(now),
            mode: self.cfg.local,
            pull: self.cfg.pull,
            seed,
            deadline,
            lead: false,
        }));
        self.event(EngineEvent::RoundStarted { round, steps, base_tick });
        let every = self.cfg.anti_entropy.every_rounds as u64;
        if every > 0 && round > self.first_round && (self.repairing || round.is_multiple_of(every)) {
            self.start_anti_entropy();
        }
    }

    pub(super) fn on_local_phase_done(&mut self, now: Micros, result: LocalResult) {
        let training = match &self.phase {
            Phase::Training(t) if t.round == result.round => t.clone(),
            _ => return, // a stale or unexpected result: ignore
        };
        if training.leading {
            return self.on_lead_done(now, training.started, result);
        }
        if result.params.len() != training.base.len() {
            // The trainer broke its contract; do not publish garbage.
            self.phase = Phase::Waiting;
            return;
        }
        // The round's own time and its lead steps' (not the waits between).
        let lead_busy = training.lead.map_or(Micros::ZERO, |l| l.busy);
        let elapsed = (now.saturating_sub(training.started) + lead_busy).as_secs_f64().max(1e-6);
        // A partial step counts for its share of a batch, so the estimate
        // stays in whole steps per second.
        let mut result = result;
        if let Some(lead) = training.lead {
            result.loss = lead.mean_loss(&result);
            result.steps += lead.steps;
            result.samples += lead.samples;
            result.flops += lead.flops;
        }
        let work = (result.steps as f64 + result.partial.clamp(0.0, 1.0) as f64).max(1.0);
        self.update_speed((work / elapsed) as f32);
        self.stats.rounds += 1;
        self.stats.steps += result.steps as u64;
        self.stats.samples += result.samples;
        self.stats.last_loss = result.loss;

        let mut delta = result.params;
        if self.cfg.local == LocalMode::Train {
            for (d, b) in delta.iter_mut().zip(training.base.iter()) {
                *d = b - *d;
            }
        }
        let payload = if self.cfg.error_feedback {
            self.residual.compress(self.cfg.codec, &delta)
        } else {
            let mut out = Vec::new();
            crate::codec::encode(self.cfg.codec, &delta, &mut out);
            out
        };
        let publish_tick = self.clock.as_ref().map_or(0, |c| c.tick(now));
        let announcement = UpdateAnnouncement {
            run_id: self.run_id,
            id: UpdateId { src: self.me, round: training.round },
            base_total: training.base_applied_total,
            base: training.base_version.clone(),
            base_tick: training.base_tick,
            publish_tick,
            sender_staleness: self.version.total().saturating_sub(training.base_applied_total).min(u32::MAX as u64)
                as u32,
            steps: result.steps,
            samples: result.samples,
            speed: self.membership.my_speed(),
            loss: if result.loss.is_finite() { result.loss } else { f32::MAX },
            codec: self.cfg.codec,
            num_values: delta.len() as u64,
            payload_len: payload.len() as u64,
            payload_hash: Hash32::of(&payload),
        };
        let payload = Arc::new(payload);
        let to = self.publish_targets(self.batch_key(&announcement));
        self.emit(Output::Record(RecordKind::Contribution {
            round: training.round,
            base_version: training.base_applied_total,
            steps: result.steps,
            samples: result.samples,
            flops: result.flops,
            payload_hash: announcement.payload_hash,
        }));
        self.emit(Output::Publish(Publication { announcement: announcement.clone(), payload: payload.clone(), to }));
        self.round += 1;
        self.phase = Phase::Waiting;
        // Our own update goes through the same receive rule as everyone's.
        self.accept_payload(announcement, payload);
    }

    /// Speed EMA that reacts fast to slowdowns and slowly to speed-ups.
    fn update_speed(&mut self, measured: f32) {
        if !(measured.is_finite() && measured > 0.0) {
            return;
        }
        let old = self.membership.my_speed();
        let alpha = if measured < old { 0.5 } else { 0.3 };
        let new = if self.stats.rounds == 0 { measured } else { old + alpha * (measured - old) };
        self.membership.set_my_speed(new);
    }
}
