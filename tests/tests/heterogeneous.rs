//! A 4-node heterogeneous swarm (slowdowns 1, 1, 2, 4) against a
//! single-node control running beside it for the same time: the swarm must
//! hold a clearly lower held-out loss than its fastest node alone. The same
//! swarm with ddp is measured too; only a generous ordering is asserted
//! there, and the ratio is printed for the record.

use std::time::Duration;

use ragtag_tests::{Followed, Proc, late_mean, node};

const T: Duration = Duration::from_secs(150);
/// How long the gopals swarm and the control train.
const RUN_S: &str = "100";
/// Where ddp and gopals are timed (a lone node reaches it too: a ratio, not proof).
const TARGET: f64 = 2.0;
/// The swarm's mean held-out loss over the second half must be this much
/// below the control's. Measured on 2 cores with the built-in task of
/// 2026-12-05 (64 inputs, 32 classes): swarm 1.948, alone 2.012 (each
/// evaluation of a lone node scatters by about 0.03, the mean of 25 by
/// about 0.01).
const MARGIN: f64 = 0.02;

/// Every held-out evaluation `(t, loss)` a node prints until it exits.
fn evaluations(n: &Proc) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let ended = n.follow(usize::MAX, T, &mut out);
    assert!(matches!(ended, Followed::Exited(_)), "no exit within {T:?}:\n{}", n.stderr());
    out
}

fn swarm(dir: &std::path::Path, strategy: &str, extra: &[&str]) -> Vec<Proc> {
    let mut common = vec!["--strategy", strategy, "--duration", RUN_S];
    common.extend_from_slice(extra);
    let mut args = common.clone();
    args.extend(["--slowdown", "1"]);
    let first = node(&dir.join("n0"), &args);
    let addr = first.listen_addr(T);
    let mut nodes = vec![first];
    for (i, slowdown) in ["1", "2", "4"].iter().enumerate() {
        let mut args = common.clone();
        args.extend(["--slowdown", slowdown, "--bootstrap", &addr]);
        nodes.push(node(&dir.join(format!("n{}", i + 1)), &args));
    }
    nodes
}

#[test]
fn a_heterogeneous_swarm_beats_its_fastest_node_alone_and_ddp() {
    let dir = tempfile::tempdir().unwrap();
    let gopals = swarm(&dir.path().join("gopals"), "gopals", &[]);
    // The control: the fastest node's hardware, alone, at the same time.
    let alone = node(&dir.path().join("alone"), &["--duration", RUN_S, "--slowdown", "1"]);
    let swarm_evals = evaluations(&gopals[0]);
    let alone_evals = evaluations(&alone);
    drop(gopals);
    drop(alone);
    let (s, a) = (late_mean(&swarm_evals), late_mean(&alone_evals));
    eprintln!("held-out loss over the second half: swarm {s:.3}, fastest node alone {a:.3}");
    assert!(s + MARGIN < a, "the swarm ({s:.3}) is not {MARGIN} below one node alone ({a:.3})");

    let tg = swarm_evals
        .iter()
        .find(|e| e.1 <= TARGET)
        .map(|e| e.0)
        .unwrap_or_else(|| panic!("gopals never reached {TARGET}: {swarm_evals:?}"));
    let ddp = swarm(&dir.path().join("ddp"), "ddp", &["--target-loss", &TARGET.to_string()]);
    let td = evaluations(&ddp[0]).iter().find(|e| e.1 <= TARGET).map(|e| e.0);
    drop(ddp);
    match td {
        Some(td) => {
            eprintln!("time to held-out loss {TARGET}: gopals {tg:.1}s, ddp {td:.1}s, ratio {:.2}", tg / td);
            assert!(tg < 3.0 * td, "gopals {tg:.1}s is far behind ddp {td:.1}s");
        }
        None => eprintln!("time to held-out loss {TARGET}: gopals {tg:.1}s, ddp did not reach it in {RUN_S} s"),
    }
}
