//! Replica state sent to joiners: decode, then check it against a model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::engine::{EngineConfig, ReplicaState, Strategy};

fuzz_target!(|data: &[u8]| {
    if data.len() > 1 << 16 {
        return;
    }
    if let Ok(s) = postcard::from_bytes::<ReplicaState>(data) {
        let _ = s.verify(&EngineConfig::preset(Strategy::Gopals), 16);
    }
});
