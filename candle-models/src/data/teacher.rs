//! The teacher task: Gaussian inputs labelled by sampling from a fixed
//! random teacher network's softmax. The best any model can do is the
//! teacher's own expected loss (the entropy of its predictions): a known
//! floor to measure against.

use ragtag_protocol::rng::SeededRng;

use super::{Batch, Inputs};

/// A fixed random one-hidden-layer tanh network.
#[derive(Debug)]
pub struct Teacher {
    inputs: usize,
    hidden: usize,
    classes: usize,
    w1: Vec<f32>,
    w2: Vec<f32>,
    inv_temperature: f32,
}

impl Teacher {
    /// A teacher drawn from `seed`.
    pub fn new(inputs: usize, hidden: usize, classes: usize, temperature: f32, seed: u64) -> Self {
        let mut rng = SeededRng::derive(seed, "teacher");
        let s1 = 1.0 / (inputs as f64).sqrt();
        let s2 = 2.0 / (hidden as f64).sqrt();
        let w1 = (0..hidden * inputs).map(|_| (rng.normal() * s1) as f32).collect();
        let w2 = (0..classes * hidden).map(|_| (rng.normal() * s2) as f32).collect();
        Self { inputs, hidden, classes, w1, w2, inv_temperature: 1.0 / temperature.max(1e-3) }
    }

    /// Class probabilities for one input.
    pub fn probabilities(&self, x: &[f32]) -> Vec<f32> {
        let h: Vec<f32> = (0..self.hidden)
            .map(|j| {
                self.w1[j * self.inputs..(j + 1) * self.inputs].iter().zip(x).map(|(w, v)| w * v).sum::<f32>().tanh()
            })
            .collect();
        let logits: Vec<f32> = (0..self.classes)
            .map(|c| {
                self.w2[c * self.hidden..(c + 1) * self.hidden].iter().zip(&h).map(|(w, v)| w * v).sum::<f32>()
                    * self.inv_temperature
            })
            .collect();
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let z: f32 = exp.iter().sum();
        exp.into_iter().map(|e| e / z).collect()
    }

    /// `n` samples: inputs from N(0, I), labels drawn from the teacher.
    pub fn batch(&self, n: usize, rng: &mut SeededRng) -> Batch {
        let mut data = Vec::with_capacity(n * self.inputs);
        let mut targets = Vec::with_capacity(n);
        for _ in 0..n {
            let x: Vec<f32> = (0..self.inputs).map(|_| rng.normal() as f32).collect();
            let p = self.probabilities(&x);
            let u = rng.uniform() as f32;
            let mut acc = 0.0;
            let label = p.iter().position(|pi| {
                acc += pi;
                u < acc
            });
            targets.push(label.unwrap_or(self.classes - 1) as u32);
            data.extend(x);
        }
        Batch { inputs: Inputs::Features { data, width: self.inputs }, targets }
    }

    /// The teacher's expected cross-entropy on these inputs: the mean
    /// entropy of its predictions (nats). No model can beat it in expectation.
    pub fn bayes_loss(&self, batch: &Batch) -> f32 {
        let Inputs::Features { data, width } = &batch.inputs else { return f32::NAN };
        let n = data.len() / width;
        let total: f64 = data
            .chunks(*width)
            .map(|x| {
                self.probabilities(x).iter().filter(|p| **p > 0.0).map(|p| -(*p as f64) * (*p as f64).ln()).sum::<f64>()
            })
            .sum();
        (total / n.max(1) as f64) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_teacher_and_floor_is_below_uniform() {
        let t = Teacher::new(8, 16, 4, 0.5, 1);
        let mut rng = SeededRng::new(2);
        let b = t.batch(4000, &mut rng);
        let floor = t.bayes_loss(&b);
        assert!(floor > 0.0 && floor < (4f32).ln(), "floor {floor}");
        // Empirical cross-entropy of the teacher on its own labels ~ its entropy.
        let Inputs::Features { data, width } = &b.inputs else { unreachable!() };
        let ce: f64 = data
            .chunks(*width)
            .zip(&b.targets)
            .map(|(x, y)| -(t.probabilities(x)[*y as usize] as f64).ln())
            .sum::<f64>()
            / 4000.0;
        assert!((ce as f32 - floor).abs() < 0.05, "ce {ce} floor {floor}");
    }
}
