//! The sled ledger: crash safety under SIGKILL, tamper detection, and the
//! `ragtag ledger` commands.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use ragtag_node::ledger::{ExportFormat, SledLedger, export, summary, verify};
use ragtag_protocol::{
    Keypair,
    ids::{Hash32, RunId, UpdateId},
    ledger::{LedgerStore, LedgerWriter, ReceiptOutcome, RecordKind, Vouchers},
};

const RUN: RunId = RunId(Hash32([5; 32]));

fn contribution(round: u64) -> RecordKind {
    RecordKind::Contribution {
        round,
        base_version: round,
        steps: 10,
        samples: 320,
        flops: 1e6,
        payload_hash: Hash32([round as u8; 32]),
    }
}

/// Child mode: append forever in groups, print "ACK seq" after each flush.
#[test]
fn ledger_writer_child() {
    let Ok(dir) = std::env::var("RAGTAG_LEDGER_CHILD") else { return };
    let key = Keypair::deterministic(9, 0);
    let mut ledger = SledLedger::open(Path::new(&dir)).unwrap();
    let last = ledger.last().unwrap();
    let mut w = LedgerWriter::resume(key, RUN, last.as_ref()).unwrap();
    let mut group = 1;
    loop {
        let records: Vec<_> = (0..group).map(|_| w.next(0, contribution(w.next_seq()))).collect();
        ledger.append_unflushed(&records).unwrap();
        ledger.flush().unwrap();
        println!("ACK {}", w.next_seq() - 1);
        group = group % 7 + 1;
        let _ = &mut ledger;
    }
}

#[test]
fn acknowledged_records_survive_sigkill_and_the_chain_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger");
    let mut acked: Option<u64> = None;
    let mut rng = ragtag_protocol::rng::SeededRng::new(17);
    for kill in 0..20 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "ledger_writer_child", "--nocapture", "--test-threads=1"])
            .env("RAGTAG_LEDGER_CHILD", &db)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = None;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(seq) = line.strip_prefix("ACK ").and_then(|s| s.trim().parse::<u64>().ok()) {
                    last = Some(seq);
                }
            }
            last
        });
        std::thread::sleep(Duration::from_millis(50 + rng.below(250)));
        #[allow(unsafe_code)]
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGKILL);
        }
        let _ = child.wait();
        if let Some(a) = reader.join().unwrap() {
            acked = Some(a);
        }
        let ledger = SledLedger::open(&db).unwrap();
        let report = verify(&ledger).unwrap();
        assert_eq!(report.error, None, "after kill {kill}: {report:?}");
        let stored = ledger.records().unwrap().len() as u64;
        if let Some(a) = acked {
            assert!(stored > a, "after kill {kill}: record {a} was acknowledged but only {stored} survive");
        }
    }
    assert!(acked.is_some_and(|a| a > 20), "the child should have written many records: {acked:?}");
}

fn filled(dir: &Path, n: u64) -> SledLedger {
    let mut ledger = SledLedger::open(dir).unwrap();
    let mut w = LedgerWriter::new(Keypair::deterministic(9, 1), RUN);
    for i in 0..n {
        ledger.append(&w.next(i, contribution(i))).unwrap();
    }
    ledger
}

#[test]
fn every_kind_of_tampering_is_detected_and_named() {
    // A flipped byte.
    let d = tempfile::tempdir().unwrap();
    let l = filled(d.path(), 10);
    let (seq, mut bytes) = l.raw_records().unwrap().remove(4);
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    l.overwrite_raw(seq, &bytes).unwrap();
    assert_eq!(verify(&l).unwrap().bad_record, Some(4));

    // A deleted record.
    let d = tempfile::tempdir().unwrap();
    let l = filled(d.path(), 10);
    l.remove_raw(6).unwrap();
    assert_eq!(verify(&l).unwrap().bad_record, Some(6));

    // Two records swapped.
    let d = tempfile::tempdir().unwrap();
    let l = filled(d.path(), 10);
    let raw = l.raw_records().unwrap();
    l.overwrite_raw(2, &raw[3].1).unwrap();
    l.overwrite_raw(3, &raw[2].1).unwrap();
    assert_eq!(verify(&l).unwrap().bad_record, Some(2));

    // A replaced signature.
    let d = tempfile::tempdir().unwrap();
    let l = filled(d.path(), 10);
    let r = &l.records().unwrap()[8];
    let other = Keypair::deterministic(10, 0);
    let forged = r.clone().with_signature(other.sign(b"ragtag/v1/ledger", r.body()));
    l.overwrite_raw(8, &postcard::to_allocvec(&forged).unwrap()).unwrap();
    let report = verify(&l).unwrap();
    assert_eq!(report.bad_record, Some(8));
    assert!(report.error.unwrap().contains("Signature"));

    // And the command says so with a non-zero exit.
    drop(l);
    let state = d.path().parent().unwrap().join(format!("state-{}", std::process::id()));
    std::fs::create_dir_all(&state).unwrap();
    let _ = std::fs::remove_dir_all(state.join("ledger"));
    std::fs::rename(d.path(), state.join("ledger")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ragtag"))
        .args(["ledger", "verify", "--state", state.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("record 8"), "{}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn summary_counts_credit_and_export_carries_signatures() {
    let d = tempfile::tempdir().unwrap();
    let mut l = filled(d.path(), 3);
    let me = Keypair::deterministic(9, 1).node_id();
    for by in [2, 3] {
        let mut w = LedgerWriter::new(Keypair::deterministic(9, by), RUN);
        let receipt = w.next(
            0,
            RecordKind::Receipt {
                update: UpdateId { src: me, round: 1 },
                payload_hash: Hash32([1; 32]),
                samples: 320,
                outcome: ReceiptOutcome::Accepted { weight: 1.0, staleness: 0 },
            },
        );
        l.keep_receipt(&receipt).unwrap();
    }
    let s =
        summary(&l, 2, &Vouchers::Allowlist([2, 3].map(|i| Keypair::deterministic(9, i).node_id()).into())).unwrap();
    assert_eq!(s.me.contributions, 3);
    assert_eq!(s.me.receipts_from_distinct_peers, 2);
    assert_eq!(s.me.credit, 320.0);
    // Neither countersigner had an update accepted by this node: in a public
    // swarm their receipts vouch for nothing.
    assert_eq!(summary(&l, 2, &Vouchers::AcceptedByOwner).unwrap().me.credit, 0.0);
    let jsonl = export(&l, ExportFormat::Jsonl).unwrap();
    assert_eq!(jsonl.lines().count(), 3);
    assert!(jsonl.contains("signature_hex"));
    let csv = export(&l, ExportFormat::Csv).unwrap();
    assert_eq!(csv.lines().count(), 4);
}

fn receipt_by(signer: u64, about: &Keypair, round: u64) -> ragtag_protocol::ledger::SignedRecord {
    let mut w = LedgerWriter::new(Keypair::deterministic(9, signer), RUN);
    w.next(
        0,
        RecordKind::Receipt {
            update: UpdateId { src: about.node_id(), round },
            payload_hash: Hash32::default(),
            samples: 320,
            outcome: ReceiptOutcome::Accepted { weight: 1.0, staleness: 0 },
        },
    )
}

#[test]
fn a_ledger_with_one_key_per_record_is_moved_into_blocks_on_open() {
    // The layout before blocks: "own" keyed by big-endian sequence,
    // "receipts" keyed by record hash.
    let d = tempfile::tempdir().unwrap();
    let me = Keypair::deterministic(9, 1);
    let mut w = LedgerWriter::new(me.clone(), RUN);
    let chain: Vec<_> = (0..21).map(|i| w.next(i, contribution(i))).collect();
    let receipts: Vec<_> = (2..5).map(|by| receipt_by(by, &me, 1)).collect();
    {
        let db = sled::open(d.path()).unwrap();
        let (own, kept) = (db.open_tree("own").unwrap(), db.open_tree("receipts").unwrap());
        for (i, r) in chain.iter().enumerate() {
            own.insert((i as u64).to_be_bytes(), postcard::to_allocvec(r).unwrap()).unwrap();
        }
        for r in &receipts {
            kept.insert(r.hash().0, postcard::to_allocvec(r).unwrap()).unwrap();
        }
        db.flush().unwrap();
    }
    for _ in 0..2 {
        let l = SledLedger::open(d.path()).unwrap();
        assert_eq!(l.records().unwrap(), chain);
        let mut kept = l.receipts().unwrap();
        kept.sort_by_key(|r| r.hash());
        let mut want = receipts.clone();
        want.sort_by_key(|r| r.hash());
        assert_eq!(kept, want);
        assert_eq!(verify(&l).unwrap().error, None);
    }
    // And it goes on appending where the old chain ended.
    let l = SledLedger::open(d.path()).unwrap();
    let mut w = LedgerWriter::resume(me, RUN, l.last().unwrap().as_ref()).unwrap();
    l.append_unflushed(&[w.next(21, contribution(21))]).unwrap();
    l.flush().unwrap();
    assert_eq!(l.records().unwrap().len(), 22);
    assert_eq!(verify(&l).unwrap().error, None);
}

#[test]
fn a_receipt_delivered_twice_is_kept_once() {
    let d = tempfile::tempdir().unwrap();
    let mut l = SledLedger::open(d.path()).unwrap();
    let me = Keypair::deterministic(9, 1);
    let receipts: Vec<_> = (0..20).map(|round| receipt_by(2, &me, round)).collect();
    for r in receipts.iter().chain(&receipts) {
        l.keep_receipt(r).unwrap();
    }
    drop(l);
    // Reopened: the write-side memory of recent receipts is gone, so a late
    // duplicate is stored and reads still count it once.
    let mut l = SledLedger::open(d.path()).unwrap();
    l.keep_receipt(&receipts[3]).unwrap();
    assert_eq!(l.receipts().unwrap().len(), 20);
}
