//! Finding a run's manifest for a joiner who knows only its id: the
//! bootstrap never trains, so it asks the peers connected to it and keeps
//! what it found. A manifest is checked against the run id (its hash), so
//! neither a peer nor the bootstrap can hand out another run's.

use std::{collections::VecDeque, time::Duration};

use libp2p::PeerId;
use ragtag_node::net::Client;
use ragtag_protocol::{ids::RunId, manifest::Manifest, wire::Message};

/// Peers asked at once for a manifest.
const PEERS_ASKED: usize = 8;
/// How long a lookup waits for the peers' answers.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
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

/// Asks up to [`PEERS_ASKED`] of `peers` at once for `run`'s manifest; the
/// first that checks against the run id wins.
pub(crate) async fn find_manifest(client: &Client, peers: &[PeerId], run: RunId) -> Option<Vec<u8>> {
    let asks = peers.iter().take(PEERS_ASKED).map(|&peer| {
        Box::pin(async move {
            match client.request(peer, Message::ManifestRequest(run)).await {
                Ok(Message::Manifest(bytes)) => match Manifest::decode_for_run(&bytes, run) {
                    Ok(_) => Some(bytes),
                    Err(e) => {
                        tracing::warn!("{peer} served a manifest that is not run {run}'s: {e}");
                        None
                    }
                },
                _ => None,
            }
        })
    });
    let mut pending: Vec<_> = asks.collect();
    let deadline = tokio::time::sleep(LOOKUP_TIMEOUT);
    tokio::pin!(deadline);
    while !pending.is_empty() {
        tokio::select! {
            (found, _, rest) = futures::future::select_all(pending) => {
                if found.is_some() {
                    return found;
                }
                pending = rest;
            }
            _ = &mut deadline => return None,
        }
    }
    None
}
