//! `ragtag-simnet`: the heterogeneity lab's command line.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ragtag_protocol::engine::{Strategy, inner_lr::InnerLr};
use ragtag_simnet::{
    ablation::{self, LateUpdates, ablate_staleness},
    compare::{compare, summarize, table},
    outputs::write_all,
    report::{RunSummary, run_line},
    scenario::{BUILTIN, Scenario},
    sim::{RunOptions, run},
};

/// Many ragtag nodes in virtual time: the real engine, real math, a
/// modelled clock and network.
#[derive(Parser, Debug)]
#[command(name = "ragtag-simnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the built-in scenarios.
    Scenarios,
    /// Run one strategy on a scenario.
    Run {
        /// Built-in scenario name or a TOML file.
        #[arg(long, default_value = "demo")]
        scenario: String,
        /// Strategy: ddp, diloco, diloco-proportional, async, gopals, gopals-async.
        #[arg(long, default_value = "gopals", value_parser = parse_strategy)]
        strategy: Strategy,
        /// Seed offset.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write summary.json, CSV and plots here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the JSON summary on stdout (and no progress bar).
        #[arg(long)]
        json: bool,
        /// Run the scenario's whole duration instead of stopping soon
        /// after its target (to see where the loss goes next).
        #[arg(long)]
        whole: bool,
        /// The inner learning rate over the run: `plateau` (the local-SGD
        /// presets' default) or `constant` (for ablation).
        #[arg(long, value_parser = ["plateau", "constant"])]
        inner_lr: Option<String>,
    },
    /// Run a scenario with real `ragtag` processes (loopback, or network
    /// namespaces with --netem) and write the same report as virtual mode.
    Real {
        /// Built-in scenario name or a TOML file.
        #[arg(long, default_value = "hetero-4x")]
        scenario: String,
        /// Override the scenario's nodes: this many...
        #[arg(long)]
        nodes: Option<u32>,
        /// ...with these speeds (comma separated, repeated to fill).
        #[arg(long, value_delimiter = ',')]
        speeds: Vec<f64>,
        /// Strategy.
        #[arg(long, default_value = "gopals", value_parser = parse_strategy)]
        strategy: Strategy,
        /// Seconds every node runs.
        #[arg(long, default_value_t = 60.0)]
        duration: f64,
        /// tc netem shaping, e.g. "delay 20ms rate 100mbit" (needs root: namespaces).
        #[arg(long)]
        netem: Option<String>,
        /// A fixed tick period in ms (default: the scenario's, derived from
        /// the step cost that every process emulates).
        #[arg(long)]
        tick_ms: Option<u32>,
        /// Record the per-layer measurements of virtual mode (layers.csv),
        /// estimated from each node's traced rounds (`ragtag run
        /// --trace-updates`).
        #[arg(long)]
        layers: bool,
        /// Where reports go.
        #[arg(long)]
        out: PathBuf,
    },
    /// Run several strategies on the same scenario and compare them.
    Compare {
        /// Built-in scenario name or a TOML file.
        #[arg(long, default_value = "demo")]
        scenario: String,
        /// Strategies, comma separated.
        #[arg(long, default_value = "ddp,diloco,diloco-proportional,async,gopals", value_delimiter = ',', value_parser = parse_strategy)]
        strategies: Vec<Strategy>,
        /// Seeds per strategy.
        #[arg(long, default_value_t = 1)]
        seeds: u32,
        /// Write summary.json, CSV and plots here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the JSON summary on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The heterogeneity study: specialisation, straggler drift, the
    /// shape frontier and the mitigations, on two tasks with several
    /// seeds; writes STUDY.md and its plots.
    Study {
        /// The quick version (fewer shapes, half the time): a check.
        #[arg(long)]
        quick: bool,
        /// Seeds per configuration (default: 3; 2 with --quick).
        #[arg(long)]
        seeds: Option<u32>,
        /// The transformer task's text file.
        #[arg(long, default_value = "../shared/data/shakespeare.txt")]
        text: PathBuf,
        /// Tasks, comma separated: teacher, char.
        #[arg(long, value_delimiter = ',', default_value = "teacher,char", value_parser = parse_task)]
        tasks: Vec<ragtag_simnet::study::Task>,
        /// Where STUDY.md goes (its plots and figures go to docs/study/ there).
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// Also run one configuration per question of the MLP task with
        /// real processes, tracing their rounds (needs the ragtag and
        /// ragtag-bootstrap binaries beside this one).
        #[arg(long)]
        real: bool,
        /// Take the simulations from this study.json of an earlier run
        /// instead of running them again (to add --real or redraw).
        #[arg(long)]
        reuse: Option<PathBuf>,
    },
    /// The staleness ablation: one strategy on one scenario with late
    /// updates at full weight, weighted (the default) and dropped, several
    /// seeds each.
    Ablate {
        /// Built-in scenario name or a TOML file.
        #[arg(long, default_value = "stragglers")]
        scenario: String,
        /// Strategy every arm runs.
        #[arg(long, default_value = "gopals", value_parser = parse_strategy)]
        strategy: Strategy,
        /// Arms, comma separated: none, polynomial, drop.
        #[arg(long, default_value = "none,polynomial,drop", value_delimiter = ',', value_parser = parse_arm)]
        staleness: Vec<LateUpdates>,
        /// Seeds per arm.
        #[arg(long, default_value_t = 3)]
        seeds: u32,
        /// Print the JSON result on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn parse_arm(s: &str) -> Result<LateUpdates, String> {
    LateUpdates::parse(s).ok_or_else(|| {
        let names: Vec<&str> = LateUpdates::ALL.iter().map(|a| a.name()).collect();
        format!("unknown arm {s:?}; one of {}", names.join(", "))
    })
}

fn parse_task(s: &str) -> Result<ragtag_simnet::study::Task, String> {
    ragtag_simnet::study::Task::ALL
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| format!("unknown task {s:?}; one of teacher, char"))
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
        format!("unknown strategy {s:?}; one of {}", names.join(", "))
    })
}

/// A thousand engines and the nodes' training allocate small blocks all
/// run long, on both cores: against glibc's arena per thread, mimalloc
/// took the 1,000-node run to 0.94x its wall time and 0.73x its peak
/// memory (BENCHMARKS.md, "1,000 nodes: the members of a tick booked in
/// one pass, and mimalloc").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: first thing in main, before any other thread is spawned.
    unsafe {
        ragtag_models::device::prepare_cpu_process(ragtag_models::device::Arenas::PerThread)
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Scenarios => {
            for (name, _) in BUILTIN {
                let s = Scenario::load(name)?;
                println!("{name:<14} {:>5} nodes  {}", s.node_count(), s.description);
            }
        }
        Command::Run { scenario, strategy, seed, out, json, whole, inner_lr } => {
            let mut s = Scenario::load(&scenario)?;
            if whole {
                s.after_target_s = s.duration_s;
            }
            if let Some(v) = inner_lr {
                s.engine.inner_lr = Some(if v == "constant" { InnerLr::Constant } else { InnerLr::PLATEAU });
            }
            let wall = std::time::Instant::now();
            let output = run(&s, &RunOptions { strategy, seed, progress: !json, ddp_lr: None })?;
            let summary = RunSummary::new(&s, &output);
            if let Some(dir) = &out {
                let c = summarize(&s, &[strategy], 1, std::slice::from_ref(&output));
                write_all(dir, &c, std::slice::from_ref(&output))
                    .with_context(|| format!("writing {}", dir.display()))?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                println!("{}", run_line(&summary));
                println!("({} events, {:.1}s wall)", summary.events, wall.elapsed().as_secs_f64());
            }
        }
        Command::Real { scenario, nodes, speeds, strategy, duration, netem, tick_ms, layers, out } => {
            let mut s = Scenario::load(&scenario)?;
            if !speeds.is_empty() || nodes.is_some() {
                let n = nodes.unwrap_or(speeds.len() as u32).max(1) as usize;
                let base = if speeds.is_empty() { vec![1.0] } else { speeds };
                s.nodes = ragtag_simnet::scenario::Nodes {
                    speeds: (0..n).map(|i| base[i % base.len()]).collect(),
                    ..Default::default()
                };
            }
            let opts = ragtag_simnet::real::RealOptions {
                strategy,
                duration_s: duration,
                netem,
                out: out.clone(),
                tick_ms,
                trace_updates: layers,
            };
            let output = ragtag_simnet::real::run_real(&s, &opts)?;
            let c = summarize(&s, &[strategy], 1, std::slice::from_ref(&output));
            write_all(&out, &c, std::slice::from_ref(&output))?;
            println!("{}", run_line(&RunSummary::new(&s, &output)));
            println!("wrote summary.json, CSV and PNG plots to {}", out.display());
        }
        Command::Compare { scenario, strategies, seeds, out, json } => {
            if strategies.is_empty() || seeds == 0 {
                bail!("need at least one strategy and one seed");
            }
            let s = Scenario::load(&scenario)?;
            let (c, outputs) = compare(&s, &strategies, seeds, !json)?;
            if let Some(dir) = &out {
                write_all(dir, &c, &outputs).with_context(|| format!("writing {}", dir.display()))?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                print!("{}", table(&c));
                if let Some(dir) = &out {
                    println!("wrote summary.json, CSV and PNG plots to {}", dir.display());
                }
            }
        }
        Command::Study { quick, seeds, text, tasks, out, real, reuse } => {
            let seeds = seeds.unwrap_or(if quick { 2 } else { 3 });
            if seeds == 0 || tasks.is_empty() {
                bail!("need at least one seed and one task");
            }
            let mut command = String::from("cargo run -p ragtag-simnet -- study");
            if quick {
                command.push_str(" --quick");
            }
            if seeds != if quick { 2 } else { 3 } {
                command.push_str(&format!(" --seeds {seeds}"));
            }
            if tasks != ragtag_simnet::study::Task::ALL {
                let names: Vec<&str> = tasks.iter().map(|t| t.name()).collect();
                command.push_str(&format!(" --tasks {}", names.join(",")));
            }
            let opts = ragtag_simnet::study::StudyOptions { quick, seeds, text, tasks, progress: true };
            if real {
                command.push_str(" --real");
            }
            if let Some(path) = &reuse {
                command.push_str(&format!(" --reuse {}", path.display()));
            }
            let path = ragtag_simnet::study::write::run_and_write(&opts, &out, &command, reuse.as_deref(), real)?;
            println!("wrote {}", path.display());
        }
        Command::Ablate { scenario, strategy, staleness, seeds, json } => {
            if staleness.is_empty() || seeds == 0 {
                bail!("need at least one arm and one seed");
            }
            let s = Scenario::load(&scenario)?;
            let a = ablate_staleness(&s, strategy, &staleness, seeds, !json)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&a)?);
            } else {
                print!("{}", ablation::table(&a));
            }
        }
    }
    Ok(())
}
