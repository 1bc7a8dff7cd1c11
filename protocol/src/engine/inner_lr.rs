//! The inner learning rate over a run: a constant rate leaves local SGD on a
//! noise floor above what the model can reach (DDP's averaged gradient has
//! a lower one at the same rate), so the engine lowers the rate when the
//! swarm's training loss stops falling, and drops the outer momentum and the
//! rate when it spikes (a divergence guard).
//!
//! The decision reads only the training losses that applied updates report
//! in their signed announcements, batch by batch, so replicas that apply the
//! same canonical batches reach the same scale at the same outer round.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// How the inner learning rate changes over a run (part of the manifest).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InnerLr {
    /// The manifest's rate for the whole run.
    Constant,
    /// Reduce on plateau: the mean training loss of the last `window` outer
    /// rounds is compared with the best such mean so far; after `patience`
    /// rounds without a relative improvement of `threshold` the rate is
    /// multiplied by `factor` (never below `min_scale` times the manifest's).
    /// A round whose loss exceeds `spike` times that best mean, twice in a
    /// row, is a divergence: the rate falls by `factor` and the outer
    /// momentum is dropped.
    Plateau {
        /// Outer rounds averaged into one loss reading.
        window: u32,
        /// Outer rounds without improvement before the rate falls.
        patience: u32,
        /// Relative improvement that counts as progress.
        threshold: f32,
        /// What the rate is multiplied by at a plateau or a spike.
        factor: f32,
        /// The lowest scale of the manifest's rate.
        min_scale: f32,
        /// A round's loss over this multiple of the best mean is a spike.
        spike: f32,
    },
}

impl InnerLr {
    /// The default for local-SGD strategies.
    pub const PLATEAU: InnerLr =
        InnerLr::Plateau { window: 8, patience: 16, threshold: 0.01, factor: 0.5, min_scale: 1.0 / 32.0, spike: 2.0 };

    /// One sentence for a manifest's rationale.
    pub fn describe(&self) -> String {
        match *self {
            InnerLr::Constant => "constant: the manifest's rate for the whole run".into(),
            InnerLr::Plateau { window, patience, threshold, factor, min_scale, spike } => format!(
                "reduce on plateau: x{factor} when the swarm's mean training loss over {window} outer rounds has not \
                 improved {}% in {patience} rounds (down to x{min_scale}); a round's loss over {spike}x the best \
                 reading twice running drops the outer momentum and lowers the rate too. Local steps at a \
                 constant rate plateau above DDP's loss (BENCHMARKS.md, the versus-DDP task)",
                threshold * 100.0
            ),
        }
    }

    /// Checks the values a manifest could get wrong.
    pub fn validate(&self) -> Result<(), InnerLrError> {
        let InnerLr::Plateau { window, patience, threshold, factor, min_scale, spike } = *self else {
            return Ok(());
        };
        if window == 0 || patience == 0 {
            return Err(InnerLrError::Rounds);
        }
        if !(0.0..1.0).contains(&threshold) {
            return Err(InnerLrError::Threshold(threshold));
        }
        if !(factor > 0.0 && factor < 1.0) {
            return Err(InnerLrError::Factor(factor));
        }
        if !(min_scale > 0.0 && min_scale <= 1.0) {
            return Err(InnerLrError::MinScale(min_scale));
        }
        if !(spike > 1.0 && spike.is_finite()) {
            return Err(InnerLrError::Spike(spike));
        }
        Ok(())
    }
}

/// Why an inner learning-rate schedule is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InnerLrError {
    /// A zero window or patience.
    #[error("the plateau window and patience must be at least one round")]
    Rounds,
    /// Threshold outside [0, 1).
    #[error("the plateau threshold must be in [0, 1), got {0}")]
    Threshold(f32),
    /// Factor outside (0, 1).
    #[error("the rate factor must be in (0, 1), got {0}")]
    Factor(f32),
    /// Minimum scale outside (0, 1].
    #[error("the minimum rate scale must be in (0, 1], got {0}")]
    MinScale(f32),
    /// Spike multiple not above 1.
    #[error("the spike multiple must be above 1, got {0}")]
    Spike(f32),
}

/// Why the scale changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrChange {
    /// The loss stopped falling.
    Plateau,
    /// The loss jumped: a divergence.
    Spike,
}

impl LrChange {
    /// The name used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            LrChange::Plateau => "plateau",
            LrChange::Spike => "spike",
        }
    }
}

/// The schedule's state (part of the replica state, so a joiner continues
/// at the swarm's rate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InnerLrState {
    /// The manifest's rate is multiplied by this.
    pub scale: f32,
    /// Mean training losses of the last outer rounds, newest last.
    recent: VecDeque<f32>,
    /// The best window mean since the last change.
    best: Option<f32>,
    /// Rounds since `best` last improved.
    since_best: u32,
    /// Consecutive rounds above the spike line.
    spiking: u32,
    /// Reported `(loss, samples)` of the round being collected, one per
    /// applied update: the round reads as their capped and clipped mean (see
    /// [`robust_mean`]), so one peer's forged report cannot decide it.
    open: Vec<(f32, u64)>,
    /// Times the scale changed.
    pub changes: u32,
}

impl Default for InnerLrState {
    fn default() -> Self {
        Self {
            scale: 1.0,
            recent: VecDeque::new(),
            best: None,
            since_best: 0,
            spiking: 0,
            open: Vec::new(),
            changes: 0,
        }
    }
}

/// Most rounds kept for one reading, whatever a manifest asks.
const MAX_WINDOW: usize = 256;
/// Most loss reports kept for one round (a round applies one update per
/// peer, so this bounds memory, not swarms we expect).
const MAX_OPEN: usize = 4096;

/// A round's reading: the samples-weighted mean of its `(loss, samples)`
/// reports, each weight capped at the median claimed samples and each loss
/// clipped to within a factor `spread` of the weighted median. Both are the
/// sender's word: capped and clipped, one forged report (an absurd loss, a
/// billion samples) moves the reading by a bounded share instead of
/// deciding it, while honest rounds read as their plain weighted mean.
/// `None` when empty. The result does not depend on arrival order.
fn robust_mean(reports: &mut [(f32, u64)], spread: f32) -> Option<f32> {
    if reports.is_empty() {
        return None;
    }
    let mid = reports.len() / 2;
    let cap = reports.select_nth_unstable_by_key(mid, |r| r.1).1.1;
    // A total order: reports that compare equal are equal bit for bit, so
    // the summing order below is the same whatever the arrival order.
    reports.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let weight = |r: &(f32, u64)| r.1.min(cap) as f64;
    let total: f64 = reports.iter().map(weight).sum();
    if total <= 0.0 {
        return None;
    }
    let mut below = 0.0;
    let median = reports
        .iter()
        .find(|r| {
            below += weight(r);
            2.0 * below >= total
        })
        .map_or(reports[reports.len() - 1].0, |r| r.0);
    let spread = spread.max(1.0);
    let (lo, hi) = (median / spread, median * spread);
    let sum: f64 = reports.iter().map(|r| weight(r) * r.0.clamp(lo, hi) as f64).sum();
    Some((sum / total) as f32)
}

impl InnerLrState {
    /// Counts an applied update's reported training loss into the open
    /// round (an update that trained on no samples reports nothing). Its
    /// sample count weighs it only up to the round's median claim: it is the
    /// sender's word, like the loss.
    pub fn observe(&mut self, loss: f32, samples: u64) {
        if loss.is_finite() && loss >= 0.0 && samples > 0 && self.open.len() < MAX_OPEN {
            self.open.push((loss, samples));
        }
    }

    /// Closes an outer round: returns the change made, if any.
    pub fn close_round(&mut self, schedule: &InnerLr) -> Option<LrChange> {
        let InnerLr::Plateau { window, patience, threshold, factor, min_scale, spike } = *schedule else {
            return None;
        };
        let loss = robust_mean(&mut self.open, spike)?;
        self.open.clear();
        let window = (window as usize).min(MAX_WINDOW);
        if self.best.is_some_and(|best| loss > spike * best) {
            self.spiking += 1;
            if self.spiking >= 2 {
                self.lower(factor, min_scale);
                // Readings start again from where the loss is now: a best
                // that cannot be reached again (a diverged run's, or a
                // forged one in a served state) would count every round
                // after as a spike.
                self.best = None;
                return Some(LrChange::Spike);
            }
            // A lone spike stays out of the readings.
            return None;
        }
        self.spiking = 0;
        self.recent.push_back(loss);
        while self.recent.len() > window {
            self.recent.pop_front();
        }
        if self.recent.len() < window {
            return None;
        }
        let mean = self.recent.iter().sum::<f32>() / window as f32;
        match self.best {
            Some(best) if mean >= best * (1.0 - threshold) => self.since_best += 1,
            _ => {
                self.best = Some(mean);
                self.since_best = 0;
            }
        }
        if self.since_best >= patience && self.scale > min_scale {
            // The best mean is kept: the lower rate must beat it to count.
            self.lower(factor, min_scale);
            return Some(LrChange::Plateau);
        }
        None
    }

    fn lower(&mut self, factor: f32, min_scale: f32) {
        self.scale = (self.scale * factor).max(min_scale);
        self.recent.clear();
        self.since_best = 0;
        self.spiking = 0;
        self.changes += 1;
    }

    /// Takes a peer's schedule state in an anti-entropy average, so replicas
    /// that lowered their rates at different times (the two sides of a
    /// healed partition) go on from one state: the outer momentum can depend
    /// on the rate (`beta_early`), and replicas with the same batches must
    /// step alike. `bounded` (one peer's word) takes it only within one
    /// `factor` of our scale: that peer cannot jump our rate to either end.
    /// Returns whether it was taken.
    pub fn adopt(&mut self, peer: &InnerLrState, schedule: &InnerLr, bounded: bool) -> bool {
        if !peer.plausible(schedule) || *self == *peer {
            return false;
        }
        if let InnerLr::Plateau { factor, .. } = *schedule
            && bounded
        {
            let ratio = peer.scale / self.scale;
            let slack = 1.0 + 1e-4;
            if ratio * slack < factor || ratio > slack / factor {
                return false;
            }
        }
        *self = peer.clone();
        true
    }

    /// True when a peer's state is one this schedule could have reached:
    /// the scale in `[min_scale, 1]`, every loss finite and non-negative.
    pub fn plausible(&self, schedule: &InnerLr) -> bool {
        let min = match *schedule {
            InnerLr::Constant => 1.0,
            InnerLr::Plateau { min_scale, .. } => min_scale,
        };
        let finite = |x: f32| x.is_finite() && x >= 0.0;
        (min..=1.0).contains(&self.scale)
            && self.recent.len() <= MAX_WINDOW
            && self.recent.iter().all(|l| finite(*l))
            && self.best.is_none_or(finite)
            && self.open.len() <= MAX_OPEN
            && self.open.iter().all(|&(l, samples)| finite(l) && samples > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEDULE: InnerLr =
        InnerLr::Plateau { window: 4, patience: 3, threshold: 0.01, factor: 0.5, min_scale: 0.25, spike: 2.0 };

    fn round(s: &mut InnerLrState, loss: f32) -> Option<LrChange> {
        s.observe(loss, 100);
        s.close_round(&SCHEDULE)
    }

    #[test]
    fn a_falling_loss_keeps_the_rate() {
        let mut s = InnerLrState::default();
        for r in 0..100 {
            assert_eq!(round(&mut s, 2.0 * 0.97f32.powi(r)), None, "round {r}");
        }
        assert_eq!(s.scale, 1.0);
    }

    #[test]
    fn a_flat_loss_halves_the_rate_down_to_the_floor() {
        let mut s = InnerLrState::default();
        let changes: Vec<(usize, LrChange)> =
            (0..100).filter_map(|r| round(&mut s, 1.0 + 0.001 * (r % 2) as f32).map(|c| (r, c))).collect();
        // Window full at round 3 (the best), three rounds without progress.
        assert_eq!(changes[0], (6, LrChange::Plateau));
        assert_eq!(changes.len(), 2, "0.25 is the floor: {changes:?}");
        assert_eq!(s.scale, 0.25);
    }

    #[test]
    fn two_spikes_in_a_row_lower_the_rate_one_does_not() {
        let mut s = InnerLrState::default();
        for _ in 0..4 {
            round(&mut s, 1.0);
        }
        assert_eq!(round(&mut s, 5.0), None, "a lone spike");
        assert_eq!(round(&mut s, 1.0), None);
        assert_eq!(round(&mut s, 5.0), None);
        assert_eq!(round(&mut s, 5.0), Some(LrChange::Spike));
        assert_eq!(s.scale, 0.5);
        // The loss stays at its new level: no spike after spike.
        for r in 0..12 {
            assert_ne!(round(&mut s, 5.0), Some(LrChange::Spike), "round {r}");
        }
    }

    #[test]
    fn a_forged_best_reading_costs_at_most_one_spike() {
        let mut s = InnerLrState { best: Some(0.0), ..InnerLrState::default() };
        let changes: Vec<LrChange> = (0..40).filter_map(|_| round(&mut s, 1.0)).collect();
        assert_eq!(changes.iter().filter(|c| **c == LrChange::Spike).count(), 1, "{changes:?}");
    }

    /// A peer that reports an absurd loss or none (and claims a billion
    /// samples to weigh it) every round, beside two honest reports: its
    /// weight is capped at the median claim and its loss clipped to within 2x
    /// of the median, so the divergence guard never fires and every reading
    /// stays within half again of the honest one (here 0.79x to 1.43x; a
    /// sample-weighted mean would have read 1e30 and spiked).
    #[test]
    fn one_forged_report_in_three_moves_a_round_by_a_bounded_share() {
        let (mut honest, mut attacked) = (InnerLrState::default(), InnerLrState::default());
        for r in 0..40 {
            let loss = 2.0 / (1.0 + r as f32 * 0.01);
            honest.observe(loss, 100);
            honest.observe(loss, 300);
            attacked.observe(loss, 100);
            attacked.observe(loss, 300);
            attacked.observe(if r % 2 == 0 { 1e30 } else { 0.0 }, 1_000_000_000);
            honest.close_round(&SCHEDULE);
            assert_ne!(attacked.close_round(&SCHEDULE), Some(LrChange::Spike), "round {r}");
            if let (Some(h), Some(a)) = (honest.recent.back(), attacked.recent.back()) {
                assert!((0.75..=1.5).contains(&(a / h)), "round {r}: {a} against {h}");
            }
        }
    }

    #[test]
    fn a_round_reads_as_its_capped_and_clipped_mean() {
        assert_eq!(robust_mean(&mut [], 2.0), None);
        // Honest rounds: the plain weighted mean.
        assert_eq!(robust_mean(&mut [(1.0, 3), (2.0, 1)], 2.0), Some(1.25));
        assert_eq!(robust_mean(&mut [(1.0, 1), (1.5, 1), (1.2, 1)], 2.0), Some(1.2333334));
        // A forged report: its weight capped at the median claim (2), its
        // loss clipped to twice the weighted median (1.0).
        let r = robust_mean(&mut [(1e30, u64::MAX), (1.0, 2), (1.0, 2), (1.0, 1)], 2.0).unwrap();
        assert!((r - 9.0 / 7.0).abs() < 1e-6, "{r}");
    }

    #[test]
    fn losses_that_cannot_be_read_are_ignored() {
        let mut s = InnerLrState::default();
        s.observe(f32::NAN, 10);
        s.observe(-1.0, 10);
        s.observe(1.0, 0);
        assert_eq!(s.close_round(&SCHEDULE), None);
        assert!(s.recent.is_empty());
        assert!(s.plausible(&SCHEDULE));
    }

    #[test]
    fn implausible_states_are_told_apart() {
        let s = InnerLrState { scale: 0.1, ..InnerLrState::default() };
        assert!(!s.plausible(&SCHEDULE), "below the floor");
        assert!(!InnerLrState { scale: 0.5, ..InnerLrState::default() }.plausible(&InnerLr::Constant));
        let mut s = InnerLrState::default();
        s.recent.push_back(f32::INFINITY);
        assert!(!s.plausible(&SCHEDULE));
        // A served open round with reports of no samples: observe() never
        // keeps one, and a round of them would read as 0/0.
        let s = InnerLrState { open: vec![(1.0, 0)], ..InnerLrState::default() };
        assert!(!s.plausible(&SCHEDULE));
        assert_eq!(robust_mean(&mut [(1.0, 0), (2.0, 0)], 2.0), None);
    }

    /// One peer's word moves our schedule at most one `factor` step; a
    /// vouched state (unbounded) is taken whole; an implausible one never.
    #[test]
    fn a_peer_schedule_is_adopted_within_its_bounds() {
        let at = |scale: f32| InnerLrState { scale, since_best: 7, ..InnerLrState::default() };
        let mut s = InnerLrState::default();
        assert!(s.adopt(&at(0.5), &SCHEDULE, true));
        assert_eq!(s, at(0.5));
        assert!(!s.adopt(&at(0.5), &SCHEDULE, true), "nothing to take");
        assert!(s.adopt(&at(1.0), &SCHEDULE, true), "one step back up");
        let mut s = InnerLrState::default();
        assert!(!s.adopt(&at(0.25), &SCHEDULE, true), "two steps at one peer's word");
        assert_eq!(s, InnerLrState::default());
        assert!(s.adopt(&at(0.25), &SCHEDULE, false), "vouched");
        assert_eq!(s.scale, 0.25);
        assert!(!s.adopt(&at(0.1), &SCHEDULE, false), "below the floor");
        assert!(!s.adopt(&at(0.5), &InnerLr::Constant, false), "a constant rate has one scale");
    }

    #[test]
    fn bad_schedules_are_refused() {
        assert!(InnerLr::PLATEAU.validate().is_ok());
        let bad =
            InnerLr::Plateau { window: 4, patience: 3, threshold: 0.01, factor: 1.0, min_scale: 0.25, spike: 2.0 };
        assert_eq!(bad.validate(), Err(InnerLrError::Factor(1.0)));
    }
}
