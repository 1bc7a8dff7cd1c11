//! Any bytes from the network: decode, then open every signed part; a
//! bulk message read by its head (as the stream codec reads it) decodes to
//! exactly what the whole decode gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{
    ids::{Hash32, RunId},
    validate::UpdateValidator,
    wire::{MAX_SPLIT_HEAD, Message, parse_split_head},
};

/// The stream codec's way: the head from the first bytes, then the rest.
fn read_split(data: &[u8]) -> Option<Message> {
    match parse_split_head(&data[..data.len().min(MAX_SPLIT_HEAD)]).ok()? {
        None => Message::decode(data).ok(),
        Some(h) if data.len() != h.head_len() + h.tail_len() => None,
        Some(h) => h.into_message(data[h.head_len()..].to_vec()).ok(),
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = Message::decode(data);
    // Compared by encoding: a NaN in a digest's sketch is not equal to itself.
    assert_eq!(read_split(data).map(|m| m.encode()), whole.as_ref().ok().map(Message::encode));
    let Ok(msg) = whole else { return };
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
