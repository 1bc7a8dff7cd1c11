//! Any bytes from the network: decode, then open every signed part.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{
    ids::{Hash32, RunId},
    validate::UpdateValidator,
    wire::Message,
};

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = Message::decode(data) else { return };
    // Whatever decodes re-encodes within its kind's limit.
    assert!(msg.encode().len() <= msg.kind().max_len());
    let validator = UpdateValidator::new(RunId(Hash32([0; 32])), 64, 50, None);
    match msg {
        Message::Announce(s) => {
            let _ = validator.check_announcement(&s);
        }
        Message::Update { announcement, payload } => {
            if let Ok(a) = announcement.decode_unverified() {
                let _ = validator.check_payload(&a, &payload);
            }
            let _ = validator.check_announcement(&announcement);
        }
        Message::Heartbeat(s) => {
            let _ = s.open();
        }
        Message::Receipt(r) => {
            let _ = r.open();
        }
        _ => {}
    }
});
