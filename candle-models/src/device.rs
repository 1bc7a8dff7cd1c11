//! Device selection: `auto | cpu | cuda[:N] | metal`.
//!
//! GPU back ends are opt-in cargo features (`cuda`, `metal`); `auto` takes
//! the best one compiled in and present, and falls back to the CPU with a
//! log line saying why.

use std::{fmt, str::FromStr};

use candle_core::Device;

use crate::{Error, Result};

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The best available.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA GPU with this ordinal.
    Cuda(usize),
    /// Apple Metal.
    Metal,
}

/// A device name `DeviceChoice` does not know: users type these by hand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown device {0:?}: use auto, cpu, cuda, cuda:N or metal")]
pub struct UnknownDevice(pub String);

impl FromStr for DeviceChoice {
    type Err = UnknownDevice;
    fn from_str(s: &str) -> std::result::Result<Self, UnknownDevice> {
        match s.trim() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            "metal" => Ok(DeviceChoice::Metal),
            other => match other.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(n)) => Ok(DeviceChoice::Cuda(n)),
                _ => Err(UnknownDevice(other.to_string())),
            },
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceChoice::Metal => f.write_str("metal"),
        }
    }
}

/// How many malloc arenas a process keeps ([`prepare_cpu_process`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arenas {
    /// One arena shared by every thread: a node's free memory does not grow
    /// with its threads (a long-lived process on a volunteer's machine).
    One,
    /// glibc's default, an arena per thread up to eight per core: the
    /// simulator allocates on every core at once, and one arena's lock
    /// put its 1,000-node run in futex waits (746 s against 1,015 s;
    /// BENCHMARKS.md, "1,000 nodes: memory and the allocator's lock").
    /// The simulator's own allocations now go through mimalloc; this
    /// still governs what its C libraries allocate.
    PerThread,
}

/// Sets up a process that trains on the CPU; call it first thing in
/// `main`. Two things cost more than a small model's arithmetic otherwise:
///
/// - candle asks for its thread count on every matrix product and, unless
///   `RAYON_NUM_THREADS` is set, reads /proc/cpuinfo each time (a fifth of
///   the digits CNN's step). A value the user set is left alone.
/// - glibc's malloc maps and unmaps each tensor of megabytes a step
///   allocates and frees, and grows and trims its heap as it goes: the page
///   faults and TLB shootdowns took more time than the arithmetic. So:
///   `arenas`, blocks up to 32 MiB from the heap, 32 MiB of slack kept at
///   its top.
///   The char transformer's step halves against the 64 KiB mmap and
///   128 KiB trim thresholds the node set before; a 16-process soak holds
///   more memory per process but grows no faster (BENCHMARKS.md, "Training
///   step on the CPU vs JAX").
///
/// # Safety
/// Sets an environment variable and the allocator's parameters: call it
/// before the process starts any other thread.
#[allow(unsafe_code)]
pub unsafe fn prepare_cpu_process(arenas: Arenas) {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        // SAFETY: the caller promises no other thread exists yet.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let one_arena = (arenas == Arenas::One).then_some((libc::M_ARENA_MAX, 1));
        let heap =
            [(libc::M_MMAP_THRESHOLD, 32 << 20), (libc::M_TRIM_THRESHOLD, 32 << 20), (libc::M_TOP_PAD, 32 << 20)];
        for (param, value) in heap.into_iter().chain(one_arena) {
            // SAFETY: mallopt only sets allocator parameters; no other
            // thread allocates yet.
            unsafe { libc::mallopt(param, value) };
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// A selected device and a description for logs and status.
#[derive(Clone, Debug)]
pub struct SelectedDevice {
    /// The candle device.
    pub device: Device,
    /// "cpu (2 threads)", "cuda:0", ...
    pub description: String,
    /// Why `auto` did not pick a GPU, if it did not.
    pub fallback_reason: Option<String>,
}

fn cpu(reason: Option<String>) -> SelectedDevice {
    SelectedDevice {
        device: Device::Cpu,
        description: format!("cpu ({} threads)", candle_core::utils::get_num_threads()),
        fallback_reason: reason,
    }
}

/// The first line of a device error: candle's may carry a backtrace.
#[cfg(any(feature = "cuda", feature = "metal"))]
fn first_line(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

#[cfg(feature = "cuda")]
fn cuda(n: usize) -> Result<SelectedDevice> {
    let device = Device::new_cuda(n).map_err(|e| Error::Device(format!("cuda:{n}: {}", first_line(&e))))?;
    Ok(SelectedDevice { device, description: format!("cuda:{n}"), fallback_reason: None })
}

#[cfg(not(feature = "cuda"))]
fn cuda(n: usize) -> Result<SelectedDevice> {
    Err(Error::Device(format!("cuda:{n} requested, but this build has no CUDA support (rebuild with --features cuda)")))
}

#[cfg(feature = "metal")]
fn metal() -> Result<SelectedDevice> {
    let device = Device::new_metal(0).map_err(|e| Error::Device(format!("metal: {}", first_line(&e))))?;
    Ok(SelectedDevice { device, description: "metal".into(), fallback_reason: None })
}

#[cfg(not(feature = "metal"))]
fn metal() -> Result<SelectedDevice> {
    Err(Error::Device("metal requested, but this build has no Metal support (rebuild with --features metal)".into()))
}

/// Selects a device. `auto` never fails: it falls back to the CPU.
pub fn select(choice: DeviceChoice) -> Result<SelectedDevice> {
    match choice {
        DeviceChoice::Cpu => Ok(cpu(None)),
        DeviceChoice::Cuda(n) => cuda(n),
        DeviceChoice::Metal => metal(),
        DeviceChoice::Auto => {
            let mut reasons = Vec::new();
            match cuda(0) {
                Ok(d) => return Ok(d),
                Err(e) => reasons.push(e.to_string()),
            }
            match metal() {
                Ok(d) => return Ok(d),
                Err(e) => reasons.push(e.to_string()),
            }
            let reason = format!("no GPU available ({}); training on the CPU", reasons.join("; "));
            Ok(cpu(Some(reason)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for s in ["auto", "cpu", "cuda:0", "cuda:3", "metal"] {
            let c: DeviceChoice = s.parse().unwrap();
            assert_eq!(c.to_string(), s);
        }
        assert_eq!("cuda".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cuda(0));
        assert!("tpu".parse::<DeviceChoice>().is_err());
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn auto_always_gives_a_device() {
        let d = select(DeviceChoice::Auto).unwrap();
        if !cfg!(any(feature = "cuda", feature = "metal")) {
            assert!(d.device.is_cpu());
            assert!(d.fallback_reason.is_some());
        }
    }
}
