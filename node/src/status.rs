//! The node's status: served as JSON on `/status`, printed by `ragtag status`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A snapshot of the node, refreshed by the event loop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// ragtag version.
    pub version: String,
    /// Our node id (ed25519 public key, hex).
    pub node_id: String,
    /// Our libp2p PeerId.
    pub peer_id: String,
    /// The run.
    pub run_id: String,
    /// The run's name.
    pub run_name: String,
    /// Strategy.
    pub strategy: String,
    /// Device.
    pub device: String,
    /// Listen addresses (with /p2p/).
    pub listen_addrs: Vec<String>,
    /// public / private / relayed / hole punched / unknown.
    pub reachability: String,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Our next round.
    pub round: u64,
    /// Outer rounds completed.
    pub outer_rounds: u64,
    /// Updates applied to our replica.
    pub applied: u64,
    /// Rejected or dropped inputs by reason.
    pub rejected: BTreeMap<String, u64>,
    /// Connected libp2p peers.
    pub connected_peers: usize,
    /// Live members of the run (us included).
    pub live_nodes: usize,
    /// Our inner steps per second.
    pub speed: f32,
    /// Mean training loss of the last round.
    pub train_loss: Option<f32>,
    /// Latest held-out loss of our replica.
    pub eval_loss: Option<f32>,
    /// Latest held-out accuracy.
    pub eval_accuracy: Option<f32>,
    /// Fraction of the time training.
    pub utilisation: f64,
    /// Bytes sent and received.
    pub bytes_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Ledger records written.
    pub ledger_records: u64,
    /// What the node is doing, in words.
    pub state: String,
    /// Applied updates by staleness (last bucket: 7 or more).
    #[serde(default)]
    pub staleness_histogram: [u64; 8],
    /// Local phases completed.
    #[serde(default)]
    pub rounds: u64,
    /// Samples processed.
    #[serde(default)]
    pub samples: u64,
    /// gossipsub scores of connected peers (PeerId -> score).
    #[serde(default)]
    pub peer_scores: BTreeMap<String, f64>,
    /// The model, in words.
    #[serde(default)]
    pub model: String,
    /// The data, in words.
    #[serde(default)]
    pub data: String,
    /// Held-out loss over wall time: (seconds since start, loss), the most
    /// recent evaluations.
    #[serde(default)]
    pub eval_history: Vec<(f64, f32)>,
    /// Peers connected or heard from.
    #[serde(default)]
    pub peers: Vec<PeerStatus>,
    /// Bytes sent per second, over the last refresh.
    #[serde(default)]
    pub bytes_out_per_s: f64,
    /// Bytes received per second, over the last refresh.
    #[serde(default)]
    pub bytes_in_per_s: f64,
    /// Our credit: samples x applied weight, from receipts of at least one
    /// voucher (see `ragtag ledger summary`), recomputed every 30 s.
    #[serde(default)]
    pub credit: Option<f64>,
    /// The scale of the manifest's inner rate this node trains at (the
    /// engine lowers it when the swarm's loss stops falling, and a budget's
    /// cooldown with the clock).
    #[serde(default = "one")]
    pub inner_lr_scale: f32,
    /// Bytes received (gossip and fetched payloads) by how the sender was
    /// reached: direct, relayed, quic (unknown before the first refresh of
    /// the connection table). Relayed bytes cross a relay's bandwidth limit.
    #[serde(default)]
    pub bytes_in_by_connection: BTreeMap<String, u64>,
    /// Hole punching (DCUtR) with peers reached through a relay.
    #[serde(default)]
    pub hole_punch: HolePunchStatus,
    /// Seconds up but not training, by the engine's reason (startup,
    /// barrier, exchange, tick_rest, short_tick).
    #[serde(default)]
    pub idle_s: BTreeMap<String, f64>,
    /// Quorum sums this node published and received (aggregated
    /// dissemination; absent when the run does not aggregate).
    #[serde(default)]
    pub sums: Option<SumStatus>,
}

/// Aggregated dissemination's sums, as this node saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SumStatus {
    /// Sums of our group's updates we signed and published as an aggregator.
    pub published: u64,
    /// Sum bodies pulled from peers (offered down the tree or fetched from
    /// a signer), before the engine's checks.
    pub received: u64,
    /// Offers of a sum declined because as many pulls were already under
    /// way as a node takes at once (the engine then asks a signer).
    #[serde(default)]
    pub declined: u64,
}

/// What became of our attempts to replace relayed connections by direct ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HolePunchStatus {
    /// Direct connections made.
    pub succeeded: u64,
    /// Attempts that failed.
    pub failed: u64,
    /// The latest outcome, in words ("direct connection to PEER" or why not).
    pub last: Option<String>,
}

fn one() -> f32 {
    1.0
}

/// One peer, as this node sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Its libp2p PeerId.
    pub peer_id: String,
    /// A libp2p connection is open to it.
    pub connected: bool,
    /// Its gossipsub score, when connected.
    pub score: Option<f64>,
    /// Inner steps per second it advertises (members of the run only).
    pub speed: Option<f32>,
    /// Seconds since its last heartbeat (members of the run only).
    pub last_seen_s: Option<f64>,
    /// Its updates applied to our replica.
    pub applied: u64,
    /// Mean staleness of those updates (ticks or versions late).
    pub mean_staleness: Option<f64>,
    /// How we reach it: direct, relayed or quic (connected peers).
    pub connection: Option<String>,
    /// Its inputs we rejected.
    pub rejected: u64,
}

impl Status {
    /// The idle time as shares of the uptime, largest first ("none" when
    /// nothing was idle or nothing measured).
    pub fn idle_text(&self) -> String {
        let mut v: Vec<(&String, f64)> = self
            .idle_s
            .iter()
            .filter(|(_, s)| **s > 0.0 && self.uptime_s > 0.0)
            .map(|(why, s)| (why, s / self.uptime_s))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        let parts: Vec<String> = v.iter().map(|(why, s)| format!("{why} {:.1}%", 100.0 * s)).collect();
        if parts.is_empty() { "none".into() } else { parts.join(", ") }
    }

    /// A few readable lines.
    pub fn render(&self) -> String {
        let loss = |v: Option<f32>| v.map_or_else(|| "-".into(), |v| format!("{v:.4}"));
        let rejected = if self.rejected.is_empty() {
            "none".to_string()
        } else {
            self.rejected.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        };
        format!(
            "ragtag {} — {}\n\
             node     {}\n\
             run      {} ({}, {})\n\
             device   {} at {:.1} steps/s, utilisation {:.0}% (idle: {})\n\
             network  {} peers connected, {} live nodes, {}, {} out / {} in\n\
             training round {}, {} outer rounds, {} updates applied, train loss {}, held-out loss {} (accuracy {}), inner lr x{}\n\
             rejected {}\n\
             ledger   {} records\n\
             listen   {}",
            self.version,
            self.state,
            self.peer_id,
            self.run_name,
            &self.run_id[..self.run_id.len().min(16)],
            self.strategy,
            self.device,
            self.speed,
            100.0 * self.utilisation,
            self.idle_text(),
            self.connected_peers,
            self.live_nodes,
            self.reachability,
            human_bytes(self.bytes_out),
            human_bytes(self.bytes_in),
            self.round,
            self.outer_rounds,
            self.applied,
            loss(self.train_loss),
            loss(self.eval_loss),
            loss(self.eval_accuracy),
            self.inner_lr_scale,
            rejected,
            self.ledger_records,
            self.listen_addrs.join(" "),
        ) + &self.sums.as_ref().map_or_else(String::new, |s| {
            format!(
                "\nsums     {} published, {} received, {} offers declined (aggregated dissemination)",
                s.published, s.received, s.declined
            )
        })
    }
}

/// Bytes as "1.2 MiB".
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// Why `ragtag status` could not read a node's status: shown to the user.
#[derive(Debug, thiserror::Error)]
pub enum StatusFetchError {
    /// The node did not accept the connection in time.
    #[error("timed out connecting to {addr}")]
    Timeout {
        /// The metrics address.
        addr: String,
    },
    /// The connection was refused or failed.
    #[error("cannot connect to {addr}: {source} (is a node running with --metrics {addr}?)")]
    Connect {
        /// The metrics address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Sending the request or reading the answer failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The answer is not an HTTP response.
    #[error("malformed HTTP response")]
    MalformedHttp,
    /// The body is not a status.
    #[error("malformed status: {0}")]
    MalformedStatus(#[source] serde_json::Error),
}

/// Fetches `/status` from a node's metrics address (plain HTTP/1.0 GET).
pub async fn fetch(addr: &str) -> Result<Status, StatusFetchError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(std::time::Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| StatusFetchError::Timeout { addr: addr.into() })?
        .map_err(|source| StatusFetchError::Connect { addr: addr.into(), source })?;
    stream.write_all(format!("GET /status HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    stream.take(1 << 20).read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).ok_or(StatusFetchError::MalformedHttp)?;
    serde_json::from_str(body).map_err(StatusFetchError::MalformedStatus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_formats_bytes() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
        let s = Status { run_id: "abcd".into(), ..Status::default() };
        assert!(s.render().contains("rejected none"));
        assert!(s.render().contains("(idle: none)"));
    }

    #[test]
    fn idle_time_reads_as_shares_of_the_uptime_largest_first() {
        let idle_s = [("exchange", 5.0), ("tick_rest", 20.0), ("barrier", 0.0)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let s = Status { uptime_s: 100.0, idle_s, ..Status::default() };
        assert_eq!(s.idle_text(), "tick_rest 20.0%, exchange 5.0%");
    }
}
