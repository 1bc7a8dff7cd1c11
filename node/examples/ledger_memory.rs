//! How much resident memory the node's ledger holds as it grows: every pair
//! is one signed receipt appended to our chain (the node's most common
//! record; appends are flushed every 8, as a drain does) and one receipt
//! another node signed about our work, kept. Prints the process's RSS and
//! the size on disk every `EVERY` pairs.
//!
//! `cargo run --release -p ragtag-node --example ledger_memory -- PAIRS [EVERY]`

use anyhow::{Context, Result};
use ragtag_node::ledger::SledLedger;
use ragtag_protocol::{
    Keypair,
    ids::{Hash32, RunId, UpdateId},
    ledger::{LedgerStore, LedgerWriter, ReceiptOutcome, RecordKind},
};

fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmRSS")).context("no VmRSS line")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

fn disk_bytes(dir: &std::path::Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { disk_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

fn receipt(src: Keypair, round: u64) -> RecordKind {
    RecordKind::Receipt {
        update: UpdateId { src: src.node_id(), round },
        payload_hash: Hash32(*blake3::hash(&round.to_le_bytes()).as_bytes()),
        samples: 1600,
        outcome: ReceiptOutcome::Accepted { weight: 0.9, staleness: 1 },
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ledger_memory PAIRS [EVERY]";
    let pairs: u64 = args.first().context(usage)?.parse()?;
    let every: u64 = args.get(1).map_or(Ok(10_000), |a| a.parse())?.max(1);
    let dir = tempfile::tempdir()?;
    let mut ledger = SledLedger::open(dir.path())?;
    let run = RunId(Hash32([7; 32]));
    let (me, other) = (Keypair::deterministic(1, 0), Keypair::deterministic(1, 1));
    let (mut ours, mut theirs) = (LedgerWriter::new(me.clone(), run), LedgerWriter::new(other.clone(), run));
    println!("pairs rss_kib disk_bytes");
    println!("0 {} {}", rss_kib()?, disk_bytes(dir.path())?);
    let mut group = Vec::new();
    for i in 0..pairs {
        group.push(ours.next(i, receipt(other.clone(), i)));
        if group.len() == 8 {
            ledger.append_unflushed(&group)?;
            ledger.flush()?;
            group.clear();
        }
        ledger.keep_receipt(&theirs.next(i, receipt(me.clone(), i)))?;
        if (i + 1) % every == 0 {
            println!("{} {} {}", i + 1, rss_kib()?, disk_bytes(dir.path())?);
        }
    }
    Ok(())
}
