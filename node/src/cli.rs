//! The command line (clap) and the TOML config file that may set any flag
//! of `ragtag run`.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};
use ragtag_protocol::codec::CodecKind;
use serde::Deserialize;

use crate::ledger::ExportFormat;

/// ragtag: train one neural network on mixed, volunteered hardware.
#[derive(Parser, Debug)]
#[command(name = "ragtag", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create an ed25519 identity (file mode 0600) and print its PeerId.
    Keygen {
        /// Where to write it (default: ./ragtag.key).
        #[arg(long, default_value = "ragtag.key")]
        out: PathBuf,
    },
    /// Create runs.
    Swarm {
        /// What to create.
        #[command(subcommand)]
        command: SwarmCommand,
    },
    /// Run a node (with no flags: the built-in default run on 127.0.0.1).
    Run(Box<RunArgs>),
    /// Show a running node's status.
    Status {
        /// The node's --metrics address.
        #[arg(long, default_value = "127.0.0.1:9477")]
        metrics: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write this node's current replica as a safetensors file with the
    /// model's layer names (load it with the `safetensors` package).
    Export {
        /// The node's state directory.
        #[arg(long, default_value = "ragtag-state")]
        state: PathBuf,
        /// The file to write.
        #[arg(long, default_value = "model.safetensors")]
        out: PathBuf,
    },
    /// Read this node's contribution ledger.
    Ledger {
        /// What to do with it.
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// Check that this machine can take part, and say how to fix what fails.
    Doctor(DoctorArgs),
}

/// `ragtag swarm ...`
#[derive(Subcommand, Debug)]
pub enum SwarmCommand {
    /// Write a run manifest (and, with --private, a swarm.key).
    New {
        /// The run's name.
        #[arg(long)]
        name: String,
        /// A private swarm: also write swarm.key (pre-shared key).
        #[arg(long)]
        private: bool,
        /// mlp, cnn or transformer (default: what the data needs).
        #[arg(long)]
        model: Option<String>,
        /// The MLP's hidden widths, comma separated (default 64,64).
        #[arg(long, value_delimiter = ',')]
        hidden: Option<Vec<u32>>,
        /// The transformer's size: context, width, layers and heads, comma
        /// separated (default for text files 128,256,4,4). Every volunteer
        /// trains this model, so size it for the slowest machine you expect.
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=65_536))]
        transformer: Option<Vec<u32>>,
        /// teacher, markov, text:PATH, digits:PATH or idx:IMAGES,LABELS.
        #[arg(long, default_value = "teacher")]
        data: String,
        /// ddp, diloco, diloco-proportional, async, gopals, gopals-async.
        #[arg(long, default_value = "gopals")]
        strategy: String,
        /// Seed of the initial weights.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Inner steps per round (H), at least 1 (default: the strategy's).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        h: Option<u32>,
        /// Inner mini-batch size per step (default 32).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65_536))]
        batch: Option<u32>,
        /// Update codec on the wire: f32, f16, int8 (blocks of 256),
        /// int8/BLOCK or topNpermille (the N largest values per thousand).
        #[arg(long, value_parser = parse_codec)]
        codec: Option<CodecKind>,
        /// The held-out loss the run aims for (reports measure the time to
        /// it; `ragtag run --target-loss` stops a node there).
        #[arg(long, value_parser = parse_target_loss)]
        target_loss: Option<f32>,
        /// Fixed tick period in ms (tick mode; default: H / v_ref).
        #[arg(long)]
        tick_ms: Option<u32>,
        /// Aggregated dissemination in this many groups a tick: an update
        /// goes to its group's 3 aggregators, and a node receives one sum
        /// per group (2 signers must agree) instead of every update, so its
        /// traffic per round stops growing with the swarm. Ticks are then
        /// at least 1 s. Off by default.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
        aggregate: Option<u32>,
        /// Inner learning rate: a number, or `auto` to probe 3e-4, 1e-3,
        /// 3e-3 and 1e-2 on this machine (the same model, data and initial
        /// weights, --probe-steps each) and keep the lowest held-out loss.
        /// The evidence goes into the manifest's rationale.
        #[arg(long, default_value = "auto", value_parser = parse_lr)]
        lr: LrChoice,
        /// Inner steps per candidate rate when --lr is auto (default: 2000
        /// for MLPs and CNNs, 300 for the transformer).
        #[arg(long)]
        probe_steps: Option<u32>,
        /// The inner learning rate over the run: `plateau` (halve it when
        /// the swarm's training loss stops falling; the default for local
        /// steps) or `constant`.
        #[arg(long, value_parser = ["plateau", "constant"])]
        inner_lr: Option<String>,
        /// The run's budget in seconds from now, where it has one: the
        /// inner rate then stays whole until the budget's last fifth and
        /// falls linearly to zero over it (a cooldown), instead of halving
        /// on plateaus (`--inner-lr plateau` keeps those too).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        budget: Option<u32>,
        /// The share of the budget the cooldown takes, in (0, 1]; 1 makes
        /// the rate fall from the run's start. Higher gets lower sooner in a
        /// run long enough to reach its noise floor and ends higher in a
        /// short one (BENCHMARKS.md, "over the whole run or its last fifth").
        #[arg(long, requires = "budget", default_value_t = ragtag_protocol::engine::cooldown::DEFAULT_FRACTION)]
        cooldown_fraction: f32,
        /// Directory to write manifest.toml (and swarm.key) into.
        #[arg(long)]
        out: PathBuf,
    },
}

/// How `swarm new` sets the inner learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrChoice {
    /// Probe the candidates on this machine.
    Auto,
    /// This rate.
    Fixed(f32),
}

fn parse_codec(s: &str) -> Result<CodecKind, CliValueError> {
    CodecKind::parse_name(s).ok_or_else(|| {
        CliValueError(format!(
            "--codec {s:?}: use f32, f16, int8, int8/BLOCK (1 to 1048576) or topNpermille (1 to 1000)"
        ))
    })
}

fn parse_target_loss(s: &str) -> Result<f32, CliValueError> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(CliValueError(format!("--target-loss {s:?}: use a held-out loss above 0, e.g. 1.3"))),
    }
}

fn parse_lr(s: &str) -> Result<LrChoice, CliValueError> {
    if s == "auto" {
        return Ok(LrChoice::Auto);
    }
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1.0 => Ok(LrChoice::Fixed(v)),
        _ => Err(CliValueError(format!("--lr {s:?}: use `auto` or a rate between 0 and 1, e.g. 0.001"))),
    }
}

/// A command-line value that is out of range.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CliValueError(String);

/// `ragtag ledger ...`
#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// Contributions, samples, FLOPs, accepted weight and credit per peer.
    Summary {
        /// The node's state directory.
        #[arg(long, default_value = "ragtag-state")]
        state: PathBuf,
        /// Distinct countersigning peers needed for credit.
        #[arg(long, short, default_value_t = 1)]
        k: u64,
        /// A private swarm's allowlist (peer ids): only their receipts
        /// count. Without it, receipts count from peers whose updates this
        /// node accepted.
        #[arg(long)]
        allow: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check every signature and the hash chain; non-zero exit names the first bad record.
    Verify {
        /// The node's state directory.
        #[arg(long, default_value = "ragtag-state")]
        state: PathBuf,
    },
    /// Every record with its signature, verifiable with the public key.
    Export {
        /// The node's state directory.
        #[arg(long, default_value = "ragtag-state")]
        state: PathBuf,
        /// jsonl or csv.
        #[arg(long, value_enum, default_value = "jsonl")]
        format: ExportFormat,
    },
}

/// `ragtag doctor`
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Bootstrap nodes to test.
    #[arg(long)]
    pub bootstrap: Vec<String>,
    /// Swarm key of a private swarm.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    /// Device to test.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Seconds to wait for network checks.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

/// `ragtag run` flags. Every one may also come from `--config FILE` (TOML,
/// same names with `_` for `-`); flags win over the file.
#[derive(Args, Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunArgs {
    /// A TOML file setting any of these flags.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The run manifest (default: the built-in run, or fetched from peers with --run-id).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Join a run by id: fetch its manifest from the bootstrap peers.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Strategy of the built-in run.
    #[arg(long)]
    pub strategy: Option<String>,
    /// Pre-shared key of a private swarm (TCP only).
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    /// Peers allowed to connect and contribute (private swarms).
    #[arg(long)]
    pub allow: Vec<String>,
    /// Peers to join through (full multiaddr with /p2p/).
    #[arg(long)]
    pub bootstrap: Vec<String>,
    /// Addresses to listen on (default: 127.0.0.1 only).
    #[arg(long)]
    pub listen: Vec<String>,
    /// Discover peers on the local network with mDNS (sends multicast).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub mdns: Option<bool>,
    /// Also listen on QUIC (public swarms).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub quic: Option<bool>,
    /// auto, cpu, cuda, cuda:N or metal.
    #[arg(long)]
    pub device: Option<String>,
    /// The data file, for runs on file data.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// State directory: identity, ledger, checkpoints (resumes after a restart).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Identity file (default: STATE/identity.key).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Serve Prometheus metrics and /status here.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Make every inner step take this many times longer (emulates slower hardware).
    #[arg(long)]
    pub slowdown: Option<f32>,
    /// Make every inner step take at least this many seconds (emulates a
    /// device of known speed; the simulator's real mode uses it).
    #[arg(long)]
    pub step_time: Option<f64>,
    /// Stop after this many rounds.
    #[arg(long)]
    pub max_rounds: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop once the held-out loss of our replica is at or below this.
    #[arg(long)]
    pub target_loss: Option<f32>,
    /// Evaluate the held-out loss every this many rounds (default: about
    /// every 50 inner steps, so every round when a round is 50 steps).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Checkpoint every this many rounds (default: every 5 evaluations).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Print a JSON line per round on stdout (for scripts and tests).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub json: Option<bool>,
    /// With --json, add each round's per-layer update sample and the
    /// representation similarity of its model and anchor to the round line
    /// (the heterogeneity study's measurements, for `ragtag-simnet real`).
    /// Costs two forward passes of a 512-row probe after each round,
    /// outside the round's timing.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub trace_updates: Option<bool>,
}

/// Inner steps between held-out evaluations when no interval is given.
pub const EVAL_EVERY_STEPS: u64 = 50;
/// Evaluations between checkpoints when no interval is given.
pub const EVALS_PER_CHECKPOINT: u64 = 5;

/// Default (evaluation, checkpoint) intervals in rounds for `h` inner steps
/// per round. A ddp round is one step: evaluating 2,048 held-out samples and
/// checkpointing on a round count alone would cost more than the steps.
pub fn default_intervals(h: u32) -> (u64, u64) {
    let eval = EVAL_EVERY_STEPS.div_ceil(u64::from(h.max(1)));
    (eval, eval * EVALS_PER_CHECKPOINT)
}

/// Why the config file of `ragtag run` could not be used: the user fixes the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not TOML of `ragtag run`'s flags.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        source: toml::de::Error,
    },
}

impl RunArgs {
    /// Fills unset flags from the config file, if one was given.
    pub fn merged(mut self) -> Result<Self, ConfigFileError> {
        let Some(path) = self.config.clone() else { return Ok(self) };
        let text =
            std::fs::read_to_string(&path).map_err(|source| ConfigFileError::Read { path: path.clone(), source })?;
        let file: RunArgs = toml::from_str(&text).map_err(|source| ConfigFileError::Parse { path, source })?;
        macro_rules! fill {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = file.$f; } )* };
        }
        macro_rules! extend {
            ($($f:ident),*) => { $( if self.$f.is_empty() { self.$f = file.$f; } )* };
        }
        fill!(
            manifest,
            run_id,
            strategy,
            swarm_key,
            mdns,
            quic,
            device,
            data,
            state,
            key,
            metrics,
            slowdown,
            step_time,
            max_rounds,
            duration,
            target_loss,
            eval_every,
            checkpoint_every,
            json,
            trace_updates
        );
        extend!(allow, bootstrap, listen);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_intervals_follow_inner_steps() {
        // gopals' 50-step rounds: evaluate each round, checkpoint every 5.
        assert_eq!(default_intervals(50), (1, 5));
        assert_eq!(default_intervals(200), (1, 5));
        // ddp's one-step rounds.
        assert_eq!(default_intervals(1), (50, 250));
        assert_eq!(default_intervals(0), (50, 250));
        assert_eq!(default_intervals(20), (3, 15));
    }

    #[test]
    fn config_file_fills_unset_flags_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.toml");
        std::fs::write(&cfg, "slowdown = 4.0\nbootstrap = [\"/ip4/127.0.0.1/tcp/1\"]\nmax_rounds = 9\nmdns = false\n")
            .unwrap();
        let cli = Cli::parse_from(["ragtag", "run", "--config", cfg.to_str().unwrap(), "--max-rounds", "3"]);
        let Command::Run(args) = cli.command else { panic!("not run") };
        let args = args.merged().unwrap();
        assert_eq!(args.slowdown, Some(4.0));
        assert_eq!(args.max_rounds, Some(3));
        assert_eq!(args.bootstrap.len(), 1);
        assert_eq!(args.mdns, Some(false));
        std::fs::write(&cfg, "no_such_flag = 1\n").unwrap();
        let cli = Cli::parse_from(["ragtag", "run", "--config", cfg.to_str().unwrap()]);
        let Command::Run(args) = cli.command else { panic!("not run") };
        assert!(args.merged().unwrap_err().to_string().contains("no_such_flag"));
    }

    /// `--cooldown-fraction` shapes a budget's cooldown and means nothing
    /// without one.
    #[test]
    fn a_cooldown_fraction_needs_a_budget() {
        let new = |extra: &[&str]| {
            let mut args = vec!["ragtag", "swarm", "new", "--name", "n", "--out", "x"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        assert!(new(&[]).is_ok());
        let refused = new(&["--cooldown-fraction", "0.5"]).unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::MissingRequiredArgument, "no budget: {refused}");
        let fraction = |cli: Cli| match cli.command {
            Command::Swarm { command: SwarmCommand::New { cooldown_fraction, budget, .. } } => {
                (budget, cooldown_fraction)
            }
            _ => panic!("not swarm new"),
        };
        let given = new(&["--budget", "200", "--cooldown-fraction", "0.5"]).unwrap();
        assert_eq!(fraction(given), (Some(200), 0.5));
        let default = new(&["--budget", "200"]).unwrap();
        assert_eq!(fraction(default), (Some(200), ragtag_protocol::engine::cooldown::DEFAULT_FRACTION));
    }

    #[test]
    fn help_is_available_everywhere() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
