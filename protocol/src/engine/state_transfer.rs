//! A replica state on the wire, in two parts, so that a joiner can take the
//! bulk of it from several holders at once and no single holder carries
//! every joiner:
//!
//! - the shared part (anchor, outer optimiser, versions, clock, inner
//!   rate): identical, byte for byte, at every honest replica that applied
//!   the same batches, so it is named by its hash and any of them serves
//!   its chunks;
//! - the head: the holder's own round and the updates it holds but has not
//!   applied, small, naming the shared part by hash and length.

use serde::{Deserialize, Serialize};

use super::{
    Pending, ReplicaState, inner_lr::InnerLrState, outer::OuterState, roster::Roster, sum_guard::SumGuard,
    tick::TickClock,
};
use crate::{
    ids::Hash32,
    version::{AppliedSet, VersionVector},
};

/// Largest head accepted: a round number and one batch of pending updates.
pub const MAX_HEAD_BYTES: usize = 64 << 20;

/// The part of a replica state every honest replica holds identically.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedState {
    /// The anchor.
    pub anchor: Vec<f32>,
    /// Outer optimiser state.
    pub outer: OuterState,
    /// Version vector.
    pub version: VersionVector,
    /// Updates applied.
    pub applied: AppliedSet,
    /// The tick clock (tick mode).
    pub clock: Option<TickClock>,
    /// The newest batch key whose outer round is closed.
    pub last_closed_key: Option<u64>,
    /// The inner learning rate's schedule.
    pub inner_lr: InnerLrState,
    /// Recent contributors to sums (aggregated dissemination).
    pub roster: Roster,
    /// Recently applied sums' norms.
    pub sum_guard: SumGuard,
}

/// The holder's own part, with the name of the shared part.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateHead {
    /// Hash of the encoded shared part.
    pub shared_hash: Hash32,
    /// Its length in bytes.
    pub shared_len: u64,
    /// The holder's current round.
    pub round: u64,
    /// Updates received but not yet applied.
    pub pending: Vec<Pending>,
}

/// Why the parts of a state could not be read or put together.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A head larger than [`MAX_HEAD_BYTES`].
    #[error("a state head of {0} bytes is over the limit")]
    HeadTooLarge(usize),
    /// Bytes that do not decode.
    #[error("does not decode: {0}")]
    Decode(#[from] postcard::Error),
    /// The shared part is not the one the head names.
    #[error("the shared part does not match the head's hash or length")]
    Mismatch,
}

/// Encodes `state` as (head, shared part).
pub fn split(state: ReplicaState) -> (Vec<u8>, Vec<u8>) {
    let ReplicaState {
        anchor,
        outer,
        version,
        applied,
        clock,
        round,
        last_closed_key,
        pending,
        inner_lr,
        roster,
        sum_guard,
    } = state;
    let shared = SharedState { anchor, outer, version, applied, clock, last_closed_key, inner_lr, roster, sum_guard };
    let shared = postcard::to_allocvec(&shared).expect("encoding to a Vec cannot fail");
    let head = StateHead { shared_hash: Hash32::of(&shared), shared_len: shared.len() as u64, round, pending };
    (postcard::to_allocvec(&head).expect("encoding to a Vec cannot fail"), shared)
}

/// Decodes a head, its size checked first.
pub fn decode_head(bytes: &[u8]) -> Result<StateHead, TransferError> {
    if bytes.len() > MAX_HEAD_BYTES {
        return Err(TransferError::HeadTooLarge(bytes.len()));
    }
    Ok(postcard::from_bytes(bytes)?)
}

/// The replica state `head` and the `shared` bytes it names make up (the
/// caller still verifies it against the manifest).
pub fn assemble(head: StateHead, shared: &[u8]) -> Result<ReplicaState, TransferError> {
    if shared.len() as u64 != head.shared_len || Hash32::of(shared) != head.shared_hash {
        return Err(TransferError::Mismatch);
    }
    let SharedState { anchor, outer, version, applied, clock, last_closed_key, inner_lr, roster, sum_guard } =
        postcard::from_bytes(shared)?;
    Ok(ReplicaState {
        anchor,
        outer,
        version,
        applied,
        clock,
        round: head.round,
        last_closed_key,
        pending: head.pending,
        inner_lr,
        roster,
        sum_guard,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::{Engine, EngineConfig, Strategy};

    fn state(values: Vec<f32>, round: u64) -> ReplicaState {
        let cfg = EngineConfig::preset(Strategy::Gopals);
        let mut s = Engine::new(
            cfg,
            crate::ids::NodeId([1; 32]),
            crate::ids::RunId(Hash32([2; 32])),
            crate::time::Micros(0),
            values,
            1.0,
            7,
        )
        .replica_state();
        s.round = round;
        s
    }

    #[test]
    fn a_state_split_and_assembled_is_the_same_state() {
        let s = state(vec![0.5, -1.0, 2.0], 9);
        let (head, shared) = split(s.clone());
        assert_eq!(assemble(decode_head(&head).unwrap(), &shared).unwrap(), s);
    }

    #[test]
    fn holders_at_different_rounds_share_the_same_bulk() {
        let (head_a, shared_a) = split(state(vec![0.5; 100], 3));
        let (head_b, shared_b) = split(state(vec![0.5; 100], 40));
        assert_eq!(shared_a, shared_b);
        assert_ne!(head_a, head_b);
        let other = split(state(vec![0.25; 100], 3)).1;
        let head = decode_head(&head_a).unwrap();
        assert!(matches!(assemble(head.clone(), &other), Err(TransferError::Mismatch)));
        assert!(matches!(assemble(head, &shared_a[1..]), Err(TransferError::Mismatch)));
    }

    #[test]
    fn an_oversized_head_is_refused_before_decoding() {
        let big = vec![0u8; MAX_HEAD_BYTES + 1];
        assert!(matches!(decode_head(&big), Err(TransferError::HeadTooLarge(_))));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(head) = decode_head(&bytes) {
                let _ = assemble(head, &bytes);
            }
            let _ = postcard::from_bytes::<SharedState>(&bytes);
        }

        #[test]
        fn states_round_trip(values in proptest::collection::vec(-1e3f32..1e3, 1..64), round in 0u64..1000) {
            let s = state(values, round);
            let (head, shared) = split(s.clone());
            prop_assert_eq!(assemble(decode_head(&head).unwrap(), &shared).unwrap(), s);
        }
    }
}
