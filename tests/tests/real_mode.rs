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
