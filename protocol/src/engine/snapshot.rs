//! Engine state that outlives the process: the shared replica (sent to
//! joiners) and the full checkpoint (replica plus our own progress).

use serde::{Deserialize, Serialize};

use super::{Engine, Phase, config::EngineConfig, outer::OuterState, tick::TickClock};
use crate::{
    codec::ErrorFeedback,
    ids::{NodeId, RunId},
    time::Micros,
    version::{AppliedSet, VersionVector},
};

/// The replica everyone shares: what a joiner needs to start contributing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaState {
    /// The anchor.
    pub anchor: Vec<f32>,
    /// Outer optimiser state.
    pub outer: OuterState,
    /// Version vector.
    pub version: VersionVector,
    /// Updates applied.
    pub applied: AppliedSet,
    /// The tick clock (tick mode), so a joiner agrees on every boundary.
    pub clock: Option<TickClock>,
    /// The serving node's current round (the global round in barrier mode).
    pub round: u64,
    /// The newest batch key whose outer round is closed.
    #[serde(default)]
    pub last_closed_key: Option<u64>,
    /// Updates received but not yet applied (the next canonical batch), so
    /// a joiner's next batch is the same as ours.
    #[serde(default)]
    pub pending: Vec<super::Pending>,
    /// The inner learning rate's schedule, so a joiner trains at the
    /// swarm's rate.
    #[serde(default)]
    pub inner_lr: super::inner_lr::InnerLrState,
    /// Who contributed to the last ticks' sums (aggregated dissemination),
    /// so a joiner ranks aggregators as the swarm does.
    #[serde(default)]
    pub roster: super::roster::Roster,
    /// Recently applied sums' norms, so a joiner refuses the sums we would.
    #[serde(default)]
    pub sum_guard: super::sum_guard::SumGuard,
}

/// Why a replica state was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StateError {
    /// The anchor has the wrong number of parameters.
    #[error("state has {got} parameters, the model has {expected}")]
    Shape {
        /// Parameters expected.
        expected: usize,
        /// Parameters received.
        got: usize,
    },
    /// The outer state does not fit the configured optimiser, or claims
    /// more rounds than [`super::outer::MAX_OUTER_ROUNDS`].
    #[error("outer optimiser state does not fit the manifest's optimiser or claims too many rounds")]
    OuterState,
    /// Non-finite values.
    #[error("state contains non-finite values")]
    NonFinite,
    /// A second moment below zero (its square root would be NaN).
    #[error("state has a negative second moment")]
    NegativeSecondMoment,
    /// An inner learning-rate schedule the manifest's could not reach.
    #[error("state's inner learning-rate schedule is out of range")]
    InnerLr,
    /// Contributors recorded for ticks the state has not closed.
    #[error("state's roster names ticks it has not closed")]
    Roster,
    /// A sum guard that is not a window of norms.
    #[error("state's sum guard is unusable: {0}")]
    SumGuard(#[from] super::sum_guard::SumGuardError),
}

impl ReplicaState {
    /// Checks the state against the manifest's model size and engine.
    pub fn verify(&self, cfg: &EngineConfig, num_params: usize) -> Result<(), StateError> {
        if self.anchor.len() != num_params {
            return Err(StateError::Shape { expected: num_params, got: self.anchor.len() });
        }
        if !self.outer.fits(cfg.outer.kind, num_params) {
            return Err(StateError::OuterState);
        }
        if self.anchor.iter().any(|v| !v.is_finite()) {
            return Err(StateError::NonFinite);
        }
        if self.outer.second_moment.iter().any(|v| *v < 0.0) {
            return Err(StateError::NegativeSecondMoment);
        }
        if !self.inner_lr.plausible(&cfg.inner_lr) {
            return Err(StateError::InnerLr);
        }
        if self.roster.newest().is_some_and(|n| self.last_closed_key.is_none_or(|c| n > c)) {
            return Err(StateError::Roster);
        }
        self.sum_guard.check()?;
        for p in &self.pending {
            let payload = crate::codec::Payload::parse(p.announcement.codec, num_params, &p.bytes)
                .map_err(|_| StateError::Shape { expected: num_params, got: p.bytes.len() })?;
            if !payload.finite_and_norm_sq().0 || crate::ids::Hash32::of(&p.bytes) != p.announcement.payload_hash {
                return Err(StateError::NonFinite);
            }
        }
        Ok(())
    }
}

impl ReplicaState {
    /// Whether a joiner may still start from this state at `now`. With
    /// aggregated dissemination a tick's sums are announced once, in the
    /// tick after it: a state closed through tick `c` misses nothing only
    /// if its joiner listens before tick `c + 2` begins, when the sums of
    /// tick `c + 1` are announced; one that closed no tick, only in the
    /// run's first tick. Always true otherwise.
    pub fn current_at(&self, cfg: &EngineConfig, now: Micros) -> bool {
        match (cfg.aggregation, &self.clock) {
            (Some(_), Some(clock)) => self.last_closed_key.map_or(0, |c| c + 1) >= clock.tick(now),
            _ => true,
        }
    }
}

/// Everything needed to resume this node after a restart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineCheckpoint {
    /// The replica.
    pub replica: ReplicaState,
    /// Our next round.
    pub round: u64,
    /// The first round we took part in.
    pub first_round: u64,
    /// Error-feedback residual.
    pub residual: Vec<f32>,
    /// Speed estimate.
    pub speed: f32,
    /// Updates given up as too stale.
    pub given_up: AppliedSet,
}

impl Engine {
    /// A checkpoint of this engine.
    pub fn checkpoint(&self) -> EngineCheckpoint {
        EngineCheckpoint {
            replica: self.replica_state(),
            round: self.round,
            first_round: self.first_round,
            residual: self.residual.residual().to_vec(),
            speed: self.membership.my_speed(),
            given_up: self.given_up.clone(),
        }
    }

    /// Resumes from a checkpoint of this same node. A round that was in
    /// flight is abandoned: it restarts from the checkpoint's anchor with a
    /// new round number, so its id never collides with anything published.
    pub fn resume(
        cfg: EngineConfig,
        me: NodeId,
        run_id: RunId,
        t0: Micros,
        checkpoint: EngineCheckpoint,
        seed: u64,
    ) -> Self {
        let mut e = Engine::new(cfg, me, run_id, t0, Vec::new(), checkpoint.speed, seed);
        e.install_replica(checkpoint.replica);
        e.round = e.round.max(checkpoint.round);
        e.first_round = checkpoint.first_round;
        e.residual = ErrorFeedback::from_residual(checkpoint.residual);
        e.given_up = checkpoint.given_up;
        e
    }

    /// When this replica's state is fit to give a joiner: `None` now, or
    /// the time to ask again. With aggregated dissemination a state taken
    /// while the last tick's sums are still being announced would leave
    /// its joiner without them (their signed hashes went out before it
    /// listened), so it waits until that tick is closed.
    pub fn state_ready_at(&self, now: Micros) -> Option<Micros> {
        let (Some(_), Some(clock)) = (self.cfg.aggregation, self.clock.as_ref()) else {
            return None;
        };
        let tick = clock.tick(now);
        if tick == 0 || self.last_closed_key.is_some_and(|c| c + 1 >= tick) {
            return None;
        }
        let grace = self.grace_time().0.max(1);
        let closes = clock.boundary(tick) + Micros(super::aggregation::EXCHANGE_GRACES * grace);
        Some(if closes > now { closes } else { now + Micros(grace) })
    }

    /// Makes sure our next round number is at least `round` (after a crash,
    /// the ledger may show a contribution newer than the checkpoint).
    pub fn advance_round_to(&mut self, round: u64) {
        self.round = self.round.max(round);
    }

    /// Joins a run mid-way from a peer's replica state (already verified).
    pub fn join(
        cfg: EngineConfig,
        me: NodeId,
        run_id: RunId,
        t0: Micros,
        state: ReplicaState,
        initial_speed: f32,
        seed: u64,
    ) -> Self {
        let barrier = matches!(cfg.schedule, super::config::Schedule::Barrier);
        let peer_round = state.round;
        let mut e = Engine::new(cfg, me, run_id, t0, Vec::new(), initial_speed, seed);
        e.install_replica(state);
        if barrier {
            // Take part from the round after the one in progress.
            e.round = e.round.max(peer_round.saturating_add(1));
        }
        e.first_round = e.round;
        e
    }

    fn install_replica(&mut self, state: ReplicaState) {
        // Never reuse one of our own round numbers the swarm has seen.
        self.round = state.applied.max_round(&self.me).map_or(0, |r| r + 1);
        self.anchor = std::sync::Arc::new(state.anchor);
        self.outer = state.outer;
        self.inner_lr = state.inner_lr;
        self.version = state.version;
        self.applied = state.applied;
        self.clock = state.clock;
        self.last_closed_key = state.last_closed_key;
        self.pending = state.pending;
        self.roster = state.roster;
        self.sum_guard = state.sum_guard;
        self.aggregation.replay.clear();
        self.late_updates.clear();
        self.index_pending();
        self.phase = Phase::Created;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::AggregationConfig, engine::Strategy, ids::Hash32};

    fn aggregating() -> (EngineConfig, ReplicaState) {
        let mut cfg = EngineConfig::preset(Strategy::Gopals);
        cfg.aggregation = Some(AggregationConfig { groups: 2, aggregators: 3, quorum: 2, fanout: 8, min_tick_ms: 0 });
        let e = Engine::new(cfg, NodeId([1; 32]), RunId(Hash32([2; 32])), Micros(0), vec![0.5; 4], 1.0, 7);
        let mut s = e.replica_state();
        s.clock = Some(TickClock::new(Micros(0), Micros::from_secs_f64(1.0)));
        s.last_closed_key = Some(4);
        (cfg, s)
    }

    #[test]
    fn a_joiner_may_start_from_a_state_only_before_its_next_sums_are_announced() {
        let (cfg, s) = aggregating();
        // Closed through tick 4: tick 5's sums are announced early in tick 6.
        assert!(s.current_at(&cfg, Micros::from_secs_f64(5.9)));
        assert!(!s.current_at(&cfg, Micros::from_secs_f64(6.0)));
        let full = EngineConfig::preset(Strategy::Gopals);
        assert!(s.current_at(&full, Micros::from_secs_f64(60.0)), "without aggregation every state is current");
    }

    #[test]
    fn a_roster_newer_than_the_closed_ticks_is_refused() {
        let (cfg, mut s) = aggregating();
        s.roster.record(NodeId([3; 32]), 4);
        assert_eq!(s.verify(&cfg, 4), Ok(()));
        s.roster.record(NodeId([3; 32]), 5);
        assert_eq!(s.verify(&cfg, 4), Err(StateError::Roster));
    }
}
