//! A fully connected layer whose weight gradient comes out in the weight's
//! own layout, on the CPU.
//!
//! candle's `Linear` computes `x @ w.t() + b`. Backward then adds the
//! weight's gradient twice: into the transposed view's zeroed gradient, and
//! through the transpose into the weight's, a strided pass over every weight
//! (4.8 ms per million weights on one core here, eight times a contiguous
//! add; a quarter of the 784-1024-1024 MLP's step). The bias's gradient is
//! a strided sum over the rows. Here the layer is one operation: forward is
//! one matrix product into the bias rows, backward three products (the
//! bias's as a row of ones times the gradient). Same parameters, names and
//! layout as `Linear`; on other devices, dtypes or ranks, and where candle's
//! products go to a BLAS (`mkl`, `accelerate`), `Linear` itself.

use candle_core::{CpuStorage, CustomOp3, DType, Error, Layout, Module, Shape, Tensor};
use candle_nn::{Linear, VarBuilder};

use super::cpu_gemm::{View, biased_product};

/// Whether candle's CPU products go to a BLAS: then backward's products
/// would not run the forward's kernel, so `Linear` runs throughout.
pub(crate) const BLAS: bool = cfg!(any(feature = "mkl", feature = "accelerate"));

/// `x @ w.t() + b` over rows, with `Linear`'s parameters.
#[derive(Clone, Debug)]
pub(crate) struct Dense {
    inner: Linear,
}

/// A layer of `inputs -> outputs` under `vb`, initialised as
/// `candle_nn::linear` does.
pub(crate) fn dense(inputs: usize, outputs: usize, vb: VarBuilder) -> candle_core::Result<Dense> {
    Ok(Dense { inner: candle_nn::linear(inputs, outputs, vb)? })
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let w = self.inner.weight();
        match self.inner.bias() {
            Some(b) if !BLAS && x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() == 2 => {
                x.apply_op3(w, b, DenseCpu)
            }
            _ => self.inner.forward(x),
        }
    }
}

/// Forward of [`Dense`] on the CPU.
struct DenseCpu;

impl CustomOp3 for DenseCpu {
    fn name(&self) -> &'static str {
        "dense"
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
        let x = View::of(xs, xl, "dense", "input")?;
        let w = View::of(ws, wl, "dense", "weight")?;
        let b = View::of(bs, bl, "dense", "bias")?;
        let y = biased_product(x, w.t(), b).map_err(|e| {
            Error::Msg(format!(
                "dense: input [{}, {}], weight [{}, {}], bias [{}, {}]: {e}",
                x.rows(),
                x.cols(),
                w.rows(),
                w.cols(),
                b.rows(),
                b.cols()
            ))
        })?;
        Ok((CpuStorage::F32(y), Shape::from((x.rows(), w.rows()))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // A batch of data needs no gradient: a fifth of the MLP's products.
        let dx = if x.track_op() { Some(grad.matmul(w)?) } else { None };
        let dw = grad.t()?.matmul(x)?;
        let ones = Tensor::ones((1, grad.dim(0)?), grad.dtype(), grad.device())?;
        let db = ones.matmul(grad)?.squeeze(0)?;
        Ok((dx, Some(dw), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};
    use candle_nn::VarMap;

    use super::*;
    use crate::model::cpu_slice::max_diff;

    /// Output and every gradient agree with candle's `Linear` on the same
    /// parameters, for a contiguous input, a transposed one, one row, and a
    /// product large enough for gemm to split it over threads and pack it.
    #[test]
    fn matches_candles_linear_and_its_gradients() {
        let dev = Device::Cpu;
        let cases =
            [(7, 5, 3, false), (64, 33, 17, true), (1, 12, 9, false), (256, 300, 200, true), (256, 300, 200, false)];
        for (rows, inputs, outputs, transposed) in cases {
            let map = VarMap::new();
            let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
            let ours = dense(inputs, outputs, vb.pp("l")).unwrap();
            let theirs = Linear::new(ours.inner.weight().clone(), ours.inner.bias().cloned());
            let x = if transposed {
                Var::from_tensor(&Tensor::randn(0f32, 1.0, (inputs, rows), &dev).unwrap()).unwrap()
            } else {
                Var::from_tensor(&Tensor::randn(0f32, 1.0, (rows, inputs), &dev).unwrap()).unwrap()
            };
            let input = if transposed { x.as_tensor().t().unwrap() } else { x.as_tensor().clone() };
            let probe = Tensor::randn(0f32, 1.0, (rows, outputs), &dev).unwrap();
            let (a, b) = (ours.forward(&input).unwrap(), theirs.forward(&input).unwrap());
            assert!(max_diff(&a, &b) < 1e-4, "outputs differ by {}", max_diff(&a, &b));
            let ga = (&a * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let gb = (&b * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let w = ours.inner.weight();
            let bias = ours.inner.bias().unwrap();
            for (name, t) in [("input", x.as_tensor()), ("weight", w), ("bias", bias)] {
                let (ta, tb) = (ga.get(t).unwrap(), gb.get(t).unwrap());
                assert_eq!(ta.dims(), tb.dims(), "{name}");
                assert!(max_diff(ta, tb) < 1e-3, "{name} gradients differ by {}", max_diff(ta, tb));
            }
        }
    }

    /// An input that needs no gradient gets none; the parameters still do.
    #[test]
    fn a_constant_input_gets_no_gradient() {
        let dev = Device::Cpu;
        let map = VarMap::new();
        let layer = dense(4, 3, VarBuilder::from_varmap(&map, DType::F32, &dev).pp("l")).unwrap();
        let x = Tensor::randn(0f32, 1.0, (5, 4), &dev).unwrap();
        let grads = layer.forward(&x).unwrap().sum_all().unwrap().backward().unwrap();
        assert!(grads.get(&x).is_none());
        assert!(grads.get(layer.inner.weight()).is_some() && grads.get(layer.inner.bias().unwrap()).is_some());
    }

    /// No rows, or rows of no inputs: the bias rows, or nothing.
    #[test]
    fn empty_products_give_the_bias_rows() {
        let dev = Device::Cpu;
        let w = Tensor::zeros((2, 0), DType::F32, &dev).unwrap();
        let b = Tensor::new(&[1.5f32, -2.0], &dev).unwrap();
        let y = Tensor::zeros((3, 0), DType::F32, &dev).unwrap().apply_op3(&w, &b, DenseCpu).unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap(), vec![vec![1.5, -2.0]; 3]);
        let w = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
        let y = Tensor::zeros((0, 4), DType::F32, &dev).unwrap().apply_op3(&w, &b, DenseCpu).unwrap();
        assert_eq!(y.dims(), &[0, 2]);
    }

    /// Mismatched shapes are an error, not a read past the storage.
    #[test]
    fn refuses_mismatched_shapes() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((4, 3), DType::F32, &dev).unwrap();
        let w = Tensor::zeros((2, 5), DType::F32, &dev).unwrap();
        let b = Tensor::zeros(2, DType::F32, &dev).unwrap();
        assert!(x.apply_op3(&w, &b, DenseCpu).is_err());
        let w = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        let b = Tensor::zeros(3, DType::F32, &dev).unwrap();
        assert!(x.apply_op3(&w, &b, DenseCpu).is_err());
    }
}
