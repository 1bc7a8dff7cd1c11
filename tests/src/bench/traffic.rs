//! Traffic per node as the swarm grows, in real processes: what each node
//! sends and receives per round at N nodes with full dissemination (every
//! update to every peer) and with aggregation (an update to its group's
//! aggregators, one sum per group back). Both arms run ticks of one second,
//! so a second is a round. The transport figure is libp2p's own count
//! (after noise and yamux, gossip forwarding and duplicates included),
//! read from each node's /metrics at two times of the steady run; beside
//! it, what of it is gossip messages (gossipsub's count, duplicates
//! included) and request-response messages (the codec's count, by kind),
//! and of those, anti-entropy's.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use ragtag_protocol::wire::MessageKind;

use super::{
    Figure,
    soak::{Soaked, spawn},
};
use crate::{free_port, http_get};

/// Aggregation groups at every size: fixed, so a node receives the same
/// number of sums a round however many nodes there are.
const GROUPS: u32 = 2;
/// Seconds before the first reading: start-up, joins, the gossip mesh.
const WARM_S: u64 = 20;

/// The two ways an update reaches the swarm.
#[derive(Clone, Copy)]
enum Arm {
    Full,
    Aggregated,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Full => "full dissemination",
            Arm::Aggregated => "aggregated",
        }
    }
}

/// Sum of the counters in a Prometheus text answer whose name starts
/// with `prefix` and whose line contains every one of `labels`.
fn counter_sum(text: &str, prefix: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// The request-response kinds of anti-entropy: digests, and the replica
/// states fetched after them.
const ANTI_ENTROPY_KINDS: [MessageKind; 3] = [MessageKind::Digest, MessageKind::StateRequest, MessageKind::StateChunk];

/// One node's byte counters, in + out, at one time.
#[derive(Clone, Copy, Default)]
struct Reading {
    /// libp2p's transport count (after noise and yamux).
    transport: f64,
    /// Gossip messages as gossipsub counts them, every duplicate included
    /// (control messages not).
    gossip: f64,
    /// Request-response messages of every kind.
    request_response: f64,
    /// Of those, anti-entropy's.
    anti_entropy: f64,
    /// Anchors averaged with a peer's: replicas over the same updates
    /// that differ (identical replicas never average).
    averages: f64,
}

impl Reading {
    fn of(text: &str) -> Option<Self> {
        let rr = "ragtag_request_response_bytes";
        text.contains("libp2p_bandwidth").then(|| Reading {
            transport: counter_sum(text, "libp2p_bandwidth_bytes", &[]),
            gossip: counter_sum(text, "gossipsub_topic_msg_sent_bytes", &[])
                + counter_sum(text, "gossipsub_topic_msg_recv_bytes_unfiltered", &[]),
            request_response: counter_sum(text, rr, &[]),
            anti_entropy: ANTI_ENTROPY_KINDS
                .iter()
                .map(|k| counter_sum(text, rr, &[&format!("kind=\"{}\"", k.name())]))
                .sum(),
            averages: counter_sum(text, "ragtag_anchors_averaged_total", &[]),
        })
    }

    /// What moved between `self` and `later`, per second over `dt`.
    fn rate(&self, later: &Reading, dt: f64) -> Reading {
        Reading {
            transport: (later.transport - self.transport) / dt,
            gossip: (later.gossip - self.gossip) / dt,
            request_response: (later.request_response - self.request_response) / dt,
            anti_entropy: (later.anti_entropy - self.anti_entropy) / dt,
            averages: (later.averages - self.averages) / dt,
        }
    }
}

/// One node's counters now.
fn reading(metrics: &str) -> Option<Reading> {
    Reading::of(&http_get(metrics, "/metrics"))
}

/// A manifest of the built-in run with one-second ticks, aggregated or not.
fn manifest(ragtag: &Path, dir: &Path, arm: Arm) -> Result<std::path::PathBuf, String> {
    let mut cmd = Command::new(ragtag);
    cmd.args(["swarm", "new", "--name", "traffic", "--lr", "0.001", "--tick-ms", "1000", "--out"]).arg(dir);
    if let Arm::Aggregated = arm {
        cmd.args(["--aggregate", &GROUPS.to_string()]);
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", ragtag.display()))?;
    if !out.status.success() {
        return Err(format!("swarm new: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(dir.join("manifest.toml"))
}

/// Per node: bytes a second; and the live nodes each heard in its last
/// round.
type Measured = (Vec<Reading>, Vec<f64>);

/// What `measure_s` seconds of a swarm of `n` nodes moved.
fn one(ragtag: &Path, n: usize, arm: Arm, measure_s: u64) -> Result<Measured, String> {
    let dir = std::env::temp_dir().join(format!("ragtag-traffic-{}-{n}-{}", std::process::id(), arm as u8));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let m = manifest(ragtag, &dir, arm)?;
    let duration = WARM_S + measure_s + 10;
    let mut procs: Vec<(Soaked, String)> = Vec::new();
    let mut bootstrap: Option<String> = None;
    for i in 0..n {
        let metrics = format!("127.0.0.1:{}", free_port());
        let extra = vec!["--manifest".into(), m.display().to_string(), "--metrics".into(), metrics.clone()];
        let p = spawn(ragtag, &dir.join(format!("n{i}")), duration, bootstrap.as_deref(), &extra)
            .map_err(|e| format!("cannot start node {i}: {e}"))?;
        if bootstrap.is_none() {
            bootstrap = Some(p.listen_addr().ok_or("the first node printed no address")?);
        }
        procs.push((p, metrics));
    }
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(WARM_S));
    let first: Vec<Option<Reading>> = procs.iter().map(|(_, m)| reading(m)).collect();
    let t1 = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(measure_s));
    let second: Vec<Option<Reading>> = procs.iter().map(|(_, m)| reading(m)).collect();
    let dt = start.elapsed().as_secs_f64() - t1;
    let mut live = Vec::new();
    for (p, _) in &mut procs {
        let _ = p.child.wait();
        let last = p
            .stdout
            .try_iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
            .filter(|e| e["event"] == "round")
            .last();
        if let Some(l) = last.and_then(|r| r["live"].as_f64()) {
            live.push(l);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let rates: Vec<Reading> =
        first.iter().zip(&second).filter_map(|(a, b)| Some(a.as_ref()?.rate(b.as_ref()?, dt))).collect();
    if rates.len() < n {
        return Err(format!("{} of {n} nodes answered on /metrics at both readings", rates.len()));
    }
    Ok((rates, live))
}

/// Runs each size in `sizes` with both arms for `measure_s` steady seconds.
pub fn run(ragtag: &Path, sizes: &[usize], measure_s: u64) -> Vec<Figure> {
    let mut figures = Vec::new();
    for arm in [Arm::Full, Arm::Aggregated] {
        let mut base: Option<f64> = None;
        for &n in sizes {
            let name = format!("{n} nodes, {}: transport bytes per node per round (in + out)", arm.name());
            match one(ragtag, n, arm, measure_s) {
                Ok((rates, live)) => {
                    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
                    let of = |f: fn(&Reading) -> f64| mean(&rates.iter().map(f).collect::<Vec<_>>());
                    let transport: Vec<f64> = rates.iter().map(|r| r.transport).collect();
                    let max = transport.iter().copied().fold(0.0, f64::max);
                    let b = *base.get_or_insert(mean(&transport));
                    figures.push(
                        Figure::new("traffic", &name, mean(&transport), "B")
                            .with_ratio(mean(&transport) / b.max(1e-9), &format!("x the {}-node figure", sizes[0]))
                            .with_note(format!(
                                "busiest node {max:.0} B; of the mean: gossip messages {:.0} B (duplicates included), \
                                 request-response {:.0} B, of which anti-entropy {:.0} B; anchors averaged per node \
                                 per round {:.2}; live nodes heard in the last round {:.1} (mean)",
                                of(|r| r.gossip),
                                of(|r| r.request_response),
                                of(|r| r.anti_entropy),
                                of(|r| r.averages),
                                mean(&live)
                            )),
                    );
                }
                Err(why) => figures.push(Figure::new("traffic", &name, f64::NAN, "B").with_note(why)),
            }
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_splits_transport_into_gossip_and_request_response() {
        let text = "# HELP libp2p_bandwidth_bytes x\n\
                    libp2p_bandwidth_bytes_total{protocols=\"/ip4/tcp\",direction=\"Inbound\"} 100\n\
                    libp2p_bandwidth_bytes_total{protocols=\"/ip4/tcp\",direction=\"Outbound\"} 50\n\
                    gossipsub_topic_msg_sent_bytes_total{partial=\"false\",topic_hash=\"t\"} 11\n\
                    gossipsub_topic_msg_recv_bytes_unfiltered_total{hash=\"t\"} 13\n\
                    gossipsub_topic_msg_recv_bytes_total{hash=\"t\"} 5\n\
                    ragtag_request_response_bytes_total{kind=\"update\",direction=\"in\"} 7\n\
                    ragtag_request_response_bytes_total{kind=\"state_chunk\",direction=\"in\"} 20\n\
                    ragtag_request_response_bytes_total{kind=\"digest\",direction=\"out\"} 3\n\
                    ragtag_anchors_averaged_total 2\n";
        let r = Reading::of(text).unwrap();
        assert_eq!(r.transport, 150.0);
        assert_eq!(r.gossip, 24.0, "sent and received with duplicates, not the deduplicated count");
        assert_eq!(r.request_response, 30.0);
        assert_eq!(r.anti_entropy, 23.0);
        assert_eq!(r.averages, 2.0);
        assert!(Reading::of("ragtag_up 1").is_none(), "no transport counters: no reading");
    }
}
