//! A replica state served in chunks: any sequence of chunks is reassembled
//! under a limit, and whatever completes is decoded as each part of a state
//! transfer (head, shared part), put together and checked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{
    chunks::Reassembly,
    engine::{
        EngineConfig, Strategy,
        state_transfer::{self, SharedState},
    },
    ids::Hash32,
    wire::Chunk,
};

const LIMIT: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Ok(chunks) = postcard::from_bytes::<Vec<Chunk>>(data) else { return };
    let mut object = Reassembly::new(LIMIT);
    for c in chunks {
        match object.push(c) {
            Ok(Some((bytes, hash))) => {
                assert!(bytes.len() as u64 <= LIMIT);
                assert_eq!(Hash32::of(&bytes), hash);
                let _ = postcard::from_bytes::<SharedState>(&bytes);
                if let Ok(head) = state_transfer::decode_head(&bytes) {
                    // The same bytes as the shared part it names: refused
                    // unless the hash matches, decoded and verified if so.
                    if let Ok(s) = state_transfer::assemble(head, &bytes) {
                        let _ = s.verify(&EngineConfig::preset(Strategy::Gopals), 16);
                    }
                }
                return;
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
});
