//! Layer norm over the last dimension, as one pass forward and one backward
//! on the CPU.
//!
//! candle-nn's `LayerNorm` module is a fused kernel applied without a
//! backward pass (backprop stops there, and with it only the transformer's
//! head ever trained), so the layer was written from differentiable tensor
//! ops: seven operations forward, and in backward their gradients, among
//! them strided sums over the rows for the weight and the bias. Here the
//! CPU computes it row by row; elsewhere the tensor ops run.

use candle_core::{CpuStorage, CustomOp3, D, DType, Error, Layout, Shape, Tensor};
use candle_nn::VarBuilder;

use super::cpu_slice::contiguous_f32;

const EPS: f32 = 1e-5;

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last dimension.
#[derive(Debug)]
pub(crate) struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm {
    /// Weight 1 and bias 0, under `weight` and `bias`.
    pub(crate) fn new(n: usize, vb: VarBuilder) -> candle_core::Result<Self> {
        let weight = vb.get_with_hints(n, "weight", candle_nn::Init::Const(1.0))?;
        let bias = vb.get_with_hints(n, "bias", candle_nn::Init::Const(0.0))?;
        Ok(Self { weight, bias })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() == 2 {
            x.contiguous()?.apply_op3(&self.weight, &self.bias, LayerNormCpu)
        } else {
            self.with_tensor_ops(x)
        }
    }

    /// The same function from differentiable tensor ops, for any device.
    fn with_tensor_ops(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let n = x.dim(D::Minus1)? as f64;
        let centred = x.broadcast_sub(&(x.sum_keepdim(D::Minus1)? / n)?)?;
        let variance = (centred.sqr()?.sum_keepdim(D::Minus1)? / n)?;
        centred
            .broadcast_div(&(variance + f64::from(EPS))?.sqrt()?)?
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

/// A row's normalised values into `out`; returns `1 / sqrt(var + eps)`.
fn normalise(row: &[f32], out: &mut [f32]) -> f32 {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let rstd = 1.0 / (var + EPS).sqrt();
    for (o, v) in out.iter_mut().zip(row) {
        *o = (v - mean) * rstd;
    }
    rstd
}

/// Rows of `x` checked against the weight's width.
fn rows<'a>(x: &'a [f32], l: &Layout, width: usize) -> candle_core::Result<std::slice::ChunksExact<'a, f32>> {
    if width == 0 || l.dims().last() != Some(&width) || !x.len().is_multiple_of(width) {
        return Err(Error::Msg(format!("layer norm: input {:?} against width {width}", l.dims())));
    }
    Ok(x.chunks_exact(width))
}

/// Forward of [`LayerNorm`] on the CPU.
struct LayerNormCpu;

impl CustomOp3 for LayerNormCpu {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, b) = (
            contiguous_f32(xs, xl, "layer norm", "input")?,
            contiguous_f32(ws, wl, "layer norm", "weight")?,
            contiguous_f32(bs, bl, "layer norm", "bias")?,
        );
        if w.len() != b.len() {
            return Err(Error::Msg("layer norm: weight and bias differ in size".into()));
        }
        let mut y = vec![0.0f32; x.len()];
        for (row, out) in rows(x, xl, w.len())?.zip(y.chunks_exact_mut(w.len())) {
            normalise(row, out);
            for ((o, wi), bi) in out.iter_mut().zip(w).zip(b) {
                *o = *o * wi + bi;
            }
        }
        Ok((CpuStorage::F32(y), xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let rows = x.dim(0)?;
        let all = x.apply_op3_no_bwd(w, &grad.contiguous()?, &LayerNormGrad)?;
        let dx = all.narrow(0, 0, rows)?;
        let dw = all.get(rows)?;
        let db = all.get(rows + 1)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// The gradients of [`LayerNormCpu`] as one tensor `[rows + 2, width]`:
/// the input's rows, then the weight's and the bias's.
struct LayerNormGrad;

impl CustomOp3 for LayerNormGrad {
    fn name(&self) -> &'static str {
        "layer-norm-grad"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, g) = (
            contiguous_f32(xs, xl, "layer norm", "input")?,
            contiguous_f32(ws, wl, "layer norm", "weight")?,
            contiguous_f32(gs, gl, "layer norm", "gradient")?,
        );
        let width = w.len();
        if g.len() != x.len() {
            return Err(Error::Msg("layer norm: gradient and input differ in size".into()));
        }
        let n_rows = x.len() / width.max(1);
        let mut out = vec![0.0f32; x.len() + 2 * width];
        let (dx, dwb) = out.split_at_mut(x.len());
        let (dw, db) = dwb.split_at_mut(width);
        let mut xhat = vec![0.0f32; width];
        let mut dxhat = vec![0.0f32; width];
        for ((row, gr), dxr) in rows(x, xl, width)?.zip(g.chunks_exact(width)).zip(dx.chunks_exact_mut(width)) {
            let rstd = normalise(row, &mut xhat);
            for ((((dbj, dwj), dh), (gj, xh)), wj) in
                db.iter_mut().zip(dw.iter_mut()).zip(dxhat.iter_mut()).zip(gr.iter().zip(&xhat)).zip(w)
            {
                *dbj += gj;
                *dwj += gj * xh;
                *dh = gj * wj;
            }
            let mean_d = dxhat.iter().sum::<f32>() / width as f32;
            let mean_dx = dxhat.iter().zip(&xhat).map(|(d, x)| d * x).sum::<f32>() / width as f32;
            for ((d, dh), xh) in dxr.iter_mut().zip(&dxhat).zip(&xhat) {
                *d = rstd * (dh - mean_d - xh * mean_dx);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((n_rows + 2, width))))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};
    use candle_nn::VarMap;

    use super::*;
    use crate::model::cpu_slice::max_diff;

    /// Output and the gradients of input, weight and bias agree with the
    /// same layer from tensor ops, with weights away from 1 and rows of
    /// different scales (one constant row).
    #[test]
    fn matches_the_tensor_op_layer_and_its_gradients() {
        let dev = Device::Cpu;
        let (rows, width) = (9, 16);
        let map = VarMap::new();
        let ln = LayerNorm::new(width, VarBuilder::from_varmap(&map, DType::F32, &dev)).unwrap();
        for (name, var) in map.data().lock().unwrap().iter() {
            let shift = if name.ends_with("weight") { 1.0 } else { 0.0 };
            var.set(&(Tensor::randn(0f32, 0.5, width, &dev).unwrap() + shift).unwrap()).unwrap();
        }
        let scales = Tensor::from_vec((0..rows).map(|r| 0.1 + r as f32).collect(), (rows, 1), &dev).unwrap();
        let mut x0 = Tensor::randn(0f32, 1.0, (rows, width), &dev).unwrap().broadcast_mul(&scales).unwrap();
        x0 = x0.slice_assign(&[0..1, 0..width], &Tensor::full(3.0f32, (1, width), &dev).unwrap()).unwrap();
        let x = Var::from_tensor(&x0).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (rows, width), &dev).unwrap();
        let (a, b) = (ln.forward(x.as_tensor()).unwrap(), ln.with_tensor_ops(x.as_tensor()).unwrap());
        assert!(max_diff(&a, &b) < 1e-4, "outputs differ by {}", max_diff(&a, &b));
        let ga = (&a * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (&b * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, t) in [("input", x.as_tensor()), ("weight", &ln.weight), ("bias", &ln.bias)] {
            let (ta, tb) = (ga.get(t).unwrap(), gb.get(t).unwrap());
            assert_eq!(ta.dims(), tb.dims(), "{name}");
            assert!(max_diff(ta, tb) < 1e-3, "{name} gradients differ by {}", max_diff(ta, tb));
        }
    }

    /// An input whose width is not the layer's is an error.
    #[test]
    fn refuses_a_width_that_is_not_the_layers() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((4, 3), DType::F32, &dev).unwrap();
        let w = Tensor::ones(5, DType::F32, &dev).unwrap();
        let b = Tensor::zeros(5, DType::F32, &dev).unwrap();
        assert!(x.apply_op3(&w, &b, LayerNormCpu).is_err());
    }
}
