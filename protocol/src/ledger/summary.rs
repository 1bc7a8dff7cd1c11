//! Credit: what a ledger says each node contributed.
//!
//! Credit measures useful work: the samples of a contribution times the
//! weight the swarm applied it with (staleness included), counted only from
//! receipts that name the contribution's payload hash and are signed by
//! vouchers: in a private swarm the allowlist; in a public one, peers at least
//! `VOUCHER_MIN_ACCEPTED` of whose own updates this ledger's owner accepted
//! (a fresh key has none). A peer's credit in our ledger is first-hand: our
//! own receipts about it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{ReceiptOutcome, RecordBody, RecordKind};
use crate::ids::{Hash32, NodeId};

/// Updates of a peer the ledger's owner must have accepted before the
/// peer's receipts vouch (public swarms): each sybil must keep doing work
/// that passes the update checks, not just once.
pub const VOUCHER_MIN_ACCEPTED: u64 = 3;

/// What one node is credited with, as seen from one ledger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerCredit {
    /// The node.
    pub node: String,
    /// Updates it published (own ledger) or we received from it (receipts).
    pub contributions: u64,
    /// Samples in those updates.
    pub samples: u64,
    /// Estimated FLOPs (own contributions only).
    pub flops: f64,
    /// Sum of staleness weights applied to its updates.
    pub accepted_weight: f64,
    /// Its updates we accepted.
    pub accepted: u64,
    /// Its updates we rejected.
    pub rejected: u64,
    /// Distinct peers that signed a receipt accepting its work.
    pub receipts_from_distinct_peers: u64,
    /// Credit: samples times applied weight (see the module doc).
    pub credit: f64,
}

/// Whose receipts count toward our credit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vouchers {
    /// A private swarm's allowlist.
    Allowlist(BTreeSet<NodeId>),
    /// Peers whose updates the ledger's owner accepted.
    AcceptedByOwner,
}

/// The summary of one node's ledger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerSummary {
    /// The ledger's owner.
    pub me: PeerCredit,
    /// Everyone the owner received updates from.
    pub peers: Vec<PeerCredit>,
    /// The k used for credit.
    pub k: u64,
}

/// Summarises a node's own chain and the receipts others signed about it.
/// A contribution earns credit once at least `k` distinct vouchers signed a
/// receipt accepting it with its payload hash: its samples times the mean
/// weight those receipts applied.
pub fn summarize(own: &[RecordBody], foreign_receipts: &[RecordBody], k: u64, vouchers: &Vouchers) -> LedgerSummary {
    let Some(me) = own.first().map(|b| b.signer) else {
        return LedgerSummary { k, ..LedgerSummary::default() };
    };
    let mut mine = PeerCredit { node: me.to_hex(), ..PeerCredit::default() };
    let mut my_rounds: BTreeMap<u64, (u64, Hash32)> = BTreeMap::new();
    let mut others: BTreeMap<NodeId, PeerCredit> = BTreeMap::new();
    for body in own {
        match &body.kind {
            RecordKind::Contribution { round, samples, flops, payload_hash, .. } => {
                mine.contributions += 1;
                mine.samples += samples;
                mine.flops += flops;
                my_rounds.insert(*round, (*samples, *payload_hash));
            }
            RecordKind::Receipt { update, samples, outcome, .. } if update.src != me => {
                let p = others
                    .entry(update.src)
                    .or_insert_with(|| PeerCredit { node: update.src.to_hex(), ..PeerCredit::default() });
                p.contributions += 1;
                match outcome {
                    ReceiptOutcome::Accepted { weight, .. } => {
                        p.accepted += 1;
                        p.samples += samples;
                        p.accepted_weight += applied_weight(*weight);
                        p.credit += *samples as f64 * applied_weight(*weight);
                    }
                    ReceiptOutcome::Rejected { .. } => p.rejected += 1,
                }
            }
            RecordKind::Receipt { outcome: ReceiptOutcome::Accepted { weight, .. }, .. } => {
                mine.accepted += 1;
                mine.accepted_weight += applied_weight(*weight);
            }
            _ => {}
        }
    }
    let vouches = |signer: &NodeId| match vouchers {
        Vouchers::Allowlist(allowed) => allowed.contains(signer),
        Vouchers::AcceptedByOwner => others.get(signer).is_some_and(|p| p.accepted >= VOUCHER_MIN_ACCEPTED),
    };
    // Per contribution: the weight each distinct voucher applied it with.
    let mut acceptors: BTreeMap<u64, BTreeMap<NodeId, f64>> = BTreeMap::new();
    let mut distinct: BTreeSet<NodeId> = BTreeSet::new();
    for r in foreign_receipts {
        if let RecordKind::Receipt { update, payload_hash, outcome: ReceiptOutcome::Accepted { weight, .. }, .. } =
            &r.kind
            && update.src == me
            && r.signer != me
            && my_rounds.get(&update.round).is_some_and(|(_, hash)| hash == payload_hash)
            && vouches(&r.signer)
        {
            acceptors.entry(update.round).or_default().insert(r.signer, applied_weight(*weight));
            distinct.insert(r.signer);
        }
    }
    mine.receipts_from_distinct_peers = distinct.len() as u64;
    mine.credit = acceptors
        .iter()
        .filter(|(_, who)| who.len() as u64 >= k.max(1))
        .map(|(round, who)| my_rounds[round].0 as f64 * who.values().sum::<f64>() / who.len() as f64)
        // From +0: an empty f64 sum is -0, which prints as "-0".
        .fold(0.0, |a, b| a + b);
    LedgerSummary { me: mine, peers: others.into_values().collect(), k }
}

/// A receipt's weight as credit counts it: within [0, 1], zero when not a number.
fn applied_weight(w: f32) -> f64 {
    if w.is_finite() { w.clamp(0.0, 1.0) as f64 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        identity::Keypair,
        ids::{Hash32, RunId, UpdateId},
        ledger::LedgerWriter,
    };

    const RUN: RunId = RunId(Hash32([3; 32]));

    fn hash(round: u64) -> Hash32 {
        Hash32([round as u8 + 1; 32])
    }

    /// A receipt signed by key `by` about `src`'s update of `round`.
    fn receipt(by: &Keypair, src: &Keypair, round: u64, payload_hash: Hash32, weight: f32) -> RecordBody {
        LedgerWriter::new(by.clone(), RUN)
            .next(
                0,
                RecordKind::Receipt {
                    update: UpdateId { src: src.node_id(), round },
                    payload_hash,
                    samples: 100,
                    outcome: ReceiptOutcome::Accepted { weight, staleness: 0 },
                },
            )
            .open()
            .unwrap()
    }

    /// The owner's chain: contributions of 100 samples in rounds 0..4 (payload
    /// hash `hash(round)`), and receipts accepting `VOUCHER_MIN_ACCEPTED`
    /// updates of each of `accepted` (40 samples, weight 0.5).
    fn own_chain(me: &Keypair, accepted: &[&Keypair]) -> Vec<RecordBody> {
        let counted: Vec<(&Keypair, u64)> = accepted.iter().map(|p| (*p, VOUCHER_MIN_ACCEPTED)).collect();
        own_chain_accepting(me, &counted)
    }

    /// `own_chain` with `n` accepted updates of each peer.
    fn own_chain_accepting(me: &Keypair, accepted: &[(&Keypair, u64)]) -> Vec<RecordBody> {
        let mut w = LedgerWriter::new(me.clone(), RUN);
        let mut own: Vec<RecordBody> = (0..4)
            .map(|round| {
                let kind = RecordKind::Contribution {
                    round,
                    base_version: 0,
                    steps: 10,
                    samples: 100,
                    flops: 1.0,
                    payload_hash: hash(round),
                };
                w.next(round, kind).open().unwrap()
            })
            .collect();
        let mut at = 10;
        for (p, n) in accepted {
            for round in 0..*n {
                let kind = RecordKind::Receipt {
                    update: UpdateId { src: p.node_id(), round },
                    payload_hash: Hash32::default(),
                    samples: 40,
                    outcome: ReceiptOutcome::Accepted { weight: 0.5, staleness: 1 },
                };
                own.push(w.next(at, kind).open().unwrap());
                at += 1;
            }
        }
        own
    }

    #[test]
    fn credit_is_samples_times_applied_weight_from_k_vouchers_with_the_payload_hash() {
        let me = Keypair::deterministic(1, 0);
        let (p1, p2) = (Keypair::deterministic(1, 1), Keypair::deterministic(1, 2));
        let own = own_chain(&me, &[&p1, &p2]);
        let foreign = vec![
            // Round 0: two vouchers, weights 1 and 0.5: 100 x 0.75.
            receipt(&p1, &me, 0, hash(0), 1.0),
            receipt(&p2, &me, 0, hash(0), 0.5),
            // Round 1: one voucher, twice.
            receipt(&p1, &me, 1, hash(1), 1.0),
            receipt(&p1, &me, 1, hash(1), 1.0),
            // Round 2: two vouchers, but not for the payload we published.
            receipt(&p1, &me, 2, hash(9), 1.0),
            receipt(&p2, &me, 2, hash(9), 1.0),
        ];
        let s = summarize(&own, &foreign, 2, &Vouchers::AcceptedByOwner);
        assert_eq!((s.me.contributions, s.me.samples), (4, 400));
        assert_eq!(s.me.receipts_from_distinct_peers, 2);
        assert_eq!(s.me.credit, 75.0);
        assert_eq!(summarize(&own, &foreign, 1, &Vouchers::AcceptedByOwner).me.credit, 175.0);
        // Peers' credit is first-hand: our receipts, 40 samples x 0.5 each.
        let per_peer = VOUCHER_MIN_ACCEPTED as f64 * 20.0;
        assert_eq!(s.peers.iter().map(|p| p.credit).collect::<Vec<_>>(), vec![per_peer, per_peer]);
    }

    /// Ten freshly made keys countersign our contributions, and rounds we
    /// never published: none of them ever had an update accepted, so no
    /// credit is minted.
    #[test]
    fn fresh_identities_mint_no_credit() {
        let me = Keypair::deterministic(2, 0);
        let honest = Keypair::deterministic(2, 1);
        let own = own_chain(&me, &[&honest]);
        let sybils: Vec<Keypair> = (100..110).map(|i| Keypair::deterministic(2, i)).collect();
        let mut foreign = Vec::new();
        for s in &sybils {
            for round in 0..4 {
                foreign.push(receipt(s, &me, round, hash(round), 1.0));
            }
            foreign.push(receipt(s, &me, 7, hash(7), 1.0)); // fabricated: not in our chain
        }
        let s = summarize(&own, &foreign, 1, &Vouchers::AcceptedByOwner);
        assert_eq!(s.me.credit.to_string(), "0", "no credit, and not -0");
        assert_eq!(s.me.receipts_from_distinct_peers, 0);
        // One honest voucher (whose update we applied) does count.
        foreign.push(receipt(&honest, &me, 3, hash(3), 1.0));
        assert_eq!(summarize(&own, &foreign, 1, &Vouchers::AcceptedByOwner).me.credit, 100.0);
        // And a verifier's ledger credits a cheater with nothing it did not
        // itself accept, whatever receipts exist elsewhere.
        let verifier = own_chain(&Keypair::deterministic(3, 0), &[]);
        let s = summarize(&verifier, &foreign, 1, &Vouchers::AcceptedByOwner);
        assert!(s.peers.is_empty());
    }

    /// A key with one accepted update (cheap to make: one honest-looking
    /// update) does not vouch yet; with `VOUCHER_MIN_ACCEPTED` it does.
    #[test]
    fn a_voucher_needs_several_accepted_updates() {
        let me = Keypair::deterministic(5, 0);
        let (newcomer, regular) = (Keypair::deterministic(5, 1), Keypair::deterministic(5, 2));
        let own = own_chain_accepting(&me, &[(&newcomer, 1), (&regular, VOUCHER_MIN_ACCEPTED)]);
        let foreign = vec![receipt(&newcomer, &me, 0, hash(0), 1.0), receipt(&regular, &me, 1, hash(1), 1.0)];
        let s = summarize(&own, &foreign, 1, &Vouchers::AcceptedByOwner);
        assert_eq!(s.me.credit, 100.0, "round 1's receipt only");
        assert_eq!(s.me.receipts_from_distinct_peers, 1);
        let own = own_chain_accepting(&me, &[(&newcomer, VOUCHER_MIN_ACCEPTED - 1), (&regular, 0)]);
        assert_eq!(summarize(&own, &foreign, 1, &Vouchers::AcceptedByOwner).me.credit.to_string(), "0");
    }

    /// In a private swarm only the allowlist vouches: an outsider's receipt
    /// counts for nothing even when we applied one of its updates.
    #[test]
    fn a_private_swarm_counts_receipts_from_the_allowlist_only() {
        let me = Keypair::deterministic(4, 0);
        let (member, outsider) = (Keypair::deterministic(4, 1), Keypair::deterministic(4, 2));
        let own = own_chain(&me, &[&outsider]);
        let foreign = vec![receipt(&member, &me, 0, hash(0), 1.0), receipt(&outsider, &me, 1, hash(1), 1.0)];
        let allow = Vouchers::Allowlist([member.node_id()].into_iter().collect());
        assert_eq!(summarize(&own, &foreign, 1, &allow).me.credit, 100.0);
        assert_eq!(summarize(&own, &foreign, 1, &Vouchers::AcceptedByOwner).me.credit, 100.0, "the outsider's only");
    }
}
