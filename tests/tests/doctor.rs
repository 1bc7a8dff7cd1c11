//! `ragtag doctor` on loopback: against a running bootstrap every check
//! passes (dial, reachability, relay reservation, peers); against a closed
//! port it names the failure and the fix, and exits non-zero.

use std::process::Command;

use ragtag_tests::{bin, bootstrap};

/// Runs the doctor; returns whether it exited 0 and what it printed.
fn doctor(args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("ragtag"))
        .arg("doctor")
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("ragtag runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn doctor_passes_against_a_running_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let (_b, addr) = bootstrap(dir.path(), &["--listen", "/ip4/127.0.0.1/tcp/0"]);
    let (ok, out) = doctor(&["--bootstrap", &addr, "--timeout", "20"]);
    assert!(ok, "{out}");
    for check in ["dial bootstrap", "relay reservation", "peers discovered"] {
        assert!(out.contains(&format!("[ok  ] {check}")), "{check} did not pass:\n{out}");
    }
    assert!(!out.contains("[FAIL]"), "{out}");
    assert!(out.contains("this machine can take part"), "{out}");
}

#[test]
fn doctor_explains_a_closed_port() {
    // A free port below Linux's ephemeral range (32768-60999): nothing
    // listens there, and no node of a test running beside this one (they
    // all bind port 0) can be given it between this check and the dial,
    // which once made the dial reach that node instead ("Unexpected peer ID").
    let start = 20_000 + (std::process::id() % 8_000) as u16;
    let port = (start..32_000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range");
    let key = tempfile::tempdir().unwrap();
    let keygen =
        Command::new(bin("ragtag")).args(["keygen", "--out", key.path().join("k").to_str().unwrap()]).output().unwrap();
    let peer = String::from_utf8_lossy(&keygen.stdout).trim().to_string();
    let addr = format!("/ip4/127.0.0.1/tcp/{port}/p2p/{peer}");
    let (ok, out) = doctor(&["--bootstrap", &addr, "--timeout", "5"]);
    assert!(!ok, "the doctor should exit non-zero:\n{out}");
    assert!(out.contains("[FAIL] dial bootstrap"), "{out}");
    assert!(out.contains("Connection refused"), "the failure should say why:\n{out}");
    assert!(out.contains("fix: check the address and port"), "the failure should say how to fix it:\n{out}");
}
