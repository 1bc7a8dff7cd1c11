//! The contribution ledger's records: signed, sequence-numbered and
//! hash-chained, so a node's history is tamper-evident without any chain or
//! central database. Storage is behind [`LedgerStore`]: sled in the node,
//! memory in the simulator and tests.

mod store;
mod summary;

use serde::{Deserialize, Serialize};
pub use store::{LedgerStore, MemoryLedger};
pub use summary::{LedgerSummary, PeerCredit, VOUCHER_MIN_ACCEPTED, Vouchers, summarize};

use crate::{
    identity::{self, Keypair, Signable, SignatureCheck, Signed},
    ids::{Hash32, NodeId, RunId, UpdateId},
    reject::RejectReason,
};

/// A signed ledger record.
pub type SignedRecord = Signed<RecordBody>;

/// What a receipt says about an update.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReceiptOutcome {
    /// Applied to the replica with this staleness weight.
    Accepted {
        /// The weight applied.
        weight: f32,
        /// The staleness measured.
        staleness: u32,
    },
    /// Not applied, and why.
    Rejected {
        /// The reason.
        reason: RejectReason,
    },
}

/// What a record records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RecordKind {
    /// This node joined the run.
    Join {
        /// Its speed estimate at join (steps/s).
        speed: f32,
        /// Its device, in words.
        device: String,
    },
    /// This node published an update.
    Contribution {
        /// Its round.
        round: u64,
        /// `|B|` of the base the round started from.
        base_version: u64,
        /// Inner steps.
        steps: u32,
        /// Samples processed.
        samples: u64,
        /// Estimated floating-point operations.
        flops: f64,
        /// blake3 of the payload.
        payload_hash: Hash32,
    },
    /// This node accepted or rejected someone's update.
    Receipt {
        /// The update.
        update: UpdateId,
        /// Its payload hash (zero when unknown).
        payload_hash: Hash32,
        /// Samples the contributor claimed.
        samples: u64,
        /// Applied or not.
        outcome: ReceiptOutcome,
    },
    /// This node wrote a checkpoint.
    Checkpoint {
        /// Its round.
        round: u64,
        /// blake3 of the anchor.
        anchor_hash: Hash32,
    },
    /// This node left the run.
    Leave {
        /// Its last round.
        round: u64,
        /// Why, in words.
        reason: String,
    },
}

/// A ledger record before signing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordBody {
    /// The node whose ledger this is.
    pub signer: NodeId,
    /// 0, 1, 2, ... without gaps.
    pub seq: u64,
    /// Hash of the previous signed record (zero for seq 0).
    pub prev: Hash32,
    /// The run.
    pub run_id: RunId,
    /// Wall time, Unix ms (virtual ms in the simulator).
    pub time_ms: u64,
    /// What it records.
    pub kind: RecordKind,
}

impl Signable for RecordBody {
    const DOMAIN: &'static [u8] = b"ragtag/v1/ledger";
    const MAX_BODY: usize = 1536;
    fn signer(&self) -> NodeId {
        self.signer
    }
}

/// Appends to one node's chain: holds the key and the chain's head.
#[derive(Debug)]
pub struct LedgerWriter {
    key: Keypair,
    run_id: RunId,
    next_seq: u64,
    head: Hash32,
}

impl LedgerWriter {
    /// A writer for an empty chain.
    pub fn new(key: Keypair, run_id: RunId) -> Self {
        Self { key, run_id, next_seq: 0, head: Hash32::default() }
    }

    /// A writer continuing after `last` (the chain's newest record).
    pub fn resume(key: Keypair, run_id: RunId, last: Option<&SignedRecord>) -> Result<Self, ChainError> {
        let mut w = Self::new(key, run_id);
        if let Some(last) = last {
            let body =
                last.open().map_err(|e| ChainError { seq: None, reason: ChainFault::Signature(e.to_string()) })?;
            w.next_seq = body.seq + 1;
            w.head = last.hash();
        }
        Ok(w)
    }

    /// The next sequence number.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Builds and signs the next record and advances the head. The caller
    /// stores it durably before treating it as written.
    pub fn next(&mut self, time_ms: u64, kind: RecordKind) -> SignedRecord {
        let body = RecordBody {
            signer: self.key.node_id(),
            seq: self.next_seq,
            prev: self.head,
            run_id: self.run_id,
            time_ms,
            kind,
        };
        let signed = Signed::sign(&body, &self.key);
        self.next_seq += 1;
        self.head = signed.hash();
        signed
    }
}

/// What is wrong with a chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChainFault {
    /// The record does not decode.
    Malformed(String),
    /// Its signature does not verify.
    Signature(String),
    /// Signed by another key than the chain's.
    WrongSigner,
    /// A sequence number is missing or repeated.
    Sequence {
        /// The number expected here.
        expected: u64,
        /// The number found.
        found: u64,
    },
    /// `prev` is not the hash of the previous record.
    BrokenLink,
}

/// The first bad record of a chain.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("record {}: {reason:?}", seq.map(|s| s.to_string()).unwrap_or_else(|| "?".into()))]
pub struct ChainError {
    /// Position (sequence number expected there), when known.
    pub seq: Option<u64>,
    /// What is wrong.
    pub reason: ChainFault,
}

/// Checks a whole chain: every signature (in batches, falling back to one
/// by one to name the bad record), the sequence, the links and the signer.
/// Returns the decoded bodies.
pub fn verify_chain(records: &[SignedRecord]) -> Result<Vec<RecordBody>, ChainError> {
    verify_chain_on(records, 1)
}

/// [`verify_chain`] with the signatures checked on `threads` threads (the
/// caller knows the machine; signature arithmetic is nearly all the cost).
/// The result, including which record is named on failure, does not depend
/// on `threads`.
pub fn verify_chain_on(records: &[SignedRecord], threads: usize) -> Result<Vec<RecordBody>, ChainError> {
    let mut bodies = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let body = r
            .decode_unverified()
            .map_err(|e| ChainError { seq: Some(i as u64), reason: ChainFault::Malformed(e.to_string()) })?;
        bodies.push(body);
    }
    let per_thread = records.len().div_ceil(threads.max(1)).max(1);
    let first_bad = std::thread::scope(|scope| {
        let workers: Vec<_> = records
            .chunks(per_thread)
            .zip(bodies.chunks(per_thread))
            .enumerate()
            .map(|(t, (recs, bods))| scope.spawn(move || first_bad_signature(recs, bods, t * per_thread)))
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .min_by_key(|e| e.seq)
    });
    if let Some(e) = first_bad {
        return Err(e);
    }
    let mut prev = Hash32::default();
    for (i, (r, body)) in records.iter().zip(&bodies).enumerate() {
        let seq = i as u64;
        if body.signer != bodies[0].signer {
            return Err(ChainError { seq: Some(seq), reason: ChainFault::WrongSigner });
        }
        if body.seq != seq {
            return Err(ChainError { seq: Some(seq), reason: ChainFault::Sequence { expected: seq, found: body.seq } });
        }
        if body.prev != prev {
            return Err(ChainError { seq: Some(seq), reason: ChainFault::BrokenLink });
        }
        prev = r.hash();
    }
    Ok(bodies)
}

/// The first record in `records` (numbered from `offset`) whose signature
/// fails: batches of 256, one by one only inside a failing batch.
fn first_bad_signature(records: &[SignedRecord], bodies: &[RecordBody], offset: usize) -> Option<ChainError> {
    const BATCH: usize = 256;
    for (b, chunk) in records.chunks(BATCH).enumerate() {
        let items: Vec<SignatureCheck<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(j, r)| SignatureCheck {
                signer: bodies[b * BATCH + j].signer,
                domain: RecordBody::DOMAIN,
                message: r.body(),
                signature: *r.signature(),
            })
            .collect();
        if identity::verify_batch(&items).is_err() {
            for (j, check) in items.iter().enumerate() {
                if let Err(e) = check.verify() {
                    let seq = Some((offset + b * BATCH + j) as u64);
                    return Some(ChainError { seq, reason: ChainFault::Signature(e.to_string()) });
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u64) -> (Keypair, Vec<SignedRecord>) {
        let k = Keypair::deterministic(11, 0);
        let mut w = LedgerWriter::new(k.clone(), RunId(Hash32([1; 32])));
        let records = (0..n)
            .map(|i| {
                w.next(
                    i,
                    RecordKind::Contribution {
                        round: i,
                        base_version: i * 3,
                        steps: 50,
                        samples: 1600,
                        flops: 1e9,
                        payload_hash: Hash32([i as u8; 32]),
                    },
                )
            })
            .collect();
        (k, records)
    }

    #[test]
    fn a_good_chain_verifies() {
        let (_, records) = chain(300);
        assert_eq!(verify_chain(&records).unwrap().len(), 300);
        assert!(verify_chain(&[]).unwrap().is_empty());
    }

    #[test]
    fn flipped_byte_is_named() {
        let (_, mut records) = chain(10);
        let mut body = records[4].body().to_vec();
        let last = body.len() - 2;
        body[last] ^= 0x40;
        records[4] = SignedRecord::from_parts(body, *records[4].signature());
        let err = verify_chain(&records).unwrap_err();
        assert_eq!(err.seq, Some(4));
    }

    #[test]
    fn the_thread_count_changes_nothing_but_speed() {
        let (_, mut records) = chain(700);
        for threads in [1, 2, 3, 8, 1000] {
            assert_eq!(verify_chain_on(&records, threads).unwrap(), verify_chain(&records).unwrap());
        }
        // Two forgeries in different threads' ranges: the first is named.
        let other = Keypair::deterministic(12, 0);
        for i in [650, 300] {
            let forged = other.sign(RecordBody::DOMAIN, records[i].body());
            records[i] = records[i].clone().with_signature(forged);
        }
        for threads in [1, 2, 3, 8] {
            assert_eq!(verify_chain_on(&records, threads).unwrap_err().seq, Some(300), "{threads} threads");
        }
    }

    #[test]
    fn deleted_record_is_named() {
        let (_, mut records) = chain(10);
        records.remove(6);
        let err = verify_chain(&records).unwrap_err();
        assert_eq!(err, ChainError { seq: Some(6), reason: ChainFault::Sequence { expected: 6, found: 7 } });
    }

    #[test]
    fn reordered_records_are_named() {
        let (_, mut records) = chain(10);
        records.swap(2, 3);
        let err = verify_chain(&records).unwrap_err();
        assert_eq!(err.seq, Some(2));
    }

    #[test]
    fn replaced_signature_is_named() {
        let (_, mut records) = chain(10);
        let other = Keypair::deterministic(12, 0);
        let forged = other.sign(RecordBody::DOMAIN, records[8].body());
        records[8] = records[8].clone().with_signature(forged);
        let err = verify_chain(&records).unwrap_err();
        assert_eq!(err.seq, Some(8));
        assert!(matches!(err.reason, ChainFault::Signature(_)));
    }

    #[test]
    fn writer_resumes_after_the_last_record() {
        let (k, records) = chain(5);
        let mut w = LedgerWriter::resume(k, RunId(Hash32([1; 32])), records.last()).unwrap();
        let mut all = records.clone();
        all.push(w.next(9, RecordKind::Leave { round: 5, reason: "done".into() }));
        verify_chain(&all).unwrap();
    }
}
