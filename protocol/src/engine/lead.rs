//! Lead steps: while the last tick's updates are still arriving, a round's
//! first inner steps train on the anchor as it is; when the batch is
//! applied, those steps are carried onto the new anchor (the parameters
//! move by the anchor's move) and the round goes on from there. The exchange
//! wait becomes training, and unlike the overlapped schedule every update
//! still lands on the anchor its round ends on: only the lead steps'
//! gradients were taken one outer step early.

use std::sync::Arc;

use super::{
    Engine, LocalPhase, LocalResult, Output, Phase, Training,
    config::{LocalMode, Work},
};
use crate::time::Micros;

/// Inner steps per lead phase: the engine looks at the exchange again after
/// each, so the round is carried over as soon as the batch is in.
const LEAD_CHUNK_STEPS: u32 = 1;

/// The lead of the round about to start.
#[derive(Clone, Debug)]
pub(super) struct Lead {
    /// The tick the round belongs to.
    tick: u64,
    /// The anchor the lead started from.
    from: Arc<Vec<f32>>,
    /// The parameters after the lead steps so far.
    params: Arc<Vec<f32>>,
    /// The work done so far, added to the round's.
    pub(super) work: LeadWork,
}

/// What the lead steps did: added to the round's own figures.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LeadWork {
    pub(super) steps: u32,
    pub(super) samples: u64,
    pub(super) flops: f64,
    /// Time the lead phases trained (not the waits between them): the
    /// speed estimate counts it with the round's own.
    pub(super) busy: Micros,
    /// Sum of the lead phases' mean losses, each weighted by its steps.
    loss_sum: f64,
    /// A lead phase trained to a non-finite loss: the round's loss is
    /// non-finite too, so the divergence guard still sees it.
    nonfinite: bool,
}

impl Lead {
    /// Lead steps taken for tick `k`'s round.
    pub(super) fn steps_in(&self, k: u64) -> u32 {
        if self.tick == k { self.work.steps } else { 0 }
    }
}

impl LeadWork {
    /// The round's mean training loss with `result`'s steps after these.
    pub(super) fn mean_loss(&self, result: &LocalResult) -> f32 {
        if self.steps == 0 {
            return result.loss;
        }
        if self.nonfinite || (result.steps > 0 && !result.loss.is_finite()) {
            return f32::NAN;
        }
        if result.steps == 0 {
            return (self.loss_sum / self.steps as f64) as f32;
        }
        ((self.loss_sum + result.loss as f64 * result.steps as f64) / (self.steps + result.steps) as f64) as f32
    }
}

impl Engine {
    /// Starts (or continues) the lead of tick `k`'s round if a lead step
    /// fits before `deadline`, the end of the exchange wait. False: wait
    /// as before.
    pub(super) fn try_lead(&mut self, now: Micros, k: u64, deadline: Micros) -> bool {
        // Fixed work takes H steps whatever the time: nothing to fill.
        if self.cfg.local != LocalMode::Train || self.cfg.work != Work::ProportionalToSpeed || self.cfg.pull.p > 0.0 {
            return false;
        }
        let left = deadline.saturating_sub(now).as_secs_f64();
        if left * (self.membership.my_speed() as f64) < LEAD_CHUNK_STEPS as f64 {
            return false;
        }
        if self.lead.as_ref().is_some_and(|l| l.tick != k) {
            self.lead = None; // a lead whose round never started
        }
        let lead = self.lead.get_or_insert_with(|| Lead {
            tick: k,
            from: self.anchor.clone(),
            params: self.anchor.clone(),
            work: LeadWork::default(),
        });
        let start = lead.params.clone();
        self.idle.leave(now, &mut self.stats.idle);
        self.phase = Phase::Training(Training {
            round: self.round,
            started: now,
            base: start.clone(),
            base_version: None,
            base_applied_total: self.version.total(),
            base_tick: k,
            lead: None,
            leading: true,
        });
        let seed = self.rng.next_u64();
        self.emit(Output::StartLocalPhase(LocalPhase {
            round: self.round,
            anchor: start,
            steps: LEAD_CHUNK_STEPS,
            partial: 0.0,
            lr_scale: self.lr_scale(now),
            mode: self.cfg.local,
            pull: self.cfg.pull,
            seed,
            deadline: Some(deadline),
            lead: true,
        }));
        true
    }

    /// A lead phase started at `started` finished: keep its parameters and
    /// work for the round.
    pub(super) fn on_lead_done(&mut self, now: Micros, started: Micros, result: LocalResult) {
        self.phase = Phase::Waiting;
        let Some(lead) = self.lead.as_mut() else { return };
        if result.params.len() != lead.params.len() {
            self.lead = None; // the trainer broke its contract: drop the lead
            return;
        }
        lead.params = Arc::new(result.params);
        let w = &mut lead.work;
        w.steps += result.steps;
        w.samples += result.samples;
        w.flops += result.flops;
        w.busy = w.busy + now.saturating_sub(started);
        if result.steps > 0 {
            w.loss_sum += result.loss as f64 * result.steps as f64;
            w.nonfinite |= !result.loss.is_finite();
        }
    }

    /// The round of tick `tick` starts from the anchor just made: its
    /// lead, if any, is carried onto it. Returns the parameters to start
    /// from and the lead's work.
    pub(super) fn carry_lead(&mut self, tick: u64) -> (Arc<Vec<f32>>, Option<LeadWork>) {
        let Some(lead) = self.lead.take().filter(|l| l.tick == tick && l.work.steps > 0) else {
            return (self.anchor.clone(), None);
        };
        if Arc::ptr_eq(&lead.from, &self.anchor) {
            return (lead.params, Some(lead.work));
        }
        let carried =
            self.anchor.iter().zip(lead.params.iter().zip(lead.from.iter())).map(|(a, (p, f))| a + (p - f)).collect();
        (Arc::new(carried), Some(lead.work))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::{EngineConfig, Strategy},
        identity::Keypair,
        ids::RunId,
    };

    #[test]
    fn a_lead_is_carried_by_the_anchors_move_and_only_into_its_own_tick() {
        let me = Keypair::deterministic(3, 0).node_id();
        let cfg = EngineConfig::preset(Strategy::Gopals);
        let mut e = Engine::new(cfg, me, RunId(crate::ids::Hash32([1; 32])), Micros::ZERO, vec![1.0, 2.0, 3.0], 1.0, 1);
        let from = e.anchor.clone();
        let work = LeadWork { steps: 2, samples: 64, busy: Micros(5), loss_sum: 1.0, ..LeadWork::default() };
        let lead = Lead { tick: 7, from, params: Arc::new(vec![1.5, 2.0, 2.0]), work };
        // The batch moved the anchor by (1, -1, 0.5) while the lead trained.
        e.lead = Some(lead.clone());
        e.anchor = Arc::new(vec![2.0, 1.0, 3.5]);
        let (start, carried) = e.carry_lead(7);
        assert_eq!(*start, vec![2.5, 1.0, 2.5]);
        assert_eq!(carried.map(|w| (w.steps, w.busy)), Some((2, Micros(5))));
        assert!(e.lead.is_none());
        // A lead of another tick is dropped: the round starts at the anchor.
        e.lead = Some(lead);
        let (start, carried) = e.carry_lead(8);
        assert!(Arc::ptr_eq(&start, &e.anchor));
        assert!(carried.is_none());
    }

    fn result(steps: u32, loss: f32) -> LocalResult {
        LocalResult { round: 0, params: vec![], steps, partial: 0.0, samples: 0, loss, flops: 0.0 }
    }

    #[test]
    fn the_round_loss_weighs_lead_and_round_steps_alike_and_keeps_a_divergence() {
        let work = LeadWork { steps: 1, samples: 32, loss_sum: 4.0, ..LeadWork::default() };
        assert_eq!(work.mean_loss(&result(3, 2.0)), 2.5);
        assert_eq!(work.mean_loss(&result(0, f32::NAN)), 4.0);
        assert_eq!(LeadWork::default().mean_loss(&result(2, 3.0)), 3.0);
        // A diverged lead step or round makes the round's loss non-finite:
        // the inner rate's divergence guard reads it as a spike.
        assert!(work.mean_loss(&result(3, f32::NAN)).is_nan());
        let diverged = LeadWork { nonfinite: true, ..work };
        assert!(diverged.mean_loss(&result(3, 2.0)).is_nan());
    }
}
