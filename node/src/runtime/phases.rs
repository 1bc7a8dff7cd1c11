//! The local phase in the trainer's hands: never lost in a full queue,
//! retried when it fails, and a node whose trainer stops answering exits
//! with a clear error instead of waiting for ever.

use std::time::{Duration, Instant};

use ragtag_protocol::engine::LocalPhase;

use super::now;

/// Failures of the same phase in a row before the node gives up.
pub(crate) const MAX_PHASE_FAILURES: u32 = 3;
/// Slack beyond a phase's expected end before it counts as lost.
const PHASE_SLACK: Duration = Duration::from_secs(120);
/// A phase without a deadline may take this many times its expected time.
const OVERRUN_FACTOR: f64 = 4.0;

/// The phase being trained, or waiting for room in the trainer's queue.
#[derive(Debug, Default)]
pub(crate) struct PhaseWatch {
    current: Option<Watched>,
    failures: u32,
    fatal: Option<String>,
}

#[derive(Debug)]
struct Watched {
    phase: LocalPhase,
    /// When it reached the trainer's queue (`None`: not yet, the queue was full).
    sent: Option<Instant>,
    /// When it counts as lost.
    limit: Duration,
}

impl PhaseWatch {
    /// A new phase from the engine; `speed` (steps/s) sizes its time limit.
    pub(crate) fn start(&mut self, phase: LocalPhase, speed: f32) {
        let expected = match phase.deadline {
            Some(d) => Duration::from_micros(d.0.saturating_sub(now().0)),
            None => Duration::from_secs_f64(phase.steps as f64 / speed.max(1e-3) as f64 * OVERRUN_FACTOR),
        };
        self.current = Some(Watched { phase, sent: None, limit: expected + PHASE_SLACK });
    }

    /// The phase to hand to the trainer, if it has not reached its queue.
    pub(crate) fn unsent(&self) -> Option<LocalPhase> {
        self.current.as_ref().filter(|w| w.sent.is_none()).map(|w| w.phase.clone())
    }

    /// The trainer's queue took it.
    pub(crate) fn sent(&mut self) {
        if let Some(w) = self.current.as_mut() {
            w.sent = Some(Instant::now());
        }
    }

    /// The trainer finished `round`.
    pub(crate) fn done(&mut self, round: u64) {
        if self.current.as_ref().is_some_and(|w| w.phase.round == round) {
            self.current = None;
            self.failures = 0;
        }
    }

    /// The trainer failed `round`: it is sent again, or after
    /// [`MAX_PHASE_FAILURES`] in a row the node must stop.
    pub(crate) fn failed(&mut self, round: u64, error: &str) {
        let Some(w) = self.current.as_mut().filter(|w| w.phase.round == round) else { return };
        self.failures += 1;
        if self.failures >= MAX_PHASE_FAILURES {
            self.fatal = Some(format!("the trainer failed round {round} {} times in a row: {error}", self.failures));
        } else {
            tracing::warn!("the trainer failed round {round} ({error}); trying again");
            w.sent = None;
        }
    }

    /// Why the node must stop, if it must: repeated failures, or a phase
    /// the trainer has held past its limit.
    pub(crate) fn fatal(&self) -> Option<String> {
        if let Some(f) = &self.fatal {
            return Some(f.clone());
        }
        let w = self.current.as_ref()?;
        let held = w.sent?.elapsed();
        (held > w.limit).then(|| {
            format!(
                "the trainer has not finished round {} in {:.0} s (limit {:.0} s)",
                w.phase.round,
                held.as_secs_f64(),
                w.limit.as_secs_f64()
            )
        })
    }

    /// What the node is waiting for, in words (for `ragtag status`).
    /// What the node waits for, as a metric label, and for how long the
    /// phase in training has run (0 otherwise).
    pub(crate) fn waiting_on(&self) -> (&'static str, f64) {
        match &self.current {
            None => ("next_round", 0.0),
            Some(Watched { sent: None, .. }) => ("trainer_queue", 0.0),
            Some(Watched { sent: Some(t), .. }) => ("training", t.elapsed().as_secs_f64()),
        }
    }

    /// Every label [`PhaseWatch::waiting_on`] gives.
    pub(crate) const WAITS: [&'static str; 3] = ["next_round", "trainer_queue", "training"];

    pub(crate) fn describe(&self) -> String {
        match &self.current {
            None => "waiting for the next round".into(),
            Some(Watched { phase, sent: None, .. }) => {
                format!("round {} waits for room in the trainer's queue", phase.round)
            }
            Some(Watched { phase, sent: Some(t), limit }) => format!(
                "training round {} ({:.0} s so far, limit {:.0} s)",
                phase.round,
                t.elapsed().as_secs_f64(),
                limit.as_secs_f64()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ragtag_protocol::engine::{EngineConfig, LocalMode, Strategy};

    use super::*;

    fn phase(round: u64) -> LocalPhase {
        LocalPhase {
            round,
            anchor: Arc::new(vec![0.0; 4]),
            steps: 10,
            partial: 0.0,
            lr_scale: 1.0,
            mode: LocalMode::Train,
            pull: EngineConfig::preset(Strategy::Gopals).pull,
            seed: 0,
            deadline: None,
            lead: false,
        }
    }

    #[test]
    fn a_failed_phase_is_sent_again_then_the_node_gives_up() {
        let mut w = PhaseWatch::default();
        w.start(phase(3), 10.0);
        assert!(w.unsent().is_some(), "not yet in the queue");
        assert_eq!(w.waiting_on(), ("trainer_queue", 0.0));
        w.sent();
        assert!(w.unsent().is_none());
        w.failed(3, "out of memory");
        assert_eq!(w.unsent().map(|p| p.round), Some(3), "retried");
        w.sent();
        w.failed(2, "a stale round"); // not ours: ignored
        assert!(w.fatal().is_none());
        w.failed(3, "out of memory");
        w.sent();
        w.failed(3, "out of memory");
        assert!(w.fatal().is_some_and(|f| f.contains("3 times")), "{:?}", w.fatal());
    }

    #[test]
    fn success_resets_the_count_and_describes_the_wait() {
        let mut w = PhaseWatch::default();
        w.start(phase(1), 10.0);
        w.sent();
        w.failed(1, "x");
        w.sent();
        assert!(w.describe().starts_with("training round 1"));
        assert_eq!(w.waiting_on().0, "training");
        w.done(1);
        assert_eq!(w.describe(), "waiting for the next round");
        assert_eq!(w.waiting_on(), ("next_round", 0.0));
        w.start(phase(2), 10.0);
        w.sent();
        w.failed(2, "x");
        w.sent();
        w.failed(2, "x");
        assert!(w.fatal().is_none(), "two failures of round 2, the earlier one of round 1 forgotten");
    }
}
