//! Update payloads of every codec: parse, then read every value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::codec::{CodecKind, Payload};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let kind = match data[0] % 4 {
        0 => CodecKind::F32,
        1 => CodecKind::F16,
        2 => CodecKind::Int8 { block: 1 + data[1] as u32 },
        _ => CodecKind::TopK { per_mille: 1 + (data[1] as u32 * 4) % 1000 },
    };
    let n = data[2] as usize * 4;
    if let Ok(p) = Payload::parse(kind, n, &data[3..]) {
        let _ = p.finite_and_norm_sq();
        assert_eq!(p.to_vec().len(), n);
    }
});
