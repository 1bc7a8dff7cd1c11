//! Memory planning: will the model and batch fit, and if not, which
//! micro-batch (with gradient accumulation, same effective batch) will.

use crate::{Error, Result};

/// Bytes the trainer needs: parameters, gradients, two AdamW moments and
/// an anchor copy (5 × 4 bytes per parameter), plus activations.
pub fn estimate_bytes(params: usize, activation_bytes_per_sample: u64, micro_batch: usize) -> u64 {
    5 * 4 * params as u64 + activation_bytes_per_sample * micro_batch as u64
}

/// Memory available to this process on the CPU (MemAvailable), if known.
pub fn available_cpu_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The largest micro-batch (a divisor of `batch`) whose estimate fits in
/// `budget` bytes; an error naming what to change when none does.
pub fn plan_micro_batch(params: usize, activation_bytes_per_sample: u64, batch: usize, budget: u64) -> Result<usize> {
    let mut micro = batch.max(1);
    loop {
        if estimate_bytes(params, activation_bytes_per_sample, micro) <= budget {
            return Ok(micro);
        }
        if micro == 1 {
            return Err(Error::Memory(format!(
                "the model needs about {} MiB even one sample at a time, and the device has {} MiB free: \
                 choose a smaller model in the manifest or a device with more memory",
                estimate_bytes(params, activation_bytes_per_sample, 1) >> 20,
                budget >> 20
            )));
        }
        micro = (1..micro).rev().find(|m| batch.is_multiple_of(*m)).unwrap_or(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_to_a_divisor_then_fails_clearly() {
        let params = 1000;
        let fixed = estimate_bytes(params, 0, 0);
        assert_eq!(plan_micro_batch(params, 100, 32, fixed + 3200).unwrap(), 32);
        assert_eq!(plan_micro_batch(params, 100, 32, fixed + 1600).unwrap(), 16);
        assert_eq!(plan_micro_batch(params, 100, 12, fixed + 500).unwrap(), 4);
        let e = plan_micro_batch(params, 100, 32, fixed + 50).unwrap_err();
        assert!(e.to_string().contains("smaller model"), "{e}");
        assert!(available_cpu_bytes().is_some_and(|b| b > 0));
    }
}
