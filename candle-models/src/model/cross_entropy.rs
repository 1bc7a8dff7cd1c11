//! The mean cross-entropy of logits against class indices, as one
//! operation on the CPU.
//!
//! candle-nn's `cross_entropy` is a log-softmax (five tensor operations)
//! and a gather, a sum and a division, each with its own allocation and a
//! backward of its own: about thirty operations a step, whose overhead is a
//! visible share of a small model's step. Here forward is one pass over the
//! rows, and backward one pass writing `(softmax - one_hot) / rows` times
//! the incoming gradient. On other devices, dtypes or target types
//! candle-nn's runs.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Error, Layout, Shape, Tensor};

use super::cpu_slice::contiguous_f32;

/// Mean over rows of `-log softmax(logits)[target]`: `logits` `[rows,
/// classes]`, `targets` `[rows]` class indices.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    if logits.device().is_cpu() && logits.dtype() == DType::F32 && targets.dtype() == DType::U32 {
        logits.contiguous()?.apply_op2(&targets.contiguous()?, CrossEntropyCpu)
    } else {
        candle_nn::loss::cross_entropy(logits, targets)
    }
}

/// The logits as rows, the targets checked to be one class index per row.
fn rows<'a>(
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
) -> candle_core::Result<(&'a [f32], usize, &'a [u32])> {
    let logits = contiguous_f32(s1, l1, "cross-entropy", "logits")?;
    let (&[rows, classes], &[n]) = (l1.dims(), l2.dims()) else {
        return Err(Error::Msg(format!("cross-entropy: logits {:?}, targets {:?}", l1.dims(), l2.dims())));
    };
    let (start, end) =
        l2.contiguous_offsets().ok_or_else(|| Error::Msg("cross-entropy: non-contiguous targets".into()))?;
    let targets = match s2 {
        CpuStorage::U32(v) => v.get(start..end).unwrap_or_default(),
        _ => return Err(Error::Msg("cross-entropy: targets are not u32".into())),
    };
    if n != rows || targets.len() != rows || classes == 0 {
        return Err(Error::Msg(format!("cross-entropy: logits {:?}, targets {:?}", l1.dims(), l2.dims())));
    }
    if let Some(t) = targets.iter().find(|&&t| t as usize >= classes) {
        return Err(Error::Msg(format!("cross-entropy: target {t} outside {classes} classes")));
    }
    Ok((logits, classes, targets))
}

/// The row's maximum and `sum(exp(row - max))`.
fn max_and_sum(row: &[f32]) -> (f32, f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (max, row.iter().map(|v| (v - max).exp()).sum())
}

/// Forward of [`cross_entropy`] on the CPU.
struct CrossEntropyCpu;

impl CustomOp2 for CrossEntropyCpu {
    fn name(&self) -> &'static str {
        "cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (logits, classes, targets) = rows(s1, l1, s2, l2)?;
        let total: f64 = logits
            .chunks_exact(classes)
            .zip(targets)
            .map(|(row, &t)| {
                let (max, sum) = max_and_sum(row);
                (sum.ln() + max - row[t as usize]) as f64
            })
            .sum();
        let mean = (total / targets.len() as f64) as f32;
        Ok((CpuStorage::F32(vec![mean]), Shape::from(())))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let g = logits.apply_op3_no_bwd(targets, &grad_res.contiguous()?, &CrossEntropyGrad)?;
        Ok((Some(g), None))
    }
}

/// `(softmax(row) - one_hot(target)) * g / rows` per row, from the logits,
/// the targets and the incoming (scalar) gradient `g`.
struct CrossEntropyGrad;

impl CustomOp3 for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "cross-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (logits, classes, targets) = rows(s1, l1, s2, l2)?;
        let &[g] = contiguous_f32(s3, l3, "cross-entropy", "gradient")? else {
            return Err(Error::Msg(format!("cross-entropy: gradient of shape {:?}", l3.dims())));
        };
        let scale = g / targets.len() as f32;
        let mut out = vec![0.0f32; logits.len()];
        for ((row, o), &t) in logits.chunks_exact(classes).zip(out.chunks_exact_mut(classes)).zip(targets) {
            // Each exponential once: into the output, then scaled.
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for (o, v) in o.iter_mut().zip(row) {
                *o = (v - max).exp();
                sum += *o;
            }
            let k = scale / sum;
            o.iter_mut().for_each(|o| *o *= k);
            o[t as usize] -= scale;
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::model::cpu_slice::max_diff;

    /// Loss and gradient agree with candle-nn's, scaled by an incoming
    /// gradient, for large and one-row batches and logits far from zero.
    #[test]
    fn matches_candle_nn() {
        let dev = Device::Cpu;
        for (rows, classes, spread) in [(32, 10, 1.0), (1, 3, 1.0), (200, 65, 30.0)] {
            let x = Var::from_tensor(&Tensor::randn(0f32, spread, (rows, classes), &dev).unwrap()).unwrap();
            let t: Vec<u32> = (0..rows as u32).map(|i| (i * 7 + 3) % classes as u32).collect();
            let t = Tensor::new(t.as_slice(), &dev).unwrap();
            let ours = cross_entropy(x.as_tensor(), &t).unwrap();
            let theirs = candle_nn::loss::cross_entropy(x.as_tensor(), &t).unwrap();
            let (a, b) = (ours.to_scalar::<f32>().unwrap(), theirs.to_scalar::<f32>().unwrap());
            assert!((a - b).abs() < 1e-5 * b.abs().max(1.0), "loss {a} against {b}");
            let ga = (ours * 3.0).unwrap().backward().unwrap();
            let gb = (theirs * 3.0).unwrap().backward().unwrap();
            let (ga, gb) = (ga.get(x.as_tensor()).unwrap(), gb.get(x.as_tensor()).unwrap());
            assert!(max_diff(ga, gb) < 1e-6, "gradients differ by {}", max_diff(ga, gb));
        }
    }

    /// A target past the classes, or a count of targets other than the
    /// rows, is an error.
    #[test]
    fn refuses_bad_targets() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        assert!(cross_entropy(&x, &Tensor::new(&[0u32, 2], &dev).unwrap()).is_ok());
        assert!(cross_entropy(&x, &Tensor::new(&[0u32, 3], &dev).unwrap()).is_err());
        assert!(cross_entropy(&x, &Tensor::new(&[0u32], &dev).unwrap()).is_err());
    }
}
