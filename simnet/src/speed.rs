//! Compute speed over virtual time: a base speed per node and transient
//! straggler episodes. An inner step costs `step_cost / speed(t)`.

use ragtag_protocol::rng::SeededRng;

use crate::scenario::Scenario;

/// One node's speed over time.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeedProfile {
    /// Relative speed outside episodes.
    pub base: f64,
    /// Hardware tier, when the scenario names one.
    pub tier: Option<String>,
    /// `(start, end, slowdown)` episodes, sorted, non-overlapping.
    pub episodes: Vec<(f64, f64, f64)>,
}

impl SpeedProfile {
    /// Relative speed at `t`.
    pub fn speed_at(&self, t: f64) -> f64 {
        match self.episodes.iter().find(|(s, e, _)| *s <= t && t < *e) {
            Some((_, _, slowdown)) => self.base / slowdown,
            None => self.base,
        }
    }

    /// Virtual time `steps` inner steps take when started at `start`.
    pub fn phase_duration(&self, start: f64, steps: u32, step_cost: f64) -> f64 {
        self.phase_until(start, steps, 0.0, step_cost, None).2
    }

    /// The whole steps a phase started at `start` completes, the batch
    /// fraction of the partial step it takes after them (asked for:
    /// `partial`, 0 for none) and the time they take, stopped the way the
    /// node's trainer stops at the engine's deadline: after each step it
    /// goes on only if the next step, as long as the last one per row of
    /// batch, would end before `deadline`. At least one step runs, so a
    /// straggler whose speed fell mid-round publishes on time with fewer
    /// steps instead of overrunning its tick. A partial step costs its
    /// fraction of a whole one: real steps have a fixed cost per step too,
    /// so this is the optimistic end.
    pub fn phase_until(
        &self,
        start: f64,
        steps: u32,
        partial: f32,
        step_cost: f64,
        deadline: Option<f64>,
    ) -> (u32, f32, f64) {
        let mut t = start;
        let mut step = 0.0;
        for done in 1..=steps {
            step = step_cost / self.speed_at(t);
            t += step;
            if done < steps && deadline.is_some_and(|d| t + step >= d) {
                return (done, 0.0, t - start);
            }
        }
        if partial > 0.0 && steps > 0 && deadline.is_none_or(|d| t + step * f64::from(partial) < d) {
            t += partial as f64 * step_cost / self.speed_at(t);
            return (steps, partial, t - start);
        }
        (steps, 0.0, t - start)
    }

    /// Seconds of compute available in `[from, to)` at speed 1 (for the ideal).
    pub fn work_between(&self, from: f64, to: f64) -> f64 {
        let mut work = (to - from) * self.base;
        for (s, e, slowdown) in &self.episodes {
            let overlap = (e.min(to) - s.max(from)).max(0.0);
            work -= overlap * self.base * (1.0 - 1.0 / slowdown);
        }
        work
    }
}

/// The profiles of every node of a scenario, drawn from `seed`.
pub fn profiles(s: &Scenario, seed: u64) -> Vec<SpeedProfile> {
    let mut rng = SeededRng::derive(seed, "speeds");
    let mut out: Vec<SpeedProfile> =
        s.nodes.speeds.iter().map(|v| SpeedProfile { base: *v, tier: None, episodes: Vec::new() }).collect();
    for t in &s.nodes.tiers {
        for _ in 0..t.count {
            out.push(SpeedProfile { base: t.speed, tier: Some(t.name.clone()), episodes: Vec::new() });
        }
    }
    if let Some(l) = &s.nodes.lognormal {
        for _ in 0..l.count {
            let v = (l.median.ln() + l.sigma * rng.normal()).exp().clamp(l.min, l.max);
            out.push(SpeedProfile { base: v, tier: None, episodes: Vec::new() });
        }
    }
    if let Some(st) = &s.nodes.stragglers {
        for p in out.iter_mut() {
            if !rng.bernoulli(st.fraction) {
                continue;
            }
            let mut t = 0.0;
            loop {
                t += -st.every_s * (1.0 - rng.uniform()).ln();
                if t >= s.duration_s {
                    break;
                }
                p.episodes.push((t, t + st.duration_s, st.slowdown));
                t += st.duration_s;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_slow_steps_down() {
        let p = SpeedProfile { base: 2.0, tier: None, episodes: vec![(10.0, 20.0, 4.0)] };
        assert_eq!(p.speed_at(5.0), 2.0);
        assert_eq!(p.speed_at(15.0), 0.5);
        assert!((p.phase_duration(0.0, 10, 0.1) - 0.5).abs() < 1e-9);
        assert!((p.phase_duration(10.0, 10, 0.1) - 2.0).abs() < 1e-9);
        // A deadline cuts the phase as the node's trainer does: 5 steps of
        // 0.05 s end at 0.25, a sixth would end at 0.30 >= 0.28.
        let (steps, _, took) = p.phase_until(0.0, 10, 0.0, 0.1, Some(0.28));
        assert!(steps == 5 && (took - 0.25).abs() < 1e-9, "{steps} steps, {took} s");
        // An episode that starts mid-phase slows the steps, and the cut follows.
        // (9.95, 10.0 at full speed, then 10.2, 10.4; a fifth would end at 10.6.)
        let (steps, _, took) = p.phase_until(9.9, 10, 0.0, 0.1, Some(10.5));
        assert!(steps == 4 && (took - 0.5).abs() < 1e-9, "{steps} steps, {took} s");
        // At least one step, even past the deadline.
        assert_eq!(p.phase_until(0.0, 10, 0.0, 0.1, Some(0.0)).0, 1);
        // A partial step of 0.6 fits when 0.6 of a step is left before the
        // deadline (5 whole steps end at 0.25, the partial at 0.28), not
        // when less is.
        let (steps, partial, took) = p.phase_until(0.0, 5, 0.6, 0.1, Some(0.285));
        // (The fraction is an f32: 0.6 is 0.6 to about 1e-8.)
        assert!(steps == 5 && partial == 0.6 && (took - 0.28).abs() < 1e-8, "{steps}, {partial}, {took}");
        assert_eq!(p.phase_until(0.0, 5, 0.6, 0.1, Some(0.275)).1, 0.0);
        assert!((p.work_between(0.0, 30.0) - (60.0 - 10.0 * 2.0 * 0.75)).abs() < 1e-9);
    }

    #[test]
    fn profiles_are_seeded() {
        let s = Scenario::load("stragglers").unwrap();
        assert_eq!(profiles(&s, 3), profiles(&s, 3));
        assert!(profiles(&s, 3).iter().any(|p| !p.episodes.is_empty()));
        let l = Scenario::load("large").unwrap();
        let ps = profiles(&l, 1);
        assert_eq!(ps.len(), 1000);
        assert!(ps.iter().all(|p| (1.0..=8.0).contains(&p.base)));
    }
}
