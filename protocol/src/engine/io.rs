//! What goes in and out of the engine: inputs from the shell, outputs for
//! it to act on, and the events it may count or log.

use std::sync::Arc;

use super::{LocalMode, PullConfig, ReplicaState};
use crate::{
    aggregate::AggregateAnnouncement,
    ids::{Hash32, NodeId, UpdateId},
    ledger::RecordKind,
    time::Micros,
    validate::RejectReason,
    wire::{Heartbeat, ReplicaDigest, UpdateAnnouncement},
};

/// Work for the trainer: start from `anchor`, take `steps` inner steps.
#[derive(Clone, Debug)]
pub struct LocalPhase {
    /// The round this phase closes.
    pub round: u64,
    /// The anchor to start from (shared with the engine, not copied).
    pub anchor: Arc<Vec<f32>>,
    /// Inner steps to take.
    pub steps: u32,
    /// After them, one more step on this fraction of a batch (0: none):
    /// fills the part of a tick too short for a whole step.
    pub partial: f32,
    /// The manifest's inner learning rate is multiplied by this (the
    /// engine's schedule, [`super::inner_lr`]).
    pub lr_scale: f32,
    /// Train with inner AdamW, or compute one gradient.
    pub mode: LocalMode,
    /// Pseudo-synchronisation settings for the inner loop.
    pub pull: PullConfig,
    /// Seed for the phase's own random choices (pull steps).
    pub seed: u64,
    /// Stop stepping at this time even if steps remain (tick mode): keeps a
    /// round inside its tick when the speed estimate was optimistic.
    pub deadline: Option<Micros>,
    /// A lead step of the round, trained while the last tick's updates
    /// arrive: its result is not the round's, so a shell does not count or
    /// measure it as one.
    pub lead: bool,
}

/// What the trainer hands back.
#[derive(Clone, Debug)]
pub struct LocalResult {
    /// The round of the phase.
    pub round: u64,
    /// `theta` after the phase (train mode) or the gradient (gradient mode).
    pub params: Vec<f32>,
    /// Whole steps actually taken.
    pub steps: u32,
    /// The batch fraction of the partial step taken after them (0: none).
    pub partial: f32,
    /// Samples processed.
    pub samples: u64,
    /// Mean training loss.
    pub loss: f32,
    /// Estimated floating-point operations.
    pub flops: f64,
}

/// An update to sign and disseminate.
#[derive(Clone, Debug)]
pub struct Publication {
    /// The announcement (the shell signs it).
    pub announcement: UpdateAnnouncement,
    /// The encoded payload.
    pub payload: Arc<Vec<u8>>,
    /// Send it only to these nodes (aggregation: its group's aggregators);
    /// empty: to every node.
    pub to: Vec<NodeId>,
}

/// Something happened that a shell may want to count or log.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A local phase started.
    RoundStarted {
        /// Round.
        round: u64,
        /// Steps planned.
        steps: u32,
        /// Tick it started in (tick mode).
        base_tick: u64,
    },
    /// An update was applied to the anchor.
    Applied {
        /// Which.
        id: UpdateId,
        /// Staleness measured.
        staleness: u64,
        /// Weight applied.
        weight: f32,
        /// Live node count used.
        nodes: usize,
    },
    /// An update was dropped.
    Dropped {
        /// Which.
        id: UpdateId,
        /// Why.
        reason: RejectReason,
    },
    /// A fetch failed on every source.
    FetchAbandoned {
        /// Which.
        id: UpdateId,
    },
    /// An outer round closed (N arrivals).
    OuterRound {
        /// Outer rounds so far.
        outer_rounds: u64,
    },
    /// A peer joined the live set.
    PeerJoined(NodeId),
    /// A peer left the live set.
    PeerLeft(NodeId),
    /// The estimated relative distance between our anchor and a peer's.
    ConsensusDistance {
        /// The peer.
        peer: NodeId,
        /// `||x_me - x_peer|| / ||x_me||`, estimated from sketches.
        distance: f32,
        /// The same distance in rounds of our anchor's recent movement
        /// (`None` before any round moved it).
        rounds: Option<f32>,
    },
    /// Anchors were averaged with a peer's (anti-entropy repair).
    AnchorsAveraged {
        /// The peer.
        peer: NodeId,
    },
    /// A far replica was taken whole (nodes that trained apart before they
    /// met, ours shared by none of them): what our replica held that the
    /// peer's did not is gone.
    FarReplicaTaken {
        /// The peer.
        peer: NodeId,
        /// How far its anchor lay, in rounds of our replica's movement.
        rounds: f32,
    },
    /// An update arrived after its batch (tick or round) was closed here,
    /// so it joins a later outer round than on replicas that had it in time.
    LateUpdate {
        /// The update.
        id: UpdateId,
        /// Its batch key.
        key: u64,
        /// The batch it was applied in instead.
        applied_in: u64,
    },
    /// An update arrived after its tick closed here, and was put back into
    /// that tick: the ticks since were recomputed, so this replica ends
    /// where those that had it in time are (full dissemination).
    UpdateReplayed {
        /// The update.
        id: UpdateId,
        /// Its tick.
        key: u64,
        /// Ticks recomputed (its own and those closed since).
        ticks: u64,
    },
    /// A peer's replica state was not used (see [`super::trust`]).
    AnchorRefused {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: super::trust::StateRefusal,
    },
    /// The inner learning rate changed.
    InnerLrChanged {
        /// The new scale of the manifest's rate.
        scale: f32,
        /// Why.
        change: super::inner_lr::LrChange,
    },
    /// A peer's anchor arrived after either side had applied more updates,
    /// so averaging it would have kept half of those: skipped.
    AnchorAverageSkipped {
        /// The peer.
        peer: NodeId,
    },
    /// A peer's replica, over the same updates and within the distance
    /// threshold, arrived, and ours is the one both keep: nothing changed.
    ReplicaKept {
        /// The peer.
        peer: NodeId,
    },
    /// An aggregate announcement or body was refused.
    AggregateRefused {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// The peer it came from.
        from: NodeId,
        /// Why.
        reason: RejectReason,
    },
    /// A group's quorum sum arrived after its tick closed here: applied in
    /// a later tick, as a late update is.
    LateAggregate {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// The tick it was applied in.
        applied_in: u64,
    },
    /// A group's quorum sum arrived after its tick closed here, and was put
    /// back into that tick: the ticks since were recomputed, so this
    /// replica ends where those that had the sum in time are.
    AggregateReplayed {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// Ticks recomputed (its own and those closed since).
        ticks: u64,
    },
    /// A group expected in a batch had no quorum aggregate when the batch
    /// closed: its updates are not applied by this replica unless the sum
    /// still arrives (then as a late aggregate).
    AggregateMissed {
        /// The tick.
        key: u64,
        /// The group.
        group: u32,
    },
}

/// What the engine asks its shell to do.
#[derive(Clone, Debug)]
pub enum Output {
    /// Run a local phase on the trainer.
    StartLocalPhase(LocalPhase),
    /// Sign and disseminate an update.
    Publish(Publication),
    /// Fetch a payload from a peer, then report `Input::Payload` or `Input::FetchFailed`.
    FetchPayload {
        /// Which.
        id: UpdateId,
        /// From whom.
        from: NodeId,
        /// Expected bytes.
        len: u64,
        /// Expected hash.
        hash: Hash32,
    },
    /// Tell peers we hold a payload we fetched, so they can pull it from us
    /// too. Only while few holders are known: every holder announcing would
    /// cost N gossip messages per update for nothing.
    AnnounceHeld {
        /// Which.
        id: UpdateId,
        /// Its payload hash.
        hash: Hash32,
    },
    /// Sign and gossip an aggregate announcement; serve `body` to fetchers.
    PublishAggregate {
        /// The announcement (the shell signs it).
        announcement: AggregateAnnouncement,
        /// The encoded [`crate::aggregate::Aggregate`].
        body: Arc<Vec<u8>>,
    },
    /// Send an aggregate body to these nodes unasked (our children in the
    /// group's tree), each to report it as `Input::AggregateBody`.
    SendAggregate {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// Its hash.
        hash: Hash32,
        /// The receivers.
        to: Vec<NodeId>,
        /// The encoded [`crate::aggregate::Aggregate`].
        body: Arc<Vec<u8>>,
    },
    /// Fetch an aggregate body by its hash from a holder (our parent in
    /// the group's tree, which answers once it holds it, or a signer), then
    /// report `Input::AggregateBody` or `Input::AggregateFetchFailed`.
    FetchAggregate {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// The holder asked.
        from: NodeId,
        /// Expected bytes.
        len: u64,
        /// Expected hash.
        hash: Hash32,
    },
    /// Fetch an announcement we missed (anti-entropy), then report `Input::Announcement`.
    FetchAnnouncement {
        /// Which.
        id: UpdateId,
        /// From whom.
        from: NodeId,
    },
    /// Sign and gossip a heartbeat.
    SendHeartbeat(Heartbeat),
    /// Exchange digests with a peer, reporting theirs as `Input::PeerDigest`.
    AntiEntropy {
        /// The peer.
        peer: NodeId,
        /// Our digest.
        digest: ReplicaDigest,
    },
    /// Fetch a peer's replica state, reporting it as `Input::PeerAnchor`.
    FetchAnchor {
        /// The peer.
        from: NodeId,
    },
    /// Sign and append a ledger record.
    Record(RecordKind),
    /// Count or log this.
    Event(EngineEvent),
}

/// What happens to the engine.
#[derive(Clone, Debug)]
pub enum Input {
    /// Begin taking part.
    Start,
    /// Peers the shell knows take part in the run (at most `max_peers` are
    /// kept): the startup wait ends as soon as each has been heard, rather
    /// than after the whole `startup_ms`.
    PeersKnown(Vec<NodeId>),
    /// The trainer finished a local phase.
    LocalPhaseDone(LocalResult),
    /// A validated (signature, run, shape) announcement arrived via `from`.
    Announcement {
        /// The announcement.
        announcement: UpdateAnnouncement,
        /// A peer that holds the payload.
        from: NodeId,
    },
    /// A validated announcement with its validated payload inline.
    Update {
        /// The announcement.
        announcement: UpdateAnnouncement,
        /// The peer it came from.
        from: NodeId,
        /// The encoded payload (shared: a simulator hands one copy to many engines).
        payload: Arc<Vec<u8>>,
    },
    /// Another peer says it holds a payload.
    PayloadSource {
        /// Which.
        id: UpdateId,
        /// Who holds it.
        from: NodeId,
    },
    /// A fetched payload that passed validation (hash, structure, finite, norm).
    Payload {
        /// Which.
        id: UpdateId,
        /// The encoded payload.
        bytes: Arc<Vec<u8>>,
    },
    /// A fetch failed; with a reason when the payload itself was refused.
    FetchFailed {
        /// Which.
        id: UpdateId,
        /// The peer asked.
        from: NodeId,
        /// Why the payload was refused, if it was.
        reason: Option<RejectReason>,
    },
    /// A peer whose digest listed this update answered that it no longer
    /// holds it (its store keeps only recent rounds). Nobody is likely to
    /// serve it now: given up, so anti-entropy can compare replicas again.
    AnnouncementGone(UpdateId),
    /// A validated heartbeat.
    Heartbeat(Heartbeat),
    /// A peer disconnected or left.
    PeerDown(NodeId),
    /// A peer's digest (anti-entropy request or response).
    PeerDigest {
        /// The peer.
        from: NodeId,
        /// Its digest.
        digest: ReplicaDigest,
    },
    /// A peer's replica state, fetched after `Output::FetchAnchor`.
    PeerAnchor {
        /// The peer.
        from: NodeId,
        /// Its state.
        state: Box<ReplicaState>,
    },
    /// The replica state asked for by `Output::FetchAnchor` will not come
    /// (the fetch failed, or the shell did not send it: a relay would
    /// carry it): the next digest may ask again.
    AnchorUnavailable {
        /// The peer.
        from: NodeId,
    },
    /// A signed aggregate announcement (signature checked by the shell).
    AggregateAnnouncement {
        /// The announcement.
        announcement: AggregateAnnouncement,
        /// The peer it came from.
        from: NodeId,
    },
    /// An aggregate body, fetched or pushed (unchecked: the engine checks
    /// its hash and decodes it within its limit).
    AggregateBody {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// The peer asked.
        from: NodeId,
        /// The bytes.
        bytes: Arc<Vec<u8>>,
    },
    /// An aggregate fetch failed.
    AggregateFetchFailed {
        /// Its tick.
        key: u64,
        /// Its group.
        group: u32,
        /// The peer asked.
        from: NodeId,
    },
    /// Leave the swarm cleanly.
    Leave,
}
