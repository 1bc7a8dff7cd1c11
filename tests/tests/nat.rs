//! A node behind NAT (network namespaces, nftables masquerade) trains with
//! a public node: it learns it is private (AutoNAT), takes a reservation at
//! the bootstrap's relay, and the public node reaches it through the relay
//! (or directly, once hole punching succeeds).

use std::time::Duration;

use ragtag_tests::{Proc, bin, lab_available, netns::Lab, node_in};

const T: Duration = Duration::from_secs(150);

#[test]
fn a_node_behind_nat_is_reached_through_the_relay() {
    if !lab_available(&["nft"]) {
        return;
    }
    let lab = Lab::new("nat", 4, 3).expect("namespaces");
    lab.nat(2, 3, 3).expect("NAT");
    let dir = tempfile::tempdir().unwrap();
    let mut bs_args: Vec<String> = lab.wrap(0);
    bs_args.extend([
        bin("ragtag-bootstrap").display().to_string(),
        "--key".into(),
        dir.path().join("bs.key").display().to_string(),
        "--listen".into(),
        format!("/ip4/{}/tcp/4900", lab.ip(0, 3)),
    ]);
    let bs = Proc::spawn(std::path::Path::new(&bs_args[0]), &bs_args[1..], &dir.path().join("bs"));
    let bs_addr = bs.stdout.recv_timeout(T).expect("bootstrap address");
    let public = node_in(
        &lab,
        1,
        &dir.path().join("public"),
        &["--listen", &format!("/ip4/{}/tcp/4901", lab.ip(1, 3)), "--bootstrap", &bs_addr, "--duration", "70"],
    );
    let private = node_in(
        &lab,
        3,
        &dir.path().join("private"),
        &["--listen", "/ip4/10.78.3.2/tcp/4903", "--bootstrap", &bs_addr, "--duration", "65"],
    );
    let (_, ep) = private.rounds_until_exit(T);
    let (public_rounds, epub) = public.rounds_until_exit(T);
    let public_version = public_rounds.iter().filter_map(|r| r["version"].as_u64()).max().unwrap_or(0);
    let reach = ep["status"]["reachability"].as_str().unwrap_or("");
    assert!(
        reach == "relayed" || reach == "private",
        "the NATed node should learn it is not public: {reach}\n{}",
        private.stderr()
    );
    assert!(private.stderr().contains("reservation accepted"), "no relay reservation:\n{}", private.stderr());
    // The public node applied the private node's updates: it holds more
    // than its own.
    let own = epub["outcome"]["rounds"].as_u64().unwrap();
    assert!(
        public_version > own + 3,
        "the public node applied {public_version} updates for its {own} rounds:\n{}",
        public.stderr()
    );
}
