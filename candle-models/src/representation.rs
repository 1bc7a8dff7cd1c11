//! How alike two models see the same inputs: linear CKA (centred kernel
//! alignment, Kornblith et al. 2019) between their hidden representations
//! of one probe batch. Parameter distance says how far a straggler's model
//! moved; CKA says whether what its layers compute moved with it (it is
//! blind to rotations and scalings of a layer that leave the function
//! alike).

use candle_core::{DType, Tensor};

use crate::Result;

/// Linear CKA of two representations of the same `n` inputs, `x` of shape
/// `[n, p]` and `y` of shape `[n, q]`: 1 when one is an orthogonal map and
/// scaling of the other, near 0 when unrelated. `None` when either is
/// constant over the inputs (no variance to compare) or `n` differs.
pub fn linear_cka(x: &Tensor, y: &Tensor) -> Result<Option<f64>> {
    let (n, p) = x.dims2()?;
    let (m, q) = y.dims2()?;
    if n != m || n < 2 {
        return Ok(None);
    }
    let centre = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_dtype(DType::F64)?;
        Ok(t.broadcast_sub(&t.mean_keepdim(0)?)?)
    };
    let (x, y) = (centre(x)?, centre(y)?);
    let sq = |t: &Tensor| -> Result<f64> { Ok(t.sqr()?.sum_all()?.to_scalar::<f64>()?) };
    // Both forms give the same value; the cheaper one has the smaller
    // inner dimension (features when there are more inputs than features,
    // Gram matrices of the inputs otherwise).
    let (cross, xx, yy) = if n > p.max(q) {
        (sq(&y.t()?.matmul(&x)?)?, sq(&x.t()?.matmul(&x)?)?, sq(&y.t()?.matmul(&y)?)?)
    } else {
        let (k, l) = (x.matmul(&x.t()?)?, y.matmul(&y.t()?)?);
        ((&k * &l)?.sum_all()?.to_scalar::<f64>()?, sq(&k)?, sq(&l)?)
    };
    let denominator = (xx * yy).sqrt();
    Ok((denominator > 0.0 && denominator.is_finite()).then(|| cross / denominator))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn random(n: usize, p: usize, seed: u64) -> Tensor {
        let mut rng = ragtag_protocol::rng::SeededRng::new(seed);
        let v: Vec<f32> = (0..n * p).map(|_| rng.normal() as f32).collect();
        Tensor::from_vec(v, (n, p), &Device::Cpu).unwrap()
    }

    #[test]
    fn a_representation_is_alike_to_itself_rotated_and_scaled() {
        let x = random(64, 8, 1);
        assert!((linear_cka(&x, &x).unwrap().unwrap() - 1.0).abs() < 1e-9);
        // A permutation of the features with a sign flip, scaled: the same
        // representation to CKA.
        let y = Tensor::cat(&[x.narrow(1, 4, 4).unwrap(), x.narrow(1, 0, 4).unwrap().neg().unwrap()], 1).unwrap();
        let y = (y * 3.0).unwrap();
        assert!((linear_cka(&x, &y).unwrap().unwrap() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn unrelated_representations_are_far_apart_and_both_forms_agree() {
        // More inputs than features (feature form) and fewer (Gram form).
        for (n, p) in [(256, 4), (16, 64)] {
            let (x, y) = (random(n, p, 2), random(n, p, 3));
            let c = linear_cka(&x, &y).unwrap().unwrap();
            let mixed = ((&x * 0.9).unwrap() + (&y * 0.1).unwrap()).unwrap();
            let close = linear_cka(&x, &mixed).unwrap().unwrap();
            assert!(c < close && close < 1.0, "n {n} p {p}: unrelated {c}, close {close}");
        }
        let (x, y) = (random(40, 30, 4), random(40, 30, 5));
        let (feature, gram) = (linear_cka(&x, &y).unwrap().unwrap(), {
            // The same inputs with more features than inputs: force the
            // Gram form by padding with zero columns (which change nothing).
            let pad = Tensor::zeros((40, 20), DType::F32, &Device::Cpu).unwrap();
            linear_cka(&Tensor::cat(&[&x, &pad], 1).unwrap(), &Tensor::cat(&[&y, &pad], 1).unwrap()).unwrap().unwrap()
        });
        assert!((feature - gram).abs() < 1e-9, "{feature} against {gram}");
    }

    #[test]
    fn a_constant_representation_has_no_similarity() {
        let x = random(32, 4, 6);
        let flat = Tensor::ones((32, 4), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(linear_cka(&x, &flat).unwrap(), None);
        assert_eq!(linear_cka(&x, &random(16, 4, 7)).unwrap(), None, "different inputs");
    }
}
