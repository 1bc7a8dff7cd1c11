//! Outer optimisers: how a received pseudo-gradient moves the anchor.
//!
//! Every optimiser reads the payload once, chunk by chunk, and fuses
//! decoding, weighting and application: no allocation per update.

use serde::{Deserialize, Serialize};

use super::config::{OuterConfig, OuterKind};
use crate::codec::Payload;

/// The outer optimiser's state (part of the shared replica state).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OuterState {
    /// Outer momentum `mu` (Nesterov kinds) or AdamW's first moment.
    pub momentum: Vec<f32>,
    /// Delayed-Nesterov / AdamW accumulation buffer.
    pub buffer: Vec<f32>,
    /// AdamW second moment (empty for other kinds).
    pub second_moment: Vec<f32>,
    /// Arrivals in the buffer.
    pub count: u32,
    /// Completed outer rounds (groups of N arrivals).
    pub outer_rounds: u64,
    /// Momentum restarts.
    #[serde(default)]
    pub restarts: u64,
}

/// Most outer rounds a state may claim: AdamW's bias correction takes the
/// count as an `i32` exponent, and a forged count past it would turn the
/// anchor into NaN (a billion rounds is more than any run reaches).
pub const MAX_OUTER_ROUNDS: u64 = 1 << 30;

impl OuterState {
    /// Zero state for `n` parameters.
    pub fn new(kind: OuterKind, n: usize) -> Self {
        let (m, b, v) = Self::lengths(kind, n);
        Self {
            momentum: vec![0.0; m],
            buffer: vec![0.0; b],
            second_moment: vec![0.0; v],
            count: 0,
            outer_rounds: 0,
            restarts: 0,
        }
    }

    /// Lengths of (momentum, buffer, second moment) that `kind` needs.
    fn lengths(kind: OuterKind, n: usize) -> (usize, usize, usize) {
        match kind {
            OuterKind::Sgd => (0, 0, 0),
            OuterKind::Nesterov => (n, 0, 0),
            OuterKind::DelayedNesterov => (n, n, 0),
            OuterKind::AdamW => (n, n, n),
        }
    }

    /// True when the state's vectors fit `n` parameters under `kind`
    /// (checked on state received from a peer).
    pub fn fits(&self, kind: OuterKind, n: usize) -> bool {
        let all_finite =
            [&self.momentum, &self.buffer, &self.second_moment].iter().all(|v| v.iter().all(|x| x.is_finite()));
        Self::lengths(kind, n) == (self.momentum.len(), self.buffer.len(), self.second_moment.len())
            && all_finite
            && self.outer_rounds <= MAX_OUTER_ROUNDS
    }

    /// The outer learning rate after warm-up.
    pub fn effective_eta(&self, cfg: &OuterConfig) -> f32 {
        if cfg.warmup_rounds == 0 {
            return cfg.eta;
        }
        let ramp = ((self.outer_rounds + 1) as f32 / cfg.warmup_rounds as f32).min(1.0);
        cfg.eta * ramp
    }

    /// Applies one update `g` with weight `w` (`n` = live node count) and
    /// closes the outer round once `n` arrivals are in. Returns true when
    /// this arrival closed an outer round.
    pub fn apply(&mut self, cfg: &OuterConfig, x: &mut [f32], g: &Payload<'_>, w: f32, n: u32) -> bool {
        self.accumulate(cfg, x, g, w, n);
        self.count >= n.max(1) && self.close_round(cfg, x, n)
    }

    /// The per-arrival part of the outer step: for SGD and delayed
    /// Nesterov `x -= eta / N * w * g`; the momentum part waits for
    /// [`OuterState::close_round`].
    pub fn accumulate(&mut self, cfg: &OuterConfig, x: &mut [f32], g: &Payload<'_>, w: f32, n: u32) {
        debug_assert_eq!(g.len(), x.len());
        let eta = self.effective_eta(cfg);
        let inv_n = 1.0 / n.max(1) as f32;
        self.count += 1;
        match cfg.kind {
            OuterKind::Sgd => {
                let c = eta * inv_n * w;
                g.for_each_chunk(|s, v| {
                    for (xi, vi) in x[s..s + v.len()].iter_mut().zip(v) {
                        *xi -= c * vi;
                    }
                });
            }
            OuterKind::Nesterov => {
                // Naive per-arrival Nesterov: mu = beta mu + w g / N; x -= eta (w g / N + beta mu).
                let beta = cfg.beta;
                for m in self.momentum.iter_mut() {
                    *m *= beta;
                }
                let c = w * inv_n;
                let mu = &mut self.momentum;
                g.for_each_chunk(|s, v| {
                    let r = s..s + v.len();
                    for ((xi, mi), vi) in x[r.clone()].iter_mut().zip(&mut mu[r]).zip(v) {
                        *mi += c * vi;
                        *xi -= eta * c * vi;
                    }
                });
                let eb = eta * beta;
                for (xi, mi) in x.iter_mut().zip(mu.iter()) {
                    *xi -= eb * mi;
                }
            }
            OuterKind::DelayedNesterov => {
                let c = eta * inv_n * w;
                let buf = &mut self.buffer;
                g.for_each_chunk(|s, v| {
                    let r = s..s + v.len();
                    for ((xi, bi), vi) in x[r.clone()].iter_mut().zip(&mut buf[r]).zip(v) {
                        *xi -= c * vi;
                        *bi += w * vi;
                    }
                });
            }
            OuterKind::AdamW => {
                let buf = &mut self.buffer;
                g.for_each_chunk(|s, v| {
                    for (bi, vi) in buf[s..s + v.len()].iter_mut().zip(v) {
                        *bi += w * vi;
                    }
                });
            }
        }
    }

    /// Closes the outer round: delayed Nesterov's momentum step
    /// (`mu = beta mu + buf / N; x -= eta beta mu`) or AdamW's step on the
    /// mean gradient. Returns false when nothing arrived since the last close.
    pub fn close_round(&mut self, cfg: &OuterConfig, x: &mut [f32], n: u32) -> bool {
        if self.count == 0 {
            return false;
        }
        let eta = self.effective_eta(cfg);
        match cfg.kind {
            OuterKind::Sgd | OuterKind::Nesterov => {}
            OuterKind::DelayedNesterov => {
                let beta = cfg.beta;
                let eb = eta * beta;
                let inv = 1.0 / n.max(1) as f32;
                if let Some(threshold) = cfg.restart_below {
                    // Gradient-based adaptive restart (O'Donoghue & Candes):
                    // a round's pseudo-gradient that opposes the momentum
                    // (cosine below the threshold) means the momentum is
                    // overshooting: drop it.
                    let (mut dot, mut nb, mut nm) = (0.0f64, 0.0f64, 0.0f64);
                    for (b, m) in self.buffer.iter().zip(&self.momentum) {
                        dot += (*b as f64) * (*m as f64);
                        nb += (*b as f64).powi(2);
                        nm += (*m as f64).powi(2);
                    }
                    if nb > 0.0 && nm > 0.0 && dot / (nb.sqrt() * nm.sqrt()) < threshold as f64 {
                        self.momentum.iter_mut().for_each(|m| *m = 0.0);
                        self.restarts += 1;
                    }
                }
                for ((xi, mi), bi) in x.iter_mut().zip(self.momentum.iter_mut()).zip(self.buffer.iter_mut()) {
                    *mi = beta * *mi + *bi * inv;
                    *xi -= eb * *mi;
                    *bi = 0.0;
                }
            }
            OuterKind::AdamW => {
                self.adamw_step(cfg, eta, x);
                return true;
            }
        }
        self.count = 0;
        self.outer_rounds += 1;
        true
    }

    /// One AdamW step on the mean of the buffered gradients.
    fn adamw_step(&mut self, cfg: &OuterConfig, lr: f32, x: &mut [f32]) {
        let inv = 1.0 / self.count.max(1) as f32;
        let mut norm_sq = 0.0f64;
        for b in self.buffer.iter_mut() {
            *b *= inv;
            norm_sq += (*b as f64) * (*b as f64);
        }
        let scale = if cfg.clip > 0.0 && norm_sq.sqrt() > cfg.clip as f64 {
            (cfg.clip as f64 / norm_sq.sqrt()) as f32
        } else {
            1.0
        };
        self.outer_rounds += 1;
        let t = self.outer_rounds as i32;
        let (b1, b2) = (cfg.beta, cfg.beta2);
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        let decay = 1.0 - lr * cfg.weight_decay;
        for (((xi, mi), vi), gi) in
            x.iter_mut().zip(self.momentum.iter_mut()).zip(self.second_moment.iter_mut()).zip(self.buffer.iter_mut())
        {
            let g = *gi * scale;
            *mi = b1 * *mi + (1.0 - b1) * g;
            *vi = b2 * *vi + (1.0 - b2) * g * g;
            let mhat = *mi / bc1;
            let vhat = *vi / bc2;
            *xi = *xi * decay - lr * mhat / (vhat.sqrt() + 1e-8);
            *gi = 0.0;
        }
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{codec::CodecKind, codec::encode, rng::SeededRng};

    fn payload_bytes(v: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(CodecKind::F32, v, &mut out);
        out
    }

    fn cfg(kind: OuterKind) -> OuterConfig {
        OuterConfig {
            kind,
            eta: 0.7,
            beta: 0.9,
            beta2: 0.95,
            weight_decay: 0.0,
            clip: 0.0,
            warmup_rounds: 0,
            restart_below: None,
            beta_early: None,
        }
    }

    /// With no staleness and fixed membership, N arrivals under delayed
    /// Nesterov equal one DiLoCo Nesterov step on the mean pseudo-gradient.
    #[test]
    fn delayed_nesterov_equals_diloco_nesterov() {
        let n_params = 257;
        let nodes = 4;
        let mut r = SeededRng::new(9);
        let c = cfg(OuterKind::DelayedNesterov);
        let mut x: Vec<f32> = (0..n_params).map(|_| r.normal() as f32).collect();
        let mut x_ref = x.clone();
        let mut mu_ref = vec![0.0f32; n_params];
        let mut st = OuterState::new(OuterKind::DelayedNesterov, n_params);
        for _round in 0..5 {
            let gs: Vec<Vec<f32>> =
                (0..nodes).map(|_| (0..n_params).map(|_| r.normal() as f32 * 0.1).collect()).collect();
            for g in &gs {
                let b = payload_bytes(g);
                st.apply(&c, &mut x, &Payload::parse(CodecKind::F32, n_params, &b).unwrap(), 1.0, nodes as u32);
            }
            // DiLoCo reference: g = mean; mu = beta mu + g; x -= eta (g + beta mu).
            for i in 0..n_params {
                let g: f32 = gs.iter().map(|g| g[i]).sum::<f32>() / nodes as f32;
                mu_ref[i] = 0.9 * mu_ref[i] + g;
                x_ref[i] -= 0.7 * (g + 0.9 * mu_ref[i]);
            }
        }
        for i in 0..n_params {
            assert!((x[i] - x_ref[i]).abs() <= 1e-5 * (1.0 + x_ref[i].abs()), "{i}: {} vs {}", x[i], x_ref[i]);
        }
        assert_eq!(st.outer_rounds, 5);
    }

    #[test]
    fn sgd_averages_and_adamw_steps_once_per_group() {
        let c = cfg(OuterKind::Sgd);
        let mut x = vec![1.0f32; 3];
        let mut st = OuterState::new(OuterKind::Sgd, 3);
        for g in [[1.0f32, 0.0, 2.0], [3.0, 0.0, 2.0]] {
            let b = payload_bytes(&g);
            st.apply(&c, &mut x, &Payload::parse(CodecKind::F32, 3, &b).unwrap(), 1.0, 2);
        }
        // x - eta * mean = 1 - 0.7 * [2, 0, 2]
        assert!((x[0] - (1.0 - 1.4)).abs() < 1e-6 && x[1] == 1.0 && (x[2] + 0.4).abs() < 1e-6);

        let a = OuterConfig { kind: OuterKind::AdamW, eta: 0.1, ..cfg(OuterKind::AdamW) };
        let mut x = vec![0.0f32; 2];
        let mut st = OuterState::new(OuterKind::AdamW, 2);
        let b = payload_bytes(&[1.0, -1.0]);
        let p = Payload::parse(CodecKind::F32, 2, &b).unwrap();
        assert!(!st.apply(&a, &mut x, &p, 1.0, 2));
        assert_eq!(x, vec![0.0, 0.0]);
        assert!(st.apply(&a, &mut x, &p, 1.0, 2));
        // The first Adam step moves each coordinate by ~lr against the gradient sign.
        assert!((x[0] + 0.1).abs() < 1e-4 && (x[1] - 0.1).abs() < 1e-4, "{x:?}");
    }

    #[test]
    fn restart_drops_momentum_that_opposes_the_new_round() {
        let c = OuterConfig { restart_below: Some(0.0), ..cfg(OuterKind::DelayedNesterov) };
        let mut x = vec![0.0f32; 2];
        let mut st = OuterState::new(OuterKind::DelayedNesterov, 2);
        let push = |st: &mut OuterState, x: &mut Vec<f32>, g: [f32; 2]| {
            let b = payload_bytes(&g);
            st.apply(&c, x, &Payload::parse(CodecKind::F32, 2, &b).unwrap(), 1.0, 1);
        };
        push(&mut st, &mut x, [1.0, 1.0]);
        push(&mut st, &mut x, [1.0, 0.5]);
        assert_eq!(st.restarts, 0);
        push(&mut st, &mut x, [-1.0, -1.0]);
        assert_eq!(st.restarts, 1);
        // After the restart the momentum is exactly this round's pseudo-gradient.
        assert_eq!(st.momentum, vec![-1.0, -1.0]);
    }

    #[test]
    fn warmup_ramps_eta() {
        let c = OuterConfig { warmup_rounds: 10, ..cfg(OuterKind::Sgd) };
        let mut st = OuterState::new(OuterKind::Sgd, 1);
        assert!((st.effective_eta(&c) - 0.07).abs() < 1e-6);
        st.outer_rounds = 9;
        assert_eq!(st.effective_eta(&c), 0.7);
    }
}
