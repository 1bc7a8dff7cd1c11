//! GELU (tanh approximation) on the CPU as one pass forward and one
//! backward.
//!
//! candle computes it element by element through libm's `tanhf`, and its
//! backward as a dozen tensor operations with two `powf` passes: about a
//! fifth of the char transformer's training step. Here `tanh` comes from
//! one `exp`, and the backward is one pass over the input and the incoming
//! gradient. Same function; on other devices and dtypes candle's own.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Error, Layout, Shape, Tensor};

use super::cpu_slice::contiguous_f32;
use crate::Result;

const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
const CUBIC: f32 = 0.044_715;

/// `gelu(x)` with the tanh approximation, as candle's `Tensor::gelu`.
pub(crate) fn gelu(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 {
        Ok(x.contiguous()?.apply_op1(GeluTanh)?)
    } else {
        Ok(x.gelu()?)
    }
}

/// `tanh` from one `exp` (libm's `tanhf` goes through `expm1f` and is
/// several times slower); saturates to +-1 where `exp` over- or underflows.
fn tanh(z: f32) -> f32 {
    1.0 - 2.0 / ((2.0 * z).exp() + 1.0)
}

struct GeluTanh;

impl CustomOp1 for GeluTanh {
    fn name(&self) -> &'static str {
        "gelu-tanh"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "gelu", "input")?;
        let y = x.iter().map(|&v| 0.5 * v * (1.0 + tanh(SQRT_TWO_OVER_PI * v * (1.0 + CUBIC * v * v)))).collect();
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(arg.apply_op2_no_bwd(&grad_res.contiguous()?, &GeluTanhGrad)?))
    }
}

/// The incoming gradient times `gelu'(x)`.
struct GeluTanhGrad;

impl CustomOp2 for GeluTanhGrad {
    fn name(&self) -> &'static str {
        "gelu-tanh-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, g) = (contiguous_f32(s1, l1, "gelu", "input")?, contiguous_f32(s2, l2, "gelu", "gradient")?);
        if x.len() != g.len() {
            return Err(Error::Msg("gelu: gradient and input differ in size".into()));
        }
        let dx = x
            .iter()
            .zip(g)
            .map(|(&v, &g)| {
                let v2 = v * v;
                let t = tanh(SQRT_TWO_OVER_PI * v * (1.0 + CUBIC * v2));
                g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * SQRT_TWO_OVER_PI * (1.0 + 3.0 * CUBIC * v2))
            })
            .collect();
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    /// Value and gradient agree with candle's `gelu` over the range a
    /// network's pre-activations take, saturated ends included.
    #[test]
    fn matches_candles_gelu_and_its_gradient() {
        let xs: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.025).chain([-60.0, -15.0, 15.0, 60.0]).collect();
        let x = Var::from_vec(xs.clone(), xs.len(), &Device::Cpu).unwrap();
        let probe = Tensor::from_vec(xs.iter().map(|v| 1.0 + 0.1 * v).collect(), xs.len(), &Device::Cpu).unwrap();
        let ours = gelu(&x).unwrap();
        let theirs = x.gelu().unwrap();
        let max_diff = |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>();
        assert!(max_diff(&ours, &theirs).unwrap() < 1e-5);
        let g_ours = (&ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g_theirs = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let diff = max_diff(g_ours.get(x.as_tensor()).unwrap(), g_theirs.get(x.as_tensor()).unwrap()).unwrap();
        assert!(diff < 1e-4, "gradients differ by {diff}");
    }
}
