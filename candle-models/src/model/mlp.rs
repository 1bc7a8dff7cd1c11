//! A multi-layer perceptron with ReLU between layers.

use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

use super::{
    Tap,
    dense::{Dense, dense},
    relu::relu,
};
use crate::Result;

/// Layers `l0 .. lk`; ReLU after every layer but the last.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<Dense>,
    widths: Vec<usize>,
}

impl Mlp {
    /// `inputs -> hidden... -> classes`.
    pub fn new(inputs: usize, hidden: &[usize], classes: usize, vb: VarBuilder) -> Result<Self> {
        let mut widths = vec![inputs];
        widths.extend_from_slice(hidden);
        widths.push(classes);
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| dense(w[0], w[1], vb.pp(format!("l{i}"))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self { layers, widths })
    }

    /// Logits `[batch, classes]` from `[batch, inputs]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_tapped(x, None)
    }

    /// [`Mlp::forward`], handing each hidden layer's output `[batch,
    /// width]` (after its ReLU) to `tap` (when given), named after the layer.
    pub fn forward_tapped(&self, x: &Tensor, mut tap: Option<&mut Tap<'_>>) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = relu(&h)?;
                if let Some(tap) = tap.as_mut() {
                    tap(format!("l{i}"), &h);
                }
            }
        }
        Ok(h)
    }

    /// Input width.
    pub fn inputs(&self) -> usize {
        self.widths[0]
    }

    /// Output classes.
    pub fn classes(&self) -> usize {
        *self.widths.last().expect("at least two widths")
    }

    pub(crate) fn forward_flops(&self) -> f64 {
        self.widths.windows(2).map(|w| 2.0 * (w[0] * w[1]) as f64).sum()
    }

    pub(crate) fn activation_bytes(&self) -> u64 {
        4 * 2 * self.widths.iter().sum::<usize>() as u64
    }
}
