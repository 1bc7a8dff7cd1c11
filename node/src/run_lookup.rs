//! Finding a run by its id alone: every node of a run announces itself in
//! the DHT as a provider of the run's key ([`net::run_key`]), so a joiner
//! or a bootstrap node finds holders without any of them being its direct
//! peer. A manifest is checked against the run id (its hash), so no peer
//! can hand out another run's.

use std::time::Duration;

use libp2p::PeerId;
use ragtag_protocol::{ids::RunId, manifest::Manifest, wire::Message};

use crate::net::{self, Client};

/// Peers asked at once for a manifest.
const PEERS_ASKED: usize = 8;
/// How long asking them may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a DHT lookup of a run's holders may take.
pub const HOLDERS_TIMEOUT: Duration = Duration::from_secs(10);

/// The peers the DHT names as holders of `run` (dialed as they are found);
/// empty when the lookup found none within [`HOLDERS_TIMEOUT`].
pub async fn holders(client: &Client, run: RunId) -> Vec<PeerId> {
    match tokio::time::timeout(HOLDERS_TIMEOUT, client.find_providers(net::run_key(&run))).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            tracing::debug!("looking up the holders of run {run}: {e}");
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// `run`'s manifest from `also` (e.g. the peers we are connected to) or
/// the holders the DHT names; `None` when nobody served one that checks.
pub async fn manifest(client: &Client, run: RunId, also: &[PeerId]) -> Option<Manifest> {
    let found = holders(client, run).await;
    tracing::info!("the DHT names {} holder(s) of run {run}", found.len());
    // `also` first: anyone can announce a provider record, so bogus holders
    // must not crowd out the peers we chose.
    let mut peers = also.to_vec();
    for p in found {
        if !peers.contains(&p) {
            peers.push(p);
        }
    }
    ask_for_manifest(client, &peers, run).await
}

/// Asks up to [`PEERS_ASKED`] of `peers` at once for `run`'s manifest; the
/// first that checks against the run id wins.
pub async fn ask_for_manifest(client: &Client, peers: &[PeerId], run: RunId) -> Option<Manifest> {
    let asks = peers.iter().take(PEERS_ASKED).map(|&peer| {
        Box::pin(async move {
            match client.request(peer, Message::ManifestRequest(run)).await {
                Ok(Message::Manifest(bytes)) => match Manifest::decode_for_run(&bytes, run) {
                    Ok(m) => Some(m),
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
    let deadline = tokio::time::sleep(ASK_TIMEOUT);
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
