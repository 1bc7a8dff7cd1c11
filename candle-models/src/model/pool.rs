//! ReLU and 2x2 max-pooling of channels-last images, as one operation on
//! the CPU.
//!
//! `max(0, max(window))` is `max(relu(window))`, so the CNN's activation
//! and pooling are one pass forward, and one backward that sends each
//! window's gradient to every element equal to that value (candle's rule
//! for `max`, and its ReLU's gradient of 1 at 0). Done with tensor
//! operations (a ReLU, two `max` reductions, a transpose for the dense
//! layer's channels-first order) each has its own allocation and backward.
//! On other devices and dtypes the tensor operations run.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Error, Layout, Shape, Tensor};

use super::cpu_slice::contiguous_f32;
use crate::Result;

/// `max(0, x)` pooled over 2x2 windows of `x = [batch, side * side,
/// channels]`: `[batch, (side / 2)^2, channels]`, or with `channels_first`
/// `[batch, channels * (side / 2)^2]` (the order candle's NCHW flattening
/// gives, which the dense layer after it expects).
pub(crate) fn relu_max_pool2(x: &Tensor, side: usize, channels_first: bool) -> Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 {
        return Ok(x.contiguous()?.apply_op1(ReluPoolCpu { side, channels_first })?);
    }
    let y = max_pool2(&x.relu()?, side)?;
    if channels_first { channels_first_flat(&y) } else { Ok(y) }
}

/// 2x2 max-pooling as tensor operations.
fn max_pool2(x: &Tensor, side: usize) -> Result<Tensor> {
    let (batch, _, channels) = x.dims3()?;
    let half = side / 2;
    let y = x.reshape((batch, half, 2, half, 2, channels))?.max(4)?.max(2)?;
    Ok(y.reshape((batch, half * half, channels))?)
}

/// `[batch, positions, channels]` as `[batch, channels * positions]`.
fn channels_first_flat(x: &Tensor) -> Result<Tensor> {
    let (batch, positions, channels) = x.dims3()?;
    Ok(x.transpose(1, 2)?.contiguous()?.reshape((batch, channels * positions))?)
}

/// The pooling's shape, checked against the input.
#[derive(Clone, Copy)]
struct Pool {
    batch: usize,
    side: usize,
    channels: usize,
    channels_first: bool,
}

impl Pool {
    fn of(l: &Layout, side: usize, channels_first: bool) -> candle_core::Result<Self> {
        match l.dims() {
            &[batch, positions, channels] if side.is_multiple_of(2) && Some(positions) == side.checked_mul(side) => {
                Ok(Self { batch, side, channels, channels_first })
            }
            dims => Err(Error::Msg(format!("relu-max-pool2: input {dims:?} for side {side}"))),
        }
    }

    fn half(&self) -> usize {
        self.side / 2
    }

    fn out_len(&self) -> usize {
        self.batch * self.half() * self.half() * self.channels
    }

    fn out_shape(&self) -> Shape {
        let cells = self.half() * self.half();
        if self.channels_first {
            Shape::from((self.batch, self.channels * cells))
        } else {
            Shape::from((self.batch, cells, self.channels))
        }
    }

    /// Calls `f(window, out)` for each window and channel: the input
    /// indices of the window's four elements, and the output index.
    fn for_each(&self, mut f: impl FnMut([usize; 4], usize)) {
        let (half, c) = (self.half(), self.channels);
        for b in 0..self.batch {
            for wy in 0..half {
                for wx in 0..half {
                    let top = (b * self.side * self.side + 2 * wy * self.side + 2 * wx) * c;
                    let window = [top, top + c, top + self.side * c, top + (self.side + 1) * c];
                    let cell = wy * half + wx;
                    for ch in 0..c {
                        let out = if self.channels_first {
                            (b * c + ch) * half * half + cell
                        } else {
                            (b * half * half + cell) * c + ch
                        };
                        f(window.map(|i| i + ch), out);
                    }
                }
            }
        }
    }
}

/// `max(0, max(window))`.
fn window_max(x: &[f32], window: [usize; 4]) -> f32 {
    window.iter().fold(0.0f32, |m, &i| m.max(x[i]))
}

/// Forward of [`relu_max_pool2`] on the CPU.
struct ReluPoolCpu {
    side: usize,
    channels_first: bool,
}

impl CustomOp1 for ReluPoolCpu {
    fn name(&self) -> &'static str {
        "relu-max-pool2"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let pool = Pool::of(l, self.side, self.channels_first)?;
        let x = contiguous_f32(s, l, "relu-max-pool2", "input")?;
        let mut y = vec![0.0f32; pool.out_len()];
        pool.for_each(|window, out| y[out] = window_max(x, window));
        Ok((CpuStorage::F32(y), pool.out_shape()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let op = ReluPoolGrad { side: self.side, channels_first: self.channels_first };
        Ok(Some(arg.apply_op2_no_bwd(&grad_res.contiguous()?, &op)?))
    }
}

/// The input's gradient: each window's gradient to every element equal to
/// `max(0, max(window))`.
struct ReluPoolGrad {
    side: usize,
    channels_first: bool,
}

impl CustomOp2 for ReluPoolGrad {
    fn name(&self) -> &'static str {
        "relu-max-pool2-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let pool = Pool::of(l1, self.side, self.channels_first)?;
        let x = contiguous_f32(s1, l1, "relu-max-pool2", "input")?;
        let g = contiguous_f32(s2, l2, "relu-max-pool2", "gradient")?;
        if g.len() != pool.out_len() {
            return Err(Error::Msg(format!("relu-max-pool2: gradient {:?} for input {:?}", l2.dims(), l1.dims())));
        }
        let mut dx = vec![0.0f32; x.len()];
        pool.for_each(|window, out| {
            let m = window_max(x, window);
            for i in window {
                if x[i] == m {
                    dx[i] += g[out];
                }
            }
        });
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::model::cpu_slice::max_diff;

    /// Values and gradients agree with the tensor operations (ReLU, two
    /// `max` reductions, the transpose), in both output orders, with ties
    /// and an all-negative window among them.
    #[test]
    fn matches_the_tensor_operations() {
        let dev = Device::Cpu;
        let (batch, side, channels) = (3, 6, 5);
        let mut values: Vec<f32> =
            (0..batch * side * side * channels).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 10.0).collect();
        // The first window (top left, top right, bottom left, bottom right):
        // channel 0 all negative, channel 1 a tie in a row, channel 2 a tie
        // at zero, channel 3 a tie in a column, channel 4 four equal values.
        let window = [0, channels, side * channels, (side + 1) * channels];
        let fours =
            [[-1.0, -2.0, -3.0, -4.0], [2.5, 2.5, 1.0, 1.0], [0.0, -1.0, -1.0, 0.0], [3.0, 1.0, 3.0, 1.0], [0.5; 4]];
        for (c, four) in fours.iter().enumerate() {
            for (at, v) in window.iter().zip(four) {
                values[at + c] = *v;
            }
        }
        let x = Var::from_vec(values, (batch, side * side, channels), &dev).unwrap();
        for channels_first in [false, true] {
            let ours = relu_max_pool2(x.as_tensor(), side, channels_first).unwrap();
            let mut theirs = max_pool2(&x.as_tensor().relu().unwrap(), side).unwrap();
            if channels_first {
                theirs = channels_first_flat(&theirs).unwrap();
            }
            assert_eq!(ours.dims(), theirs.dims());
            assert_eq!(max_diff(&ours, &theirs), 0.0);
            let probe = Tensor::randn(0f32, 1.0, ours.shape(), &dev).unwrap();
            let g_ours = (&ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let g_theirs = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let (a, b) = (g_ours.get(x.as_tensor()).unwrap(), g_theirs.get(x.as_tensor()).unwrap());
            assert!(max_diff(a, b) < 1e-6, "gradients differ by {}", max_diff(a, b));
        }
    }

    /// An odd side, or a side that does not match the positions, is an
    /// error.
    #[test]
    fn refuses_mismatched_sides() {
        let x = Tensor::zeros((2, 16, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(relu_max_pool2(&x, 4, false).is_ok());
        assert!(relu_max_pool2(&x, 3, false).is_err());
        assert!(relu_max_pool2(&x, 5, true).is_err());
    }

    /// Max-pooling's gradient is 1 at each window's maximum and 0 elsewhere.
    /// (candle 0.11's `max_pool2d` backward gives 1/4 at the maximum: its
    /// tie correction multiplies by the share of maxima in the window where
    /// it should divide, so the digits CNN's convolutions had learnt from
    /// gradients scaled by 1/4 and 1/16 before they were computed here.)
    #[test]
    fn max_pooling_passes_the_gradient_to_each_maximum() {
        let dev = Device::Cpu;
        let (side, channels) = (4, 2);
        let values: Vec<f32> = (0..side * side * channels).map(|i| ((i * 7919) % 101) as f32).collect();
        let x = Var::from_vec(values.clone(), (1, side * side, channels), &dev).unwrap();
        let grads = max_pool2(&x, side).unwrap().sum_all().unwrap().backward().unwrap();
        let g = grads.get(x.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut expected = vec![0f32; values.len()];
        for c in 0..channels {
            for wy in 0..side / 2 {
                for wx in 0..side / 2 {
                    let window = [(0, 0), (0, 1), (1, 0), (1, 1)]
                        .map(|(dy, dx)| ((2 * wy + dy) * side + 2 * wx + dx) * channels + c);
                    let top = window.into_iter().max_by(|a, b| values[*a].total_cmp(&values[*b])).unwrap();
                    expected[top] = 1.0;
                }
            }
        }
        assert_eq!(g, expected);
        let candle = x.reshape((1, side, side, channels)).unwrap().permute((0, 3, 1, 2)).unwrap();
        let theirs = candle.max_pool2d(2).unwrap().sum_all().unwrap().backward().unwrap();
        let theirs = theirs.get(x.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(theirs.iter().zip(&expected).all(|(t, e)| (t - e / 4.0).abs() < 1e-6), "candle's changed: {theirs:?}");
    }
}
