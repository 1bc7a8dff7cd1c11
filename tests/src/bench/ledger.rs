//! Ledger throughput: signed appends per second with the node's flush
//! policy (one flush per group of records), and verifies per second with
//! batch verification, each against its one-at-a-time baseline.

use std::time::Instant;

use ragtag_node::ledger::SledLedger;
use ragtag_protocol::{
    Keypair,
    ids::{Hash32, RunId},
    ledger::{LedgerWriter, RecordKind, SignedRecord, verify_chain, verify_chain_on},
};

use super::Figure;

fn kind(i: u64) -> RecordKind {
    RecordKind::Contribution {
        round: i,
        base_version: i,
        steps: 50,
        samples: 1600,
        flops: 1e9,
        payload_hash: Hash32([i as u8; 32]),
    }
}

/// Appends `n` records flushing every `group`; returns records per second.
fn appends(n: u64, group: u64) -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = SledLedger::open(dir.path()).expect("ledger");
    let mut w = LedgerWriter::new(Keypair::deterministic(1, 0), RunId(Hash32([1; 32])));
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<SignedRecord> = (0..group.min(n - i)).map(|j| w.next(0, kind(i + j))).collect();
        ledger.append_unflushed(&batch).expect("append");
        ledger.flush().expect("flush");
        i += batch.len() as u64;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Runs the benchmark with `n` records.
pub fn run(n: u64) -> Vec<Figure> {
    let one = appends(n / 10, 1);
    let grouped = appends(n, 32);
    let mut out = vec![
        Figure::new("ledger", "signed appends, flush after every record (baseline)", one, "records/s"),
        Figure::new(
            "ledger",
            "signed appends, one flush per group of 32 (the node's policy: a drain's records)",
            grouped,
            "records/s",
        )
        .with_ratio(grouped / one, "x per-record flush"),
    ];
    let mut w = LedgerWriter::new(Keypair::deterministic(1, 0), RunId(Hash32([1; 32])));
    let records: Vec<SignedRecord> = (0..n).map(|i| w.next(0, kind(i))).collect();
    let start = Instant::now();
    for r in &records {
        r.open().expect("valid");
    }
    let single = n as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    verify_chain(&records).expect("valid chain");
    let batch = n as f64 / start.elapsed().as_secs_f64();
    // As `ragtag ledger verify` runs it: on every core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    verify_chain_on(&records, threads).expect("valid chain");
    let parallel = n as f64 / start.elapsed().as_secs_f64();
    out.push(Figure::new("ledger", "verify one record at a time (baseline)", single, "records/s"));
    out.push(
        Figure::new("ledger", "verify a chain (batch signatures, links, sequence)", batch, "records/s")
            .with_ratio(batch / single, "x one at a time"),
    );
    out.push(
        Figure::new(
            "ledger",
            &format!("verify a chain on {threads} threads (as `ragtag ledger verify` does)"),
            parallel,
            "records/s",
        )
        .with_ratio(parallel / single, "x one at a time"),
    );
    out
}
