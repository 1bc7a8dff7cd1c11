//! When a peer's replica state may touch ours, and by how much.
//!
//! Anti-entropy and joins take state from a single peer, outside the update
//! path's signatures and norm guard. Honest replicas over the same updates
//! differ by little: a round or two of the replica's own movement, except
//! after a partition. So distances are measured in that unit (the median
//! norm of what our anchor moved over a recent round, averages excluded).
//! A near anchor moves ours by a bounded step; a far one is used only when
//! a second peer that contributed updates serves an anchor that agrees with
//! it (the other side of a healed partition is many such peers; a poisoner
//! alone is one). So one peer gets no more power over our replica than a
//! bounded step per round, except where it is the only other contributor
//! of a replica that is still young: of two nodes that trained apart before
//! they met, one takes the other's replica whole, as a joiner with one peer
//! takes that peer's.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::snapshot::{ReplicaState, StateError};

/// An anchor farther than this many rounds of movement from ours is used
/// only when a second peer vouches for it (the two halves of a partition
/// healed after 60 s lay up to 14 rounds apart in the simulator's partition
/// scenario; a poisoned anchor in the adversary test lay 131 rounds away).
pub const MAX_ANCHOR_DISTANCE_ROUNDS: f32 = 2.0;
/// Updates of a peer we must have applied (within the applied window)
/// before its state may touch ours: a fresh identity needs more than one
/// accepted update to count, so each sybil must keep contributing work.
pub const CONTRIBUTOR_MIN_UPDATES: u32 = 3;
/// Most one average moves our anchor, in rounds of movement.
pub const MAX_ANCHOR_STEP_ROUNDS: f32 = 0.5;
/// Rounds of movement remembered.
const MOVEMENT_WINDOW: usize = 16;
/// Anchors served by two peers agree (they vouch for each other, for a
/// joiner or for a far anchor in anti-entropy) when they lie within this
/// relative distance of each other. Honest replicas over the same
/// updates are bit-identical (canonical batches); one a batch ahead can
/// differ by far more (a round moved the built-in run's anchor by about 0.4
/// of its norm early on), so a joiner that finds no agreement asks again.
pub const AGREEMENT: f32 = 1e-2;
/// Outer momenta served to a joiner agree within this relative distance.
pub const JOIN_MOMENTUM_AGREEMENT: f32 = 0.5;

/// Why a peer's replica state was not used.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum StateRefusal {
    /// Fewer than `CONTRIBUTOR_MIN_UPDATES` of the peer's recent updates
    /// are in our replica: a fresh identity vouches for nothing.
    #[error("fewer than {CONTRIBUTOR_MIN_UPDATES} of the peer's updates are in our replica")]
    NotContributor,
    /// We already averaged with someone this round.
    #[error("already averaged this round")]
    TooSoon,
    /// Our replica has not moved yet, so there is no scale to measure by.
    #[error("no measured movement of our replica yet")]
    NoBaseline,
    /// The anchor lies this many rounds of movement from ours.
    #[error("its anchor lies {rounds:.1} rounds of movement from ours (limit {MAX_ANCHOR_DISTANCE_ROUNDS})")]
    TooFar {
        /// Distance in rounds of our replica's movement.
        rounds: f32,
    },
    /// As `TooFar`, estimated from the digest's sketch without fetching the
    /// state: nobody could vouch for it, and it was checked whole lately.
    #[error(
        "its anchor's sketch lies {rounds:.1} rounds of movement from ours (limit {MAX_ANCHOR_DISTANCE_ROUNDS}; \
         estimated, not fetched)"
    )]
    TooFarBySketch {
        /// Estimated distance in rounds of our replica's movement.
        rounds: f32,
    },
    /// A joiner was served states that no second peer's state agrees with.
    #[error("no second peer served a state that agrees with it")]
    Unvouched,
    /// The state fails the checks a joiner's does (`ReplicaState::verify`:
    /// shape, finite values, an inner-rate schedule the manifest allows).
    #[error("its state is not one this run could reach ({0})")]
    Invalid(StateError),
}

impl StateRefusal {
    /// A short name for metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Self::NotContributor => "not_contributor",
            Self::TooSoon => "too_soon",
            Self::NoBaseline => "no_baseline",
            Self::TooFar { .. } => "too_far",
            Self::TooFarBySketch { .. } => "too_far_by_sketch",
            Self::Unvouched => "unvouched",
            Self::Invalid(_) => "invalid",
        }
    }
}

/// The recent movement of our anchor per round: the unit of trust.
#[derive(Clone, Debug, Default)]
pub struct Movement {
    window: VecDeque<f32>,
}

impl Movement {
    /// Records the norm of one round's movement (zero moves are not
    /// informative: nothing was applied).
    pub fn record(&mut self, norm: f32) {
        if !(norm.is_finite() && norm > 0.0) {
            return;
        }
        if self.window.len() == MOVEMENT_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(norm);
    }

    /// The median recent movement, if any was recorded.
    pub fn median(&self) -> Option<f32> {
        let mut v: Vec<f32> = self.window.iter().copied().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f32::total_cmp);
        Some(v[v.len() / 2])
    }
}

/// `||a - b||`.
pub fn distance(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt() as f32
}

/// `||a||`.
pub fn norm(a: &[f32]) -> f32 {
    a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt() as f32
}

/// Moves `mine` toward `theirs` by the fraction `t` of the way, shortened
/// so that the move's norm is at most `bound` (`None`: not shortened).
/// Returns the fraction used.
pub fn bounded_blend(mine: &mut [f32], theirs: &[f32], t: f32, bound: Option<f32>) -> f32 {
    let t = match bound {
        Some(b) => {
            let d = distance(mine, theirs);
            if d * t > b { (b / d).max(0.0) } else { t }
        }
        None => t,
    };
    if t > 0.0 {
        for (x, y) in mine.iter_mut().zip(theirs) {
            *x += t * (y - *x);
        }
    }
    t
}

/// Whether two replica states served to a joiner describe the same replica
/// (see [`vouched_state`]). The inner-rate scale must match exactly:
/// replicas that applied the same rounds hold the same one, and a copied
/// anchor with a forged scale would otherwise carry the floor rate in.
pub fn states_agree(a: &ReplicaState, b: &ReplicaState) -> bool {
    a.inner_lr.scale == b.inner_lr.scale
        && anchors_agree(&a.anchor, &b.anchor)
        && (a.outer.momentum.is_empty() || close(&a.outer.momentum, &b.outer.momentum, JOIN_MOMENTUM_AGREEMENT))
}

/// Whether two anchors served by different peers are the same replica's
/// (within [`AGREEMENT`]).
pub fn anchors_agree(a: &[f32], b: &[f32]) -> bool {
    close(a, b, AGREEMENT)
}

fn close(a: &[f32], b: &[f32], relative: f32) -> bool {
    super::anti_entropy::relative_distance(a, b).is_some_and(|d| d <= relative)
}

/// Which of the states served to a joiner to trust: the one that agrees
/// with the most others, at least one other when more than one peer served.
/// Two states agree when their anchors lie within [`AGREEMENT`] of each
/// other and their outer momenta within [`JOIN_MOMENTUM_AGREEMENT`] (momenta
/// change faster between rounds). Two camps of equal size cannot be told
/// apart: neither is trusted. A single server is trusted alone: there is
/// nobody to check it against, and the caller says so.
pub fn vouched_state(states: &[&ReplicaState]) -> Result<usize, StateRefusal> {
    if states.len() == 1 {
        return Ok(0);
    }
    let agree = |a: &ReplicaState, b: &ReplicaState| states_agree(a, b);
    let votes: Vec<usize> = states
        .iter()
        .enumerate()
        .map(|(i, a)| states.iter().enumerate().filter(|&(j, b)| j != i && agree(a, b)).count())
        .collect();
    let best = (0..states.len()).max_by_key(|&i| (votes[i], std::cmp::Reverse(i))).ok_or(StateRefusal::Unvouched)?;
    let rival = (0..states.len()).any(|j| votes[j] == votes[best] && !agree(states[best], states[j]));
    if votes[best] == 0 || rival { Err(StateRefusal::Unvouched) } else { Ok(best) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movement_is_the_median_of_nonzero_rounds() {
        let mut m = Movement::default();
        assert_eq!(m.median(), None);
        for n in [0.0, 1.0, f32::NAN, 3.0, 2.0] {
            m.record(n);
        }
        assert_eq!(m.median(), Some(2.0));
        for _ in 0..MOVEMENT_WINDOW {
            m.record(10.0);
        }
        assert_eq!(m.median(), Some(10.0), "old rounds leave the window");
    }

    #[test]
    fn a_blend_never_moves_further_than_its_bound() {
        let mut a = vec![0.0; 4];
        let t = bounded_blend(&mut a, &[2.0, 0.0, 0.0, 0.0], 0.5, Some(10.0));
        assert_eq!((t, a[0]), (0.5, 1.0), "a near state is averaged");
        let mut a = vec![0.0; 4];
        bounded_blend(&mut a, &[1000.0, 0.0, 0.0, 0.0], 0.5, Some(2.0));
        assert!((a[0] - 2.0).abs() < 1e-4, "a far one moves us by the bound only: {}", a[0]);
        let mut a = vec![1.0; 4];
        assert_eq!(bounded_blend(&mut a, &[5.0; 4], 0.5, Some(0.0)), 0.0);
        assert_eq!(a, vec![1.0; 4], "a zero bound leaves us unchanged");
        assert_eq!(bounded_blend(&mut a, &[5.0; 4], 0.5, None), 0.5);
        assert_eq!(a, vec![3.0; 4], "no bound: the plain average");
    }

    #[test]
    fn a_joiner_trusts_the_state_a_second_peer_vouches_for() {
        let state = |f: f32, m: f32| {
            let mut s = crate::engine::Engine::new(
                crate::engine::EngineConfig::preset(crate::engine::Strategy::Gopals),
                crate::ids::NodeId([1; 32]),
                crate::ids::RunId(crate::ids::Hash32([2; 32])),
                crate::time::Micros::ZERO,
                (0..100).map(|i| i as f32 * f).collect(),
                1.0,
                0,
            )
            .replica_state();
            s.outer.momentum.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32 * m);
            s
        };
        let (honest, close, poisoned) = (state(1.0, 1.0), state(1.001, 1.1), state(100.0, 1.0));
        assert_eq!(vouched_state(&[&poisoned, &honest, &close]), Ok(1));
        assert_eq!(vouched_state(&[&honest, &poisoned]), Err(StateRefusal::Unvouched));
        assert_eq!(vouched_state(&[&poisoned]), Ok(0), "a lone server cannot be checked");
        let twin = poisoned.clone();
        assert_eq!(vouched_state(&[&poisoned, &twin, &honest, &close]), Err(StateRefusal::Unvouched), "a tie");
        assert_eq!(vouched_state(&[&poisoned, &twin, &honest, &close, &honest]), Ok(2), "the larger camp");
        let pushy = state(1.0, 50.0);
        assert_eq!(vouched_state(&[&pushy, &honest, &close]), Ok(1), "the honest anchor with a poisoned momentum");
        let mut slowed = honest.clone();
        slowed.inner_lr.scale = 1.0 / 32.0;
        assert_eq!(vouched_state(&[&slowed, &honest, &close]), Ok(1), "the honest anchor with a forged rate");
    }
}
