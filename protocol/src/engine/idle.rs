//! Why a node that is up is not training, and for how long: the idle time
//! broken down so a user (and the simulator's report) can see what a
//! schedule costs and what overlapping compute with the exchange would win.

use serde::{Deserialize, Serialize};

use crate::time::Micros;

/// Why the engine is waiting instead of training.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum IdleReason {
    /// The start-up wait for peers' heartbeats before the first round.
    Startup,
    /// Barrier schedule: the last round's updates of some member are missing.
    Barrier,
    /// Tick schedule: the last tick's updates are still arriving (waited for
    /// up to the grace).
    Exchange,
    /// Tick schedule: this tick's phase is done and the next tick has not
    /// begun (the margin, and the part of a step that did not fit).
    TickRest,
    /// Tick schedule: too little of the tick was left to be worth a round.
    ShortTick,
}

impl IdleReason {
    /// Every reason, in a fixed order.
    pub const ALL: [IdleReason; 5] =
        [IdleReason::Startup, IdleReason::Barrier, IdleReason::Exchange, IdleReason::TickRest, IdleReason::ShortTick];

    /// A stable name for metrics labels and CSV columns.
    pub fn name(self) -> &'static str {
        match self {
            IdleReason::Startup => "startup",
            IdleReason::Barrier => "barrier",
            IdleReason::Exchange => "exchange",
            IdleReason::TickRest => "tick_rest",
            IdleReason::ShortTick => "short_tick",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Idle time so far, by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleTimes {
    micros: [u64; IdleReason::ALL.len()],
}

impl IdleTimes {
    /// Time spent idle for `reason`.
    pub fn get(&self, reason: IdleReason) -> Micros {
        Micros(self.micros[reason.index()])
    }

    /// Idle time over every reason.
    pub fn total(&self) -> Micros {
        Micros(self.micros.iter().sum())
    }

    /// Adds another stretch's times (a node's earlier incarnations).
    pub fn merge(&mut self, other: &IdleTimes) {
        for r in IdleReason::ALL {
            self.add(r, other.get(r));
        }
    }

    /// Seconds per reason name, for reports and status.
    pub fn seconds_by_name(&self) -> std::collections::BTreeMap<String, f64> {
        IdleReason::ALL.iter().map(|r| (r.name().to_string(), self.get(*r).as_secs_f64())).collect()
    }

    fn add(&mut self, reason: IdleReason, d: Micros) {
        let slot = &mut self.micros[reason.index()];
        *slot = slot.saturating_add(d.0);
    }
}

/// The wait in progress: the engine enters a reason when it decides not to
/// train and leaves when a round starts; the elapsed time is booked on every
/// change, so the totals are exact at every instant the engine is called.
#[derive(Clone, Debug, Default)]
pub(super) struct IdleClock {
    current: Option<(IdleReason, Micros)>,
}

impl IdleClock {
    /// The reason of the wait in progress.
    pub(super) fn reason(&self) -> Option<IdleReason> {
        self.current.map(|(r, _)| r)
    }

    /// Waiting for `reason` from `now` (a different reason closes the last).
    pub(super) fn enter(&mut self, now: Micros, reason: IdleReason, times: &mut IdleTimes) {
        if self.reason() == Some(reason) {
            return;
        }
        self.leave(now, times);
        self.current = Some((reason, now));
    }

    /// `times` with the wait in progress booked up to `now`.
    pub(super) fn at(&self, now: Micros, times: &IdleTimes) -> IdleTimes {
        let mut out = times.clone();
        if let Some((reason, since)) = self.current {
            out.add(reason, now.saturating_sub(since));
        }
        out
    }

    /// The wait ends at `now` (a round starts or the engine stops).
    pub(super) fn leave(&mut self, now: Micros, times: &mut IdleTimes) {
        if let Some((reason, since)) = self.current.take() {
            times.add(reason, now.saturating_sub(since));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_booked_to_their_reason_on_each_change() {
        let mut t = IdleTimes::default();
        let mut c = IdleClock::default();
        c.enter(Micros(100), IdleReason::TickRest, &mut t);
        c.enter(Micros(150), IdleReason::TickRest, &mut t); // same reason: one interval
        c.enter(Micros(400), IdleReason::Exchange, &mut t);
        c.leave(Micros(430), &mut t);
        c.leave(Micros(900), &mut t); // nothing in progress: nothing booked
        assert_eq!(t.get(IdleReason::TickRest), Micros(300));
        assert_eq!(t.get(IdleReason::Exchange), Micros(30));
        assert_eq!(t.get(IdleReason::ShortTick), Micros(0));
        assert_eq!(t.total(), Micros(330));
        assert_eq!(c.reason(), None);
    }

    #[test]
    fn names_are_distinct() {
        let names: std::collections::BTreeSet<_> = IdleReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), IdleReason::ALL.len());
    }
}
