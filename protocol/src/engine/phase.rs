//! What the engine is doing, and the local phase it has on the trainer:
//! the round (or lead step) in training and what it started from.

use std::sync::Arc;

use super::lead;
use crate::{time::Micros, version::VersionVector};

/// What the engine is doing.
#[derive(Clone, Debug)]
pub(super) enum Phase {
    /// Not started yet.
    Created,
    /// Waiting to start the next round.
    Waiting,
    /// A local phase is running on the trainer.
    Training(Training),
    /// Left the swarm.
    Stopped,
}

/// The phase on the trainer: a round, or one of its lead steps.
#[derive(Clone, Debug)]
pub(super) struct Training {
    pub(super) round: u64,
    pub(super) started: Micros,
    pub(super) base: Arc<Vec<f32>>,
    pub(super) base_version: Option<VersionVector>,
    pub(super) base_applied_total: u64,
    pub(super) base_tick: u64,
    /// The work of the round's lead steps, carried onto `base`.
    pub(super) lead: Option<lead::LeadWork>,
    /// This phase is a lead step ([`lead`]), not the round itself.
    pub(super) leading: bool,
}
