//! Node checkpoints in the state directory: the engine's state (postcard)
//! and the trainer's (safetensors), each written atomically (temporary
//! file, fsync, rename).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use ragtag_protocol::{engine::EngineCheckpoint, ids::RunId};
use serde::{Deserialize, Serialize};

/// File of the engine checkpoint.
pub const ENGINE_FILE: &str = "engine.ckpt";
/// File of the trainer checkpoint.
pub const TRAINER_FILE: &str = "trainer.safetensors";

/// The checkpoint format this build writes and reads (2: the replica state
/// carries the inner learning-rate schedule; 3: the schedule's open round
/// keeps its loss reports for a robust mean).
pub const FORMAT: u32 = 3;

/// The fields every format starts with, so a checkpoint of another format
/// is told apart from a damaged file.
#[derive(Deserialize)]
struct Header {
    format: u32,
    run_id: RunId,
}

#[derive(Serialize, Deserialize)]
struct NodeCheckpoint {
    format: u32,
    run_id: RunId,
    saved_ms: u64,
    engine: EngineCheckpoint,
}

/// Checkpoint errors.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file cannot be read or written.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The file does not decode.
    #[error("{0}: not a ragtag checkpoint: {1}")]
    Malformed(PathBuf, String),
    /// Written by a ragtag build with another checkpoint format.
    #[error(
        "{path}: checkpoint format {found}, this build reads {expected}: move it away (the node then joins from the swarm's state) or use another --state directory"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// The format this build reads.
        expected: u32,
        /// The format found.
        found: u32,
    },
    /// The checkpoint belongs to another run.
    #[error("{path}: checkpoint of run {found}, this node runs {expected}; use another --state directory")]
    WrongRun {
        /// The file.
        path: PathBuf,
        /// The run asked for.
        expected: RunId,
        /// The run found.
        found: RunId,
    },
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let io = |e| CheckpointError::Io(path.into(), e);
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Saves the engine checkpoint into `dir`.
pub fn save_engine(dir: &Path, run_id: RunId, saved_ms: u64, engine: &EngineCheckpoint) -> Result<(), CheckpointError> {
    let path = dir.join(ENGINE_FILE);
    let c = NodeCheckpoint { format: FORMAT, run_id, saved_ms, engine: engine.clone() };
    let bytes = postcard::to_allocvec(&c).map_err(|e| CheckpointError::Malformed(path.clone(), e.to_string()))?;
    write_atomic(&path, &bytes)
}

/// Loads the engine checkpoint of `run_id` from `dir`, if there is one.
pub fn load_engine(dir: &Path, run_id: RunId) -> Result<Option<EngineCheckpoint>, CheckpointError> {
    let path = dir.join(ENGINE_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CheckpointError::Io(path, e)),
    };
    let malformed = |e: postcard::Error| CheckpointError::Malformed(path.clone(), e.to_string());
    let (header, _) = postcard::take_from_bytes::<Header>(&bytes).map_err(malformed)?;
    if header.format != FORMAT {
        return Err(CheckpointError::Format { path, expected: FORMAT, found: header.format });
    }
    if header.run_id != run_id {
        return Err(CheckpointError::WrongRun { path, expected: run_id, found: header.run_id });
    }
    let c: NodeCheckpoint = postcard::from_bytes(&bytes).map_err(malformed)?;
    Ok(Some(c.engine))
}

#[cfg(test)]
mod tests {
    use ragtag_protocol::{
        Keypair,
        engine::{Engine, EngineConfig, Strategy},
        ids::Hash32,
        time::Micros,
    };

    use super::*;

    #[test]
    fn round_trip_and_wrong_run() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId(Hash32([1; 32]));
        assert!(load_engine(dir.path(), run).unwrap().is_none());
        let e = Engine::new(
            EngineConfig::preset(Strategy::Gopals),
            Keypair::deterministic(1, 0).node_id(),
            run,
            Micros::ZERO,
            vec![1.0, 2.0],
            1.0,
            1,
        );
        save_engine(dir.path(), run, 5, &e.checkpoint()).unwrap();
        assert_eq!(load_engine(dir.path(), run).unwrap().unwrap(), e.checkpoint());
        let other = RunId(Hash32([2; 32]));
        assert!(matches!(load_engine(dir.path(), other), Err(CheckpointError::WrongRun { .. })));
        // Another build's format: told apart from damage, before the run.
        let mut old = postcard::to_allocvec(&(1u32, other)).unwrap();
        old.extend_from_slice(b"whatever that format held");
        std::fs::write(dir.path().join(ENGINE_FILE), old).unwrap();
        assert!(matches!(
            load_engine(dir.path(), run),
            Err(CheckpointError::Format { expected: FORMAT, found: 1, .. })
        ));
        std::fs::write(dir.path().join(ENGINE_FILE), b"junk").unwrap();
        assert!(matches!(load_engine(dir.path(), run), Err(CheckpointError::Malformed(..))));
    }
}
