//! Applying an update (decode + weight + outer step) on a 5M-parameter
//! buffer, against a plain memcpy of the same buffer in the same run.

use std::{sync::atomic::Ordering, time::Instant};

use ragtag_protocol::{
    codec::{CodecKind, Payload, encode},
    engine::{OuterConfig, OuterKind, outer::OuterState},
    rng::SeededRng,
};

use super::{Figure, alloc_count, median};

/// Parameters of the buffer (the transformer's size bound).
pub const PARAMS: usize = 5_000_000;

/// Runs the benchmark; `reps` timed repetitions each.
pub fn run(reps: usize) -> Vec<Figure> {
    let mut rng = SeededRng::new(1);
    let g: Vec<f32> = (0..PARAMS).map(|_| rng.normal() as f32 * 1e-3).collect();
    let mut x: Vec<f32> = (0..PARAMS).map(|_| rng.normal() as f32).collect();
    let src = x.clone();
    let mut dst = vec![0.0f32; PARAMS];
    let memcpy = median((0..reps).map(|_| {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        t.elapsed().as_secs_f64()
    }));
    let cfg = OuterConfig {
        kind: OuterKind::DelayedNesterov,
        eta: 0.7,
        beta: 0.9,
        beta2: 0.95,
        weight_decay: 0.0,
        clip: 0.0,
        warmup_rounds: 0,
        restart_below: None,
        beta_early: None,
    };
    let mut out = Vec::new();
    let gb = PARAMS as f64 * 4.0 / 1e9;
    out.push(
        Figure::new("apply", "memcpy of 5M f32 (baseline)", memcpy * 1e3, "ms")
            .with_note(format!("{:.1} GB/s", gb / memcpy)),
    );
    for kind in [CodecKind::F32, CodecKind::Int8 { block: 256 }] {
        let mut bytes = Vec::new();
        encode(kind, &g, &mut bytes);
        let mut st = OuterState::new(OuterKind::DelayedNesterov, PARAMS);
        let payload = Payload::parse(kind, PARAMS, &bytes).expect("own encoding");
        // Warm up (first touches, page faults), then count allocations.
        st.accumulate(&cfg, &mut x, &payload, 1.0, 16);
        // The timings' own vector is allocated before counting starts.
        let mut times = Vec::with_capacity(reps);
        let allocs_before = alloc_count().load(Ordering::Relaxed);
        for _ in 0..reps {
            let t = Instant::now();
            st.accumulate(&cfg, &mut x, &payload, 0.7, 16);
            times.push(t.elapsed().as_secs_f64());
        }
        let allocs = alloc_count().load(Ordering::Relaxed) - allocs_before;
        let per_update = median(times.into_iter());
        let close = median((0..reps.min(5)).map(|_| {
            let t = Instant::now();
            st.count = 16;
            st.close_round(&cfg, &mut x, 16);
            t.elapsed().as_secs_f64()
        }));
        // Amortised: one close per 16 arrivals.
        let amortised = per_update + close / 16.0;
        out.push(
            Figure::new(
                "apply",
                &format!("apply one {} update (decode + weight + delayed Nesterov)", kind.name()),
                amortised * 1e3,
                "ms",
            )
            .with_ratio(memcpy / amortised, "x memcpy bandwidth")
            .with_note(format!(
                "{allocs} allocations in {reps} updates; momentum step {:.2} ms per 16 updates",
                close * 1e3
            )),
        );
    }
    std::hint::black_box(&x);
    out
}
