//! Softmax over the last dimension, as one pass forward and one backward on
//! the CPU.
//!
//! candle-nn's `softmax` is five tensor operations (max, subtract, exp, sum,
//! divide), each with its own allocation and a backward of its own; its
//! fused `softmax_last_dim` has no backward pass. Here the CPU computes a
//! row at a time, and backward is `y * (g - sum(g * y))` per row;
//! elsewhere candle-nn's `softmax` runs.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, D, DType, Error, Layout, Shape, Tensor};

use super::cpu_slice::contiguous_f32;

/// Softmax of `x` over its last dimension.
pub(crate) fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() > 0 {
        x.contiguous()?.apply_op1(SoftmaxCpu)
    } else {
        candle_nn::ops::softmax(x, D::Minus1)
    }
}

/// The last dimension's size, checked to divide the data.
fn row_len(l: &Layout, len: usize) -> candle_core::Result<usize> {
    match l.dims().last() {
        Some(&n) if n > 0 && len.is_multiple_of(n) => Ok(n),
        _ => Err(Error::Msg(format!("softmax: shape {:?}", l.dims()))),
    }
}

/// Forward of [`softmax_last_dim`] on the CPU.
struct SoftmaxCpu;

impl CustomOp1 for SoftmaxCpu {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "softmax", "input")?;
        let n = row_len(l, x.len())?;
        let mut y = vec![0.0f32; x.len()];
        for (row, out) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for (o, v) in out.iter_mut().zip(row) {
                *o = (v - max).exp();
                sum += *o;
            }
            let inv = 1.0 / sum;
            out.iter_mut().for_each(|o| *o *= inv);
        }
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(res.apply_op2_no_bwd(&grad_res.contiguous()?, &SoftmaxGrad)?))
    }
}

/// `y * (g - sum(g * y))` per row, from the softmax `y` and the incoming
/// gradient `g`.
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "softmax-last-dim-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (y, g) = (contiguous_f32(s1, l1, "softmax", "output")?, contiguous_f32(s2, l2, "softmax", "gradient")?);
        if y.len() != g.len() {
            return Err(Error::Msg("softmax: gradient and output differ in size".into()));
        }
        let n = row_len(l1, y.len())?;
        let mut dx = vec![0.0f32; y.len()];
        for ((yr, gr), dr) in y.chunks_exact(n).zip(g.chunks_exact(n)).zip(dx.chunks_exact_mut(n)) {
            let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
            for ((d, a), b) in dr.iter_mut().zip(yr).zip(gr) {
                *d = a * (b - dot);
            }
        }
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::model::cpu_slice::max_diff;

    /// Value and gradient agree with candle-nn's `softmax` on attention
    /// scores of rank 4, masked entries (-inf) included.
    #[test]
    fn matches_candles_softmax_and_its_gradient() {
        let dev = Device::Cpu;
        let shape = (2, 3, 5, 5);
        let scores = (Tensor::randn(0f32, 3.0, shape, &dev).unwrap()).contiguous().unwrap();
        let mask: Vec<f32> =
            (0..5).flat_map(|i| (0..5).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (5, 5), &dev).unwrap();
        let x = Var::from_tensor(&scores).unwrap();
        let masked = x.as_tensor().broadcast_add(&mask).unwrap();
        let probe = Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
        let (a, b) = (softmax_last_dim(&masked).unwrap(), candle_nn::ops::softmax(&masked, D::Minus1).unwrap());
        assert!(max_diff(&a, &b) < 1e-6, "outputs differ by {}", max_diff(&a, &b));
        let ga = (&a * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (&b * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let (ta, tb) = (ga.get(x.as_tensor()).unwrap(), gb.get(x.as_tensor()).unwrap());
        assert!(max_diff(ta, tb) < 1e-5, "gradients differ by {}", max_diff(ta, tb));
    }
}
