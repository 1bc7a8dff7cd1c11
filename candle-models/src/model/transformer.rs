//! A character-level decoder-only transformer (GPT-style, pre-norm).

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, VarBuilder, embedding};

use super::{
    Tap,
    dense::{Dense, dense},
    gelu::gelu,
    layer_norm::LayerNorm,
    softmax::softmax_last_dim,
};
use crate::{Error, Result};

#[derive(Debug)]
struct Block {
    ln1: LayerNorm,
    qkv: Dense,
    proj: Dense,
    ln2: LayerNorm,
    fc: Dense,
    out: Dense,
}

/// Token and position embeddings, `layers` blocks, a final norm and a head.
#[derive(Debug)]
pub struct CharTransformer {
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Dense,
    vocab: usize,
    context: usize,
    width: usize,
    heads: usize,
    mask: Tensor,
}

impl CharTransformer {
    /// A transformer over `vocab` characters with `context` positions.
    pub fn new(
        vocab: usize,
        context: usize,
        width: usize,
        layers: usize,
        heads: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        if heads == 0 || !width.is_multiple_of(heads) {
            return Err(Error::Shape(format!("width {width} must divide by heads {heads}")));
        }
        let ln = |n: usize, vb: VarBuilder| LayerNorm::new(n, vb);
        let blocks = (0..layers)
            .map(|i| {
                let vb = vb.pp(format!("h{i}"));
                Ok(Block {
                    ln1: ln(width, vb.pp("ln1"))?,
                    qkv: dense(width, 3 * width, vb.pp("attn_qkv"))?,
                    proj: dense(width, width, vb.pp("attn_proj"))?,
                    ln2: ln(width, vb.pp("ln2"))?,
                    fc: dense(width, 4 * width, vb.pp("mlp_fc"))?,
                    out: dense(4 * width, width, vb.pp("mlp_out"))?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mask = causal_mask(context, vb.device())?;
        Ok(Self {
            wte: embedding(vocab, width, vb.pp("wte"))?,
            wpe: embedding(context, width, vb.pp("wpe"))?,
            blocks,
            ln_f: ln(width, vb.pp("ln_f"))?,
            head: dense(width, vocab, vb.pp("head"))?,
            vocab,
            context,
            width,
            heads,
            mask,
        })
    }

    /// Logits `[batch * t, vocab]` from tokens `[batch, t]` (t <= context).
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        self.forward_tapped(tokens, None)
    }

    /// [`CharTransformer::forward`], handing each block's output (the
    /// residual stream), one row per position `[batch * t, width]`, to `tap` (when given).
    pub fn forward_tapped(&self, tokens: &Tensor, mut tap: Option<&mut Tap<'_>>) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        if t > self.context {
            return Err(Error::Shape(format!("sequence of {t} over context {}", self.context)));
        }
        let positions = Tensor::arange(0u32, t as u32, tokens.device())?;
        // The residual stream as rows [batch * t, width]: every linear layer
        // is then one matrix product whose weight gradient is one more
        // (on [batch, t, width] candle broadcasts the weight over the batch
        // and sums the batch's gradients in a strided reduction).
        let mut x =
            self.wte.forward(tokens)?.broadcast_add(&self.wpe.forward(&positions)?)?.reshape((b * t, self.width))?;
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let hd = self.width / self.heads;
        let scale = 1.0 / (hd as f64).sqrt();
        for (i, blk) in self.blocks.iter().enumerate() {
            let h = blk.ln1.forward(&x)?;
            let qkv = blk.qkv.forward(&h)?.reshape((b, t, 3, self.heads, hd))?.permute((2, 0, 3, 1, 4))?;
            let q = qkv.get(0)?.contiguous()?;
            let k = qkv.get(1)?.contiguous()?;
            let v = qkv.get(2)?.contiguous()?;
            let att = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&mask)?;
            let att = softmax_last_dim(&att)?;
            let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b * t, self.width))?;
            x = (x + blk.proj.forward(&y)?)?;
            let h = blk.ln2.forward(&x)?;
            let h = blk.out.forward(&gelu(&blk.fc.forward(&h)?)?)?;
            x = (x + h)?;
            if let Some(tap) = tap.as_mut() {
                tap(format!("h{i}"), &x);
            }
        }
        Ok(self.head.forward(&self.ln_f.forward(&x)?)?)
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Transformer blocks.
    pub fn layers(&self) -> usize {
        self.blocks.len()
    }

    /// Context length.
    pub fn context(&self) -> usize {
        self.context
    }

    pub(crate) fn forward_flops(&self) -> f64 {
        let (t, d, l, v) = (self.context as f64, self.width as f64, self.blocks.len() as f64, self.vocab as f64);
        let per_token = l * (2.0 * 12.0 * d * d + 2.0 * 2.0 * t * d) + 2.0 * d * v;
        per_token * t
    }

    pub(crate) fn activation_bytes(&self) -> u64 {
        let (t, d, l, h) = (self.context as u64, self.width as u64, self.blocks.len() as u64, self.heads as u64);
        4 * (l * (t * d * 16 + h * t * t * 2) + t * self.vocab as u64 * 2)
    }
}

/// 0 on and below the diagonal, -inf above: `[context, context]`.
fn causal_mask(context: usize, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> =
        (0..context).flat_map(|i| (0..context).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Ok(Tensor::from_vec(values, (context, context), device)?.to_dtype(DType::F32)?)
}

#[cfg(test)]
mod tests {
    use candle_nn::VarMap;

    use super::*;

    #[test]
    fn logits_do_not_depend_on_future_tokens() {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        let m = CharTransformer::new(11, 8, 16, 2, 4, vb).unwrap();
        crate::params::ParamStore::from_varmap(&vm).init(3, crate::params::InitScheme::Gpt2 { layers: 2 }).unwrap();
        let a = Tensor::new(&[[1u32, 2, 3, 4, 5, 6]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[1u32, 2, 3, 9, 9, 9]], &Device::Cpu).unwrap();
        let la = m.forward(&a).unwrap();
        let lb = m.forward(&b).unwrap();
        let first3 = |l: &Tensor| l.narrow(0, 0, 3).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(first3(&la), first3(&lb));
        let last = |l: &Tensor| l.narrow(0, 5, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_ne!(last(&la), last(&lb));
        assert_eq!(la.dims(), &[6, 11]);
    }
}
