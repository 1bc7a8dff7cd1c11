//! One error type for the crate.

use std::path::PathBuf;

/// What can go wrong while building, training or loading.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// candle failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// A data file is missing or unreadable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A data file is malformed; `at` says where (line or byte offset).
    #[error("{path}: {at}: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Where: "line 12", "byte 16".
        at: String,
        /// What is wrong.
        message: String,
    },
    /// A data file has nothing usable.
    #[error("{path}: {message}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// Why it is unusable.
        message: String,
    },
    /// The data does not match the manifest (hash, shape, vocabulary).
    #[error("data does not match the run: {0}")]
    Mismatch(String),
    /// The model and data do not fit together.
    #[error("model and data do not fit: {0}")]
    Shape(String),
    /// The device cannot be used.
    #[error("device: {0}")]
    Device(String),
    /// Not enough memory for the model even at the smallest micro-batch.
    #[error("out of memory: {0}")]
    Memory(String),
    /// A checkpoint is unusable.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Training could not produce a usable model (every probed rate diverged).
    #[error("training: {0}")]
    Training(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
