//! Two nodes on one LAN (two network namespaces on one bridge, which this
//! test makes and removes) find each other with `--mdns` alone: no
//! bootstrap, no address given. mDNS sends multicast, so it runs only
//! inside namespaces of our own.

use std::time::Duration;

use ragtag_tests::{lab_available, netns::Lab, node_in};

const T: Duration = Duration::from_secs(120);

#[test]
fn nodes_on_a_lan_find_each_other_with_mdns() {
    if !lab_available(&[]) {
        return;
    }
    let net = 7;
    let lab = Lab::new("mdns", 2, net).expect("namespaces");
    let dir = tempfile::tempdir().unwrap();
    let start = |host: usize, who: &str| {
        let listen = format!("/ip4/{}/tcp/4910", lab.ip(host, net));
        node_in(&lab, host, &dir.path().join(who), &["--listen", &listen, "--mdns", "--duration", "40"])
    };
    let (a, b) = (start(0, "a"), start(1, "b"));
    let (_, ea) = a.rounds_until_exit(T);
    let (_, eb) = b.rounds_until_exit(T);
    let logs = format!("a:\n{}\nb:\n{}", a.stderr(), b.stderr());
    for (name, e, other) in [("a", &ea, &eb), ("b", &eb, &ea)] {
        let other_id = other["status"]["peer_id"].as_str().unwrap();
        let peer = e["status"]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["peer_id"] == other_id)
            .unwrap_or_else(|| panic!("{name} never found the other node:\n{logs}"));
        let applied = peer["applied"].as_u64().unwrap_or(0);
        assert!(applied >= 3, "{name} applied {applied} of the other's updates:\n{logs}");
        eprintln!("{name}: found the other by mDNS, applied {applied} of its updates");
    }
}
