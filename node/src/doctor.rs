//! `ragtag doctor`: can this machine take part, and if not, why and how to
//! fix it. Each check prints a verdict and, when it fails, the fix.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use libp2p::{Multiaddr, PeerId};
use ragtag_models::{
    Trainer, TrainerConfig,
    data::Shard,
    device::{DeviceChoice, select},
    memory,
};
use ragtag_protocol::{
    engine::{LocalMode, PullConfig, Strategy},
    manifest::Manifest,
    wire::{Message, MessageKind},
};

use crate::{cli::DoctorArgs, identity, net, swarm_key};

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Passed?
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to fix it (when it failed).
    pub fix: Option<String>,
    /// Whether a failure stops the node from taking part.
    pub fatal: bool,
}

impl Check {
    fn pass(name: &str, detail: String) -> Self {
        Self { name: name.into(), ok: true, detail, fix: None, fatal: false }
    }

    fn fail(name: &str, detail: String, fix: &str, fatal: bool) -> Self {
        Self { name: name.into(), ok: false, detail, fix: Some(fix.into()), fatal }
    }

    /// One line (and the fix on a second).
    pub fn render(&self) -> String {
        let verdict = if self.ok {
            "ok  "
        } else if self.fatal {
            "FAIL"
        } else {
            "warn"
        };
        match &self.fix {
            Some(fix) if !self.ok => format!("[{verdict}] {}: {}\n       fix: {fix}", self.name, self.detail),
            _ => format!("[{verdict}] {}: {}", self.name, self.detail),
        }
    }
}

fn device_checks(choice: &str) -> Vec<Check> {
    let mut out = Vec::new();
    let choice: DeviceChoice = match choice.parse() {
        Ok(c) => c,
        Err(e) => {
            return vec![Check::fail("device", e.to_string(), "use --device auto, cpu, cuda, cuda:N or metal", true)];
        }
    };
    let dev = match select(choice) {
        Ok(d) => d,
        Err(e) => {
            return vec![Check::fail(
                "device",
                e.to_string(),
                "use --device auto (falls back to the CPU) or install the GPU build",
                true,
            )];
        }
    };
    out.push(Check::pass(
        "device",
        format!("{}{}", dev.description, dev.fallback_reason.map(|r| format!(" ({r})")).unwrap_or_default()),
    ));
    let m = Manifest::builtin(Strategy::Gopals);
    let cfg = TrainerConfig {
        model: m.model.clone(),
        data: m.data.clone(),
        training: m.training,
        seed: m.seed,
        node_seed: 1,
        shard: Shard::ALL,
        data_path: None,
        device: choice,
        micro_batch: None,
    };
    match Trainer::new(cfg) {
        Ok(mut t) => {
            let p = t.export_params().unwrap_or_default();
            let start = Instant::now();
            let steps = 20;
            match t.run_phase(&p, steps, LocalMode::Train, PullConfig { p: 0.0, lambda: 0.0 }, 0) {
                Ok(r) => {
                    let s = start.elapsed().as_secs_f64();
                    out.push(Check::pass(
                        "throughput",
                        format!(
                            "{:.0} steps/s on the built-in model ({:.2} GFLOP/s)",
                            steps as f64 / s,
                            r.flops / s / 1e9
                        ),
                    ));
                }
                Err(e) => out.push(Check::fail("throughput", e.to_string(), "check the device drivers", true)),
            }
        }
        Err(e) => out.push(Check::fail("throughput", e.to_string(), "check the device drivers", true)),
    }
    // Memory: the built-in model, and a 5M-parameter transformer with batch 16.
    if let Some(free) = memory::available_cpu_bytes() {
        let need = memory::estimate_bytes(5_000_000, 16 * 1024 * 1024, 16);
        let detail =
            format!("{} MiB free; a 5M-parameter model with batch 16 needs about {} MiB", free >> 20, need >> 20);
        if free >= need {
            out.push(Check::pass("memory", detail));
        } else {
            out.push(Check::fail(
                "memory",
                detail,
                "close other programs; runs with large models will use a smaller micro-batch",
                false,
            ));
        }
    }
    out
}

/// Runs every check. With no bootstrap, only the local ones.
pub async fn run(args: &DoctorArgs) -> Vec<Check> {
    let device = args.device.clone();
    let mut checks = tokio::task::spawn_blocking(move || device_checks(&device)).await.unwrap_or_default();
    let psk = match &args.swarm_key {
        Some(p) => match swarm_key::load(p) {
            Ok(k) => {
                checks.push(Check::pass("swarm key", format!("{} (fingerprint {})", p.display(), k.fingerprint())));
                Some(k)
            }
            Err(e) => {
                checks.push(Check::fail("swarm key", e.to_string(), "copy the run's swarm.key from its creator", true));
                return checks;
            }
        },
        None => None,
    };
    if args.bootstrap.is_empty() {
        checks.push(Check::fail(
            "bootstrap",
            "no --bootstrap given: network checks skipped".into(),
            "pass the run's bootstrap address: ragtag doctor --bootstrap /ip4/.../tcp/.../p2p/...",
            false,
        ));
        return checks;
    }
    checks.extend(network_checks(args, psk).await);
    checks
}

async fn network_checks(args: &DoctorArgs, psk: Option<libp2p::pnet::PreSharedKey>) -> Vec<Check> {
    let mut out = Vec::new();
    let mut addrs = Vec::new();
    for b in &args.bootstrap {
        match b.parse::<Multiaddr>() {
            Ok(a) if net::peer_of(&a).is_some() => addrs.push(a),
            Ok(_) => out.push(Check::fail(
                "bootstrap",
                format!("{b} has no /p2p/ peer id"),
                "use the full address the bootstrap node printed",
                true,
            )),
            Err(e) => out.push(Check::fail(
                "bootstrap",
                format!("{b}: {e}"),
                "use the full address the bootstrap node printed",
                true,
            )),
        }
    }
    let key = match identity::generate() {
        Ok(k) => k,
        Err(e) => {
            out.push(Check::fail("identity", e.to_string(), "the OS must provide randomness", true));
            return out;
        }
    };
    let cfg = net::Config::loopback_client(identity::libp2p_keypair(&key), "ragtag/doctor", addrs.clone(), psk);
    let mut registry = prometheus_client::registry::Registry::default();
    let (client, mut events, task) = match net::spawn(cfg, &mut registry) {
        Ok(x) => x,
        Err(e) => {
            out.push(Check::fail("network", e.to_string(), "check that TCP is allowed on this machine", true));
            return out;
        }
    };
    let wanted: BTreeSet<PeerId> = addrs.iter().filter_map(net::peer_of).collect();
    let mut connected = BTreeSet::new();
    let mut failures: Vec<(Option<PeerId>, String)> = Vec::new();
    let mut reach = "unknown".to_string();
    let mut reserved = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.recv()).await else { break };
        match ev {
            net::Event::Connected(p) => {
                connected.insert(p);
                if wanted.is_subset(&connected) && reserved.is_none() {
                    for a in &addrs {
                        let _ = client.listen_via_relay(a.clone()).await;
                    }
                }
            }
            net::Event::DialFailed { peer, error } => failures.push((peer, error)),
            net::Event::Reachability(r) => reach = r,
            net::Event::RelayReserved(p) => {
                reserved = Some(p);
            }
            _ => {}
        }
        if wanted.is_subset(&connected) && reserved.is_some() && reach != "unknown" {
            break;
        }
    }
    for a in &addrs {
        let peer = net::peer_of(a).expect("checked above");
        if connected.contains(&peer) {
            let rtt = probe(&client, peer, 16).await;
            let bw = probe(&client, peer, 1 << 20).await;
            let detail = match (rtt, bw) {
                (Ok(r), Ok(b)) => format!(
                    "{a}: connected, round trip {:.1} ms, {:.1} MB/s",
                    r.as_secs_f64() * 1e3,
                    (1 << 20) as f64 / b.as_secs_f64().max(1e-9) / 1e6
                ),
                (Err(e), _) | (_, Err(e)) => format!("{a}: connected (probe failed: {e})"),
            };
            out.push(Check::pass("dial bootstrap", detail));
        } else {
            let err = failures
                .iter()
                .find(|(p, _)| *p == Some(peer))
                .map_or("no answer in time".to_string(), |(_, e)| e.clone());
            let fix = if psk.is_some() {
                "check the address and port, that the bootstrap node runs, and that you use the run's exact swarm.key"
            } else {
                "check the address and port, that the bootstrap node runs, and that no firewall blocks it"
            };
            out.push(Check::fail("dial bootstrap", format!("{a}: {err}"), fix, true));
        }
    }
    if !connected.is_empty() {
        if psk.is_some() {
            out.push(Check::pass("swarm key accepted", "the private handshake completed".into()));
        }
        match reach.as_str() {
            "public" => out.push(Check::pass("reachability", "public: peers can dial this node directly".into())),
            "private" => out.push(Check::fail(
                "reachability",
                "private: behind NAT or a firewall".into(),
                "nothing to do if the relay reservation below works; otherwise forward a port and pass --listen",
                false,
            )),
            _ => out.push(Check::fail(
                "reachability",
                "unknown: not enough peers answered AutoNAT probes yet".into(),
                "run the check again once the swarm has more nodes",
                false,
            )),
        }
        match reserved {
            Some(p) => out.push(Check::pass("relay reservation", format!("accepted by {p}"))),
            None => out.push(Check::fail(
                "relay reservation",
                "no relay accepted a reservation".into(),
                "use a bootstrap node that runs ragtag-bootstrap (it relays)",
                false,
            )),
        }
        let info = client.info().await.unwrap_or_default();
        out.push(Check::pass("peers discovered", format!("{} connected", info.connected.len())));
    }
    client.shutdown().await;
    let _ = task.await;
    out
}

/// Why a probe of a bootstrap peer failed: shown in the check's detail.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// The request did not get an answer.
    #[error(transparent)]
    Net(#[from] net::NetError),
    /// The peer answered with something other than a full probe reply.
    #[error("unexpected answer {0:?}")]
    Unexpected(MessageKind),
}

async fn probe(client: &net::Client, peer: PeerId, bytes: u32) -> Result<Duration, ProbeError> {
    let start = Instant::now();
    match client.request(peer, Message::Probe(bytes)).await? {
        Message::ProbeReply(b) if b.len() == bytes as usize => Ok(start.elapsed()),
        other => Err(ProbeError::Unexpected(other.kind())),
    }
}

/// True when a fatal check failed.
pub fn failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| !c.ok && c.fatal)
}
