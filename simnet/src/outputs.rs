//! A comparison's files: summary.json, the CSV series and the plots. Kept
//! apart from `compare` (which computes the figures) so that the plots can
//! read a comparison without the comparison depending on the plots.

use std::path::Path;

use crate::{compare::Comparison, plot::PlotError, report::ReportError, sim::RunOutput};

/// Why a comparison's files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The output directory could not be created.
    #[error(transparent)]
    CreateDir(std::io::Error),
    /// The summary could not be serialised.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// summary.json could not be written.
    #[error(transparent)]
    WriteSummary(std::io::Error),
    /// The CSV files could not be written.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The plots could not be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
}

/// Writes summary.json, the CSV files and the plots into `dir`.
pub fn write_all(dir: &Path, c: &Comparison, outputs: &[RunOutput]) -> Result<(), OutputError> {
    std::fs::create_dir_all(dir).map_err(OutputError::CreateDir)?;
    std::fs::write(dir.join("summary.json"), serde_json::to_string_pretty(c)? + "\n")
        .map_err(OutputError::WriteSummary)?;
    crate::report::write_csv(dir, outputs)?;
    crate::plot::write_plots(dir, c, outputs)?;
    Ok(())
}
