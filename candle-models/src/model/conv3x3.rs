//! A 3x3 convolution (stride 1, padding 1) and 2x2 max-pooling on
//! channels-last images, as a gather and one matrix product.
//!
//! candle's CPU convolution computes its backward pass with a direct
//! transposed convolution (a dot product per output element): on the
//! digits CNN that was over half of a training step. Gathering the 3x3
//! neighbourhoods with a fixed index (`index_select`, whose backward is
//! `index_add`) turns the forward and both gradients into matrix products.
//! The weights keep candle's `[out, in, 3, 3]` layout and names, so a
//! checkpoint is the same whichever way the convolution is computed.

use candle_core::{Device, Tensor};
use candle_nn::Conv2d;

use crate::Result;

/// The neighbourhood gather of one image size.
#[derive(Debug)]
pub(crate) struct Conv3x3 {
    conv: Conv2d,
    /// For output position `p` and kernel tap `k`, at `p * 9 + k`: the
    /// input position it reads, or `side * side` (a zero row) off the edge.
    gather: Tensor,
}

impl Conv3x3 {
    /// Wraps `conv` (3x3, padding 1, stride 1) for `side`x`side` inputs.
    pub(crate) fn new(conv: Conv2d, side: usize, device: &Device) -> Result<Self> {
        let outside = (side * side) as u32;
        let mut gather = Vec::with_capacity(side * side * 9);
        for y in 0..side as isize {
            for x in 0..side as isize {
                for dy in -1..=1isize {
                    for dx in -1..=1isize {
                        let (sy, sx) = (y + dy, x + dx);
                        let inside = (0..side as isize).contains(&sy) && (0..side as isize).contains(&sx);
                        gather.push(if inside { (sy as usize * side + sx as usize) as u32 } else { outside });
                    }
                }
            }
        }
        let gather = Tensor::from_vec(gather, side * side * 9, device)?;
        Ok(Self { conv, gather })
    }

    /// `[batch, side * side, in]` to `[batch, side * side, out]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (batch, positions, channels) = x.dims3()?;
        // One zero row after the image stands for every tap off its edge.
        let padded = x.pad_with_zeros(1, 0, 1)?;
        let cols = padded.index_select(&self.gather, 1)?.reshape((batch * positions, 9 * channels))?;
        let w = self.conv.weight();
        let out_channels = w.dim(0)?;
        // [out, in, 3, 3] -> [out, 3, 3, in]: columns in the gather's (tap, channel) order.
        let w = w.permute((0, 2, 3, 1))?.reshape((out_channels, 9 * channels))?;
        let mut y = cols.matmul(&w.t()?)?;
        if let Some(b) = self.conv.bias() {
            y = y.broadcast_add(b)?;
        }
        Ok(y.reshape((batch, positions, out_channels))?)
    }
}

/// 2x2 max-pooling, `[batch, side * side, channels]` to
/// `[batch, (side / 2)^2, channels]` (side even).
pub(crate) fn max_pool2(x: &Tensor, side: usize) -> Result<Tensor> {
    let (batch, _, channels) = x.dims3()?;
    let half = side / 2;
    let y = x.reshape((batch, half, 2, half, 2, channels))?.max(4)?.max(2)?;
    Ok(y.reshape((batch, half * half, channels))?)
}

/// A channels-last activation `[batch, side * side, channels]` as candle's
/// `[batch, channels, side, side]`, flattened to `[batch, channels * side * side]`.
pub(crate) fn channels_first_flat(x: &Tensor) -> Result<Tensor> {
    let (batch, positions, channels) = x.dims3()?;
    Ok(x.transpose(1, 2)?.contiguous()?.reshape((batch, channels * positions))?)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Module, Var};
    use candle_nn::{Conv2dConfig, VarBuilder, VarMap, conv2d};

    use super::*;

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// Forward, the gather and matrix product compute what candle's
    /// convolution and max-pooling compute; backward, what candle's
    /// convolution computes, with candle's weights.
    #[test]
    fn matches_candles_convolution() {
        let dev = Device::Cpu;
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
        let (side, cin, cout, batch) = (6, 3, 5, 2);
        let conv = conv2d(cin, cout, 3, Conv2dConfig { padding: 1, ..Default::default() }, vb.pp("c")).unwrap();
        let ours = Conv3x3::new(conv.clone(), side, &dev).unwrap();
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (batch, cin, side, side), &dev).unwrap()).unwrap();
        let nhwc = x.permute((0, 2, 3, 1)).unwrap().reshape((batch, side * side, cin)).unwrap();

        let pooled = channels_first_flat(&max_pool2(&ours.forward(&nhwc).unwrap().relu().unwrap(), side).unwrap());
        let theirs = conv.forward(&x).unwrap().relu().unwrap().max_pool2d(2).unwrap().flatten_from(1).unwrap();
        assert!(max_diff(&pooled.unwrap(), &theirs) < 1e-5);

        let mine = channels_first_flat(&ours.forward(&nhwc).unwrap()).unwrap();
        let theirs = conv.forward(&x).unwrap().flatten_from(1).unwrap();
        assert!(max_diff(&mine, &theirs) < 1e-5);
        let probe = Tensor::randn(0f32, 1.0, mine.shape(), &dev).unwrap();
        let g_mine = (&mine * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g_theirs = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, t) in [("input", x.as_tensor()), ("weight", conv.weight()), ("bias", conv.bias().unwrap())] {
            let diff = max_diff(g_mine.get(t).unwrap(), g_theirs.get(t).unwrap());
            assert!(diff < 1e-4, "{name} gradient differs by {diff}");
        }
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
