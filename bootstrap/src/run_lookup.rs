//! Manifests a joiner who knows only a run id asked us for: the bootstrap
//! never trains, so it finds the run's holders through the DHT (and among
//! its peers) with [`ragtag_node::run_lookup`], and keeps what it found.

use std::collections::VecDeque;

use ragtag_protocol::ids::RunId;
/// Manifests remembered (newest kept).
const CACHED: usize = 16;

/// Manifests found so far, by run.
#[derive(Debug, Default)]
pub(crate) struct ManifestCache {
    found: VecDeque<(RunId, Vec<u8>)>,
}

impl ManifestCache {
    /// The canonical bytes of `run`'s manifest, if known.
    pub(crate) fn get(&self, run: RunId) -> Option<Vec<u8>> {
        self.found.iter().find(|(r, _)| *r == run).map(|(_, b)| b.clone())
    }

    /// Remembers a manifest (checked by the caller).
    pub(crate) fn insert(&mut self, run: RunId, bytes: Vec<u8>) {
        if self.get(run).is_some() {
            return;
        }
        if self.found.len() == CACHED {
            self.found.pop_front();
        }
        self.found.push_back((run, bytes));
    }
}
