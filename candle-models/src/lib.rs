//! The compute a volunteer contributes: models, datasets and the inner
//! training loop on a candle device.
//!
//! This crate knows nothing about peers. The engine hands it an anchor and
//! a number of steps; it runs inner AdamW steps (or computes one gradient)
//! and hands back the new parameters as a flat `Vec<f32>`, sorted by
//! parameter name so every node agrees on the layout. Weights are
//! initialised from our own seeded RNG (candle's CPU RNG cannot be seeded),
//! so the same seed gives bit-identical models and training.

pub mod checkpoint;
pub mod data;
pub mod device;
mod error;
pub mod export;
pub mod lr_probe;
pub mod memory;
pub mod model;
pub mod optim;
pub mod params;
pub mod representation;
pub mod trainer;
pub mod update_trace;

pub use error::{Error, Result};
pub use trainer::{EvalResult, PhaseResult, Trainer, TrainerConfig};
