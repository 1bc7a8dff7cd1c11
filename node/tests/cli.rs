//! The `ragtag` binary's commands, run as a user would.

use std::process::Command;

use ragtag_protocol::{codec::CodecKind, engine::Strategy, manifest::ModelSpec};

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
        &["export", "--help"],
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

/// The learning rate: probed by default with its evidence in the
/// manifest's rationale, or fixed by the creator; nonsense is refused.
#[test]
fn swarm_new_probes_or_takes_the_learning_rate_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let new = |extra: &[&str], out: &str| {
        let mut args = vec!["swarm", "new", "--name", "t", "--hidden", "16", "--model", "mlp", "--out", out];
        args.extend_from_slice(extra);
        ragtag().args(&args).output().unwrap()
    };
    let probed = dir.path().join("probed");
    let out = new(&["--probe-steps", "40"], probed.to_str().unwrap());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = std::fs::read_to_string(probed.join("manifest.toml")).unwrap();
    assert!(m.contains("[rationale]") && m.contains("after 40 inner steps"), "{m}");
    let hidden = m.split("hidden = [").nth(1).and_then(|r| r.split(']').next()).unwrap_or_default();
    assert_eq!(hidden.split(',').filter_map(|w| w.trim().parse::<u32>().ok()).collect::<Vec<_>>(), vec![16]);
    let fixed = dir.path().join("fixed");
    let out = new(&["--lr", "0.0005"], fixed.to_str().unwrap());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = std::fs::read_to_string(fixed.join("manifest.toml")).unwrap();
    assert!(m.contains("lr = 0.0005") && m.contains("chosen by the run's creator"), "{m}");
    let bad = new(&["--lr", "fast"], dir.path().join("bad").to_str().unwrap());
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("use `auto` or a rate"));
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

#[test]
fn swarm_new_takes_the_knobs_that_matter_and_refuses_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "swarm",
        "new",
        "--name",
        "knobs",
        "--model",
        "mlp",
        "--hidden",
        "16",
        "--lr",
        "0.001",
        "--strategy",
        "diloco",
        "--h",
        "20",
        "--batch",
        "64",
        "--codec",
        "f16",
        "--target-loss",
        "1.2",
        "--out",
    ];
    let ok = ragtag().args(args).arg(&out).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let m = ragtag_node::manifest_file::read(&out.join("manifest.toml")).unwrap();
    assert_eq!((m.engine.strategy, m.engine.h, m.training.batch_size), (Strategy::Diloco, 20, 64));
    assert_eq!((m.engine.codec, m.training.target_loss), (CodecKind::F16, Some(1.2)));
    assert!(m.rationale["batch_size"].contains("chosen by the run's creator"));
    for (flag, value, says) in [
        ("--batch", "0", "--batch"),
        ("--h", "0", "--h"),
        ("--codec", "int4", "use f32, f16, int8"),
        ("--target-loss", "0", "above 0"),
        ("--strategy", "fast", "use ddp, diloco"),
    ] {
        let bad = ragtag()
            .args(["swarm", "new", "--name", "x", "--lr", "0.001", flag, value, "--out"])
            .arg(dir.path().join("bad"))
            .output()
            .unwrap();
        assert!(!bad.status.success(), "{flag} {value} was taken");
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

/// A creator sizes the transformer for the machines they expect; a size
/// that is not four numbers, or not a transformer's, is refused.
#[test]
fn swarm_new_sizes_the_transformer() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "to be or not to be, that is the question\n".repeat(50)).unwrap();
    let data = format!("text:{}", text.display());
    let new = |size: &str, data: &str, out: &str| {
        ragtag()
            .args(["swarm", "new", "--name", "t", "--lr", "0.001", "--data", data, "--transformer", size, "--out", out])
            .output()
            .unwrap()
    };
    let out = dir.path().join("ok");
    let ok = new("16,32,1,4", &data, out.to_str().unwrap());
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let m = ragtag_node::manifest_file::read(&out.join("manifest.toml")).unwrap();
    assert!(
        matches!(m.model, ModelSpec::CharTransformer { context: 16, width: 32, layers: 1, heads: 4, .. }),
        "{:?}",
        m.model
    );
    for (size, data, says) in [
        ("16,32,1", data.as_str(), "four numbers"),
        ("16,30,1,4", data.as_str(), "divide by heads"),
        ("16,32,1,4", "teacher", "use it with text data"),
        ("16,0,1,4", data.as_str(), "--transformer"),
    ] {
        let bad = new(size, data, dir.path().join("bad").to_str().unwrap());
        assert!(!bad.status.success(), "{size} on {data} was taken");
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(err.contains(says), "{size} on {data}: {err}");
    }
}
