//! Models as plain structs built from a `VarBuilder` (the candle way).

mod cnn;
mod conv3x3;
mod cpu_gemm;
mod cpu_slice;
mod cross_entropy;
mod dense;
mod gelu;
mod layer_norm;
mod mlp;
mod pool;
mod relu;
mod softmax;
mod transformer;

use candle_core::Tensor;
use candle_nn::VarBuilder;
pub use cnn::Cnn;
pub(crate) use cross_entropy::cross_entropy;
pub use mlp::Mlp;
use ragtag_protocol::manifest::ModelSpec;
pub use transformer::CharTransformer;

use crate::{Result, params::InitScheme};

/// Receives a hidden layer's output during a forward pass, by layer name.
pub type Tap<'a> = dyn FnMut(String, &Tensor) + 'a;

/// What a model eats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// Feature vectors of this width.
    Features(usize),
    /// Square single-channel images of this side.
    Image(usize),
    /// Token sequences of this length over this vocabulary.
    Tokens {
        /// Context length.
        context: usize,
        /// Vocabulary size.
        vocab: usize,
    },
}

/// Any of our models.
#[derive(Debug)]
pub enum Model {
    /// A multi-layer perceptron.
    Mlp(Mlp),
    /// A small CNN.
    Cnn(Cnn),
    /// A character-level transformer.
    Transformer(CharTransformer),
}

impl Model {
    /// Builds the model of `spec`, creating its variables in `vb`.
    pub fn build(spec: &ModelSpec, vb: VarBuilder) -> Result<Self> {
        Ok(match spec {
            ModelSpec::Mlp { inputs, hidden, classes } => Model::Mlp(Mlp::new(
                *inputs as usize,
                &hidden.iter().map(|h| *h as usize).collect::<Vec<_>>(),
                *classes as usize,
                vb,
            )?),
            ModelSpec::Cnn { side, channels, hidden, classes } => Model::Cnn(Cnn::new(
                *side as usize,
                [channels[0] as usize, channels[1] as usize],
                *hidden as usize,
                *classes as usize,
                vb,
            )?),
            ModelSpec::CharTransformer { vocab, context, width, layers, heads } => {
                Model::Transformer(CharTransformer::new(
                    *vocab as usize,
                    *context as usize,
                    *width as usize,
                    *layers as usize,
                    *heads as usize,
                    vb,
                )?)
            }
        })
    }

    /// Logits, flattened to `[samples, classes]` (for the transformer one
    /// sample per position).
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        match self {
            Model::Mlp(m) => m.forward(input),
            Model::Cnn(m) => m.forward(input),
            Model::Transformer(m) => m.forward(input),
        }
    }

    /// Logits and each hidden layer's output for `input`, every one as
    /// `[rows, features]` (a row per sample, per position for the
    /// transformer), named after its layer: what [`crate::representation`]
    /// compares.
    pub fn forward_with_hidden(&self, input: &Tensor) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let mut hidden = Vec::new();
        let mut keep = |name: String, t: &Tensor| hidden.push((name, t.clone()));
        let tap: Option<&mut Tap<'_>> = Some(&mut keep);
        let logits = match self {
            Model::Mlp(m) => m.forward_tapped(input, tap)?,
            Model::Cnn(m) => m.forward_tapped(input, tap)?,
            Model::Transformer(m) => m.forward_tapped(input, tap)?,
        };
        Ok((logits, hidden))
    }

    /// How this model's weights are initialised.
    pub fn init_scheme(&self) -> InitScheme {
        match self {
            Model::Transformer(m) => InitScheme::Gpt2 { layers: m.layers() },
            _ => InitScheme::FanIn,
        }
    }

    /// What the model eats.
    pub fn input_kind(&self) -> InputKind {
        match self {
            Model::Mlp(m) => InputKind::Features(m.inputs()),
            Model::Cnn(m) => InputKind::Image(m.side()),
            Model::Transformer(m) => InputKind::Tokens { context: m.context(), vocab: m.vocab() },
        }
    }

    /// Classes (vocabulary for the transformer).
    pub fn classes(&self) -> usize {
        match self {
            Model::Mlp(m) => m.classes(),
            Model::Cnn(m) => m.classes(),
            Model::Transformer(m) => m.vocab(),
        }
    }

    /// Forward floating-point operations per sample (a sequence for the
    /// transformer); training costs about three times this.
    pub fn forward_flops_per_sample(&self) -> f64 {
        match self {
            Model::Mlp(m) => m.forward_flops(),
            Model::Cnn(m) => m.forward_flops(),
            Model::Transformer(m) => m.forward_flops(),
        }
    }

    /// Bytes of activations per sample kept for the backward pass (an
    /// estimate for memory planning).
    pub fn activation_bytes_per_sample(&self) -> u64 {
        match self {
            Model::Mlp(m) => m.activation_bytes(),
            Model::Cnn(m) => m.activation_bytes(),
            Model::Transformer(m) => m.activation_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    use super::*;

    /// Every parameter of every model gets a gradient through the custom
    /// operations.
    #[test]
    fn every_parameter_gets_a_gradient() {
        let dev = Device::Cpu;
        let specs = [
            (ModelSpec::Mlp { inputs: 5, hidden: vec![7, 6], classes: 3 }, Tensor::ones((4, 5), DType::F32, &dev)),
            (
                ModelSpec::Cnn { side: 4, channels: [2, 3], hidden: 5, classes: 3 },
                Tensor::ones((4, 1, 4, 4), DType::F32, &dev),
            ),
            (
                ModelSpec::CharTransformer { vocab: 3, context: 4, width: 8, layers: 1, heads: 2 },
                Tensor::zeros((1, 4), DType::U32, &dev),
            ),
        ];
        for (spec, x) in specs {
            let map = VarMap::new();
            let model = Model::build(&spec, VarBuilder::from_varmap(&map, DType::F32, &dev)).unwrap();
            let vars = map.all_vars();
            let x = x.unwrap();
            let loss = model.forward(&x).unwrap().sqr().unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            for var in &vars {
                let g = grads.get(var.as_tensor());
                assert!(g.is_some(), "{spec:?}: a parameter of shape {:?} without a gradient", var.shape());
            }
        }
    }
}
