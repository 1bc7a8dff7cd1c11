//! Credit: what a ledger says each node contributed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{ReceiptOutcome, RecordBody, RecordKind};
use crate::ids::NodeId;

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
    /// Samples of contributions countersigned by at least k distinct peers.
    pub credit_samples: u64,
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
/// A contribution earns credit (its samples) once at least `k` distinct
/// other peers signed a receipt accepting it.
pub fn summarize(own: &[RecordBody], foreign_receipts: &[RecordBody], k: u64) -> LedgerSummary {
    let Some(me) = own.first().map(|b| b.signer) else {
        return LedgerSummary { k, ..LedgerSummary::default() };
    };
    let mut mine = PeerCredit { node: me.to_hex(), ..PeerCredit::default() };
    let mut my_rounds: BTreeMap<u64, u64> = BTreeMap::new();
    let mut others: BTreeMap<NodeId, PeerCredit> = BTreeMap::new();
    for body in own {
        match &body.kind {
            RecordKind::Contribution { round, samples, flops, .. } => {
                mine.contributions += 1;
                mine.samples += samples;
                mine.flops += flops;
                my_rounds.insert(*round, *samples);
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
                        p.accepted_weight += *weight as f64;
                    }
                    ReceiptOutcome::Rejected { .. } => p.rejected += 1,
                }
            }
            RecordKind::Receipt { outcome: ReceiptOutcome::Accepted { weight, .. }, .. } => {
                mine.accepted += 1;
                mine.accepted_weight += *weight as f64;
            }
            _ => {}
        }
    }
    let mut acceptors: BTreeMap<u64, BTreeSet<NodeId>> = BTreeMap::new();
    let mut distinct: BTreeSet<NodeId> = BTreeSet::new();
    for r in foreign_receipts {
        if let RecordKind::Receipt { update, outcome: ReceiptOutcome::Accepted { .. }, .. } = &r.kind
            && update.src == me
            && r.signer != me
            && my_rounds.contains_key(&update.round)
        {
            acceptors.entry(update.round).or_default().insert(r.signer);
            distinct.insert(r.signer);
        }
    }
    mine.receipts_from_distinct_peers = distinct.len() as u64;
    mine.credit_samples =
        acceptors.iter().filter(|(_, who)| who.len() as u64 >= k).map(|(round, _)| my_rounds[round]).sum();
    LedgerSummary { me: mine, peers: others.into_values().collect(), k }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        identity::Keypair,
        ids::{Hash32, RunId, UpdateId},
        ledger::LedgerWriter,
    };

    #[test]
    fn credit_needs_k_distinct_acceptors() {
        let run = RunId(Hash32([3; 32]));
        let me = Keypair::deterministic(1, 0);
        let mut w = LedgerWriter::new(me.clone(), run);
        let own: Vec<RecordBody> = (0..3)
            .map(|round| {
                w.next(
                    round,
                    RecordKind::Contribution {
                        round,
                        base_version: 0,
                        steps: 10,
                        samples: 100,
                        flops: 1.0,
                        payload_hash: Hash32::default(),
                    },
                )
                .open()
                .unwrap()
            })
            .collect();
        let receipt = |by: u64, round: u64| {
            let k = Keypair::deterministic(1, by);
            LedgerWriter::new(k, run)
                .next(
                    0,
                    RecordKind::Receipt {
                        update: UpdateId { src: me.node_id(), round },
                        payload_hash: Hash32::default(),
                        samples: 100,
                        outcome: ReceiptOutcome::Accepted { weight: 1.0, staleness: 0 },
                    },
                )
                .open()
                .unwrap()
        };
        // Round 0: two acceptors; round 1: one (twice the same); round 2: none.
        let foreign = vec![receipt(1, 0), receipt(2, 0), receipt(1, 1), receipt(1, 1)];
        let s = summarize(&own, &foreign, 2);
        assert_eq!(s.me.contributions, 3);
        assert_eq!(s.me.samples, 300);
        assert_eq!(s.me.receipts_from_distinct_peers, 2);
        assert_eq!(s.me.credit_samples, 100);
        assert_eq!(summarize(&own, &foreign, 1).me.credit_samples, 200);
    }
}
