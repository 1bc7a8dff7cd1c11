//! ReLU as one pass forward and one backward on the CPU.
//!
//! candle's ReLU backward is four tensor operations (zeros, a comparison, a
//! conversion and a product), each a pass with its own allocation; on the
//! 784-1024-1024 MLP's activations that is several passes over half a
//! million values a step. Here backward is one pass: the gradient where the
//! input is at least zero (candle's rule, 1 at 0). Elsewhere candle's
//! `relu` runs.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Error, Layout, Shape, Tensor};

use super::cpu_slice::contiguous_f32;

/// `max(0, x)`.
pub(crate) fn relu(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 { x.contiguous()?.apply_op1(ReluCpu) } else { x.relu() }
}

/// Forward of [`relu`] on the CPU.
struct ReluCpu;

impl CustomOp1 for ReluCpu {
    fn name(&self) -> &'static str {
        "relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "relu", "input")?;
        Ok((CpuStorage::F32(x.iter().map(|v| v.max(0.0)).collect()), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(arg.apply_op2_no_bwd(&grad_res.contiguous()?, &ReluGrad)?))
    }
}

/// The incoming gradient where the input is at least zero, else zero.
struct ReluGrad;

impl CustomOp2 for ReluGrad {
    fn name(&self) -> &'static str {
        "relu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, g) = (contiguous_f32(s1, l1, "relu", "input")?, contiguous_f32(s2, l2, "relu", "gradient")?);
        if x.len() != g.len() {
            return Err(Error::Msg("relu: gradient and input differ in size".into()));
        }
        let dx = x.iter().zip(g).map(|(v, g)| if *v >= 0.0 { *g } else { 0.0 }).collect();
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::model::cpu_slice::max_diff;

    /// Value and gradient agree with candle's ReLU, zeros included, for a
    /// contiguous and a transposed input.
    #[test]
    fn matches_candles_relu() {
        let dev = Device::Cpu;
        let mut v: Vec<f32> = (0..60).map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0).collect();
        v[5] = 0.0;
        let x = Var::from_vec(v, (6, 10), &dev).unwrap();
        for input in [x.as_tensor().clone(), x.as_tensor().t().unwrap()] {
            let (ours, theirs) = (relu(&input).unwrap(), input.relu().unwrap());
            assert_eq!(max_diff(&ours, &theirs), 0.0);
            let probe = Tensor::randn(0f32, 1.0, ours.shape(), &dev).unwrap();
            let ga = (&ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let gb = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            assert_eq!(max_diff(ga.get(x.as_tensor()).unwrap(), gb.get(x.as_tensor()).unwrap()), 0.0);
        }
    }
}
