//! Why a peer's input was refused: the one list of reasons that validation
//! returns, the ledger records in receipts and the shell counts in metrics.
//! It depends on nothing, so the ledger's records do not need the validator
//! to compile.

use serde::{Deserialize, Serialize};

/// Why an update (or message) was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RejectReason {
    /// Over a size limit.
    TooLarge,
    /// Does not decode.
    Malformed,
    /// Signature does not verify.
    BadSignature,
    /// For another run.
    WrongRun,
    /// Already applied (same source and round).
    Replay,
    /// Wrong number of values or an unusable codec.
    ShapeMismatch,
    /// NaN or infinity in the values.
    NonFinite,
    /// Norm per step far above the running median of accepted updates.
    NormTooLarge,
    /// Staler than `tau_max`.
    TooStale,
    /// The sender is not on the allowlist of a private swarm.
    NotAllowed,
    /// The payload does not hash to the announced hash.
    HashMismatch,
    /// Names a tick later than the receiver's clock allows (tick mode): a
    /// forged tick would hold its update, and the peer's place in the
    /// exchange wait, in batches that are not due yet.
    FromTheFuture,
    /// A second update from one source for one base tick (tick mode): an
    /// honest node trains one round per tick, and a flood of them would
    /// fill the queue of pending updates and close batches early.
    SecondInTick,
    /// An aggregate signed by a node that is not a designated aggregator of
    /// its group and tick in the receiver's view.
    NotAnAggregator,
    /// An aggregate whose members do not belong in it (another group or
    /// tick, already applied, a count other than announced).
    AggregateMismatch,
    /// An update that no quorum aggregate of its tick included: it arrived
    /// after its aggregators had summed their group.
    MissedAggregate,
}

impl RejectReason {
    /// Every reason, for metric labels.
    pub const ALL: [RejectReason; 16] = [
        RejectReason::TooLarge,
        RejectReason::Malformed,
        RejectReason::BadSignature,
        RejectReason::WrongRun,
        RejectReason::Replay,
        RejectReason::ShapeMismatch,
        RejectReason::NonFinite,
        RejectReason::NormTooLarge,
        RejectReason::TooStale,
        RejectReason::NotAllowed,
        RejectReason::HashMismatch,
        RejectReason::FromTheFuture,
        RejectReason::SecondInTick,
        RejectReason::NotAnAggregator,
        RejectReason::AggregateMismatch,
        RejectReason::MissedAggregate,
    ];

    /// A snake_case name for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::TooLarge => "too_large",
            RejectReason::Malformed => "malformed",
            RejectReason::BadSignature => "bad_signature",
            RejectReason::WrongRun => "wrong_run",
            RejectReason::Replay => "replay",
            RejectReason::ShapeMismatch => "shape_mismatch",
            RejectReason::NonFinite => "non_finite",
            RejectReason::NormTooLarge => "norm_too_large",
            RejectReason::TooStale => "too_stale",
            RejectReason::NotAllowed => "not_allowed",
            RejectReason::HashMismatch => "hash_mismatch",
            RejectReason::FromTheFuture => "from_the_future",
            RejectReason::SecondInTick => "second_in_tick",
            RejectReason::NotAnAggregator => "not_an_aggregator",
            RejectReason::AggregateMismatch => "aggregate_mismatch",
            RejectReason::MissedAggregate => "missed_aggregate",
        }
    }

    /// True when the reason shows misbehaviour (lowers the sender's score),
    /// rather than bad luck such as a slow link. A replay is not: whether an
    /// update was already applied depends on the receiver's state, and an
    /// honest peer that has not applied it yet may well forward it. Nor is a
    /// tick from the future (the receiver's clock may lag a period change)
    /// or a second update in a tick (a node resumed from a checkpoint may
    /// publish one; honest peers forward both), an aggregate from a node
    /// our view does not designate (views differ while membership changes)
    /// or an update that missed its aggregate (late).
    pub fn is_misbehaviour(self) -> bool {
        !matches!(
            self,
            RejectReason::TooStale
                | RejectReason::Replay
                | RejectReason::FromTheFuture
                | RejectReason::SecondInTick
                | RejectReason::NotAnAggregator
                | RejectReason::MissedAggregate
        )
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
