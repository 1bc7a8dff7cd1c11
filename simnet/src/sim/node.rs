//! One simulated node: a real engine, a real trainer, a speed profile and
//! its accounting.

use ragtag_models::Trainer;
use ragtag_protocol::{
    Keypair,
    engine::{Engine, IdleTimes, ReplicaState},
    ids::{NodeId, RunId},
    manifest::Manifest,
    time::Micros,
};

use crate::speed::SpeedProfile;

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NodeState {
    /// Not started yet (joins later).
    Late,
    /// Fetching state to join.
    Joining,
    /// Taking part.
    Up,
    /// Crashed or left.
    Down,
}

#[derive(Debug)]
pub(super) struct SimNode {
    pub(super) index: usize,
    pub(super) id: NodeId,
    pub(super) profile: SpeedProfile,
    pub(super) group: usize,
    pub(super) state: NodeState,
    pub(super) engine: Option<Engine>,
    pub(super) trainer: Trainer,
    pub(super) incarnation: u64,
    pub(super) timer_generation: u64,
    pub(super) scheduled_timeout: Option<Micros>,
    pub(super) busy_s: f64,
    pub(super) alive_s: f64,
    pub(super) published: u64,
    pub(super) samples: u64,
    /// Idle time of the engines this node ran, settled when each closed.
    pub(super) idle: IdleTimes,
    seed: u64,
    up_since: f64,
    phase_start: Option<f64>,
}

impl SimNode {
    pub(super) fn new(
        index: usize,
        seed: u64,
        profile: SpeedProfile,
        group: usize,
        trainer: Trainer,
        late: bool,
    ) -> Self {
        Self {
            index,
            id: Keypair::deterministic(seed, index as u64).node_id(),
            profile,
            group,
            state: if late { NodeState::Late } else { NodeState::Down },
            engine: None,
            trainer,
            incarnation: 0,
            timer_generation: 0,
            scheduled_timeout: None,
            busy_s: 0.0,
            alive_s: 0.0,
            published: 0,
            samples: 0,
            idle: IdleTimes::default(),
            seed: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index as u64,
            up_since: 0.0,
            phase_start: None,
        }
    }

    /// Steps per second at the base speed.
    fn steps_per_s(&self, step_cost_s: f64) -> f32 {
        (self.profile.base / step_cost_s) as f32
    }

    pub(super) fn new_engine(&self, m: &Manifest, run_id: RunId, initial: Vec<f32>, step_cost_s: f64) -> Engine {
        let t0 = Micros(m.start_ms * 1000);
        Engine::new(m.engine, self.id, run_id, t0, initial, self.steps_per_s(step_cost_s), self.seed ^ self.incarnation)
    }

    pub(super) fn join_engine(&self, m: &Manifest, run_id: RunId, state: ReplicaState, step_cost_s: f64) -> Engine {
        let t0 = Micros(m.start_ms * 1000);
        Engine::join(m.engine, self.id, run_id, t0, state, self.steps_per_s(step_cost_s), self.seed ^ self.incarnation)
    }

    pub(super) fn bring_up(&mut self, engine: Engine, now: f64) {
        self.engine = Some(engine);
        self.scheduled_timeout = None;
        self.state = NodeState::Up;
        self.up_since = now;
    }

    /// Crash or clean leave: the engine is gone; queued results of this
    /// incarnation are ignored.
    pub(super) fn bring_down(&mut self, now: f64) {
        if self.state != NodeState::Up {
            return;
        }
        self.close(now);
        self.engine = None;
        self.state = NodeState::Down;
        self.incarnation += 1;
    }

    pub(super) fn phase_started(&mut self, now: f64) {
        self.phase_start = Some(now);
    }

    pub(super) fn phase_finished(&mut self, now: f64, samples: u64) {
        if let Some(s) = self.phase_start.take() {
            self.busy_s += now - s;
        }
        self.samples += samples;
    }

    /// Settles accounting at `now` (end of run or going down: once per
    /// engine, which is dropped or the run ends right after).
    pub(super) fn close(&mut self, now: f64) {
        if self.state == NodeState::Up {
            self.alive_s += now - self.up_since;
            self.up_since = now;
            if let Some(e) = &self.engine {
                self.idle.merge(&e.idle_at(Micros::from_secs_f64(now)));
            }
            if let Some(s) = self.phase_start.take() {
                self.busy_s += now - s;
            }
        }
    }
}
