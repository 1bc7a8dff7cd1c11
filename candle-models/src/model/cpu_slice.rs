//! The f32 data of a contiguous CPU tensor, for the custom operations that
//! compute on the host (GELU, layer norm, softmax).

use candle_core::{CpuStorage, Error, Layout};

/// The elements of `l` in `s`, or an error naming the operation and the
/// argument when they are not contiguous f32.
pub(crate) fn contiguous_f32<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    op: &str,
    what: &str,
) -> candle_core::Result<&'a [f32]> {
    let (start, end) = l.contiguous_offsets().ok_or_else(|| Error::Msg(format!("{op}: non-contiguous {what}")))?;
    match s {
        CpuStorage::F32(v) => v.get(start..end).ok_or_else(|| Error::Msg(format!("{op}: {what} past its storage"))),
        _ => Err(Error::Msg(format!("{op}: {what} is not f32"))),
    }
}

/// The largest absolute difference between two tensors of one shape.
#[cfg(test)]
pub(crate) fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}
