//! The benchmarks behind BENCHMARKS.md: each measures a figure together
//! with a baseline in the same run and reports the ratio.

pub mod apply;
pub mod augmented_digits;
pub mod error;
pub mod ledger;
pub mod machine;
pub mod simulate;
pub mod soak;
pub mod suite;
pub mod teacher_digits;
pub mod traffic;
pub mod trainer;
pub mod transfer;
pub mod versus_ddp;

use std::sync::atomic::{AtomicUsize, Ordering};

/// One measured figure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figure {
    /// Which benchmark.
    pub section: String,
    /// What was measured.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Against the section's baseline (value and what it means).
    pub ratio: Option<(f64, String)>,
    /// Anything else worth knowing.
    pub note: String,
}

impl Figure {
    /// A figure without ratio or note.
    pub fn new(section: &str, name: &str, value: f64, unit: &str) -> Self {
        Self { section: section.into(), name: name.into(), value, unit: unit.into(), ratio: None, note: String::new() }
    }

    /// With a ratio against the baseline.
    pub fn with_ratio(mut self, ratio: f64, meaning: &str) -> Self {
        self.ratio = Some((ratio, meaning.into()));
        self
    }

    /// With a note.
    pub fn with_note(mut self, note: String) -> Self {
        self.note = note;
        self
    }
}

/// The median of some samples.
pub fn median(samples: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = samples.collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Allocations counted by [`CountingAllocator`] (when installed).
pub fn alloc_count() -> &'static AtomicUsize {
    &ALLOCATIONS
}

/// A global allocator that counts allocations (the benchmark binary
/// installs it to check "no allocation per update").
#[derive(Debug)]
pub struct CountingAllocator;

#[allow(unsafe_code)]
// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

/// Renders figures as a markdown table.
pub fn table(figures: &[Figure]) -> String {
    let mut out = String::from("| measurement | value | ratio | notes |\n| --- | ---: | ---: | --- |\n");
    for f in figures {
        let ratio = f.ratio.as_ref().map_or_else(|| "—".to_string(), |(r, m)| format!("{r:.2} {m}"));
        out.push_str(&format!("| {} | {:.3} {} | {} | {} |\n", f.name, f.value, f.unit, ratio, f.note));
    }
    out
}
