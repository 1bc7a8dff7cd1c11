//! A gossiped batch of receipts: decode, open every record, and compute
//! credit from them under both voucher rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{
    ledger::{Vouchers, summarize},
    wire::Message,
};

fuzz_target!(|data: &[u8]| {
    let records = match Message::decode(data) {
        Ok(Message::Receipts(r)) => r,
        Ok(Message::Receipt(r)) => vec![r],
        _ => return,
    };
    let bodies: Vec<_> = records.iter().filter_map(|r| r.decode_unverified().ok()).collect();
    for r in &records {
        let _ = r.open();
    }
    let (own, foreign) = bodies.split_at(bodies.len() / 2);
    let allow = Vouchers::Allowlist(foreign.iter().map(|b| b.signer).collect());
    for v in [Vouchers::AcceptedByOwner, allow] {
        let s = summarize(own, foreign, 1, &v);
        assert!(s.me.credit.is_finite() && s.me.credit >= 0.0);
    }
});
