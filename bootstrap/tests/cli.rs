//! `ragtag-bootstrap` starts, prints its dialable address, and stops on SIGTERM.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

#[test]
fn prints_its_address_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("b.key");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ragtag-bootstrap"))
        .args(["--key", key.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("/ip4/127.0.0.1/tcp/") && line.contains("/p2p/12D3Koo"), "{line}");
    assert!(key.exists(), "identity created on first start");
    let pid = child.id() as i32;
    #[allow(unsafe_code)]
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
