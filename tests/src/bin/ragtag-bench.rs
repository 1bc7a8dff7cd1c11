//! `ragtag-bench`: runs every benchmark of the project and rewrites
//! BENCHMARKS.md. Every figure is a ratio against a baseline measured in
//! the same run, on this machine. A run of some benchmarks (`--only A,B`)
//! or with `--print` prints its sections instead: BENCHMARKS.md holds the
//! whole set, with the analysis, and a part must not replace it.
//!
//!     cargo run --release -p ragtag-tests --bin ragtag-bench -- --quick
//!     cargo run --release -p ragtag-tests --bin ragtag-bench -- --full

use std::{fmt::Write as _, path::PathBuf};

use anyhow::Result;
use clap::Parser;
use ragtag_protocol::engine::Strategy;
use ragtag_tests::bench::{
    self, Figure, apply, ledger, machine, simulate, soak, suite, traffic, trainer, transfer, versus_ddp,
};

#[global_allocator]
static ALLOC: bench::CountingAllocator = bench::CountingAllocator;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// Runs the project's benchmarks and rewrites BENCHMARKS.md (or prints a part).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The full run: more repetitions, seeds and longer budgets.
    #[arg(long, conflicts_with = "quick")]
    full: bool,
    /// The quick run (the default).
    #[arg(long)]
    quick: bool,
    /// Only these benchmarks, comma-separated (apply, ledger, transfer,
    /// soak, traffic, trainer, simnet, versus-ddp; task-data only writes the
    /// generated files tests/tasks/*.toml read); prints instead of writing.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Print the sections instead of rewriting BENCHMARKS.md.
    #[arg(long)]
    print: bool,
    /// Soak length in seconds (default: 600 full, 120 quick).
    #[arg(long)]
    soak_seconds: Option<u64>,
    /// Swarm sizes of the traffic benchmark (default: 4, 8, 16).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 8, 16])]
    traffic_nodes: Vec<usize>,
    /// The node binary versus-ddp and traffic run (default: target/release/ragtag).
    #[arg(long)]
    ragtag: Option<PathBuf>,
    /// Each versus-ddp run's budget in seconds (default: 200 full, 120 quick).
    #[arg(long)]
    ddp_seconds: Option<f64>,
    /// The versus-ddp tasks (default: all of teacher-digits,
    /// char-shakespeare, cnn-digits).
    #[arg(long, value_delimiter = ',')]
    tasks: Option<Vec<String>>,
    /// Seeds per versus-ddp task (default: 3 full, 1 quick).
    #[arg(long)]
    seeds: Option<u64>,
    /// The first versus-ddp seed (seeds run from here up), to add seeds to
    /// an earlier run without repeating it.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// DDP's learning rates swept on a versus-ddp task's first seed, the
    /// best reused on the others (default: 3e-4,1e-3,3e-3 full, 1e-3
    /// quick). A sweep whose best is its largest rate goes on upwards.
    #[arg(long, value_delimiter = ',')]
    ddp_lrs: Option<Vec<f64>>,
    /// DDP's learning rate over a versus-ddp run: constant, or cosine
    /// decay over the budget.
    #[arg(long, value_enum, default_value = "constant")]
    ddp_schedule: versus_ddp::DdpSchedule,
    /// Tell ragtag the versus-ddp budget too (`swarm new --budget`): its
    /// inner rate then cools down to zero over the last fifth of each run,
    /// as a cosine DDP's falls over the whole of it.
    #[arg(long)]
    ragtag_budget: bool,
    /// One more argument for every versus-ddp task's `ragtag swarm new`
    /// (repeat it: `--swarm-new-arg=--inner-lr --swarm-new-arg=constant`),
    /// for an ablation of the manifest's defaults.
    #[arg(long, allow_hyphen_values = true)]
    swarm_new_arg: Vec<String>,
    /// The text task's file.
    #[arg(long, default_value = "../shared/data/shakespeare.txt")]
    text: PathBuf,
}

fn main() -> Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: first thing in main, no other thread exists yet.
    unsafe {
        ragtag_models::device::prepare_cpu_process(ragtag_models::device::Arenas::One)
    };
    let args = Args::parse();
    let full = args.full;
    let only = args.only.clone();
    let wants = |s: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let repo = repo_root();
    let out_dir = repo.join("target/bench-out");
    std::fs::create_dir_all(&out_dir)?;
    let mode = if full { "full" } else { "quick" };
    let command = format!("cargo run --release -p ragtag-tests --bin ragtag-bench -- --{mode}");
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Written by `{command}` on {} ({}).\nEvery speed is a ratio against a baseline measured in the same run on the same machine; these machines are shared and noisy, so absolute times vary between runs, ratios much less. Goals come from the issues; where a figure misses its goal, the section says why.\n",
        machine::describe(),
        std::process::Command::new("date")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    );
    let section = |title: &str, intro: &str, figures: &[Figure], md: &mut String| {
        let _ = writeln!(md, "## {title}\n\n{intro}\n\n{}", bench::table(figures));
        eprintln!("{title}:\n{}", bench::table(figures));
    };

    if wants("apply") {
        let f = apply::run(if full { 30 } else { 10 });
        section(
            "Update apply vs memcpy",
            "A 5M-parameter anchor; one update decoded, weighted and applied by the outer optimiser (delayed Nesterov: per-arrival step plus one momentum step per 16 arrivals, amortised), against copying the same buffer. Goal: at least 0.5 of memcpy's bandwidth, no allocation per update.",
            &f,
            &mut md,
        );
    }
    if wants("ledger") {
        let f = ledger::run(if full { 100_000 } else { 20_000 });
        section(
            "Ledger",
            "Signed, hash-chained records in sled. Goal: at least 20,000 appends/s with the node's flush policy and 50,000 verifies/s.",
            &f,
            &mut md,
        );
    }
    if wants("transfer") {
        let f = transfer::run(20, if full { 10 } else { 3 });
        section(
            "Payload transfer",
            "A 5M-parameter f32 payload (20 MiB) between two processes' worth of libp2p stacks in one process, over loopback, against raw TCP.",
            &f,
            &mut md,
        );
    }
    if wants("soak") {
        let ragtag = repo.join("target/release/ragtag");
        // `--soak-seconds N` runs longer, to see where memory levels off.
        let seconds = args.soak_seconds.unwrap_or(if full { 600 } else { 120 });
        let f = soak::run(&ragtag, 16, seconds);
        section(
            &format!("Soak: 16 processes for {seconds} s"),
            "16 `ragtag run` processes of the built-in run on loopback (RAYON_NUM_THREADS=1, RUST_LOG=warn) on this 2-core machine. Memory must stay flat: the ratio compares the late figure with the early one.",
            &f,
            &mut md,
        );
    }
    if wants("traffic") {
        let ragtag = args.ragtag.clone().unwrap_or_else(|| repo.join("target/release/ragtag"));
        let seconds = if full { 40 } else { 20 };
        let f = traffic::run(&ragtag, &args.traffic_nodes, seconds);
        section(
            "Traffic per node as the swarm grows (real processes)",
            &format!(
                "`ragtag run` processes of the built-in run on loopback (RAYON_NUM_THREADS=1), manifests from `ragtag swarm new --tick-ms 1000` with and without `--aggregate 2`, so a round is a second. Each node's libp2p bandwidth counters (after noise and yamux, gossip forwarding included) read from its /metrics 20 s in and {seconds} s later. Goal (issue 26): per-node bytes per round that stay bounded as the swarm grows."
            ),
            &f,
            &mut md,
        );
    }
    if wants("trainer") {
        let f = trainer::run(&repo, if full { 100 } else { 30 });
        section(
            "Training step on the CPU vs JAX",
            "Median time of one inner step (forward, backward, AdamW with clipping) on a fixed batch, candle against JAX 0.8 (jit, XLA CPU) with the same architecture, batch, f32 and optimiser, installed by this benchmark into target/bench-venv. A ratio above 1 means candle is slower.",
            &f,
            &mut md,
        );
    }
    if wants("simnet") {
        let strategies = [
            Strategy::Ddp,
            Strategy::Diloco,
            Strategy::DilocoProportional,
            Strategy::Async,
            Strategy::Gopals,
            Strategy::GopalsAsync,
        ];
        let simnet = repo.join("target/release/ragtag-simnet");
        for scenario in ["hetero-4x", "hetero-8x-16"] {
            let (c, t) = simulate::compare_scenario(scenario, &strategies, if full { 3 } else { 1 }, &out_dir)?;
            if scenario == "hetero-4x" && simnet.exists() {
                let f = simulate::real_mode(&simnet, scenario, if full { 240.0 } else { 60.0 }, &out_dir, &c);
                section(
                    "Real mode: hetero-4x with processes",
                    "`ragtag-simnet real --scenario hetero-4x --strategy S --duration D`: one `ragtag` process per node on loopback, each emulating its node's step cost (`--step-time`, the scenario's step_cost_s / speed), wall-clock time. Next to the virtual figures of the same scenario.",
                    &f,
                    &mut md,
                );
            }
            let figs = simulate::headline(&c);
            let _ = writeln!(
                md,
                "## Simulator: {scenario}\n\n`ragtag-simnet compare --scenario {scenario} --seeds {}` (plots and CSV in target/bench-out/{scenario}/):\n\n```\n{t}```\n",
                c.seeds
            );
            section(&format!("{scenario}: against the goals"), "", &figs, &mut md);
        }
        if simnet.exists() {
            // Full: about 100 rounds per node (the goal's), 1.2 rounds per virtual second.
            let f = simulate::large(&simnet, Some(if full { 85.0 } else { 30.0 }));
            section(
                "Simulator scale: 1,000 nodes",
                "`ragtag-simnet run --scenario large` in its own process.",
                &f,
                &mut md,
            );
        } else {
            let _ = writeln!(
                md,
                "## Simulator scale\n\nNot run: build target/release/ragtag-simnet first (`cargo build --release -p ragtag-simnet`).\n"
            );
        }
    }
    if only.as_ref().is_some_and(|o| o.iter().any(|x| x == "task-data")) {
        // Only the generated task files (what tests/tasks/*.toml read), for
        // the simulator without PyTorch.
        let (csv, floor) = suite::teacher_digits_file(&repo)?;
        println!("{} (held-out floor {floor:.4})", csv.display());
        println!("{}", suite::augmented_digits_file(&repo)?.display());
    }
    if wants("versus-ddp") {
        // `--ragtag PATH`: the node binary (default: the release build).
        let ragtag = args.ragtag.clone().unwrap_or_else(|| repo.join("target/release/ragtag"));
        let ragtag = std::fs::canonicalize(&ragtag).unwrap_or(ragtag);
        let seconds = args.ddp_seconds.unwrap_or(if full { 200.0 } else { 120.0 });
        let lrs = args.ddp_lrs.clone().unwrap_or_else(|| if full { vec![3e-4, 1e-3, 3e-3] } else { vec![1e-3] });
        anyhow::ensure!(!lrs.is_empty() && lrs.iter().all(|l| l.is_finite() && *l > 0.0), "--ddp-lrs: positive rates");
        let ddp_plan = versus_ddp::DdpPlan { lrs, schedule: args.ddp_schedule };
        let seeds: Vec<u64> =
            (args.first_seed..args.first_seed + args.seeds.unwrap_or(if full { 3 } else { 1 })).collect();
        let names: Vec<String> =
            args.tasks.clone().unwrap_or_else(|| suite::NAMES.iter().map(|n| n.to_string()).collect());
        let text = std::fs::canonicalize(repo.join(&args.text)).unwrap_or_else(|_| args.text.clone());
        for name in &names {
            let mut task = suite::task(&repo, name, &text)?;
            if args.ragtag_budget {
                task.swarm_new.extend(["--budget".to_string(), format!("{}", seconds.round() as u32)]);
            }
            task.swarm_new.extend(args.swarm_new_arg.iter().cloned());
            let (f, per_seed) =
                versus_ddp::run(&repo, &ragtag, &task, &seeds, seconds, &ddp_plan, &out_dir.join("versus-ddp"))?;
            section(
                &format!("Real swarm vs PyTorch DDP: {}", task.name),
                &format!(
                    "`ragtag-bench --only versus-ddp --tasks {} --seeds {}{} --ddp-schedule {}{}`: {}. Four `ragtag run` processes on loopback with the manifest `ragtag swarm new {}` writes (its learning-rate probe included), step floors {:?} s (speeds 4, 4, 2, 1); one ragtag node alone at the fastest floor as the control, whose best sets each seed's target ({} x it); PyTorch DDP (`tests/scripts/ddp_baseline.py`: torch.distributed, gloo, 127.0.0.1, AdamW at a {} rate, the manifest's batch per rank, beta2 0.999, no weight decay or clipping, its clock stopped while rank 0 evaluates) with one rank per node at the same floors. A loss is the mean of three consecutive evaluations (node 0's replica; DDP's model), each system evaluating once per 50 steps of the fastest machine.\n\nPer seed:\n\n{per_seed}",
                    task.name,
                    seeds.len(),
                    if args.first_seed > 0 { format!(" --first-seed {}", args.first_seed) } else { String::new() },
                    args.ddp_schedule.arg(),
                    if args.ragtag_budget { " --ragtag-budget" } else { "" }.to_string()
                        + &args.swarm_new_arg.iter().map(|a| format!(" --swarm-new-arg={a}")).collect::<String>(),
                    task.describe,
                    task.swarm_new.join(" "),
                    task.step_times,
                    versus_ddp::TARGET_MARGIN,
                    args.ddp_schedule.arg(),
                ),
                &f,
                &mut md,
            );
        }
    }
    if only.is_none() {
        let _ = writeln!(md, "{}", include_str!("../bench/analysis.md"));
    }
    let _ = writeln!(
        md,
        "## GPU\n\nNo CUDA GPU on this machine: the CUDA training step and its PyTorch comparison were not measured.\n"
    );
    let path = repo.join("BENCHMARKS.md");
    if only.is_some() || args.print {
        println!("{md}");
    } else {
        std::fs::write(&path, &md)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
