//! Why a benchmark could not produce its figures: the bench binary prints
//! it and stops that section.

use ragtag_node::manifest_file::ManifestFileError;
use ragtag_simnet::{compare::CompareError, outputs::OutputError, scenario::ScenarioError};

/// A benchmark's failure, saying which step failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file or process could not be read, written or started.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A program the benchmark runs (ragtag, Python, pip) failed.
    #[error("{command} failed{detail}")]
    CommandFailed {
        /// What was run.
        command: String,
        /// What it printed, when that says why (else empty).
        detail: String,
    },
    /// A run ended without the measurements the benchmark needs.
    #[error("{0}")]
    NoMeasurement(String),
    /// A manifest could not be read or written.
    #[error(transparent)]
    Manifest(#[from] ManifestFileError),
    /// A simulator scenario could not be loaded.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// A simulator comparison failed.
    #[error(transparent)]
    Compare(#[from] CompareError),
    /// A comparison's reports could not be written.
    #[error(transparent)]
    Outputs(#[from] OutputError),
    /// The trainer failed.
    #[error(transparent)]
    Trainer(#[from] ragtag_models::Error),
    /// A reference script printed something that is not its JSON result.
    #[error("{source}: {text}")]
    Json {
        /// The parse error.
        source: serde_json::Error,
        /// What was printed.
        text: String,
    },
}

impl BenchError {
    /// `command` failed; nothing it printed says more.
    pub fn failed(command: &str) -> Self {
        Self::CommandFailed { command: command.into(), detail: String::new() }
    }
}
