//! A small CNN for square single-channel images (8x8 digits, 28x28 IDX):
//! two 3x3 convolutions with ReLU and 2x2 max-pooling, then two dense layers.
//! The convolutions run channels-last (see [`super::conv3x3`]); the dense
//! layers see the channels-first flattening candle's layout gives.

use candle_core::{Module, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder, conv2d};

use super::{
    Tap,
    conv3x3::Conv3x3,
    dense::{Dense, dense},
    pool::relu_max_pool2,
    relu::relu,
};
use crate::{Error, Result};

/// conv(1->c1) pool conv(c1->c2) pool dense(hidden) dense(classes).
#[derive(Debug)]
pub struct Cnn {
    conv1: Conv3x3,
    conv2: Conv3x3,
    fc1: Dense,
    fc2: Dense,
    side: usize,
    channels: [usize; 2],
    hidden: usize,
    classes: usize,
}

impl Cnn {
    /// A CNN for `side`x`side` images (side divisible by 4).
    pub fn new(side: usize, channels: [usize; 2], hidden: usize, classes: usize, vb: VarBuilder) -> Result<Self> {
        if !side.is_multiple_of(4) {
            return Err(Error::Shape(format!("cnn image side {side} must be divisible by 4")));
        }
        let cfg = Conv2dConfig { padding: 1, ..Default::default() };
        let flat = channels[1] * (side / 4) * (side / 4);
        Ok(Self {
            conv1: Conv3x3::new(conv2d(1, channels[0], 3, cfg, vb.pp("conv1"))?, side),
            conv2: Conv3x3::new(conv2d(channels[0], channels[1], 3, cfg, vb.pp("conv2"))?, side / 2),
            fc1: dense(flat, hidden, vb.pp("fc1"))?,
            fc2: dense(hidden, classes, vb.pp("fc2"))?,
            side,
            channels,
            hidden,
            classes,
        })
    }

    /// Logits `[batch, classes]` from `[batch, 1, side, side]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_tapped(x, None)
    }

    /// [`Cnn::forward`], handing each hidden layer's output, flattened to
    /// `[batch, features]` (the convolutions' after pooling; conv1's
    /// channels-last), to `tap` (when given).
    pub fn forward_tapped(&self, x: &Tensor, mut tap: Option<&mut Tap<'_>>) -> Result<Tensor> {
        let side = self.side;
        // One channel: [batch, 1, side, side] is already channels-last.
        let x = x.reshape((x.dim(0)?, side * side, 1))?;
        let h = relu_max_pool2(&self.conv1.forward(&x)?, side, false)?;
        if let Some(tap) = tap.as_mut() {
            tap("conv1".into(), &h.flatten_from(1)?);
        }
        let h = relu_max_pool2(&self.conv2.forward(&h)?, side / 2, true)?;
        if let Some(tap) = tap.as_mut() {
            tap("conv2".into(), &h);
        }
        let h = relu(&self.fc1.forward(&h)?)?;
        if let Some(tap) = tap.as_mut() {
            tap("fc1".into(), &h);
        }
        Ok(self.fc2.forward(&h)?)
    }

    /// Image side.
    pub fn side(&self) -> usize {
        self.side
    }

    /// Output classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    pub(crate) fn forward_flops(&self) -> f64 {
        let s = self.side as f64;
        let [c1, c2] = self.channels.map(|c| c as f64);
        let conv1 = 2.0 * s * s * c1 * 9.0;
        let conv2 = 2.0 * (s / 2.0).powi(2) * c1 * c2 * 9.0;
        let fc1 = 2.0 * c2 * (s / 4.0).powi(2) * self.hidden as f64;
        let fc2 = 2.0 * self.hidden as f64 * self.classes as f64;
        conv1 + conv2 + fc1 + fc2
    }

    pub(crate) fn activation_bytes(&self) -> u64 {
        let s = self.side as u64;
        let [c1, c2] = self.channels.map(|c| c as u64);
        4 * 2 * (s * s * c1 + (s / 2) * (s / 2) * c2 + self.hidden as u64)
    }
}
