//! Aggregated dissemination: per tick, a few designated nodes sum a group
//! of sources' updates, and everyone else fetches one sum per group
//! instead of every update, so a node's payload bytes per round stay
//! bounded as the swarm grows.
//!
//! Everything here is pure: who aggregates a group (rendezvous hashing
//! over the live set, so every replica with the same view agrees and a
//! node cannot choose its role), how a sum is built (in member order, so
//! two honest aggregators of the same members produce the same bytes), and
//! how a fetched sum is decoded (size checked first). An aggregate is used
//! only when a quorum of designated aggregators signed the same body hash,
//! so no single node can change what others apply (see
//! `engine::aggregation`).

mod ranking;

pub use ranking::Ranking;
use serde::{Deserialize, Serialize};

use crate::{
    codec::{CodecError, CodecKind, Payload},
    identity::Signable,
    ids::{Hash32, NodeId, RunId, UpdateId},
};

/// Most members one aggregate lists.
pub const MAX_AGGREGATE_MEMBERS: usize = 4096;
/// Largest encoded member entry (postcard; varints at their widest).
const MAX_MEMBER_BYTES: usize = 32 + 10 + 10 + 10 + 10 + 4 + 4 + 32;

/// How a run aggregates: off unless the manifest says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregationConfig {
    /// Groups per tick: the sums each node fetches per round.
    pub groups: u32,
    /// Designated aggregators per group.
    pub aggregators: u32,
    /// Matching signed body hashes needed before a sum is fetched.
    pub quorum: u32,
    /// Nodes each node passes a sum on to: sums spread down a tree of
    /// this fan-out rooted at the aggregators, so no node serves more than
    /// this many copies of a sum whatever the swarm's size.
    #[serde(default = "default_fanout")]
    pub fanout: u32,
    /// Shortest tick (ms) when the period is derived from the swarm's
    /// speeds: a sum takes two hops, each allowed one grace, and a real
    /// node's hop (gossip, an offer, a pulled body, on a machine busy
    /// training) takes tens of milliseconds. A fixed `period_ms` is kept.
    #[serde(default = "default_min_tick_ms")]
    pub min_tick_ms: u32,
}

fn default_fanout() -> u32 {
    DEFAULT_FANOUT
}

fn default_min_tick_ms() -> u32 {
    DEFAULT_MIN_TICK_MS
}

/// The default shortest tick with aggregation. Five real processes on a
/// 2-core machine, built-in task (`tests/tests/aggregation.rs`): at 1,000-ms
/// ticks every replica was identical at every shared version; at 250 ms
/// 2-7 sums a node were missed and replicas were up to 6e-3 apart, at
/// 100 ms about 100 missed, and at the derived 40 ms replicas 0.93 apart.
pub const DEFAULT_MIN_TICK_MS: u32 = 1_000;

/// The default fan-out of the tree sums spread down: depth ~log8(N), so
/// three levels below three aggregators reach 1,755 nodes.
pub const DEFAULT_FANOUT: u32 = 8;

impl AggregationConfig {
    /// `groups` groups with the defaults for the rest: 3 aggregators, a
    /// quorum of 2, the default fan-out and tick floor.
    pub fn with_groups(groups: u32) -> Self {
        AggregationConfig {
            groups,
            aggregators: 3,
            quorum: 2,
            fanout: DEFAULT_FANOUT,
            min_tick_ms: DEFAULT_MIN_TICK_MS,
        }
    }

    /// Checks the numbers: a quorum of at least two (one signer alone could
    /// change what others apply) out of the aggregators.
    pub fn validate(&self) -> Result<(), AggregationConfigError> {
        if self.groups == 0 || self.groups as usize > MAX_AGGREGATE_MEMBERS {
            return Err(AggregationConfigError::Groups(self.groups));
        }
        if self.quorum < 2 || self.quorum > self.aggregators || self.aggregators > 16 {
            return Err(AggregationConfigError::Quorum { quorum: self.quorum, aggregators: self.aggregators });
        }
        if self.fanout == 0 || self.fanout > 1024 {
            return Err(AggregationConfigError::Fanout(self.fanout));
        }
        Ok(())
    }
}

/// Why an aggregation setting is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AggregationConfigError {
    /// No groups, or more than members an aggregate may list.
    #[error("aggregation groups must be in 1..={MAX_AGGREGATE_MEMBERS}, got {0}")]
    Groups(u32),
    /// A fan-out of zero or over 1,024.
    #[error("aggregation fanout must be in 1..=1024, got {0}")]
    Fanout(u32),
    /// A quorum under two or over the aggregators (at most 16).
    #[error("aggregation needs 2 <= quorum ({quorum}) <= aggregators ({aggregators}) <= 16")]
    Quorum {
        /// The quorum.
        quorum: u32,
        /// The aggregators per group.
        aggregators: u32,
    },
}

/// One update inside an aggregate: what a receiver needs to account for it
/// (version vector, ledger receipt, the swarm's loss) without its payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AggregateMember {
    /// Source and round.
    pub id: UpdateId,
    /// The tick its round started in.
    pub base_tick: u64,
    /// The tick it was published in.
    pub publish_tick: u64,
    /// Samples processed.
    pub samples: u64,
    /// Staleness the aggregator measured (ticks).
    pub staleness: u32,
    /// Mean training loss of the round.
    pub loss: f32,
    /// The staleness weight the sum gave it.
    pub weight: f32,
    /// Its payload's hash, as its source signed it.
    pub payload_hash: Hash32,
}

/// "I summed group `group` of tick `key`; the sum hashes to `body_hash`."
/// Gossiped; small; signed by the aggregator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AggregateAnnouncement {
    /// The run.
    pub run_id: RunId,
    /// The batch (tick) summed.
    pub key: u64,
    /// The group summed.
    pub group: u32,
    /// Who summed it (the signer).
    pub aggregator: NodeId,
    /// Members in the sum.
    pub members: u32,
    /// Encoded [`Aggregate`] size.
    pub body_len: u64,
    /// blake3 of the encoded [`Aggregate`].
    pub body_hash: Hash32,
}

impl Signable for AggregateAnnouncement {
    const DOMAIN: &'static [u8] = b"ragtag/v1/aggregate";
    const MAX_BODY: usize = 256;
    fn signer(&self) -> NodeId {
        self.aggregator
    }
}

/// A group's sum: its members, then the weighted sum of their values,
/// encoded with the run's codec. Fetched by hash after a quorum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// Members, strictly ordered by id.
    pub members: Vec<AggregateMember>,
    /// `sum_i weight_i * values_i`, encoded.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// Why fetched aggregate bytes are unusable.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AggregateError {
    /// Over the limit for the model's size.
    #[error("aggregate of {len} bytes over the limit of {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Does not decode.
    #[error("aggregate does not decode: {0}")]
    Malformed(String),
    /// No members, too many, or not strictly ordered.
    #[error("aggregate members empty, over {MAX_AGGREGATE_MEMBERS} or out of order")]
    Members,
    /// A weight outside [0, 1] or a loss that is not a number.
    #[error("aggregate member {0:?} has an unusable weight or loss")]
    Member(UpdateId),
    /// The sum is not a payload of the model's size.
    #[error(transparent)]
    Payload(#[from] CodecError),
    /// The sum holds a NaN or an infinity.
    #[error("aggregate sum is not finite")]
    NonFinite,
}

impl Aggregate {
    /// The canonical encoding (postcard), whose hash is announced.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("encoding to a Vec cannot fail")
    }

    /// The largest encoding for a model of `n` values in `codec`.
    pub fn max_len(codec: CodecKind, n: usize) -> usize {
        16 + MAX_AGGREGATE_MEMBERS * MAX_MEMBER_BYTES + codec.max_encoded_len(n) + 10
    }

    /// Decodes fetched bytes, checking the size limit first, then the
    /// members' order and numbers and the sum's shape and finiteness.
    /// Never panics.
    pub fn decode(bytes: &[u8], codec: CodecKind, n: usize) -> Result<Aggregate, AggregateError> {
        let max = Self::max_len(codec, n);
        if bytes.len() > max {
            return Err(AggregateError::TooLarge { len: bytes.len(), max });
        }
        let (agg, rest) =
            postcard::take_from_bytes::<Aggregate>(bytes).map_err(|e| AggregateError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(AggregateError::Malformed(format!("{} trailing bytes", rest.len())));
        }
        if agg.members.is_empty()
            || agg.members.len() > MAX_AGGREGATE_MEMBERS
            || agg.members.windows(2).any(|w| w[0].id >= w[1].id)
        {
            return Err(AggregateError::Members);
        }
        let usable =
            |m: &AggregateMember| m.weight.is_finite() && (0.0..=1.0).contains(&m.weight) && m.loss.is_finite();
        if let Some(m) = agg.members.iter().find(|m| !usable(m)) {
            return Err(AggregateError::Member(m.id));
        }
        if !Payload::parse(codec, n, &agg.payload)?.finite_and_norm_sq().0 {
            return Err(AggregateError::NonFinite);
        }
        Ok(agg)
    }

    /// Sums `members` (strictly ordered by id, each with its weight and
    /// payload) in that order in f32 and encodes the sum with `codec`: the
    /// same members give the same bytes on every aggregator.
    pub fn build(members: Vec<(AggregateMember, Payload<'_>)>, codec: CodecKind, n: usize) -> Aggregate {
        let mut sum = vec![0f32; n];
        for (m, payload) in &members {
            let w = m.weight;
            payload.for_each_chunk(|start, values| {
                for (s, v) in sum[start..start + values.len()].iter_mut().zip(values) {
                    *s += w * v;
                }
            });
        }
        let mut payload = Vec::new();
        crate::codec::encode(codec, &sum, &mut payload);
        Aggregate { members: members.into_iter().map(|(m, _)| m).collect(), payload }
    }
}

/// A 64-bit mix of a few words (splitmix64's finaliser over a running
/// xor): roles must be spread evenly and cheap to recompute, not secret.
fn mix(words: &[u64]) -> u64 {
    let mut h = 0x9E37_79B9_7F4A_7C15u64;
    for w in words {
        let mut z = h ^ w.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h = z ^ (z >> 31);
    }
    h
}

fn head(node: &NodeId) -> u64 {
    u64::from_le_bytes(node.0[..8].try_into().expect("8 bytes"))
}

/// The group a source's update of tick `key` belongs to: changes every
/// tick, so no pair of nodes is always summed together.
pub fn group_of(key: u64, src: &NodeId, groups: u32) -> u32 {
    (mix(&[1, key, head(src)]) % u64::from(groups.max(1))) as u32
}

/// The position a node at `position` of a group's [`Ranking`] takes the sum
/// from (`None` for the `r` aggregators): every position below it serves
/// at most `fanout` others.
pub fn tree_parent(position: usize, r: u32, fanout: u32) -> Option<usize> {
    let r = r as usize;
    (position >= r).then(|| (position - r) / fanout.max(1) as usize)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn node(i: u8) -> NodeId {
        let mut b = [0u8; 32];
        b[0] = i;
        b[1] = i.wrapping_mul(7);
        NodeId(b)
    }

    /// The `r` designated aggregators of group `group` of tick `key`
    /// among `candidates`, given in any order.
    fn aggregators_of(key: u64, group: u32, r: u32, candidates: impl Iterator<Item = NodeId>) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = candidates.collect();
        nodes.sort_unstable();
        nodes.dedup();
        Ranking::new(key, group, &nodes).span(0..r as usize)
    }

    fn member(src: u8, round: u64, weight: f32) -> AggregateMember {
        AggregateMember {
            id: UpdateId { src: node(src), round },
            base_tick: 3,
            publish_tick: 3,
            samples: 64,
            staleness: 0,
            loss: 1.5,
            weight,
            payload_hash: Hash32::of(&[src]),
        }
    }

    #[test]
    fn designated_aggregators_are_a_few_of_the_live_set_and_views_agree() {
        let all: Vec<NodeId> = (0..100).map(node).collect();
        let a = aggregators_of(7, 2, 3, all.iter().copied());
        assert_eq!(a.len(), 3);
        // Order of the view does not matter.
        let b = aggregators_of(7, 2, 3, all.iter().rev().copied());
        assert_eq!(a, b);
        // Another tick or group picks others (for these ids).
        assert_ne!(a, aggregators_of(8, 2, 3, all.iter().copied()));
        assert_ne!(a, aggregators_of(7, 3, 3, all.iter().copied()));
        // Losing a node that is not designated changes nothing.
        let spare = all.iter().copied().find(|n| !a.contains(n)).unwrap();
        assert_eq!(a, aggregators_of(7, 2, 3, all.iter().copied().filter(|n| *n != spare)));
        // Groups spread the sources.
        let mut counts = [0u32; 4];
        for n in &all {
            counts[group_of(7, n, 4) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (10..=40).contains(c)), "{counts:?}");
    }

    #[test]
    fn the_tree_serves_at_most_fanout_copies_per_node_and_stays_shallow() {
        let (r, fanout, n) = (3u32, 8u32, 1000usize);
        let mut children = vec![0usize; n];
        let mut depth = vec![0usize; n];
        for i in 0..n {
            match tree_parent(i, r, fanout) {
                None => assert!(i < r as usize),
                Some(p) => {
                    assert!(p < i);
                    children[p] += 1;
                    depth[i] = depth[p] + 1;
                }
            }
        }
        assert!(children.iter().all(|c| *c <= fanout as usize));
        assert_eq!(depth.iter().max(), Some(&3), "1,000 nodes, fan-out 8: three levels below the aggregators");
    }

    #[test]
    fn a_sum_is_the_same_bytes_whoever_builds_it_and_decodes_back() {
        let codec = CodecKind::Int8 { block: 4 };
        let (v1, v2) = ([1.0f32, -2.0, 0.5, 0.0, 3.0], [0.5f32, 0.5, -1.0, 2.0, -3.0]);
        let (mut b1, mut b2) = (Vec::new(), Vec::new());
        crate::codec::encode(codec, &v1, &mut b1);
        crate::codec::encode(codec, &v2, &mut b2);
        let build = || {
            let p1 = Payload::parse(codec, 5, &b1).unwrap();
            let p2 = Payload::parse(codec, 5, &b2).unwrap();
            Aggregate::build(vec![(member(1, 0, 1.0), p1), (member(2, 0, 0.5), p2)], codec, 5)
        };
        let (a, b) = (build(), build());
        assert_eq!(a.encode(), b.encode());
        let back = Aggregate::decode(&a.encode(), codec, 5).unwrap();
        assert_eq!(back, a);
        let mut sum = [0f32; 5];
        Payload::parse(codec, 5, &back.payload).unwrap().for_each_chunk(|s, v| sum[s..s + v.len()].copy_from_slice(v));
        for (i, want) in [1.25f32, -1.75, 0.0, 1.0, 1.5].iter().enumerate() {
            assert!((sum[i] - want).abs() < 0.05, "{i}: {} vs {want}", sum[i]);
        }
    }

    #[test]
    fn unusable_aggregates_are_refused_with_a_reason() {
        let codec = CodecKind::F32;
        let ok = Aggregate { members: vec![member(1, 0, 1.0), member(2, 0, 1.0)], payload: vec![0; 8] };
        assert!(Aggregate::decode(&ok.encode(), codec, 2).is_ok());
        let unordered = Aggregate { members: vec![member(2, 0, 1.0), member(1, 0, 1.0)], ..ok.clone() };
        assert_eq!(Aggregate::decode(&unordered.encode(), codec, 2), Err(AggregateError::Members));
        let twice = Aggregate { members: vec![member(1, 0, 1.0), member(1, 0, 1.0)], ..ok.clone() };
        assert_eq!(Aggregate::decode(&twice.encode(), codec, 2), Err(AggregateError::Members));
        let heavy = Aggregate { members: vec![member(1, 0, 2.0)], ..ok.clone() };
        assert!(matches!(Aggregate::decode(&heavy.encode(), codec, 2), Err(AggregateError::Member(_))));
        let mut nan_loss = member(1, 0, 1.0);
        nan_loss.loss = f32::NAN;
        let nan_loss = Aggregate { members: vec![nan_loss], ..ok.clone() };
        assert!(matches!(Aggregate::decode(&nan_loss.encode(), codec, 2), Err(AggregateError::Member(_))));
        let nan_sum = Aggregate { payload: [f32::NAN.to_le_bytes(), 1f32.to_le_bytes()].concat(), ..ok.clone() };
        assert_eq!(Aggregate::decode(&nan_sum.encode(), codec, 2), Err(AggregateError::NonFinite));
        let short = Aggregate { payload: vec![0; 4], ..ok.clone() };
        assert!(matches!(Aggregate::decode(&short.encode(), codec, 2), Err(AggregateError::Payload(_))));
        let mut trailing = ok.encode();
        trailing.push(0);
        assert!(matches!(Aggregate::decode(&trailing, codec, 2), Err(AggregateError::Malformed(_))));
        let huge = vec![0u8; Aggregate::max_len(codec, 2) + 1];
        assert!(matches!(Aggregate::decode(&huge, codec, 2), Err(AggregateError::TooLarge { .. })));
    }

    #[test]
    fn a_quorum_of_one_or_over_the_aggregators_is_refused() {
        let c = |groups, aggregators, quorum| {
            AggregationConfig { groups, aggregators, quorum, fanout: DEFAULT_FANOUT, min_tick_ms: 0 }.validate()
        };
        assert!(c(8, 3, 2).is_ok());
        assert!(c(8, 3, 1).is_err());
        assert!(c(8, 2, 3).is_err());
        assert!(c(0, 3, 2).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096), n in 0usize..64) {
            let _ = Aggregate::decode(&bytes, CodecKind::Int8 { block: 16 }, n);
            let _ = Aggregate::decode(&bytes, CodecKind::TopK { per_mille: 100 }, n);
        }

        #[test]
        fn mutated_aggregates_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let ok = Aggregate { members: vec![member(1, 0, 1.0), member(2, 0, 0.5)], payload: vec![0; 12] };
            let mut bytes = ok.encode();
            let i = pos.index(bytes.len());
            bytes[i] = byte;
            if let Ok(a) = Aggregate::decode(&bytes, CodecKind::F32, 3) {
                prop_assert!(a.encode().len() <= Aggregate::max_len(CodecKind::F32, 3));
            }
        }
    }
}
