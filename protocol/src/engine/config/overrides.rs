//! A strategy preset changed by a manifest, scenario or command line: each
//! setting given replaces the preset's, the rest stay.

use serde::{Deserialize, Serialize};

use super::{
    super::{cooldown::Cooldown, inner_lr::InnerLr},
    EngineConfig, OuterKind, Schedule, StalenessMeasure, StalenessWeight, Strategy, Work,
};
use crate::{aggregate::AggregationConfig, codec::CodecKind};

/// Changes to a strategy preset, as a manifest, scenario or command line
/// gives them: every field is optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineOverrides {
    /// Reference inner steps per round.
    pub h: Option<u32>,
    /// Fewest inner steps worth a round.
    pub h_min: Option<u32>,
    /// Outer learning rate.
    pub eta: Option<f32>,
    /// Outer momentum.
    pub beta: Option<f32>,
    /// Outer momentum before the inner rate's first decrease.
    pub beta_early: Option<f32>,
    /// Outer warm-up rounds.
    pub warmup_rounds: Option<u32>,
    /// Adaptive momentum restart threshold (cosine); a negative value
    /// below -1 turns it off.
    pub restart_below: Option<f32>,
    /// Outer optimiser.
    pub outer: Option<OuterKind>,
    /// Payload codec.
    pub codec: Option<CodecKind>,
    /// Error feedback on or off.
    pub error_feedback: Option<bool>,
    /// Staleness weight.
    pub weight: Option<StalenessWeight>,
    /// Staleness measure.
    pub measure: Option<StalenessMeasure>,
    /// Drop beyond this staleness.
    pub tau_max: Option<u32>,
    /// Work per round.
    pub work: Option<Work>,
    /// Tick grace as a fraction of the period (tick mode).
    pub grace: Option<f32>,
    /// Tick margin (tick mode).
    pub margin: Option<f32>,
    /// Fixed tick period (tick mode).
    pub period_ms: Option<u32>,
    /// Overlap the exchange with compute (tick mode).
    pub overlap: Option<bool>,
    /// End rounds with a partial step (tick mode).
    pub partial_step: Option<bool>,
    /// Train lead steps during the exchange wait (tick mode).
    pub lead: Option<bool>,
    /// Pull probability.
    pub pull_p: Option<f32>,
    /// Pull strength.
    pub pull_lambda: Option<f32>,
    /// Anti-entropy period in rounds (0 = off).
    pub anti_entropy_every: Option<u32>,
    /// Heartbeat period.
    pub heartbeat_ms: Option<u32>,
    /// Silence before a peer leaves the live set.
    pub peer_timeout_ms: Option<u32>,
    /// Wait before the first round.
    pub startup_ms: Option<u32>,
    /// Canonical batches on or off.
    pub canonical_batches: Option<bool>,
    /// Inner learning-rate schedule.
    pub inner_lr: Option<InnerLr>,
    /// A cooldown to the run's budget.
    pub cooldown: Option<Cooldown>,
    /// Aggregated dissemination.
    pub aggregation: Option<AggregationConfig>,
}

impl EngineOverrides {
    /// The preset of `strategy` with these changes.
    pub fn apply(&self, strategy: Strategy) -> EngineConfig {
        let mut c = EngineConfig::preset(strategy);
        let ddp = strategy == Strategy::Ddp;
        // ddp is one gradient step per round by definition.
        if !ddp {
            if let Some(v) = self.h {
                c.h = v;
            }
            if let Some(v) = self.h_min {
                c.h_min = v;
            }
            if let Some(v) = self.codec {
                c.codec = v;
            }
            if let Some(v) = self.error_feedback {
                c.error_feedback = v;
            }
            if let Some(v) = self.eta {
                c.outer.eta = v;
            }
            if let Some(v) = self.beta {
                c.outer.beta = v;
            }
            if let Some(v) = self.beta_early {
                c.outer.beta_early = Some(v);
            }
            if let Some(v) = self.outer {
                c.outer.kind = v;
            }
            if let Some(v) = self.warmup_rounds {
                c.outer.warmup_rounds = v;
            }
            if let Some(v) = self.restart_below {
                c.outer.restart_below = (v >= -1.0).then_some(v);
            }
            if let Some(v) = self.inner_lr {
                c.inner_lr = v;
            }
            if let Some(v) = self.cooldown {
                // With a known end the rate stays whole until the cooldown
                // (warm-up, stable, decay): the plateau halvings took it to
                // 1/32 in the first quarter of a 200-s run, where a cooldown
                // can no longer act (BENCHMARKS.md, "a budget's cooldown").
                c.cooldown = Some(v);
                if self.inner_lr.is_none() {
                    c.inner_lr = InnerLr::Constant;
                }
            }
        }
        c.h_min = c.h_min.min(c.h);
        if let Some(v) = self.weight {
            c.staleness.weight = v;
        }
        if let Some(v) = self.measure {
            c.staleness.measure = v;
        }
        if let Some(v) = self.tau_max {
            c.staleness.tau_max = v;
        }
        if let Some(v) = self.work
            && !ddp
        {
            c.work = v;
        }
        if let Schedule::Tick { grace, margin, period_ms, overlap, partial_step, lead } = &mut c.schedule {
            *grace = self.grace.unwrap_or(*grace);
            *margin = self.margin.unwrap_or(*margin);
            *period_ms = self.period_ms.or(*period_ms);
            *overlap = self.overlap.unwrap_or(*overlap);
            *partial_step = self.partial_step.unwrap_or(*partial_step);
            *lead = self.lead.unwrap_or(*lead);
        }
        if let Some(v) = self.pull_p {
            c.pull.p = v;
        }
        if let Some(v) = self.pull_lambda {
            c.pull.lambda = v;
        }
        if let Some(v) = self.anti_entropy_every {
            c.anti_entropy.every_rounds = v;
        }
        if let Some(v) = self.heartbeat_ms {
            c.membership.heartbeat_ms = v;
        }
        if let Some(v) = self.peer_timeout_ms {
            c.membership.peer_timeout_ms = v;
        }
        if let Some(v) = self.startup_ms {
            c.membership.startup_ms = v;
        }
        if let Some(v) = self.canonical_batches {
            c.canonical_batches = v;
        }
        // Sums are per tick: strategies without ticks keep full dissemination.
        if let Some(v) = self.aggregation
            && matches!(c.schedule, Schedule::Tick { .. })
        {
            c.aggregation = Some(v);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_change_only_what_they_name() {
        let o = EngineOverrides { h: Some(80), eta: Some(0.5), ..EngineOverrides::default() };
        let c = o.apply(Strategy::Gopals);
        assert_eq!(c.h, 80);
        assert_eq!(c.outer.eta, 0.5);
        assert_eq!(c.outer.beta, EngineConfig::preset(Strategy::Gopals).outer.beta);
        // ddp keeps one step per round and its optimiser.
        let d = o.apply(Strategy::Ddp);
        assert_eq!(d.h, 1);
        assert_eq!(d.outer.kind, OuterKind::AdamW);
        assert_eq!(EngineOverrides::default().apply(Strategy::Diloco), EngineConfig::preset(Strategy::Diloco));
    }
}
