//! simnet's real mode: real `ragtag` processes emulate their scenario
//! node's step cost, and the report reads their work back. ddp waits for
//! the slowest node every step, so the slow process is busy nearly all the
//! time and the twice-as-fast one about half of it.

use std::process::Command;

use ragtag_tests::bin;

#[test]
fn real_mode_paces_each_process_like_its_scenario_node() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let real = |duration: &str| {
        Command::new(bin("ragtag-simnet"))
            .args(["real", "--scenario", "hetero-4x", "--nodes", "2", "--speeds", "1,2", "--strategy", "ddp"])
            .args(["--duration", duration, "--out"])
            .arg(&out)
            .output()
            .unwrap()
    };
    let run = real("20");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(out.join("summary.json").exists(), "no summary.json");
    // strategy,seed,node,speed,group,utilisation,busy_s,alive_s,bytes_sent,updates,...
    let csv = std::fs::read_to_string(out.join("nodes.csv")).unwrap();
    let rows: Vec<Vec<String>> = csv.lines().skip(1).map(|l| l.split(',').map(String::from).collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    let field = |row: &[String], i: usize| row[i].parse::<f64>().unwrap();
    let (slow, fast) = (&rows[0], &rows[1]);
    assert_eq!((field(slow, 3), field(fast, 3)), (1.0, 2.0), "{csv}");
    for row in &rows {
        // 0.1 s steps for 20 s less start-up: far more than a handful.
        assert!(field(row, 9) >= 40.0, "too few steps: {csv}");
    }
    let (u_slow, u_fast) = (field(slow, 5), field(fast, 5));
    eprintln!("utilisation: slow {u_slow:.3}, fast {u_fast:.3}\n{stdout}");
    // Start-up (about 2 s of 20) counts as idle; a ddp step is one 0.1 s step
    // of the slow node plus the exchange.
    assert!(u_slow > 0.6, "the slow process should be busy most of the time: {csv}");
    assert!(u_fast > 0.2 && u_fast < 0.75 * u_slow, "the fast process should wait for the slow one: {csv}");
    // Run again into the same place: a new run (its own start time and run
    // id), so the nodes must not find the first run's state there (they
    // refused it, and no node reported a round).
    let again = real("8");
    assert!(again.status.success(), "a second run in the same place: {}", String::from_utf8_lossy(&again.stderr));
}

/// With `--layers`, every node traces its rounds and the report has the
/// simulator's per-layer figures: per tensor, both groups' update norms
/// (the fast node's rounds are four times the steps, so larger), and the
/// representation similarity of each group's rounds with their anchor.
#[test]
fn real_mode_records_per_layer_figures_from_traced_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = Command::new(bin("ragtag-simnet"))
        .args(["real", "--scenario", "hetero-4x", "--nodes", "2", "--speeds", "1,4", "--strategy", "gopals"])
        .args(["--duration", "20", "--layers", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let rows = |csv: &str| -> Vec<Vec<String>> {
        csv.lines().skip(1).map(|l| l.split(',').map(String::from).collect()).collect()
    };
    // strategy,seed,node,speed,group: the slow node is group 1.
    let nodes = read("nodes.csv");
    let groups: Vec<&str> = rows(&nodes).iter().map(|r| if r[4] == "1" { "slow" } else { "fast" }).collect::<Vec<_>>();
    assert_eq!(groups, ["slow", "fast"], "{nodes}");
    // strategy,seed,t,layer,cosine_fast_slow,norm_fast,norm_slow,...
    let layers = read("layers.csv");
    let samples = rows(&layers);
    assert!(samples.len() >= 8, "too few layer samples: {layers}");
    let field = |r: &[String], i: usize| r[i].parse::<f64>().unwrap();
    let mut tensors: Vec<&str> = samples.iter().map(|r| r[3].as_str()).collect();
    tensors.dedup();
    assert!(tensors.iter().any(|t| t.ends_with("weight")), "{layers}");
    let (mut fast, mut slow) = (0.0, 0.0);
    for r in &samples {
        assert!((-1.0..=1.0).contains(&field(r, 4)), "a cosine out of range: {layers}");
        fast += field(r, 5);
        slow += field(r, 6);
    }
    assert!(slow > 0.0 && fast > slow, "update norms: fast {fast}, slow {slow}\n{layers}");
    // strategy,seed,t,layer,cka_fast,cka_slow
    let reps = read("representations.csv");
    let cka = rows(&reps);
    assert!(!cka.is_empty(), "no representation samples: {reps}");
    for r in &cka {
        for i in [4, 5] {
            assert!(field(r, i) > 0.0 && field(r, i) <= 1.0 + 1e-9, "CKA out of range: {reps}");
        }
    }
}
