//! Any bytes fetched as an aggregate body: decode within the limit, and
//! whatever decodes re-encodes within it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ragtag_protocol::{aggregate::Aggregate, codec::CodecKind};

fuzz_target!(|data: &[u8]| {
    for codec in [CodecKind::F32, CodecKind::Int8 { block: 16 }, CodecKind::TopK { per_mille: 100 }] {
        if let Ok(a) = Aggregate::decode(data, codec, 64) {
            assert!(a.encode().len() <= Aggregate::max_len(codec, 64));
        }
    }
});
