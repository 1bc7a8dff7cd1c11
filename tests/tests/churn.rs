//! Nodes leave cleanly, crash and join during a run; the swarm keeps
//! training and ends at the target. (A target checked only at the end: the
//! built-in task dips below easy targets within a few rounds, before any
//! churn has happened.)

use std::time::Duration;

use ragtag_tests::node;

const T: Duration = Duration::from_secs(150);
/// The built-in task's loss floor is 1.19; a lone node plateaus near 1.33.
const TARGET: f64 = 1.40;

#[test]
fn the_swarm_survives_churn() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a"), &["--max-rounds", "24"]);
    let addr = a.listen_addr(T);
    let peers = |n: &str, extra: &[&str]| {
        let mut args = vec!["--bootstrap", addr.as_str(), "--duration", "110"];
        args.extend_from_slice(extra);
        node(&dir.path().join(n), &args)
    };
    let mut b = peers("b", &[]);
    let c = peers("c", &["--slowdown", "2"]);
    for _ in 0..4 {
        a.wait_json("round", T).unwrap_or_else(|| panic!("a stopped training:\n{}", a.stderr()));
    }
    c.signal(libc::SIGTERM); // clean leave
    let _d = peers("d", &[]);
    for _ in 0..2 {
        a.wait_json("round", T).unwrap_or_else(|| panic!("a stopped training:\n{}", a.stderr()));
    }
    b.kill9(); // crash
    let _e = peers("e", &["--slowdown", "2"]);
    let exit = a.wait_json("exit", T).unwrap_or_else(|| panic!("a did not finish:\n{}", a.stderr()));
    let loss = exit["outcome"]["eval_loss"].as_f64().unwrap_or(f64::MAX);
    assert!(loss <= TARGET, "a ended at held-out loss {loss} (target {TARGET})");
    assert!(exit["outcome"]["rounds"].as_u64() == Some(24), "{}", exit["outcome"]["reason"]);
    assert!(a.stderr().contains("left the run"), "a should notice the departures:\n{}", a.stderr());
}
