//! Nodes leave cleanly, crash and join during a run; the swarm keeps
//! training and ends clearly below a single-node control that trains alone
//! beside it for the same rounds. (Judged over the second half of the run:
//! the built-in task dips below easy targets within a few rounds, before any
//! churn has happened, and one evaluation scatters by about 0.02.)

use std::time::Duration;

use ragtag_tests::{Followed, late_mean, node};

const T: Duration = Duration::from_secs(150);
const ROUNDS: &str = "24";
/// The swarm's mean held-out loss over the second half must be this much
/// below the control's. Measured on 2 cores in three runs with the built-in
/// task of 2026-12-05 (64 inputs, 32 classes): swarm 1.982, 1.969, 1.970;
/// alone 2.030, 2.038, 2.028. (On the earlier, easier task the lone node had
/// come within 0.02-0.03 of the swarm once a round could end on a partial
/// step, and this test failed now and then.)
const MARGIN: f64 = 0.02;

#[test]
fn the_swarm_survives_churn_and_beats_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", ROUNDS]);
    let addr = a.listen_addr(T);
    // The control: a's hardware alone, for the same rounds, at the same time.
    let alone = node(&dir.path().join("alone"), &["--max-rounds", ROUNDS]);
    let peers = |n: &str, extra: &[&str]| {
        let mut args = vec!["--bootstrap", addr.as_str(), "--duration", "110"];
        args.extend_from_slice(extra);
        node(&dir.path().join(n), &args)
    };
    let mut evals = Vec::new();
    let mut b = peers("b", &[]);
    let c = peers("c", &["--slowdown", "2"]);
    assert!(matches!(a.follow(4, T, &mut evals), Followed::Rounds), "a stopped training:\n{}", a.stderr());
    c.signal(libc::SIGTERM); // clean leave
    let _d = peers("d", &[]);
    assert!(matches!(a.follow(2, T, &mut evals), Followed::Rounds), "a stopped training:\n{}", a.stderr());
    b.kill9(); // crash
    let _e = peers("e", &["--slowdown", "2"]);
    let Followed::Exited(exit) = a.follow(usize::MAX, T, &mut evals) else {
        panic!("a did not finish:\n{}", a.stderr())
    };
    assert!(exit["outcome"]["rounds"].as_u64() == Some(24), "{}", exit["outcome"]["reason"]);
    assert!(a.stderr().contains("left the run"), "a should notice the departures:\n{}", a.stderr());
    let mut alone_evals = Vec::new();
    let ended = alone.follow(usize::MAX, T, &mut alone_evals);
    assert!(matches!(ended, Followed::Exited(_)), "the control did not finish:\n{}", alone.stderr());
    let (s, one) = (late_mean(&evals), late_mean(&alone_evals));
    eprintln!("held-out loss over the second half: swarm under churn {s:.3}, one node alone {one:.3}");
    assert!(s + MARGIN < one, "the swarm ({s:.3}) is not {MARGIN} below one node alone ({one:.3})");
}
