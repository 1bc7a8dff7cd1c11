//! The simulator's events and the queue's ordering.

use std::{cmp::Ordering, sync::Arc};

use ragtag_protocol::{
    aggregate::AggregateAnnouncement,
    engine::ReplicaState,
    ids::{Hash32, NodeId, UpdateId},
    time::Micros,
    wire::{Heartbeat, ReplicaDigest, UpdateAnnouncement},
};

/// What a published update is, kept for fetches.
#[derive(Debug)]
pub(super) struct Published {
    pub(super) announcement: UpdateAnnouncement,
    pub(super) payload: Arc<Vec<u8>>,
}

#[derive(Clone, Debug)]
pub(super) enum Delivery {
    Update { id: UpdateId, from: NodeId },
    Announce { id: UpdateId, from: NodeId },
    Payload { id: UpdateId },
    Holder { id: UpdateId, from: NodeId },
    FetchFailed { id: UpdateId, from: NodeId },
    Heartbeat(Arc<Heartbeat>),
    Digest { from: usize, digest: Arc<ReplicaDigest>, reply: bool },
    Anchor { from: NodeId, state: Arc<ReplicaState> },
    AggregateAnnounce(Arc<AggregateAnnouncement>),
    AggregateBody { key: u64, group: u32, from: NodeId, hash: Hash32 },
    AggregateFetchFailed { key: u64, group: u32, from: NodeId },
}

#[derive(Debug)]
pub(super) enum Ev {
    Timeout {
        node: usize,
        incarnation: u64,
        generation: u64,
    },
    PhaseDone {
        node: usize,
        incarnation: u64,
        result: Box<ragtag_protocol::engine::LocalResult>,
        delta: Vec<f32>,
        /// The loss of the phase's first batch, at the anchor.
        first_loss: f32,
        /// A lead step, not the round: the study does not record it.
        lead: bool,
    },
    Deliver {
        node: usize,
        what: Delivery,
    },
    Wave {
        nodes: Vec<usize>,
        what: Delivery,
    },
    Scenario(usize),
    /// A joiner asks for a state again (its holder was mid-exchange).
    Join {
        node: usize,
    },
    Joined {
        node: usize,
        state: Box<ReplicaState>,
    },
    Sample,
}

#[derive(Debug)]
pub(super) struct Item {
    pub(super) at: Micros,
    pub(super) seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}
