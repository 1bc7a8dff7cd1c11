//! A 3x3 convolution (stride 1, padding 1) on channels-last images, as one
//! operation on the CPU.
//!
//! candle's CPU convolution computes its backward pass with a direct
//! transposed convolution (a dot product per output element): on the
//! digits CNN that was over half of a training step. Here each position's
//! 3x3 neighbourhood is gathered into a row (im2col) and the convolution is
//! one matrix product into rows holding the bias; backward gathers again
//! and runs two products (the weight's gradient, and the input's, which is
//! scattered back to the positions it came from). Done with candle's
//! tensor operations (a gather by `index_select`, a product, a bias add)
//! the step of the digits CNN was about 35 small operations, each with its
//! own allocation and its own backward, and their overhead, not the
//! arithmetic, set its time. The weights keep candle's `[out, in, 3, 3]`
//! layout and names, so a checkpoint is the same whichever way the
//! convolution is computed. On other devices and dtypes, for a layer
//! without a bias and where candle's products go to a BLAS, the tensor
//! operations run.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, DType, Error, Layout, Shape, Tensor};
use candle_nn::Conv2d;

use super::{
    cpu_gemm::{View, biased_product, product},
    cpu_slice::contiguous_f32,
    dense::BLAS,
};
use crate::Result;

/// Marks a neighbour outside the image (zero padding).
const OUTSIDE: u32 = u32::MAX;

/// A 3x3 convolution over `side x side` channels-last images.
#[derive(Debug)]
pub(crate) struct Conv3x3 {
    conv: Conv2d,
    side: usize,
    /// For position `p` and kernel tap `k = 3 * (dy + 1) + (dx + 1)`, entry
    /// `9 * p + k` is the neighbour's position, or [`OUTSIDE`].
    neighbours: Arc<[u32]>,
}

impl Conv3x3 {
    pub(crate) fn new(conv: Conv2d, side: usize) -> Self {
        let mut neighbours = Vec::with_capacity(side * side * 9);
        for y in 0..side as isize {
            for x in 0..side as isize {
                for dy in -1..=1isize {
                    for dx in -1..=1isize {
                        let (sy, sx) = (y + dy, x + dx);
                        let inside = (0..side as isize).contains(&sy) && (0..side as isize).contains(&sx);
                        neighbours.push(if inside { (sy as usize * side + sx as usize) as u32 } else { OUTSIDE });
                    }
                }
            }
        }
        Self { conv, side, neighbours: neighbours.into() }
    }

    /// `x` is `[batch, side * side, channels]`; so is the output, with the
    /// layer's output channels.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.conv.weight();
        match self.conv.bias() {
            Some(b) if !BLAS && x.device().is_cpu() && x.dtype() == DType::F32 => {
                let op = Conv3x3Cpu { neighbours: self.neighbours.clone(), input_grad: x.track_op() };
                Ok(x.contiguous()?.apply_op3(&w.contiguous()?, b, op)?)
            }
            _ => self.forward_tensor_ops(x),
        }
    }

    /// The same convolution as candle tensor operations: a gather of each
    /// neighbourhood by index (`index_select`, backward `index_add`) and a
    /// matrix product.
    fn forward_tensor_ops(&self, x: &Tensor) -> Result<Tensor> {
        let (batch, positions, channels) = x.dims3()?;
        let outside = (self.side * self.side) as u32;
        let index: Vec<u32> = self.neighbours.iter().map(|&q| if q == OUTSIDE { outside } else { q }).collect();
        let index = Tensor::from_vec(index, positions * 9, x.device())?;
        let padded = x.pad_with_zeros(1, 0, 1)?;
        let cols = padded.index_select(&index, 1)?.reshape((batch * positions, 9 * channels))?;
        let w = self.conv.weight();
        let out_channels = w.dim(0)?;
        let w = w.permute((0, 2, 3, 1))?.reshape((out_channels, 9 * channels))?;
        let mut y = cols.matmul(&w.t()?)?;
        if let Some(b) = self.conv.bias() {
            y = y.broadcast_add(b)?;
        }
        Ok(y.reshape((batch, positions, out_channels))?)
    }
}

/// The shapes of one convolution: rows are `batch * positions`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    positions: usize,
    inputs: usize,
    outputs: usize,
}

impl Dims {
    fn of(neighbours: &[u32], x: &Layout, w: &Layout) -> candle_core::Result<Self> {
        let (&[batch, positions, inputs], &[outputs, w_in, 3, 3]) = (x.dims(), w.dims()) else {
            return Err(Error::Msg(format!("conv3x3: input {:?}, weight {:?}", x.dims(), w.dims())));
        };
        let sizes = [batch, positions, inputs, 9, outputs];
        let fits = sizes.iter().try_fold(1usize, |n, s| n.checked_mul(*s)).is_some();
        if w_in != inputs || inputs == 0 || outputs == 0 || !fits || positions * 9 != neighbours.len() {
            return Err(Error::Msg(format!(
                "conv3x3: input {:?} for weight {:?} and {} positions",
                x.dims(),
                w.dims(),
                neighbours.len() / 9
            )));
        }
        Ok(Self { batch, positions, inputs, outputs })
    }

    fn rows(&self) -> usize {
        self.batch * self.positions
    }

    /// Columns of the gathered rows: `inputs * 9`, the weight's row.
    fn taps(&self) -> usize {
        self.inputs * 9
    }
}

/// Each position's neighbourhood as a row, `[c * 9 + k]` as the weight's
/// `[in, 3, 3]` lies, zero outside the image.
fn gather(x: &[f32], neighbours: &[u32], d: Dims) -> Vec<f32> {
    let mut cols = vec![0.0f32; d.rows() * d.taps()];
    for (r, row) in cols.chunks_exact_mut(d.taps()).enumerate() {
        let (image, p) = (r / d.positions, r % d.positions);
        for (k, &q) in neighbours[9 * p..9 * p + 9].iter().enumerate() {
            if q != OUTSIDE {
                let at = (image * d.positions + q as usize) * d.inputs;
                for (c, v) in x[at..at + d.inputs].iter().enumerate() {
                    row[c * 9 + k] = *v;
                }
            }
        }
    }
    cols
}

/// Adds each gathered row's entries into `x` (zeroed, the input's size) at
/// the positions they came from: [`gather`] backwards.
fn scatter_into(x: &mut [f32], cols: &[f32], neighbours: &[u32], d: Dims) {
    for (r, row) in cols.chunks_exact(d.taps()).enumerate() {
        let (image, p) = (r / d.positions, r % d.positions);
        for (k, &q) in neighbours[9 * p..9 * p + 9].iter().enumerate() {
            if q != OUTSIDE {
                let at = (image * d.positions + q as usize) * d.inputs;
                for (c, v) in x[at..at + d.inputs].iter_mut().enumerate() {
                    *v += row[c * 9 + k];
                }
            }
        }
    }
}

/// Forward of [`Conv3x3`] on the CPU.
struct Conv3x3Cpu {
    neighbours: Arc<[u32]>,
    /// Whether backward computes the input's gradient (not for a batch of
    /// data).
    input_grad: bool,
}

impl CustomOp3 for Conv3x3Cpu {
    fn name(&self) -> &'static str {
        "conv3x3"
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
        let d = Dims::of(&self.neighbours, xl, wl)?;
        let x = contiguous_f32(xs, xl, "conv3x3", "input")?;
        let w = View::reshaped(ws, wl, d.outputs, d.taps(), "conv3x3", "weight")?;
        let b = View::of(bs, bl, "conv3x3", "bias")?;
        let cols = gather(x, &self.neighbours, d);
        let y = biased_product(View::rows_of(&cols, d.taps()), w.t(), b)
            .map_err(|e| Error::Msg(format!("conv3x3: {e}")))?;
        Ok((CpuStorage::F32(y), Shape::from((d.batch, d.positions, d.outputs))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let input_grad = self.input_grad && x.track_op();
        let op = Conv3x3Grad { neighbours: self.neighbours.clone(), input_grad };
        let packed = x.apply_op3_no_bwd(w, &grad.contiguous()?, &op)?;
        let (outputs, taps) = (w.dim(0)?, w.elem_count() / w.dim(0)?.max(1));
        let dw = packed.narrow(0, 0, outputs * taps)?.reshape(w.shape())?;
        let db = packed.narrow(0, outputs * taps, outputs)?;
        let dx = if input_grad {
            Some(packed.narrow(0, outputs * taps + outputs, x.elem_count())?.reshape(x.shape())?)
        } else {
            None
        };
        Ok((dx, Some(dw), Some(db)))
    }
}

/// Backward of [`Conv3x3Cpu`]: from the input, the weight and the output's
/// gradient, the weight's, the bias's and (when asked) the input's
/// gradients, one after the other in one vector.
struct Conv3x3Grad {
    neighbours: Arc<[u32]>,
    input_grad: bool,
}

impl CustomOp3 for Conv3x3Grad {
    fn name(&self) -> &'static str {
        "conv3x3-grad"
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
        let d = Dims::of(&self.neighbours, xl, wl)?;
        let x = contiguous_f32(xs, xl, "conv3x3", "input")?;
        let w = View::reshaped(ws, wl, d.outputs, d.taps(), "conv3x3", "weight")?;
        let g = View::reshaped(gs, gl, d.rows(), d.outputs, "conv3x3", "gradient")?;
        let g_rows = contiguous_f32(gs, gl, "conv3x3", "gradient")?;
        let weights = d.outputs * d.taps();
        let inputs = if self.input_grad { d.rows() * d.inputs } else { 0 };
        let mut out = vec![0.0f32; weights + d.outputs + inputs];
        let cols = gather(x, &self.neighbours, d);
        product(&mut out[..weights], g.t(), View::rows_of(&cols, d.taps()), false)?;
        let db = &mut out[weights..weights + d.outputs];
        for row in g_rows.chunks_exact(d.outputs) {
            db.iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        if self.input_grad {
            let mut dcols = vec![0.0f32; d.rows() * d.taps()];
            product(&mut dcols, g, w, false)?;
            scatter_into(&mut out[weights + d.outputs..], &dcols, &self.neighbours, d);
        }
        let len = out.len();
        Ok((CpuStorage::F32(out), Shape::from(len)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Module, Var};
    use candle_nn::{Conv2dConfig, VarBuilder, VarMap, conv2d};

    use super::*;
    use crate::model::{cpu_slice::max_diff, pool::relu_max_pool2};

    /// The operation and the tensor-operation version compute what candle's
    /// convolution computes, forward and every gradient, with candle's
    /// weights; with the CNN's pooling after it, what candle's
    /// convolution, ReLU and pooling compute.
    #[test]
    fn matches_candles_convolution() {
        let dev = Device::Cpu;
        for (side, cin, cout, batch) in [(6, 3, 5, 2), (8, 16, 32, 4), (4, 1, 2, 1)] {
            let map = VarMap::new();
            let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
            let conv = conv2d(cin, cout, 3, Conv2dConfig { padding: 1, ..Default::default() }, vb.pp("c")).unwrap();
            let ours = Conv3x3::new(conv.clone(), side);
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (batch, cin, side, side), &dev).unwrap()).unwrap();
            let nhwc = x.permute((0, 2, 3, 1)).unwrap().reshape((batch, side * side, cin)).unwrap();

            let pooled = relu_max_pool2(&ours.forward(&nhwc).unwrap(), side, true).unwrap();
            let theirs = conv.forward(&x).unwrap().relu().unwrap().max_pool2d(2).unwrap().flatten_from(1).unwrap();
            assert!(max_diff(&pooled, &theirs) < 1e-5);

            let theirs = conv.forward(&x).unwrap().flatten_from(1).unwrap();
            let probe = Tensor::randn(0f32, 1.0, theirs.shape(), &dev).unwrap();
            let g_theirs = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            for mine in [ours.forward(&nhwc).unwrap(), ours.forward_tensor_ops(&nhwc).unwrap()] {
                let mine = mine.transpose(1, 2).unwrap().flatten_from(1).unwrap();
                assert!(max_diff(&mine, &theirs) < 1e-5);
                let g_mine = (&mine * &probe).unwrap().sum_all().unwrap().backward().unwrap();
                for (name, t) in [("input", x.as_tensor()), ("weight", conv.weight()), ("bias", conv.bias().unwrap())] {
                    let diff = max_diff(g_mine.get(t).unwrap(), g_theirs.get(t).unwrap());
                    assert!(diff < 1e-4, "{name} gradient differs by {diff}");
                }
            }
        }
    }

    /// A batch of data gets no gradient; the weights still get candle's.
    #[test]
    fn a_constant_input_gets_no_gradient() {
        let dev = Device::Cpu;
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
        let conv = conv2d(2, 3, 3, Conv2dConfig { padding: 1, ..Default::default() }, vb.pp("c")).unwrap();
        let ours = Conv3x3::new(conv.clone(), 4);
        let x = Tensor::randn(0f32, 1.0, (2, 2, 4, 4), &dev).unwrap();
        let nhwc = x.permute((0, 2, 3, 1)).unwrap().reshape((2, 16, 2)).unwrap();
        let mine = ours.forward(&nhwc).unwrap().transpose(1, 2).unwrap().flatten_from(1).unwrap();
        let theirs = conv.forward(&x).unwrap().flatten_from(1).unwrap();
        let probe = Tensor::randn(0f32, 1.0, theirs.shape(), &dev).unwrap();
        let g_mine = (&mine * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g_theirs = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        assert!(g_mine.get(&nhwc).is_none() && g_mine.get(&x).is_none());
        for (name, t) in [("weight", conv.weight()), ("bias", conv.bias().unwrap())] {
            let diff = max_diff(g_mine.get(t).unwrap(), g_theirs.get(t).unwrap());
            assert!(diff < 1e-4, "{name} gradient differs by {diff}");
        }
    }

    /// Inputs whose channels or positions do not fit the layer are errors.
    #[test]
    fn refuses_mismatched_shapes() {
        let dev = Device::Cpu;
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
        let conv = conv2d(2, 3, 3, Conv2dConfig { padding: 1, ..Default::default() }, vb.pp("c")).unwrap();
        let ours = Conv3x3::new(conv, 4);
        assert!(ours.forward(&Tensor::zeros((2, 16, 2), DType::F32, &dev).unwrap()).is_ok());
        assert!(ours.forward(&Tensor::zeros((2, 16, 3), DType::F32, &dev).unwrap()).is_err());
        assert!(ours.forward(&Tensor::zeros((2, 9, 2), DType::F32, &dev).unwrap()).is_err());
        assert!(ours.forward(&Tensor::zeros((32, 2), DType::F32, &dev).unwrap()).is_err());
        // No input channels: refused, not a panic.
        let conv = conv2d(1, 3, 3, Conv2dConfig { padding: 1, ..Default::default() }, vb.pp("d")).unwrap();
        let empty =
            Conv2d::new(Tensor::zeros((3, 0, 3, 3), DType::F32, &dev).unwrap(), conv.bias().cloned(), *conv.config());
        assert!(Conv3x3::new(empty, 4).forward(&Tensor::zeros((2, 16, 0), DType::F32, &dev).unwrap()).is_err());
    }
}
