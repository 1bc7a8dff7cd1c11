//! Update payload codecs: how a pseudo-gradient travels.
//!
//! A payload is a flat list of `n` f32 values encoded by one of four codecs.
//! Decoding never allocates per value: [`Payload::for_each_chunk`] hands out
//! decoded values in small stack chunks, so the outer step can fuse decode,
//! weighting and application into one pass over the parameters.
//! [`ErrorFeedback`] keeps what compression lost and adds it to the next
//! delta, so lossy codecs lose nothing over time.

use serde::{Deserialize, Serialize};

/// Values decoded per chunk (a stack buffer).
const CHUNK: usize = 2048;

/// Which codec a payload uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CodecKind {
    /// 4 bytes a value, lossless.
    F32,
    /// IEEE half precision, 2 bytes a value; relative error <= 2^-11 in range.
    F16,
    /// One f32 scale per block of `block` values, then one i8 a value:
    /// absolute error <= max|block| / 254.
    Int8 {
        /// Values per block.
        block: u32,
    },
    /// Only the k = n * per_mille / 1000 largest-magnitude values (index + value).
    TopK {
        /// Kept values per thousand.
        per_mille: u32,
    },
}

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Its length does not match the codec and value count.
    #[error("payload is {got} bytes; {codec:?} with {n} values needs {expected}")]
    Length {
        /// The codec.
        codec: CodecKind,
        /// Values expected.
        n: usize,
        /// Bytes received.
        got: usize,
        /// What was expected, in words.
        expected: String,
    },
    /// A top-k index is out of range or not strictly increasing.
    #[error("top-k index {index} at position {position} is out of order or range")]
    BadIndex {
        /// Position in the index list.
        position: usize,
        /// The index found.
        index: u32,
    },
    /// The codec parameters are unusable.
    #[error("bad codec parameters: {0}")]
    Params(#[from] CodecParamsError),
}

/// Why codec parameters are unusable: a manifest or peer can name any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodecParamsError {
    /// An int8 block size of zero or over 2^20 values.
    #[error("int8 block {0}")]
    Int8Block(u32),
    /// A top-k share of zero or over a thousand per mille.
    #[error("top-k per_mille {0}")]
    TopKPerMille(u32),
}

impl CodecKind {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), CodecParamsError> {
        match *self {
            CodecKind::Int8 { block } if block == 0 || block > 1 << 20 => Err(CodecParamsError::Int8Block(block)),
            CodecKind::TopK { per_mille } if per_mille == 0 || per_mille > 1000 => {
                Err(CodecParamsError::TopKPerMille(per_mille))
            }
            _ => Ok(()),
        }
    }

    /// The largest payload this codec makes for `n` values.
    pub fn max_encoded_len(&self, n: usize) -> usize {
        match *self {
            CodecKind::F32 => n * 4,
            CodecKind::F16 => n * 2,
            CodecKind::Int8 { block } => n + n.div_ceil(block.max(1) as usize) * 4,
            CodecKind::TopK { .. } => 4 + self.top_k(n) * 8,
        }
    }

    fn top_k(&self, n: usize) -> usize {
        match *self {
            CodecKind::TopK { per_mille } => (n * per_mille as usize / 1000).clamp(n.min(1), n),
            _ => n,
        }
    }

    /// The codec a name (as [`CodecKind::name`] writes it, or `int8` for
    /// blocks of 256) stands for, if valid.
    pub fn parse_name(s: &str) -> Option<CodecKind> {
        let kind = match s {
            "f32" => CodecKind::F32,
            "f16" => CodecKind::F16,
            "int8" => CodecKind::Int8 { block: 256 },
            _ => match (s.strip_prefix("int8/"), s.strip_prefix("top").and_then(|r| r.strip_suffix("permille"))) {
                (Some(block), _) => CodecKind::Int8 { block: block.parse().ok()? },
                (_, Some(per_mille)) => CodecKind::TopK { per_mille: per_mille.parse().ok()? },
                _ => return None,
            },
        };
        kind.validate().ok().map(|()| kind)
    }

    /// A short name for reports.
    pub fn name(&self) -> String {
        match *self {
            CodecKind::F32 => "f32".into(),
            CodecKind::F16 => "f16".into(),
            CodecKind::Int8 { block } => format!("int8/{block}"),
            CodecKind::TopK { per_mille } => format!("top{per_mille}permille"),
        }
    }
}

/// Encodes `values` with `kind`, appending to `out`.
pub fn encode(kind: CodecKind, values: &[f32], out: &mut Vec<u8>) {
    out.reserve(kind.max_encoded_len(values.len()));
    match kind {
        CodecKind::F32 => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        CodecKind::F16 => {
            for v in values {
                let clamped = v.clamp(-65504.0, 65504.0);
                out.extend_from_slice(&half::f16::from_f32(clamped).to_le_bytes());
            }
        }
        CodecKind::Int8 { block } => {
            for chunk in values.chunks(block as usize) {
                let max_abs = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = max_abs / 127.0;
                out.extend_from_slice(&scale.to_le_bytes());
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                out.extend(chunk.iter().map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8));
            }
        }
        CodecKind::TopK { .. } => {
            let k = kind.top_k(values.len());
            let mut idx: Vec<u32> = (0..values.len() as u32).collect();
            if k < values.len() && k > 0 {
                idx.select_nth_unstable_by(k - 1, |a, b| {
                    values[*b as usize].abs().total_cmp(&values[*a as usize].abs()).then(a.cmp(b))
                });
            }
            idx.truncate(k);
            idx.sort_unstable();
            out.extend_from_slice(&(k as u32).to_le_bytes());
            for i in &idx {
                out.extend_from_slice(&i.to_le_bytes());
            }
            for i in &idx {
                out.extend_from_slice(&values[*i as usize].to_le_bytes());
            }
        }
    }
}

/// A payload whose structure has been checked against its codec and value
/// count; its values can then be read without further checks.
#[derive(Clone, Copy, Debug)]
pub struct Payload<'a> {
    kind: CodecKind,
    n: usize,
    bytes: &'a [u8],
}

impl<'a> Payload<'a> {
    /// Checks that `bytes` is a well-formed `kind` payload of `n` values.
    pub fn parse(kind: CodecKind, n: usize, bytes: &'a [u8]) -> Result<Self, CodecError> {
        kind.validate()?;
        let length_error = |expected: String| CodecError::Length { codec: kind, n, got: bytes.len(), expected };
        match kind {
            CodecKind::F32 | CodecKind::F16 | CodecKind::Int8 { .. } => {
                let want = kind.max_encoded_len(n);
                if bytes.len() != want {
                    return Err(length_error(format!("{want} bytes")));
                }
            }
            CodecKind::TopK { .. } => {
                if bytes.len() < 4 {
                    return Err(length_error("at least 4 bytes".into()));
                }
                let k = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
                if k > n || bytes.len() != 4 + 8 * k {
                    return Err(length_error(format!("4 + 8k bytes with k <= {n}")));
                }
                let mut prev: Option<u32> = None;
                for (position, c) in bytes[4..4 + 4 * k].chunks_exact(4).enumerate() {
                    let index = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                    if index as usize >= n || prev.is_some_and(|p| index <= p) {
                        return Err(CodecError::BadIndex { position, index });
                    }
                    prev = Some(index);
                }
            }
        }
        Ok(Self { kind, n, bytes })
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The codec.
    pub fn kind(&self) -> CodecKind {
        self.kind
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// True when every value is implicitly present (not sparse).
    pub fn is_dense(&self) -> bool {
        !matches!(self.kind, CodecKind::TopK { .. })
    }

    /// Calls `f(start, values)` for runs of decoded values; indices not
    /// covered (sparse codecs) are zero.
    pub fn for_each_chunk(&self, mut f: impl FnMut(usize, &[f32])) {
        let mut buf = [0f32; CHUNK];
        match self.kind {
            CodecKind::F32 => {
                for (c, bytes) in self.bytes.chunks(CHUNK * 4).enumerate() {
                    let m = bytes.len() / 4;
                    for (d, s) in buf[..m].iter_mut().zip(bytes.chunks_exact(4)) {
                        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    }
                    f(c * CHUNK, &buf[..m]);
                }
            }
            CodecKind::F16 => {
                for (c, bytes) in self.bytes.chunks(CHUNK * 2).enumerate() {
                    let m = bytes.len() / 2;
                    for (d, s) in buf[..m].iter_mut().zip(bytes.chunks_exact(2)) {
                        *d = half::f16::from_le_bytes([s[0], s[1]]).to_f32();
                    }
                    f(c * CHUNK, &buf[..m]);
                }
            }
            CodecKind::Int8 { block } => {
                let block = block as usize;
                let mut start = 0;
                let mut rest = self.bytes;
                while start < self.n {
                    let m = block.min(self.n - start);
                    let scale = f32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                    let q = &rest[4..4 + m];
                    let mut done = 0;
                    while done < m {
                        let len = (m - done).min(CHUNK);
                        for (d, s) in buf[..len].iter_mut().zip(&q[done..done + len]) {
                            *d = (*s as i8) as f32 * scale;
                        }
                        f(start + done, &buf[..len]);
                        done += len;
                    }
                    rest = &rest[4 + m..];
                    start += m;
                }
            }
            CodecKind::TopK { .. } => {
                let k = (self.bytes.len() - 4) / 8;
                let (idx, vals) = self.bytes[4..].split_at(4 * k);
                for (i, v) in idx.chunks_exact(4).zip(vals.chunks_exact(4)) {
                    let i = u32::from_le_bytes([i[0], i[1], i[2], i[3]]) as usize;
                    f(i, &[f32::from_le_bytes([v[0], v[1], v[2], v[3]])]);
                }
            }
        }
    }

    /// Decodes into `out` (which must hold exactly `len()` values).
    pub fn decode_into(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.n, "decode_into: wrong output length");
        if !self.is_dense() {
            out.fill(0.0);
        }
        self.for_each_chunk(|start, vals| out[start..start + vals.len()].copy_from_slice(vals));
    }

    /// Decodes into a new vector.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.n];
        self.decode_into(&mut out);
        out
    }

    /// Whether every value is finite, and the squared L2 norm, in one pass.
    pub fn finite_and_norm_sq(&self) -> (bool, f64) {
        let mut finite = true;
        let mut norm = 0.0f64;
        self.for_each_chunk(|_, vals| {
            let mut s = 0.0f32;
            for v in vals {
                finite &= v.is_finite();
                s += v * v;
            }
            norm += s as f64;
        });
        (finite && norm.is_finite(), norm)
    }
}

/// Error feedback: the residual of lossy compression is carried into the
/// next delta (`q = Q(delta + e)`, `e = delta + e - Q^-1(q)`).
#[derive(Clone, Debug, Default)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    /// An empty residual (zero).
    pub fn new() -> Self {
        Self::default()
    }

    /// From a saved residual.
    pub fn from_residual(residual: Vec<f32>) -> Self {
        Self { residual }
    }

    /// The current residual.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Compresses `delta` with the residual added, updates the residual and
    /// returns the payload bytes.
    pub fn compress(&mut self, kind: CodecKind, delta: &[f32]) -> Vec<u8> {
        if self.residual.len() != delta.len() {
            self.residual = vec![0.0; delta.len()];
        }
        for (e, d) in self.residual.iter_mut().zip(delta) {
            *e += d;
        }
        let mut out = Vec::new();
        encode(kind, &self.residual, &mut out);
        let payload = Payload::parse(kind, delta.len(), &out).expect("our own encoding parses");
        let residual = &mut self.residual;
        payload.for_each_chunk(|start, vals| {
            for (e, v) in residual[start..start + vals.len()].iter_mut().zip(vals) {
                *e -= v;
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn codec_names_round_trip_and_bad_ones_are_refused() {
        for k in [CodecKind::F32, CodecKind::F16, CodecKind::Int8 { block: 64 }, CodecKind::TopK { per_mille: 30 }] {
            assert_eq!(CodecKind::parse_name(&k.name()), Some(k));
        }
        assert_eq!(CodecKind::parse_name("int8"), Some(CodecKind::Int8 { block: 256 }));
        for bad in ["int8/0", "top0permille", "top2000permille", "int4", "int8/x", ""] {
            assert_eq!(CodecKind::parse_name(bad), None, "{bad}");
        }
    }

    use proptest::prelude::*;

    use super::*;
    use crate::rng::SeededRng;

    fn sample(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SeededRng::new(seed);
        (0..n).map(|_| r.normal() as f32 * 0.01).collect()
    }

    fn round_trip(kind: CodecKind, v: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        encode(kind, v, &mut out);
        assert!(out.len() <= kind.max_encoded_len(v.len()));
        Payload::parse(kind, v.len(), &out).unwrap().to_vec()
    }

    #[test]
    fn f32_is_exact() {
        let v = sample(5000, 1);
        assert_eq!(round_trip(CodecKind::F32, &v), v);
    }

    #[test]
    fn f16_relative_error_bound() {
        let v = sample(5000, 2);
        for (a, b) in v.iter().zip(round_trip(CodecKind::F16, &v)) {
            // Normal range of f16: relative error <= 2^-11; subnormals: absolute <= 2^-25.
            assert!((a - b).abs() <= a.abs() * 2f32.powi(-11) + 2f32.powi(-24), "{a} vs {b}");
        }
    }

    #[test]
    fn int8_absolute_error_bound_per_block() {
        let v = sample(5001, 3);
        let block = 256;
        let d = round_trip(CodecKind::Int8 { block }, &v);
        for (chunk, dchunk) in v.chunks(block as usize).zip(d.chunks(block as usize)) {
            let max_abs = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for (a, b) in chunk.iter().zip(dchunk) {
                assert!((a - b).abs() <= max_abs / 254.0 * 1.0001 + 1e-12, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn top_k_keeps_the_largest_exactly() {
        let v = sample(1000, 4);
        let d = round_trip(CodecKind::TopK { per_mille: 100 }, &v);
        let kept: Vec<usize> = (0..v.len()).filter(|i| d[*i] != 0.0).collect();
        assert_eq!(kept.len(), 100);
        let min_kept = kept.iter().map(|i| v[*i].abs()).fold(f32::MAX, f32::min);
        for i in 0..v.len() {
            if d[i] == 0.0 {
                assert!(v[i].abs() <= min_kept);
            } else {
                assert_eq!(d[i], v[i]);
            }
        }
    }

    #[test]
    fn error_feedback_conserves_the_sum() {
        // Over many rounds, the sum of what was sent equals the sum of the
        // deltas minus the final residual: nothing is lost.
        let kind = CodecKind::TopK { per_mille: 50 };
        let mut ef = ErrorFeedback::new();
        let n = 400;
        let mut sent = vec![0.0f64; n];
        let mut total = vec![0.0f64; n];
        for round in 0..20 {
            let delta = sample(n, 100 + round);
            for (t, d) in total.iter_mut().zip(&delta) {
                *t += *d as f64;
            }
            let bytes = ef.compress(kind, &delta);
            let p = Payload::parse(kind, n, &bytes).unwrap();
            p.for_each_chunk(|s, vals| {
                for (i, v) in vals.iter().enumerate() {
                    sent[s + i] += *v as f64;
                }
            });
        }
        for i in 0..n {
            let diff = total[i] - sent[i] - ef.residual()[i] as f64;
            assert!(diff.abs() < 1e-5, "index {i}: {diff}");
        }
    }

    #[test]
    fn malformed_payloads_are_rejected() {
        assert!(Payload::parse(CodecKind::F32, 3, &[0; 11]).is_err());
        assert!(Payload::parse(CodecKind::Int8 { block: 4 }, 5, &[0; 12]).is_err());
        // Top-k with an out-of-order index.
        let mut b = 2u32.to_le_bytes().to_vec();
        b.extend(5u32.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend([0u8; 8]);
        assert!(matches!(Payload::parse(CodecKind::TopK { per_mille: 500 }, 10, &b), Err(CodecError::BadIndex { .. })));
        // Top-k index out of range.
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend(10u32.to_le_bytes());
        b.extend([0u8; 4]);
        assert!(Payload::parse(CodecKind::TopK { per_mille: 500 }, 10, &b).is_err());
    }

    #[test]
    fn non_finite_values_are_detected() {
        let mut v = sample(10, 5);
        v[3] = f32::NAN;
        let mut out = Vec::new();
        encode(CodecKind::F32, &v, &mut out);
        let (finite, _) = Payload::parse(CodecKind::F32, 10, &out).unwrap().finite_and_norm_sq();
        assert!(!finite);
    }

    fn any_kind() -> impl Strategy<Value = CodecKind> {
        prop_oneof![
            Just(CodecKind::F32),
            Just(CodecKind::F16),
            (1u32..64).prop_map(|block| CodecKind::Int8 { block }),
            (1u32..=1000).prop_map(|per_mille| CodecKind::TopK { per_mille }),
        ]
    }

    proptest! {
        #[test]
        fn parse_never_panics_on_garbage(kind in any_kind(), n in 0usize..64, bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(p) = Payload::parse(kind, n, &bytes) {
                let _ = p.finite_and_norm_sq();
                prop_assert_eq!(p.to_vec().len(), n);
            }
        }

        #[test]
        fn encode_then_parse_always_succeeds(kind in any_kind(), v in proptest::collection::vec(-1e3f32..1e3, 0..300)) {
            let mut out = Vec::new();
            encode(kind, &v, &mut out);
            let p = Payload::parse(kind, v.len(), &out).unwrap();
            prop_assert_eq!(p.to_vec().len(), v.len());
        }
    }
}
