//! A seeded first-order Markov chain over characters: language-like data
//! whose entropy rate is known exactly, so reports can show the distance
//! to the optimum.

use ragtag_protocol::rng::SeededRng;

use super::{Batch, Inputs};

/// Transition probabilities with `branching` successors per state.
#[derive(Debug)]
pub struct MarkovChain {
    vocab: usize,
    /// `succ[s]` = (next state, cumulative probability).
    succ: Vec<Vec<(u32, f64)>>,
    stationary: Vec<f64>,
}

impl MarkovChain {
    /// A chain drawn from `seed`.
    pub fn new(vocab: usize, branching: usize, seed: u64) -> Self {
        let mut rng = SeededRng::derive(seed, "markov");
        let branching = branching.clamp(1, vocab);
        let succ = (0..vocab)
            .map(|_| {
                let mut states: Vec<u32> = (0..vocab as u32).collect();
                rng.shuffle(&mut states);
                let weights: Vec<f64> = (0..branching).map(|_| rng.uniform_range(0.05, 1.0).powi(2)).collect();
                let z: f64 = weights.iter().sum();
                let mut acc = 0.0;
                states[..branching]
                    .iter()
                    .zip(weights)
                    .map(|(s, w)| {
                        acc += w / z;
                        (*s, acc)
                    })
                    .collect()
            })
            .collect();
        let mut chain = Self { vocab, succ, stationary: vec![1.0 / vocab as f64; vocab] };
        chain.stationary = chain.compute_stationary();
        chain
    }

    fn probs(&self, s: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let mut prev = 0.0;
        self.succ[s].iter().map(move |(t, c)| {
            let p = c - prev;
            prev = *c;
            (*t as usize, p)
        })
    }

    fn compute_stationary(&self) -> Vec<f64> {
        // Lazy power iteration (converges for aperiodic and periodic chains).
        let mut pi = vec![1.0 / self.vocab as f64; self.vocab];
        for _ in 0..2000 {
            let mut next = vec![0.0; self.vocab];
            for (s, mass) in pi.iter().enumerate() {
                for (t, p) in self.probs(s) {
                    next[t] += mass * p;
                }
            }
            for (n, p) in next.iter_mut().zip(&pi) {
                *n = 0.5 * *n + 0.5 * p;
            }
            pi = next;
        }
        pi
    }

    /// The entropy rate in nats per character: `sum_s pi(s) H(P(.|s))`.
    pub fn entropy_rate(&self) -> f64 {
        (0..self.vocab)
            .map(|s| {
                self.stationary[s] * self.probs(s).filter(|(_, p)| *p > 0.0).map(|(_, p)| -p * p.ln()).sum::<f64>()
            })
            .sum()
    }

    /// Entropy of the stationary distribution: the best loss of a model
    /// that ignores context (the chain's unigram entropy).
    pub fn stationary_entropy(&self) -> f64 {
        self.stationary.iter().filter(|p| **p > 0.0).map(|p| -p * p.ln()).sum()
    }

    fn step(&self, s: usize, rng: &mut SeededRng) -> usize {
        let u = rng.uniform();
        let succ = &self.succ[s];
        succ.iter().find(|(_, c)| u < *c).unwrap_or(succ.last().expect("branching >= 1")).0 as usize
    }

    fn start(&self, rng: &mut SeededRng) -> usize {
        let u = rng.uniform();
        let mut acc = 0.0;
        self.stationary
            .iter()
            .position(|p| {
                acc += p;
                u < acc
            })
            .unwrap_or(self.vocab - 1)
    }

    /// `n` sequences of `context` inputs with next-character targets.
    pub fn batch(&self, n: usize, context: usize, rng: &mut SeededRng) -> Batch {
        let mut data = Vec::with_capacity(n * context);
        let mut targets = Vec::with_capacity(n * context);
        for _ in 0..n {
            let mut s = self.start(rng);
            for _ in 0..context {
                data.push(s as u32);
                s = self.step(s, rng);
                targets.push(s as u32);
            }
        }
        Batch { inputs: Inputs::Tokens { data, len: context }, targets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empirical_entropy_matches_the_rate() {
        let c = MarkovChain::new(12, 3, 4);
        let h = c.entropy_rate();
        assert!(h > 0.0 && h < (3f64).ln() + 1e-9, "rate {h}");
        let mut rng = SeededRng::new(1);
        let b = c.batch(200, 100, &mut rng);
        let Inputs::Tokens { data, .. } = &b.inputs else { unreachable!() };
        let mut nll = 0.0;
        for (s, t) in data.iter().zip(&b.targets) {
            let p = c.probs(*s as usize).find(|(x, _)| *x == *t as usize).map(|(_, p)| p).unwrap();
            nll -= p.ln();
        }
        let emp = nll / b.targets.len() as f64;
        assert!((emp - h).abs() < 0.05, "empirical {emp} vs rate {h}");
        assert!(c.stationary_entropy() > h);
    }
}
