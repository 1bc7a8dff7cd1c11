//! A node leaves cleanly however it is told to: SIGTERM, SIGINT, SIGHUP, or
//! its stdout closing under it (`ragtag run --json | head`). Each time it
//! says why, exits with success, and leaves a checkpoint and a ledger that
//! verifies.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ragtag_tests::{bin, node};

const T: Duration = Duration::from_secs(60);

/// The state directory was left as a clean stop leaves it.
fn left_cleanly(state: &Path, stderr: &str, why: &str) {
    assert!(stderr.contains(&format!("stopping: {why}")), "no clean stop for {why}:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(state.join("engine.ckpt").exists(), "no checkpoint after {why}");
    let verify = Command::new(bin("ragtag")).args(["ledger", "verify", "--state"]).arg(state).output().unwrap();
    assert!(verify.status.success(), "{why}: {}", String::from_utf8_lossy(&verify.stdout));
}

#[test]
fn signals_stop_a_node_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    for (sig, why) in [
        (libc::SIGTERM, "terminated (SIGTERM)"),
        (libc::SIGINT, "interrupted (SIGINT)"),
        (libc::SIGHUP, "hung up (SIGHUP)"),
    ] {
        let d = dir.path().join(format!("sig{sig}"));
        let mut p = node(&d, &["--max-rounds", "1000"]);
        assert!(p.wait_json("round", T).is_some(), "no round:\n{}", p.stderr());
        p.signal(sig);
        let status = p.wait_exit(T).unwrap_or_else(|| panic!("no exit after signal {sig}:\n{}", p.stderr()));
        assert!(status.success(), "{why}: {status:?}\n{}", p.stderr());
        left_cleanly(&d.join("state"), &p.stderr(), why);
    }
}

#[test]
fn a_closed_stdout_stops_the_node_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut child = Command::new(bin("ragtag"))
        .args(["run", "--json", "--max-rounds", "1000", "--state"])
        .arg(&state)
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read the first line, as `head -1` would, then close the pipe.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("\"event\""), "{first}");
    drop(stdout);
    let end = Instant::now() + T;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "the node ran on with its stdout closed");
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "{status:?}\n{stderr}");
    left_cleanly(&state, &stderr, "stdout was closed");
}

/// On a terminal `ragtag run` keeps one live status line under its logs;
/// through a pipe (and with --json) it prints nothing extra. `script`
/// (util-linux, in every Debian) gives the node a pseudo-terminal.
#[test]
fn a_terminal_gets_the_live_line_and_a_pipe_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let ragtag = bin("ragtag");
    let run =
        |state: &str| format!("{} run --max-rounds 6 --state {}", ragtag.display(), dir.path().join(state).display());
    let tty = Command::new("script").args(["-qec", &run("tty"), "/dev/null"]).output().expect("script runs");
    let tty = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.contains("held-out") && tty.contains("steps/s ·"), "no live line on a terminal:\n{tty}");
    let piped = Command::new(&ragtag)
        .args(["run", "--max-rounds", "6", "--state"])
        .arg(dir.path().join("pipe"))
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(piped.status.success());
    let all = format!("{}{}", String::from_utf8_lossy(&piped.stdout), String::from_utf8_lossy(&piped.stderr));
    assert!(!all.contains("steps/s ·"), "a live line through a pipe:\n{all}");
}
