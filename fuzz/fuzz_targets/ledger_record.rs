//! Ledger records from storage or gossip: decode, open, verify as a chain.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::ledger::{SignedRecord, verify_chain};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = postcard::from_bytes::<SignedRecord>(data) {
        let _ = r.open();
        let _ = verify_chain(&[r.clone(), r]);
    }
});
