//! A large generated task in the digits CSV format (64 pixels 0..16 and a
//! label), read through the same file loader as real digits: the inputs are
//! correlated like images (a low-rank latent plus noise), the labels are
//! drawn from a fixed random teacher network, so the best achievable
//! held-out loss (the teacher's own entropy) is known and a model needs
//! many samples to approach it.

use std::{fmt::Write as _, io::Write as _, path::Path};

use ragtag_protocol::rng::SeededRng;

/// Pixels per example (the digits format).
const PIXELS: usize = 64;
/// Latent dimensions behind the pixels.
const LATENT: usize = 8;
/// Hidden units of the teacher.
const TEACHER_HIDDEN: usize = 32;
/// Classes.
const CLASSES: usize = 10;
/// Softmax temperature of the teacher's labels.
const TEMPERATURE: f64 = 0.25;

/// What was written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TeacherDigits {
    /// Rows written.
    pub rows: usize,
    /// Mean entropy of the teacher's label distribution over the held-out
    /// rows (every fifth): the lowest held-out loss any model can reach.
    pub floor: f64,
}

/// Writes `rows` examples to `path`, the same bytes for the same seed.
pub fn write(path: &Path, rows: usize, seed: u64) -> std::io::Result<TeacherDigits> {
    let mut rng = SeededRng::derive(seed, "teacher-digits");
    let mix: Vec<f64> = (0..PIXELS * LATENT).map(|_| rng.normal()).collect();
    let w1: Vec<f64> = (0..TEACHER_HIDDEN * PIXELS).map(|_| rng.normal() * 3.0 / (PIXELS as f64).sqrt()).collect();
    let b1: Vec<f64> = (0..TEACHER_HIDDEN).map(|_| rng.normal() * 0.5).collect();
    let w2: Vec<f64> =
        (0..CLASSES * TEACHER_HIDDEN).map(|_| rng.normal() * 2.5 / (TEACHER_HIDDEN as f64).sqrt()).collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let (mut entropy, mut held) = (0.0, 0usize);
    let mut line = String::new();
    for row in 0..rows {
        let z: Vec<f64> = (0..LATENT).map(|_| rng.normal()).collect();
        let pixels: Vec<u32> = (0..PIXELS)
            .map(|j| {
                let v: f64 = (0..LATENT).map(|k| mix[j * LATENT + k] * z[k]).sum::<f64>() / (LATENT as f64).sqrt();
                (8.0 + 4.0 * v + 1.5 * rng.normal()).round().clamp(0.0, 16.0) as u32
            })
            .collect();
        let x: Vec<f64> = pixels.iter().map(|p| *p as f64 / 16.0 - 0.5).collect();
        let h: Vec<f64> = (0..TEACHER_HIDDEN)
            .map(|i| (b1[i] + (0..PIXELS).map(|j| w1[i * PIXELS + j] * x[j]).sum::<f64>()).tanh())
            .collect();
        let logits: Vec<f64> = (0..CLASSES)
            .map(|c| (0..TEACHER_HIDDEN).map(|i| w2[c * TEACHER_HIDDEN + i] * h[i]).sum::<f64>() / TEMPERATURE)
            .collect();
        let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
        let total: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|v| v / total).collect();
        let mut u = rng.uniform();
        let label = p.iter().position(|pi| {
            u -= pi;
            u < 0.0
        });
        let label = label.unwrap_or(CLASSES - 1);
        if row % 5 == 0 {
            entropy -= p.iter().filter(|pi| **pi > 0.0).map(|pi| pi * pi.ln()).sum::<f64>();
            held += 1;
        }
        line.clear();
        for px in &pixels {
            let _ = write!(line, "{px},");
        }
        let _ = writeln!(line, "{label}");
        out.write_all(line.as_bytes())?;
    }
    out.flush()?;
    Ok(TeacherDigits { rows, floor: entropy / held.max(1) as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_in_the_digits_format() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
        let ta = write(&a, 500, 3).unwrap();
        write(&b, 500, 3).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert!(ta.floor > 0.0 && ta.floor < (CLASSES as f64).ln(), "floor {}", ta.floor);
        let text = std::fs::read_to_string(&a).unwrap();
        let labels: std::collections::BTreeSet<&str> = text.lines().map(|l| l.rsplit(',').next().unwrap()).collect();
        assert!(labels.len() >= 5, "labels {labels:?}");
        assert!(text.lines().all(|l| l.split(',').count() == PIXELS + 1));
    }
}
