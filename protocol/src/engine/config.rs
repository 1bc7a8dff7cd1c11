//! Engine configuration: every mechanism of GoPALS is a switch here, and
//! every baseline strategy is a preset of these switches, not a copy of the
//! engine.

use serde::{Deserialize, Serialize};

use super::cooldown::{Cooldown, CooldownError};
use super::inner_lr::{InnerLr, InnerLrError};
use crate::{
    aggregate::{AggregationConfig, AggregationConfigError},
    codec::{CodecKind, CodecParamsError},
};

mod overrides;
pub use overrides::EngineOverrides;

/// The strategies we compare side by side (DESIGN.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Synchronous data parallel: one step, all gradients averaged, slowest gates all.
    Ddp,
    /// Synchronous local SGD: H steps, barrier, average, outer Nesterov.
    Diloco,
    /// DiLoCo with each node's steps proportional to its speed.
    DilocoProportional,
    /// Apply every update on arrival: no staleness weight, no speed adaptation.
    Async,
    /// The default: clock-aligned rounds (ticks), time budgets, staleness weights.
    Gopals,
    /// Free-running GoPALS for swarms without usable clocks.
    GopalsAsync,
}

impl Strategy {
    /// Every strategy, in the order reports list them.
    pub const ALL: [Strategy; 6] = [
        Strategy::Ddp,
        Strategy::Diloco,
        Strategy::DilocoProportional,
        Strategy::Async,
        Strategy::Gopals,
        Strategy::GopalsAsync,
    ];

    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Ddp => "ddp",
            Strategy::Diloco => "diloco",
            Strategy::DilocoProportional => "diloco-proportional",
            Strategy::Async => "async",
            Strategy::Gopals => "gopals",
            Strategy::GopalsAsync => "gopals-async",
        }
    }

    /// Parses a name as printed by [`Strategy::name`].
    pub fn parse(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Default adaptive-restart threshold of gopals: the momentum is dropped
/// when a round's pseudo-gradient points against it (cosine below this).
pub const RESTART_BELOW: f32 = -0.5;

/// Gopals' outer momentum until the inner rate first falls (0.9 after).
/// It beat 0.9's mean time to target on all five simulator tasks and
/// reached every target on every seed (cnn-digits 0.35x ddp's time at 0.83x
/// its samples); 0.7 throughout never reached teacher-digits' target. Real
/// swarms: teacher-digits and cnn-digits gained, char-shakespeare lost on
/// its one seed (BENCHMARKS.md, "outer momentum before and after the first
/// plateau", "with the early momentum").
pub const BETA_EARLY: f32 = 0.7;

/// The presets' reference inner steps per round (H). Shorter rounds took
/// fewer samples to the simulator's char-transformer target (1.38x ddp's
/// at H = 20, 1.75x at 50) for more bytes per sample; part of that gain is
/// the plateau schedule, which counts rounds, lowering the rate sooner
/// (BENCHMARKS.md, "rounds of H = 20", where teacher-digits loses by it).
pub const DEFAULT_H: u32 = 20;

/// The presets' fewest steps worth a round: a tenth of H, so a node at a
/// quarter of the reference speed still trains every tick.
pub const DEFAULT_H_MIN: u32 = 2;

/// The smallest partial step worth taking, as a fraction of a batch: below
/// it a step is mostly fixed per-step cost.
pub const MIN_PARTIAL_STEP: f32 = 0.25;

/// A partial step is planned to end this fraction of a step before the
/// round's deadline: planned to the deadline exactly, it would not fit
/// whenever a step ran a hair slower than the estimate (and, in the
/// simulator, whenever the rounding fell the wrong way).
pub const PARTIAL_STEP_SLACK: f32 = 0.1;

/// When a node starts its next round.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Rounds aligned to a shared clock; a round ends on the clock, never
    /// waiting for anyone, and the next starts once the tick's updates are in
    /// or `grace` (a fraction of the tick period) after the tick, whichever
    /// is first.
    Tick {
        /// Longest wait after a tick for its updates, as a fraction of the
        /// tick period (choose H so that a tick is ~10x the dissemination time).
        grace: f32,
        /// Fraction of the tick left unplanned as a safety margin against
        /// speed estimates that are slightly optimistic.
        margin: f32,
        /// A fixed tick period; `None` derives it as `H / v_ref`.
        period_ms: Option<u32>,
        /// Overlap the exchange with compute: a round starts at its tick
        /// without waiting for the last tick's updates, and each tick's
        /// updates are applied one tick later, by every replica alike.
        #[serde(default)]
        overlap: bool,
        /// End a round with one step on part of a batch when a whole step
        /// no longer fits before the tick (at least [`MIN_PARTIAL_STEP`]
        /// of one): a slow node's tick otherwise loses up to a step's time.
        #[serde(default)]
        partial_step: bool,
        /// While the last tick's updates arrive, train the round's first
        /// steps on the anchor as it is and carry them onto the new anchor
        /// when the batch is applied: the exchange wait
        /// becomes training.
        #[serde(default)]
        lead: bool,
    },
    /// Round r+1 starts when every live member's round-r update is applied.
    Barrier,
    /// The next round starts as soon as the last one is published.
    FreeRunning,
}

/// How many inner steps a round gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Work {
    /// Exactly H, also in tick mode (no deadline: a slow node's round may
    /// span ticks and publish late).
    Fixed,
    /// Proportional to speed: `clamp(floor(H v_i / v_ref), H_min, H)`, or in
    /// tick mode the steps that fit before the next tick.
    ProportionalToSpeed,
}

/// What the local phase computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalMode {
    /// Inner AdamW steps; the update is the pseudo-gradient `x_base - theta`.
    Train,
    /// One gradient at the anchor, no inner step (ddp): the outer optimiser
    /// is then the real optimiser.
    Gradient,
}

/// How staleness is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StalenessMeasure {
    /// Tick mode: outer rounds between the update's base tick and the
    /// canonical batch that applies it (at least its publish tick): a late
    /// arrival counts as stale, and replicas that apply it in the same batch
    /// agree on its weight.
    Tick,
    /// Updates the sender applied between base and publish, carried in the update.
    Sender,
    /// `sum_j max(0, V_k[j] - B[j])` at receiver k (replicas drift; experiments only).
    Receiver,
}

/// The weight a stale update gets.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StalenessWeight {
    /// Always 1.
    None,
    /// `(1 + tau)^-a`.
    Polynomial {
        /// The exponent a.
        a: f32,
    },
    /// `exp(-lambda tau)`.
    Exponential {
        /// The decay rate.
        lambda: f32,
    },
    /// 1 up to `free`, then `1 / (1 + slope (tau - free))`.
    Hinge {
        /// Staleness that costs nothing.
        free: u32,
        /// How fast the weight falls beyond it.
        slope: f32,
    },
}

/// Staleness settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StalenessConfig {
    /// How tau is measured.
    pub measure: StalenessMeasure,
    /// The weight function.
    pub weight: StalenessWeight,
    /// Divide `(1 + tau)` by the live node count before weighting, capped at
    /// 1 (free-running mode, where every update is ~N-1 updates stale).
    pub normalize_by_nodes: bool,
    /// Updates staler than this are dropped with a reason.
    pub tau_max: u32,
}

/// The outer optimiser that merges pseudo-gradients into the anchor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OuterKind {
    /// Per arrival a plain step, one momentum step per N arrivals (DESIGN §2.3).
    DelayedNesterov,
    /// Naive Nesterov on every arrival (for ablation; oscillates at eta 0.7).
    Nesterov,
    /// Plain SGD on every arrival: `x -= eta / N * w * g`.
    Sgd,
    /// AdamW on the mean of each N arrivals (ddp: the gradients' optimiser).
    AdamW,
}

/// Outer optimiser settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OuterConfig {
    /// Which optimiser.
    pub kind: OuterKind,
    /// Outer learning rate (for AdamW: its learning rate).
    pub eta: f32,
    /// Momentum (Nesterov) or first-moment decay (AdamW).
    pub beta: f32,
    /// AdamW second-moment decay.
    pub beta2: f32,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// AdamW gradient-norm clip (0 = none).
    pub clip: f32,
    /// eta ramps linearly over this many outer rounds (0 = no warm-up).
    pub warmup_rounds: u32,
    /// Reset the outer momentum when the cosine between a round's
    /// pseudo-gradient and the momentum falls below this (adaptive restart;
    /// delayed Nesterov only; `None` = off).
    #[serde(default)]
    pub restart_below: Option<f32>,
    /// Momentum while the inner rate is still the manifest's (before the
    /// first plateau lowers it); `beta` after (`None` = `beta` throughout).
    /// Replicas whose rates fell at different times (the two sides of a
    /// healed partition) step with different momenta until anti-entropy
    /// hands them one schedule state.
    #[serde(default)]
    pub beta_early: Option<f32>,
}

/// Pseudo-synchronisation: with probability p an inner step pulls the
/// working model toward the anchor instead of taking a gradient step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PullConfig {
    /// Probability of a pull step (0 = off).
    pub p: f32,
    /// Pull strength lambda.
    pub lambda: f32,
}

/// Anti-entropy: the repair path after partitions and restarts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AntiEntropyConfig {
    /// Run with one random peer every this many rounds (0 = off).
    pub every_rounds: u32,
    /// Average anchors when their relative distance exceeds this.
    pub distance_threshold: f32,
}

/// Membership timing.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MembershipConfig {
    /// How often the engine asks to send a heartbeat.
    pub heartbeat_ms: u32,
    /// A peer silent this long leaves the live count N.
    pub peer_timeout_ms: u32,
    /// Most peers tracked (bounded table).
    pub max_peers: u32,
    /// Longest wait after start before the first round, so peers' first
    /// heartbeats arrive (barrier and tick modes); it ends sooner once every
    /// peer the shell knows takes part has been heard.
    #[serde(default = "default_startup_ms")]
    pub startup_ms: u32,
}

fn default_startup_ms() -> u32 {
    2_000
}

/// The whole engine configuration. It is part of the manifest, so every
/// node of a run uses the same one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// The strategy this configuration started from (for reports).
    pub strategy: Strategy,
    /// Round schedule.
    pub schedule: Schedule,
    /// Steps per round.
    pub work: Work,
    /// Local phase mode.
    pub local: LocalMode,
    /// Reference inner steps per round.
    pub h: u32,
    /// Fewest inner steps worth a round.
    pub h_min: u32,
    /// Staleness settings.
    pub staleness: StalenessConfig,
    /// Outer optimiser.
    pub outer: OuterConfig,
    /// Pull settings.
    pub pull: PullConfig,
    /// Anti-entropy settings.
    pub anti_entropy: AntiEntropyConfig,
    /// Payload codec.
    pub codec: CodecKind,
    /// Keep the compression error and add it to the next delta.
    pub error_feedback: bool,
    /// Apply received updates in canonical order at round boundaries
    /// (replicas stay bit-identical whatever the arrival order), or on arrival.
    pub canonical_batches: bool,
    /// Membership timing.
    pub membership: MembershipConfig,
    /// The inner learning rate over the run (manifests written before it
    /// existed keep a constant rate).
    #[serde(default = "constant_inner_lr")]
    pub inner_lr: InnerLr,
    /// A cooldown to the run's budget, where its creator gave one.
    #[serde(default)]
    pub cooldown: Option<Cooldown>,
    /// Aggregated dissemination ([`crate::aggregate`]): `None` sends every
    /// update to every node.
    #[serde(default)]
    pub aggregation: Option<AggregationConfig>,
}

fn constant_inner_lr() -> InnerLr {
    InnerLr::Constant
}

impl EngineConfig {
    /// The preset for a strategy, with DESIGN.md's defaults.
    pub fn preset(strategy: Strategy) -> Self {
        let delayed = OuterConfig {
            kind: OuterKind::DelayedNesterov,
            eta: 0.7,
            beta: 0.9,
            beta2: 0.95,
            weight_decay: 0.0,
            clip: 0.0,
            warmup_rounds: 10,
            restart_below: None,
            beta_early: None,
        };
        let base = EngineConfig {
            strategy,
            schedule: Schedule::Tick {
                grace: 0.1,
                margin: 0.02,
                period_ms: None,
                overlap: false,
                partial_step: false,
                lead: false,
            },
            work: Work::ProportionalToSpeed,
            local: LocalMode::Train,
            h: DEFAULT_H,
            h_min: DEFAULT_H_MIN,
            staleness: StalenessConfig {
                measure: StalenessMeasure::Tick,
                weight: StalenessWeight::Polynomial { a: 0.5 },
                normalize_by_nodes: false,
                tau_max: 4,
            },
            outer: delayed,
            pull: PullConfig { p: 0.0, lambda: 0.0 },
            anti_entropy: AntiEntropyConfig { every_rounds: 10, distance_threshold: 1e-3 },
            codec: CodecKind::Int8 { block: 256 },
            error_feedback: true,
            canonical_batches: true,
            membership: MembershipConfig {
                heartbeat_ms: 2_000,
                peer_timeout_ms: 15_000,
                max_peers: 4_096,
                startup_ms: 2_000,
            },
            inner_lr: InnerLr::PLATEAU,
            cooldown: None,
            aggregation: None,
        };
        let no_staleness = StalenessConfig {
            measure: StalenessMeasure::Sender,
            weight: StalenessWeight::None,
            normalize_by_nodes: false,
            tau_max: u32::MAX,
        };
        match strategy {
            Strategy::Gopals => {
                let outer = OuterConfig { restart_below: Some(RESTART_BELOW), beta_early: Some(BETA_EARLY), ..delayed };
                // A last, partial step fills a slow node's tick: the least
                // busy node's utilisation from 52-78% to 66-94% over the
                // simulator's scenarios and tasks (BENCHMARKS.md, "a partial
                // step fills the tick"). Lead steps fill the exchange wait
                // of nodes fast enough to fit a step into it: hetero-8x-16's
                // exchange share of up time from 5.4% to 2.7% (BENCHMARKS.md,
                // "lead steps").
                let schedule = Schedule::Tick {
                    grace: 0.1,
                    margin: 0.02,
                    period_ms: None,
                    overlap: false,
                    partial_step: true,
                    lead: true,
                };
                EngineConfig { outer, schedule, ..base }
            }
            Strategy::GopalsAsync => EngineConfig {
                schedule: Schedule::FreeRunning,
                staleness: StalenessConfig {
                    measure: StalenessMeasure::Sender,
                    weight: StalenessWeight::Polynomial { a: 0.5 },
                    normalize_by_nodes: true,
                    tau_max: 64,
                },
                outer: OuterConfig { eta: 0.35, ..delayed },
                canonical_batches: false,
                ..base
            },
            Strategy::Async => EngineConfig {
                schedule: Schedule::FreeRunning,
                work: Work::Fixed,
                staleness: no_staleness,
                outer: OuterConfig { eta: 0.35, ..delayed },
                canonical_batches: false,
                ..base
            },
            Strategy::Diloco => {
                EngineConfig { schedule: Schedule::Barrier, work: Work::Fixed, staleness: no_staleness, ..base }
            }
            Strategy::DilocoProportional => {
                EngineConfig { schedule: Schedule::Barrier, staleness: no_staleness, ..base }
            }
            Strategy::Ddp => EngineConfig {
                schedule: Schedule::Barrier,
                work: Work::Fixed,
                local: LocalMode::Gradient,
                h: 1,
                h_min: 1,
                staleness: no_staleness,
                outer: OuterConfig {
                    kind: OuterKind::AdamW,
                    eta: 1e-3,
                    beta: 0.9,
                    beta2: 0.95,
                    weight_decay: 0.1,
                    clip: 1.0,
                    warmup_rounds: 0,
                    restart_below: None,
                    beta_early: None,
                },
                anti_entropy: AntiEntropyConfig { every_rounds: 0, distance_threshold: 1e-3 },
                codec: CodecKind::F32,
                error_feedback: false,
                // Gradient mode has no inner steps: the rate is the outer AdamW's.
                inner_lr: InnerLr::Constant,
                ..base
            },
        }
    }

    /// Checks the values a manifest could get wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.h == 0 || self.h_min == 0 || self.h_min > self.h {
            return Err(ConfigError::Steps { h: self.h, h_min: self.h_min });
        }
        if !(self.outer.eta.is_finite() && self.outer.eta > 0.0) {
            return Err(ConfigError::OuterEta(self.outer.eta));
        }
        if !(0.0..1.0).contains(&self.outer.beta) {
            return Err(ConfigError::OuterBeta(self.outer.beta));
        }
        if let Some(b) = self.outer.beta_early
            && !(0.0..1.0).contains(&b)
        {
            return Err(ConfigError::OuterBeta(b));
        }
        if !(0.0..1.0).contains(&self.pull.p) {
            return Err(ConfigError::PullP(self.pull.p));
        }
        if self.local == LocalMode::Gradient && self.outer.kind != OuterKind::AdamW && self.outer.kind != OuterKind::Sgd
        {
            return Err(ConfigError::GradientOuter);
        }
        if let Schedule::Tick { margin, grace, .. } = self.schedule {
            if !(0.0..0.5).contains(&margin) {
                return Err(ConfigError::TickMargin(margin));
            }
            if grace.is_nan() || grace < 0.0 {
                return Err(ConfigError::TickGrace(grace));
            }
        }
        if self.membership.max_peers == 0 || self.membership.peer_timeout_ms == 0 {
            return Err(ConfigError::Membership);
        }
        self.inner_lr.validate()?;
        if let Some(c) = self.cooldown {
            c.validate()?;
        }
        if let Some(a) = self.aggregation {
            a.validate()?;
            // Sums are built per tick batch and weighted by tick staleness.
            // Anti-entropy stays the repair path: the updates of a sum a
            // replica missed are given up (too stale by the time a digest
            // names them, or gone from the holders' stores), and the
            // replicas then average (BENCHMARKS.md, "A lost sum").
            let tick = matches!(self.schedule, Schedule::Tick { overlap: false, .. });
            if !tick || !self.canonical_batches || self.staleness.measure != StalenessMeasure::Tick {
                return Err(ConfigError::AggregationNeedsTicks);
            }
        }
        Ok(self.codec.validate()?)
    }
}

/// Why an engine config is unusable: a manifest can carry any values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Inner steps out of order or zero.
    #[error("need 0 < h_min ({h_min}) <= h ({h})")]
    Steps {
        /// Reference inner steps per round.
        h: u32,
        /// Fewest inner steps worth a round.
        h_min: u32,
    },
    /// Outer learning rate not positive and finite.
    #[error("outer eta must be positive, got {0}")]
    OuterEta(f32),
    /// Outer momentum outside [0, 1).
    #[error("outer beta must be in [0, 1), got {0}")]
    OuterBeta(f32),
    /// Pull probability outside [0, 1).
    #[error("pull p must be in [0, 1), got {0}")]
    PullP(f32),
    /// Gradient mode with an outer optimiser it cannot use.
    #[error("gradient mode needs an AdamW or SGD outer optimiser")]
    GradientOuter,
    /// Tick margin outside [0, 0.5).
    #[error("tick margin must be in [0, 0.5), got {0}")]
    TickMargin(f32),
    /// Tick grace negative or NaN.
    #[error("tick grace must be a non-negative fraction of the period, got {0}")]
    TickGrace(f32),
    /// A membership limit of zero.
    #[error("membership limits must be positive")]
    Membership,
    /// The inner learning-rate schedule is invalid.
    #[error(transparent)]
    InnerLr(#[from] InnerLrError),
    /// The cooldown is invalid.
    #[error(transparent)]
    Cooldown(#[from] CooldownError),
    /// The codec parameters are unusable.
    #[error(transparent)]
    Codec(#[from] CodecParamsError),
    /// The aggregation numbers are unusable.
    #[error(transparent)]
    Aggregation(#[from] AggregationConfigError),
    /// Aggregation with a schedule it cannot sum.
    #[error("aggregation needs tick mode without overlap, canonical batches and tick staleness")]
    AggregationNeedsTicks,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_names_round_trip() {
        for s in Strategy::ALL {
            EngineConfig::preset(s).validate().unwrap();
            assert_eq!(Strategy::parse(s.name()), Some(s));
        }
    }
}
