//! Manifests received from peers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{
    ids::{Hash32, RunId},
    manifest::Manifest,
};

fuzz_target!(|data: &[u8]| {
    // Any run id: the hash check comes after decoding, which must not panic.
    let _ = Manifest::decode_for_run(data, RunId(Hash32::of(data)));
    if let Ok((m, _)) = postcard::take_from_bytes::<Manifest>(data) {
        let _ = m.validate();
        let _ = Manifest::decode_for_run(data, m.run_id());
    }
});
