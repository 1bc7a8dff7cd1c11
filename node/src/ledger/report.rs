//! `ragtag ledger summary | verify | export`.

use std::fmt::Write as _;

use ragtag_protocol::{
    identity::Signed,
    ledger::{
        ChainError, ChainFault, LedgerStore, LedgerSummary, RecordBody, SignedRecord, Vouchers, summarize,
        verify_chain_on,
    },
};
use serde::Serialize;

use super::{LedgerError, SledLedger};

/// The outcome of `verify`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Records checked.
    pub records: usize,
    /// The signer.
    pub signer: Option<String>,
    /// The first bad record, if any.
    pub error: Option<String>,
    /// Its sequence number.
    pub bad_record: Option<u64>,
}

/// Checks every signature and the chain. Records that do not even decode
/// are reported by their storage key.
pub fn verify(ledger: &SledLedger) -> Result<VerifyReport, LedgerError> {
    let raw = ledger.raw_records()?;
    let mut records = Vec::with_capacity(raw.len());
    for (i, (key, bytes)) in raw.iter().enumerate() {
        if *key != i as u64 {
            // A gap in the keys: a record was removed.
            let e =
                ChainError { seq: Some(i as u64), reason: ChainFault::Sequence { expected: i as u64, found: *key } };
            return Ok(bad(raw.len(), None, &e));
        }
        match postcard::from_bytes::<Signed<RecordBody>>(bytes) {
            Ok(r) => records.push(r),
            Err(e) => {
                let e = ChainError { seq: Some(*key), reason: ChainFault::Malformed(e.to_string()) };
                return Ok(bad(raw.len(), None, &e));
            }
        }
    }
    let signer = records.first().and_then(|r| r.decode_unverified().ok()).map(|b| b.signer.to_hex());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    match verify_chain_on(&records, threads) {
        Ok(_) => Ok(VerifyReport { records: records.len(), signer, error: None, bad_record: None }),
        Err(e) => Ok(bad(records.len(), signer, &e)),
    }
}

fn bad(records: usize, signer: Option<String>, e: &ChainError) -> VerifyReport {
    VerifyReport { records, signer, error: Some(e.to_string()), bad_record: e.seq }
}

/// The credit summary, with receipts from `k` distinct vouchers needed.
pub fn summary(ledger: &SledLedger, k: u64, vouchers: &Vouchers) -> Result<LedgerSummary, LedgerError> {
    let own: Vec<RecordBody> = ledger.records()?.iter().filter_map(|r| r.open().ok()).collect();
    let foreign: Vec<RecordBody> = ledger.receipts()?.iter().filter_map(|r| r.open().ok()).collect();
    Ok(summarize(&own, &foreign, k, vouchers))
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values.
    Csv,
}

#[derive(Serialize)]
struct ExportRow {
    seq: u64,
    signer: String,
    prev: String,
    hash: String,
    time_ms: u64,
    kind: String,
    record: RecordBody,
    body_hex: String,
    signature_hex: String,
}

fn kind_name(b: &RecordBody) -> &'static str {
    use ragtag_protocol::ledger::RecordKind::*;
    match b.kind {
        Join { .. } => "join",
        Contribution { .. } => "contribution",
        Receipt { .. } => "receipt",
        Checkpoint { .. } => "checkpoint",
        Leave { .. } => "leave",
    }
}

/// Every record with its signed bytes and signature, so anyone holding the
/// public key can check it.
pub fn export(ledger: &SledLedger, format: ExportFormat) -> Result<String, LedgerError> {
    let records: Vec<SignedRecord> = ledger.records()?;
    let mut out = String::new();
    if format == ExportFormat::Csv {
        out.push_str("seq,signer,prev,hash,time_ms,kind,body_hex,signature_hex\n");
    }
    for r in &records {
        let Ok(b) = r.decode_unverified() else { continue };
        let row = ExportRow {
            seq: b.seq,
            signer: b.signer.to_hex(),
            prev: b.prev.to_hex(),
            hash: r.hash().to_hex(),
            time_ms: b.time_ms,
            kind: kind_name(&b).into(),
            body_hex: hex::encode(r.body()),
            signature_hex: hex::encode(r.signature()),
            record: b,
        };
        match format {
            ExportFormat::Jsonl => {
                out.push_str(&serde_json::to_string(&row).expect("plain data serialises"));
                out.push('\n');
            }
            ExportFormat::Csv => {
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{},{}",
                    row.seq, row.signer, row.prev, row.hash, row.time_ms, row.kind, row.body_hex, row.signature_hex
                );
            }
        }
    }
    Ok(out)
}
