//! Inner AdamW with gradient-norm clipping, over plain tensors so its state
//! can be checkpointed (candle-nn's AdamW keeps its state private).

use candle_core::{Tensor, Var};
use ragtag_protocol::manifest::TrainingSpec;

use crate::Result;

/// AdamW state: first and second moments per parameter and the step count.
#[derive(Debug)]
pub struct AdamW {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    clip: f64,
    step: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamW {
    /// Zero state for `vars`, with the run's hyperparameters.
    pub fn new(vars: &[Var], spec: &TrainingSpec) -> Result<Self> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        Ok(Self {
            lr: spec.lr as f64,
            beta1: spec.beta1 as f64,
            beta2: spec.beta2 as f64,
            eps: 1e-8,
            weight_decay: spec.weight_decay as f64,
            clip: spec.clip as f64,
            step: 0,
            m: vars.iter().map(zeros).collect::<candle_core::Result<_>>()?,
            v: vars.iter().map(zeros).collect::<candle_core::Result<_>>()?,
        })
    }

    /// One step on `vars` with `grads` (same order; `None` = no gradient),
    /// the learning rate scaled by `lr_scale`. Returns the gradient norm
    /// before clipping.
    pub fn step(&mut self, vars: &[Var], grads: &[Option<Tensor>], lr_scale: f64) -> Result<f32> {
        let mut sq = Vec::with_capacity(grads.len());
        for g in grads.iter().flatten() {
            sq.push(g.sqr()?.sum_all()?);
        }
        let norm = if sq.is_empty() { 0.0 } else { Tensor::stack(&sq, 0)?.sum_all()?.to_scalar::<f32>()?.sqrt() };
        let scale = if self.clip > 0.0 && norm as f64 > self.clip { self.clip / norm as f64 } else { 1.0 };
        self.step += 1;
        let t = self.step as i32;
        let lr = self.lr * lr_scale;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        for (i, (var, g)) in vars.iter().zip(grads).enumerate() {
            let Some(g) = g else { continue };
            let g = if scale != 1.0 { g.affine(scale, 0.0)? } else { g.clone() };
            self.m[i] = ((&self.m[i] * self.beta1)? + (&g * (1.0 - self.beta1))?)?;
            self.v[i] = ((&self.v[i] * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
            let mhat = (&self.m[i] / bc1)?;
            let denom = ((&self.v[i] / bc2)?.sqrt()? + self.eps)?;
            let theta = var.as_tensor();
            let next = ((theta * (1.0 - lr * self.weight_decay))? - (mhat / denom)?.affine(lr, 0.0)?)?;
            var.set(&next)?;
        }
        Ok(norm)
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The moments, for checkpoints.
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }

    /// Restores moments and step count from a checkpoint.
    pub fn restore(&mut self, step: u64, m: Vec<Tensor>, v: Vec<Tensor>) -> Result<()> {
        if m.len() != self.m.len() || v.len() != self.v.len() {
            return Err(crate::Error::Shape("optimizer state does not match the model".into()));
        }
        for (a, b) in m.iter().zip(&self.m).chain(v.iter().zip(&self.v)) {
            if a.dims() != b.dims() {
                return Err(crate::Error::Shape(format!("optimizer state shape {:?} vs {:?}", a.dims(), b.dims())));
            }
        }
        self.step = step;
        self.m = m;
        self.v = v;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// Pinned against a line-by-line transcription of `torch.optim.AdamW`'s
    /// documented update (decoupled decay first, then the bias-corrected step):
    /// ```python
    /// p=[1.0,-2.0]; m=[0,0]; v=[0,0]; lr=0.1; b1=0.9; b2=0.95; wd=0.1; eps=1e-8
    /// for t in range(1,4):
    ///     g=[2*x for x in p]
    ///     for i in range(2):
    ///         p[i]*=1-lr*wd
    ///         m[i]=b1*m[i]+(1-b1)*g[i]; v[i]=b2*v[i]+(1-b2)*g[i]**2
    ///         p[i]-=lr/(1-b1**t)*m[i]/(math.sqrt(v[i])/math.sqrt(1-b2**t)+eps)
    /// print(p)  # [0.6745543954291001, -1.6440805507001606]
    /// ```
    #[test]
    fn matches_pytorch_adamw() {
        let var = Var::from_slice(&[1.0f32, -2.0], 2, &Device::Cpu).unwrap();
        let spec =
            TrainingSpec { lr: 0.1, beta1: 0.9, beta2: 0.95, weight_decay: 0.1, clip: 0.0, ..TrainingSpec::default() };
        let mut opt = AdamW::new(std::slice::from_ref(&var), &spec).unwrap();
        for _ in 0..3 {
            let g = (var.as_tensor() * 2.0).unwrap();
            opt.step(std::slice::from_ref(&var), &[Some(g)], 1.0).unwrap();
        }
        let p = var.as_tensor().to_vec1::<f32>().unwrap();
        assert!((p[0] - 0.674_554_4).abs() < 1e-5 && (p[1] + 1.644_080_6).abs() < 1e-5, "{p:?}");
    }

    #[test]
    fn clipping_bounds_the_first_step() {
        let var = Var::from_slice(&[0.0f32; 4], 4, &Device::Cpu).unwrap();
        let spec = TrainingSpec { lr: 1.0, weight_decay: 0.0, clip: 1.0, ..TrainingSpec::default() };
        let mut opt = AdamW::new(std::slice::from_ref(&var), &spec).unwrap();
        let g = Tensor::new(&[100.0f32, 0.0, 0.0, 0.0], &Device::Cpu).unwrap();
        let norm = opt.step(std::slice::from_ref(&var), &[Some(g)], 1.0).unwrap();
        assert_eq!(norm, 100.0);
        // Adam's first step is ~lr * sign(g) whatever the scale.
        let p = var.as_tensor().to_vec1::<f32>().unwrap();
        assert!((p[0] + 1.0).abs() < 1e-4 && p[1] == 0.0, "{p:?}");
    }
}
