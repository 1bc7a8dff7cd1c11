//! The `ragtag` binary's commands, run as a user would.

use std::process::Command;

fn ragtag() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ragtag"))
}

#[test]
fn help_works_for_every_command() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["swarm", "new", "--help"],
        &["ledger", "verify", "--help"],
        &["doctor", "--help"],
        &["status", "--help"],
        &["keygen", "--help"],
    ] {
        let out = ragtag().args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"), "{args:?}");
    }
}

#[test]
fn keygen_writes_a_private_identity_and_prints_the_peer_id() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id.key");
    let out = ragtag().args(["keygen", "--out", key.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success());
    let peer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(peer.starts_with("12D3Koo"), "{peer}");
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    // Refuses to overwrite.
    assert!(!ragtag().args(["keygen", "--out", key.to_str().unwrap()]).status().unwrap().success());
}

#[test]
fn swarm_new_writes_a_manifest_and_a_swarm_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = ragtag()
        .args([
            "swarm",
            "new",
            "--name",
            "t",
            "--private",
            "--strategy",
            "diloco",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(dir.path().join("swarm.key")).unwrap();
    assert!(text.starts_with("/key/swarm/psk/1.0.0/\n/base16/\n"));
    let m = std::fs::read_to_string(dir.path().join("manifest.toml")).unwrap();
    assert!(m.contains("diloco"));
    let bad = ragtag()
        .args(["swarm", "new", "--name", "t", "--data", "nope", "--out", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown data"));
}

#[test]
fn ledger_commands_explain_a_missing_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let out = ragtag().args(["ledger", "verify", "--state", dir.path().to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no ledger"));
}

#[test]
fn status_explains_when_no_node_runs() {
    let out = ragtag().args(["status", "--metrics", "127.0.0.1:1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}
