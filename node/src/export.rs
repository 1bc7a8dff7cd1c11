//! `ragtag export`: the node's current replica as a safetensors file with
//! the model's layer names, to take the trained model home.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::{
    checkpoint::{self, CheckpointError},
    manifest_file::{self, ManifestFileError},
};

/// The run's manifest, as a node keeps it in its state directory.
pub const MANIFEST_FILE: &str = "manifest.toml";

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The state directory has no manifest (no node ran there yet).
    #[error("no {MANIFEST_FILE} in {0} (pass the --state of a node that has run)")]
    NoManifest(PathBuf),
    /// The manifest does not read.
    #[error(transparent)]
    Manifest(#[from] ManifestFileError),
    /// The checkpoint does not read or is of another run.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// No checkpoint yet.
    #[error("no checkpoint in {0} yet (a node writes one every few rounds and when it stops)")]
    NoCheckpoint(PathBuf),
    /// Writing the file failed.
    #[error(transparent)]
    Write(#[from] ragtag_models::Error),
}

/// What was exported.
#[derive(Debug, Clone)]
pub struct Exported {
    /// Tensors written.
    pub tensors: usize,
    /// Parameters written.
    pub parameters: usize,
    /// The model, in words.
    pub model: String,
}

/// Writes the replica of the node whose state directory is `state` to `out`.
pub fn export(state: &Path, out: &Path) -> Result<Exported, ExportError> {
    let manifest_path = state.join(MANIFEST_FILE);
    if !manifest_path.exists() {
        return Err(ExportError::NoManifest(state.into()));
    }
    let manifest = manifest_file::read(&manifest_path)?;
    let ck =
        checkpoint::load_engine(state, manifest.run_id())?.ok_or_else(|| ExportError::NoCheckpoint(state.into()))?;
    let meta = HashMap::from([
        ("format".to_string(), "ragtag-model-v1".to_string()),
        ("run_id".to_string(), manifest.run_id().to_string()),
        ("run_name".to_string(), manifest.name.clone()),
        ("model".to_string(), manifest.model.to_string()),
        ("updates_applied".to_string(), ck.replica.version.total().to_string()),
    ]);
    let layout = ragtag_models::export::write_safetensors(&manifest.model, &ck.replica.anchor, meta, out)?;
    Ok(Exported { tensors: layout.entries.len(), parameters: layout.total(), model: manifest.model.to_string() })
}
