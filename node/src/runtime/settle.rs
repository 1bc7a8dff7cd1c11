//! The start-up wait: our addresses, the bootstrap connections and the
//! peers that take part in the run. A public swarm's bootstrap node does
//! not train, so the run's holders are looked up in the DHT (provider
//! records) and dialed, and the state to join with comes from them. A peer
//! that trains says so by subscribing to the run's topic.

use std::{collections::BTreeSet, time::Duration};

use libp2p::{Multiaddr, PeerId};
use ragtag_protocol::ids::RunId;
use tokio::sync::mpsc;

use super::{startup, startup_inbox::StartupInbox};
use crate::net::{self, Client};

/// Longest wait at start-up for the bootstrap peers and the run's holders
/// (a DHT lookup, then a connection to each).
const SETTLE: Duration = Duration::from_secs(12);
/// The wait with no bootstrap peers (only our addresses to learn).
const SETTLE_ALONE: Duration = Duration::from_millis(300);

/// What the wait found.
#[derive(Debug)]
pub(crate) struct Settled {
    /// Our listen addresses.
    pub listen: Vec<Multiaddr>,
    /// The peers connected by the end of the wait.
    pub connected: BTreeSet<PeerId>,
    /// The peers subscribed to the run's topic by then (nodes of the run,
    /// training or still starting): the engine's startup wait ends once
    /// each has been heard.
    pub training: BTreeSet<PeerId>,
    /// The peers to take the replica state from: those that train, then
    /// the run's other holders; anyone connected only when neither is known
    /// (a bootstrap node or a mere client serves none, and one that never
    /// answers would hold the join up).
    pub state_sources: Vec<PeerId>,
    /// Whether no bootstrap peer could be reached.
    pub no_bootstrap_reached: bool,
}

/// Start-up has found enough of the run: training peers, as many as the
/// state is taken from, or every holder the DHT named once its lookup is
/// over (none: we are the run's first node), less those a dial could not
/// reach. A provider record outlives its node by up to its TTL, so a
/// joiner is often named holders that have left; waiting for them held
/// every such join up for the whole settle time. Where holders were named,
/// one at least is waited for: a live holder a direct dial cannot reach
/// (behind NAT) may still connect through a relay, and a joiner that
/// settled with none would start from the initial weights.
fn settled(training: &BTreeSet<PeerId>, holders: Option<&[PeerId]>, unreachable: &BTreeSet<PeerId>) -> bool {
    let enough = match holders {
        Some([]) => 0,
        Some(h) => h.iter().filter(|p| !unreachable.contains(p)).count().clamp(1, startup::MAX_STATE_SOURCES),
        None => startup::MAX_STATE_SOURCES,
    };
    training.len() >= enough
}

/// Waits (bounded) until the run's peers are found; events it does not
/// need go to `inbox` for the running node.
pub(crate) async fn settle(
    net: &Client,
    events: &mut mpsc::Receiver<net::Event>,
    bootstrap: &[Multiaddr],
    run_id: RunId,
    inbox: &mut StartupInbox,
) -> Settled {
    let mut listen = Vec::new();
    let mut connected = BTreeSet::new();
    let mut training = BTreeSet::new();
    let deadline = tokio::time::sleep(if bootstrap.is_empty() { SETTLE_ALONE } else { SETTLE });
    tokio::pin!(deadline);
    let want: BTreeSet<PeerId> = bootstrap.iter().filter_map(net::peer_of).collect();
    let (holders_tx, mut holders_rx) = mpsc::channel(1);
    let mut holders: Option<Vec<PeerId>> = None;
    let mut lookup_started = false;
    let mut unreachable = BTreeSet::new();
    loop {
        if !lookup_started && !want.is_empty() && want.is_subset(&connected) {
            lookup_started = true;
            let (client, tx) = (net.clone(), holders_tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(crate::run_lookup::holders(&client, run_id).await).await;
            });
        }
        if want.is_subset(&connected) && settled(&training, holders.as_deref(), &unreachable) {
            break;
        }
        tokio::select! {
            _ = &mut deadline => {
                if !want.is_empty() {
                    tracing::info!(
                        "start-up stopped waiting for the run's peers at its deadline: {} of {} bootstrap peer(s) connected, {} node(s) of the run heard, {} holder(s) named",
                        want.intersection(&connected).count(),
                        want.len(),
                        training.len(),
                        holders.as_ref().map_or(0, Vec::len),
                    );
                }
                break;
            }
            Some(found) = holders_rx.recv() => {
                tracing::info!("the DHT names {} holder(s) of this run", found.len());
                holders = Some(found);
            }
            Some(ev) = events.recv() => match ev {
                net::Event::Listening(a) => listen.push(a),
                net::Event::Connected(p) => { unreachable.remove(&p); connected.insert(p); }
                net::Event::Subscribed(p) => { training.insert(p); }
                // A holder named by the DHT may have left the run; a later
                // connection (it dialed us) makes it reachable again.
                net::Event::DialFailed { peer: Some(p), error } if !want.contains(&p) => {
                    if !connected.contains(&p) && unreachable.insert(p) {
                        tracing::info!("not waiting for {p}: it cannot be reached (a holder that left the run?): {error}");
                    }
                }
                net::Event::DialFailed { peer, error } => tracing::warn!("cannot reach {}: {error}", peer.map_or("a bootstrap peer".into(), |p| p.to_string())),
                other => inbox.take(net, other).await,
            }
        }
    }
    let mut state_sources: Vec<PeerId> = training.iter().copied().collect();
    for p in holders.iter().flatten() {
        if !state_sources.contains(p) && !unreachable.contains(p) {
            state_sources.push(*p);
        }
    }
    if state_sources.is_empty() {
        state_sources = connected.iter().copied().collect();
    }
    let no_bootstrap_reached = !want.is_empty() && connected.is_empty();
    Settled { listen, connected, training, state_sources, no_bootstrap_reached }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<PeerId> {
        (0..n).map(|_| PeerId::random()).collect()
    }

    #[test]
    fn holders_a_dial_could_not_reach_are_not_waited_for() {
        let p = peers(4);
        let training: BTreeSet<PeerId> = p[..2].iter().copied().collect();
        let none = BTreeSet::new();
        // The DHT named four holders, two of them gone: two training peers
        // are not enough until the dials to the other two fail.
        assert!(!settled(&training, Some(&p), &none));
        let gone: BTreeSet<PeerId> = p[2..3].iter().copied().collect();
        assert!(!settled(&training, Some(&p), &gone));
        let gone: BTreeSet<PeerId> = p[2..].iter().copied().collect();
        assert!(settled(&training, Some(&p), &gone));
        // Every holder named is gone: one is waited for still (it may come
        // through a relay), or the deadline.
        let gone: BTreeSet<PeerId> = p.iter().copied().collect();
        assert!(!settled(&BTreeSet::new(), Some(&p), &gone));
        assert!(settled(&training, Some(&p), &gone));
        // The DHT named none: we are the run's first node.
        assert!(settled(&BTreeSet::new(), Some(&[]), &gone));
        // Before the lookup answers, a full set of sources is wanted.
        assert!(!settled(&training, None, &gone));
        let all: BTreeSet<PeerId> = peers(startup::MAX_STATE_SOURCES).into_iter().collect();
        assert!(settled(&all, None, &none));
    }
}
