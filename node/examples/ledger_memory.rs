//! How much resident memory sled holds as a node's ledger grows, for a
//! given cache bound: appends record-sized values to an "own" tree (keyed
//! by sequence) and a "receipts" tree (keyed by hash), flushing every 8, as
//! the node does, and prints the process's RSS every `every` pairs.
//!
//! `cargo run --release -p ragtag-node --example ledger_memory -- CACHE_BYTES PAIRS [SIZE] [EVERY]`

use anyhow::{Context, Result};

fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmRSS")).context("no VmRSS line")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

fn arg(args: &[String], i: usize, default: Option<u64>) -> Result<u64> {
    match args.get(i) {
        Some(a) => Ok(a.parse()?),
        None => default.context("usage: ledger_memory CACHE_BYTES PAIRS [SIZE] [EVERY]"),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cache, pairs) = (arg(&args, 0, None)?, arg(&args, 1, None)?);
    let (size, every) = (arg(&args, 2, Some(250))? as usize, arg(&args, 3, Some(1000))?.max(1));
    let dir = tempfile::tempdir()?;
    let db = sled::Config::new().path(dir.path()).cache_capacity(cache).flush_every_ms(None).open()?;
    let (own, receipts) = (db.open_tree("own")?, db.open_tree("receipts")?);
    println!("pairs rss_kib disk_bytes");
    println!("0 {} {}", rss_kib()?, db.size_on_disk()?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..pairs {
        // Incompressible bytes, like signatures and hashes.
        let value: Vec<u8> = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        own.insert(i.to_be_bytes(), value.as_slice())?;
        receipts.insert(blake3::hash(&value).as_bytes(), value)?;
        if i % 8 == 7 {
            db.flush()?;
        }
        if (i + 1) % every == 0 {
            println!("{} {} {}", i + 1, rss_kib()?, db.size_on_disk()?);
        }
    }
    Ok(())
}
