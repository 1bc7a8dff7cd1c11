//! `ragtag`: the volunteer node's command line.

use std::{collections::BTreeSet, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};
use clap::Parser;
use libp2p::{Multiaddr, PeerId};
use ragtag_models::{TrainerConfig, data::Shard, device::DeviceChoice, lr_probe};
use ragtag_node::{
    cli::{self, Cli, Command, LedgerCommand, LrChoice, RunArgs, SwarmCommand},
    doctor, identity,
    ledger::{self, SledLedger},
    manifest_file, net,
    runtime::{self, NodeOptions, startup},
    status, swarm_key,
    trainer_thread::Pace,
};
use ragtag_protocol::{
    engine::{EngineOverrides, LocalMode, Strategy, cooldown::Cooldown, inner_lr::InnerLr},
    ledger::Vouchers,
    manifest::ModelSpec,
};

fn main() -> ExitCode {
    #[allow(unsafe_code)]
    // SAFETY: first thing in main, before any other thread is spawned.
    unsafe {
        ragtag_models::device::prepare_cpu_process(ragtag_models::device::Arenas::One)
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,libp2p_kad=error,libp2p_swarm=warn".into()),
        )
        .with_writer(ragtag_node::live_line::LogWriter)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Keygen { out } => {
            if out.exists() {
                bail!("{} exists; refusing to overwrite an identity", out.display());
            }
            let key = identity::generate()?;
            identity::save(&key, &out)?;
            let peer = PeerId::from(identity::libp2p_keypair(&key).public());
            println!("{peer}");
            eprintln!("identity written to {} (mode 0600)", out.display());
        }
        Command::Swarm {
            command:
                SwarmCommand::New {
                    name,
                    private,
                    model,
                    hidden,
                    transformer,
                    data,
                    strategy,
                    seed,
                    h,
                    batch,
                    codec,
                    target_loss,
                    tick_ms,
                    aggregate,
                    lr,
                    probe_steps,
                    inner_lr,
                    budget,
                    cooldown_fraction,
                    out,
                },
        } => {
            let strategy = Strategy::parse(&strategy).with_context(|| {
                format!(
                    "unknown strategy {strategy:?}: use ddp, diloco, diloco-proportional, async, gopals or gopals-async"
                )
            })?;
            let inner_lr = inner_lr.map(|s| if s == "constant" { InnerLr::Constant } else { InnerLr::PLATEAU });
            let cooldown = budget.map(|b| Cooldown::for_budget(b, cooldown_fraction)).transpose()?;
            let aggregation = aggregate.map(ragtag_protocol::aggregate::AggregationConfig::with_groups);
            let overrides = EngineOverrides {
                h,
                period_ms: tick_ms,
                codec,
                inner_lr,
                cooldown,
                aggregation,
                ..EngineOverrides::default()
            };
            let start_ms = runtime::now().0 / 1000;
            let mut m = manifest_file::new_run(&manifest_file::NewRun {
                name,
                private,
                data: data.clone(),
                model,
                hidden,
                transformer: match transformer.as_deref() {
                    None => None,
                    Some(&[c, w, l, h]) => Some([c, w, l, h]),
                    Some(v) => bail!("--transformer takes four numbers (context,width,layers,heads), not {}", v.len()),
                },
                strategy,
                overrides,
                seed,
                start_ms,
            })?;
            if let Some(b) = batch {
                m.training.batch_size = b;
                m.rationale.insert("batch_size".into(), format!("{b}: chosen by the run's creator"));
            }
            if let Some(c) = codec {
                m.rationale.insert("codec".into(), format!("{}: chosen by the run's creator", c.name()));
            }
            m.training.target_loss = target_loss.or(m.training.target_loss);
            std::fs::create_dir_all(&out)?;
            match lr {
                // ddp has no inner steps: its optimiser is the outer one.
                _ if m.engine.local == LocalMode::Gradient => {
                    m.rationale.insert("lr".into(), "unused: ddp steps with the outer optimiser".into());
                }
                LrChoice::Fixed(v) => {
                    m.training.lr = v;
                    m.rationale.insert("lr".into(), format!("{v}: chosen by the run's creator"));
                }
                LrChoice::Auto => {
                    let data_path = data.split_once(':').map(|(_, p)| PathBuf::from(p));
                    let transformer = matches!(m.model, ModelSpec::CharTransformer { .. });
                    let steps = probe_steps.unwrap_or(if transformer { 300 } else { 2_000 });
                    let cfg = TrainerConfig {
                        model: m.model.clone(),
                        data: m.data.clone(),
                        training: m.training,
                        seed: m.seed,
                        node_seed: m.seed,
                        shard: Shard::ALL,
                        data_path: data_path.filter(|p| !p.as_os_str().is_empty()),
                        device: DeviceChoice::Cpu,
                        micro_batch: None,
                    };
                    eprintln!(
                        "probing the inner learning rate: {steps} steps at each of {:?} \
                         (--lr VALUE skips this, --probe-steps N shortens it)",
                        lr_probe::DEFAULT_GRID
                    );
                    // Training is blocking compute: off the runtime's workers.
                    let p = tokio::task::spawn_blocking(move || {
                        let started = std::time::Instant::now();
                        lr_probe::probe_with_progress(&cfg, &lr_probe::DEFAULT_GRID, steps, |t| {
                            eprintln!(
                                "  lr {:<7} held-out loss {:.4}  ({:.0} s so far)",
                                t.lr,
                                t.loss,
                                started.elapsed().as_secs_f64()
                            )
                        })
                    })
                    .await?
                    .context("probing the inner learning rate")?;
                    m.training.lr = p.chosen;
                    m.rationale.insert("lr".into(), p.evidence());
                }
            }
            m.validate()?;
            manifest_file::write(&m, &out.join("manifest.toml"))?;
            println!("inner learning rate {}", m.training.lr);
            println!("run id {}", m.run_id());
            println!("manifest: {}", out.join("manifest.toml").display());
            if private {
                let key = swarm_key::generate()?;
                swarm_key::save(&key, &out.join("swarm.key"))?;
                println!("swarm key: {} (share it only with members)", out.join("swarm.key").display());
            }
        }
        Command::Run(args) => return run(*args).await,
        Command::Status { metrics, json } => {
            let s = status::fetch(&metrics).await.map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{}", s.render());
            }
        }
        Command::Ledger { command } => return ledger_command(command),
        Command::Export { state, out } => {
            let e = ragtag_node::export::export(&state, &out)?;
            println!("wrote {} ({}: {} tensors, {} parameters)", out.display(), e.model, e.tensors, e.parameters);
        }
        Command::Doctor(args) => {
            let checks = doctor::run(&args).await;
            for c in &checks {
                println!("{}", c.render());
            }
            if doctor::failed(&checks) {
                println!("this machine cannot take part yet: fix the FAIL lines above");
                return Ok(ExitCode::FAILURE);
            }
            println!("this machine can take part");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ledger_command(command: LedgerCommand) -> Result<ExitCode> {
    let open = |state: &std::path::Path| {
        let dir = state.join("ledger");
        if !dir.exists() {
            bail!("no ledger in {} (pass the node's --state)", state.display());
        }
        Ok(SledLedger::open(&dir)?)
    };
    match command {
        LedgerCommand::Summary { state, k, allow, json } => {
            let vouchers = if allow.is_empty() {
                Vouchers::AcceptedByOwner
            } else {
                let nodes = allow
                    .iter()
                    .map(|s| {
                        let peer = s.parse::<PeerId>().with_context(|| format!("invalid --allow peer id {s:?}"))?;
                        identity::node_id(&peer).with_context(|| format!("--allow {s:?} is not an ed25519 peer id"))
                    })
                    .collect::<Result<_>>()?;
                Vouchers::Allowlist(nodes)
            };
            let s = ledger::summary(&open(&state)?, k, &vouchers)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!(
                    "{:<18} {:>8} {:>10} {:>12} {:>10} {:>9} {:>9} {:>12}",
                    "node", "updates", "samples", "GFLOP", "weight", "accepted", "receipts", "credit"
                );
                for p in std::iter::once(&s.me).chain(&s.peers) {
                    println!(
                        "{:<18} {:>8} {:>10} {:>12.2} {:>10.2} {:>9} {:>9} {:>12.1}",
                        &p.node[..p.node.len().min(16)],
                        p.contributions,
                        p.samples,
                        p.flops / 1e9,
                        p.accepted_weight,
                        p.accepted,
                        p.receipts_from_distinct_peers,
                        p.credit
                    );
                }
                println!(
                    "(first line: this node, credited samples x applied weight from receipts of at least {k} {}; \
                     other lines: what this node applied of theirs)",
                    if allow.is_empty() { "peers whose updates it accepted" } else { "allowed peers" }
                );
            }
        }
        LedgerCommand::Verify { state } => {
            let r = ledger::verify(&open(&state)?)?;
            match &r.error {
                None => {
                    println!("ledger ok: {} records signed by {}", r.records, r.signer.as_deref().unwrap_or("nobody"))
                }
                Some(e) => {
                    println!("ledger BROKEN at record {}: {e}", r.bad_record.map_or("?".into(), |s| s.to_string()));
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        LedgerCommand::Export { state, format } => print!("{}", ledger::export(&open(&state)?, format)?),
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_addrs(list: &[String], what: &str) -> Result<Vec<Multiaddr>> {
    list.iter().map(|s| s.parse::<Multiaddr>().with_context(|| format!("invalid {what} address {s:?}"))).collect()
}

async fn run(args: RunArgs) -> Result<ExitCode> {
    let args = args.merged().map_err(anyhow::Error::msg)?;
    let state_arg = args.state.clone();
    let state = startup::StateDir::lock(state_arg.as_deref().unwrap_or("ragtag-state".as_ref()), state_arg.is_none())?;
    let key = identity::load_or_create(&args.key.clone().unwrap_or_else(|| state.path.join("identity.key")))?;
    let keypair = identity::libp2p_keypair(&key);
    let swarm_key = args.swarm_key.as_deref().map(swarm_key::load).transpose()?;
    let bootstrap = parse_addrs(&args.bootstrap, "--bootstrap")?;
    let mut listen = parse_addrs(&args.listen, "--listen")?;
    // A QUIC address to listen on or to join through asks for QUIC too.
    let wants_quic = args.quic.unwrap_or(false) || listen.iter().chain(&bootstrap).any(net::is_quic);
    let quic = wants_quic && swarm_key.is_none();
    if wants_quic && swarm_key.is_some() {
        tracing::warn!("QUIC cannot carry the swarm key of a private swarm: using TCP only");
    }
    if listen.is_empty() {
        listen.push("/ip4/127.0.0.1/tcp/0".parse()?);
        if quic {
            listen.push("/ip4/127.0.0.1/udp/0/quic-v1".parse()?);
        }
    }
    let beyond_loopback =
        listen.iter().any(|a| !a.to_string().starts_with("/ip4/127.") && !a.to_string().starts_with("/ip6/::1"));
    let allow_peers: Vec<PeerId> = args
        .allow
        .iter()
        .map(|s| s.parse::<PeerId>().with_context(|| format!("invalid --allow peer id {s:?}")))
        .collect::<Result<_>>()?;
    let mut allow_nodes: Option<BTreeSet<_>> =
        (!allow_peers.is_empty()).then(|| allow_peers.iter().filter_map(identity::node_id).collect());
    if let Some(a) = allow_nodes.as_mut() {
        a.insert(key.node_id());
    }

    // The manifest may have to come from peers: start a short-lived network for it.
    let manifest = if args.manifest.is_none() && args.run_id.is_some() {
        let keypair = identity::libp2p_keypair(&identity::generate()?);
        let cfg = net::Config::loopback_client(keypair, "ragtag/manifest", bootstrap.clone(), swarm_key);
        let mut registry = prometheus_client::registry::Registry::default();
        let (client, _events, task) = net::spawn(cfg, &mut registry).map_err(anyhow::Error::msg)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let peers: Vec<PeerId> = bootstrap.iter().filter_map(net::peer_of).collect();
        let m = startup::manifest(None, args.run_id.as_deref(), None, Some((&client, &peers))).await;
        client.shutdown().await;
        let _ = task.await;
        m?
    } else {
        startup::manifest(args.manifest.as_deref(), None, args.strategy.as_deref(), None).await?
    };
    if manifest.data.needs_file() && args.data.is_none() {
        bail!("this run trains on a data file ({:?}): pass it with --data PATH", manifest.data);
    }
    let device: DeviceChoice = args.device.as_deref().unwrap_or("auto").parse().map_err(anyhow::Error::msg)?;
    let net_cfg = net::Config {
        keypair,
        topic: format!("ragtag/{}", manifest.run_id()),
        listen,
        bootstrap,
        swarm_key,
        allow: if allow_peers.is_empty() {
            Vec::new()
        } else {
            allow_peers.into_iter().chain([PeerId::from(identity::libp2p_keypair(&key).public())]).collect()
        },
        mdns: args.mdns.unwrap_or(false),
        quic,
        dial_remote: beyond_loopback || args.mdns.unwrap_or(false),
        relay_server: false,
    };
    let (eval_every, checkpoint_every) = cli::default_intervals(manifest.engine.h);
    let opts = NodeOptions {
        manifest,
        key,
        state: state.path.clone(),
        data: args.data.clone(),
        device,
        pace: Pace {
            slowdown: f64::from(args.slowdown.unwrap_or(1.0)),
            step_floor: Duration::try_from_secs_f64(args.step_time.unwrap_or(0.0))
                .context("--step-time must be a non-negative number of seconds")?,
        },
        metrics: args.metrics,
        max_rounds: args.max_rounds,
        duration: args.duration.map(Duration::from_secs_f64),
        target_loss: args.target_loss,
        eval_every: args.eval_every.unwrap_or(eval_every),
        checkpoint_every: args.checkpoint_every.unwrap_or(checkpoint_every),
        json: args.json.unwrap_or(false),
        trace_updates: args.trace_updates.unwrap_or(false),
        net: net_cfg,
        allow: allow_nodes,
    };
    // The live line on a terminal; JSON output stays machine-readable.
    if !opts.json {
        ragtag_node::live_line::start();
    }
    let outcome = runtime::run(opts).await;
    ragtag_node::live_line::finish();
    let outcome = outcome?;
    eprintln!(
        "stopped: {} after {} rounds, {} updates applied{}",
        outcome.reason,
        outcome.rounds,
        outcome.applied,
        outcome.eval_loss.map(|l| format!(", held-out loss {l:.4}")).unwrap_or_default()
    );
    drop(state);
    Ok(if outcome.failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
