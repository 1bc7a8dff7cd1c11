//! Network namespaces for multi-host tests: hosts on a bridge (in a
//! namespace of their own), partitions that split and heal, and a NAT
//! gateway. Everything created is deleted when the value drops, also on
//! test failure. Needs root (CI runs as root); [`Lab::available`] says
//! whether this machine can create namespaces.

use std::process::Command;

/// Why a namespace command failed: tests print it and stop.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The program could not be started.
    #[error("{command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("{command}: {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its stderr, trimmed.
        stderr: String,
    },
}

/// Runs `ip` (or another tool) and fails loudly with its stderr.
fn run(args: &[&str]) -> Result<(), NetnsError> {
    output(args).map(drop)
}

/// How a NAT router maps its inside host's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatKind {
    /// Source ports kept where free: hole punching can work.
    PortPreserving,
    /// A random port for every connection ("symmetric"): the port a peer
    /// observed is useless to anyone else, so hole punching fails and a
    /// relay is the only path.
    Symmetric,
}

/// Runs a program and returns its stdout (its stderr in the error).
fn output(args: &[&str]) -> Result<String, NetnsError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|source| NetnsError::Spawn { command: args.join(" "), source })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetnsError::Failed { command: args.join(" "), stderr: String::from_utf8_lossy(&out.stderr).trim().into() })
    }
}

/// The byte count of the `ip daddr <to> ... counter packets P bytes B` rule
/// in an nft listing.
fn counter_bytes(listing: &str, to: &str) -> Option<u64> {
    listing.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let at = words.windows(2).position(|w| w[0] == "daddr" && w[1] == to)?;
        let bytes = words[at..].iter().position(|w| *w == "bytes")?;
        words.get(at + bytes + 1)?.parse().ok()
    })
}

/// A set of namespaces named `<prefix>-*`.
#[derive(Debug)]
pub struct Lab {
    prefix: String,
    hosts: usize,
    bridge_ns: String,
}

impl Lab {
    /// Whether namespaces can be created here (root, iproute2).
    pub fn available() -> bool {
        // Unique per call: tests of one binary probe at once from threads.
        static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = format!("rt-probe-{}-{n}", std::process::id());
        let ok = run(&["ip", "netns", "add", &probe]).is_ok();
        let _ = run(&["ip", "netns", "del", &probe]);
        ok
    }

    /// `hosts` namespaces on one bridge, addresses 10.77.<net>.1.. (the
    /// third octet keeps concurrent labs apart).
    pub fn new(name: &str, hosts: usize, net: u8) -> Result<Self, NetnsError> {
        let prefix = format!("rt{}-{name}", std::process::id() % 10_000);
        let bridge_ns = format!("{prefix}-br");
        let lab = Self { prefix, hosts, bridge_ns };
        run(&["ip", "netns", "add", &lab.bridge_ns])?;
        lab.exec_in(&lab.bridge_ns, &["ip", "link", "add", "br0", "type", "bridge"])?;
        lab.exec_in(&lab.bridge_ns, &["ip", "link", "add", "br1", "type", "bridge"])?;
        lab.exec_in(&lab.bridge_ns, &["ip", "link", "set", "br0", "up"])?;
        lab.exec_in(&lab.bridge_ns, &["ip", "link", "set", "br1", "up"])?;
        for i in 0..hosts {
            let ns = lab.host(i);
            run(&["ip", "netns", "add", &ns])?;
            let (inner, outer) = (format!("h{i}"), format!("p{i}"));
            run(&[
                "ip",
                "link",
                "add",
                &inner,
                "netns",
                &ns,
                "type",
                "veth",
                "peer",
                "name",
                &outer,
                "netns",
                &lab.bridge_ns,
            ])?;
            lab.exec_in(&lab.bridge_ns, &["ip", "link", "set", &outer, "master", "br0", "up"])?;
            lab.exec_in(&ns, &["ip", "addr", "add", &format!("{}/24", lab.ip(i, net)), "dev", &inner])?;
            lab.exec_in(&ns, &["ip", "link", "set", &inner, "up"])?;
            lab.exec_in(&ns, &["ip", "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    /// Host `i`'s namespace.
    pub fn host(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn ip(&self, i: usize, net: u8) -> String {
        format!("10.77.{net}.{}", i + 1)
    }

    /// Runs a command inside a namespace.
    pub fn exec_in(&self, ns: &str, args: &[&str]) -> Result<(), NetnsError> {
        let mut all = vec!["ip", "netns", "exec", ns];
        all.extend_from_slice(args);
        run(&all)
    }

    /// The command prefix that runs a program inside host `i`'s namespace.
    pub fn wrap(&self, i: usize) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.host(i)]
    }

    /// Moves `hosts` to the second bridge: they and the rest can no longer talk.
    pub fn partition(&self, hosts: &[usize]) -> Result<(), NetnsError> {
        for i in hosts {
            self.exec_in(&self.bridge_ns, &["ip", "link", "set", &format!("p{i}"), "master", "br1"])?;
        }
        Ok(())
    }

    /// Puts every host back on one bridge.
    pub fn heal(&self) -> Result<(), NetnsError> {
        for i in 0..self.hosts {
            self.exec_in(&self.bridge_ns, &["ip", "link", "set", &format!("p{i}"), "master", "br0"])?;
        }
        Ok(())
    }

    /// Puts host `inside` behind host `router`, which masquerades (NAT) its
    /// traffic onto the bridge: `inside` can dial out, nobody can dial in.
    /// `inside` gets 10.78.<net>.2 with the router at 10.78.<net>.1. The
    /// router keeps source ports where it can (as most home routers do).
    pub fn nat(&self, router: usize, inside: usize, net: u8) -> Result<(), NetnsError> {
        self.nat_with(router, inside, net, NatKind::PortPreserving)
    }

    /// [`Lab::nat`] with a choice of mapping.
    pub fn nat_with(&self, router: usize, inside: usize, net: u8, kind: NatKind) -> Result<(), NetnsError> {
        let (r, h) = (self.host(router), self.host(inside));
        // Off the bridge: the only way out is through the router.
        self.exec_in(&self.bridge_ns, &["ip", "link", "set", &format!("p{inside}"), "nomaster"])?;
        self.exec_in(&self.bridge_ns, &["ip", "link", "set", &format!("p{inside}"), "down"])?;
        self.exec_in(&h, &["ip", "link", "set", &format!("h{inside}"), "down"])?;
        run(&["ip", "link", "add", "lan0", "netns", &r, "type", "veth", "peer", "name", "wan0", "netns", &h])?;
        self.exec_in(&r, &["ip", "addr", "add", &format!("10.78.{net}.1/24"), "dev", "lan0"])?;
        self.exec_in(&r, &["ip", "link", "set", "lan0", "up"])?;
        self.exec_in(&h, &["ip", "addr", "add", &format!("10.78.{net}.2/24"), "dev", "wan0"])?;
        self.exec_in(&h, &["ip", "link", "set", "wan0", "up"])?;
        self.exec_in(&h, &["ip", "route", "add", "default", "via", &format!("10.78.{net}.1")])?;
        self.exec_in(&r, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
        self.exec_in(&r, &["nft", "add", "table", "ip", "nat"])?;
        self.exec_in(
            &r,
            &["nft", "add", "chain", "ip", "nat", "post", "{ type nat hook postrouting priority 100 ; }"],
        )?;
        let oif = format!("h{router}");
        let mut rule = vec!["nft", "add", "rule", "ip", "nat", "post", "oifname", &oif, "masquerade"];
        if kind == NatKind::Symmetric {
            rule.push("random");
        }
        self.exec_in(&r, &rule)?;
        // Like a home router, drop (not refuse) unsolicited connections from
        // outside: a refusal would end a hole punch whose SYN arrives before
        // the peer's own SYN opened the mapping.
        self.exec_in(&r, &["nft", "add", "table", "ip", "firewall"])?;
        self.exec_in(
            &r,
            &["nft", "add", "chain", "ip", "firewall", "input", "{ type filter hook input priority 0 ; }"],
        )?;
        self.exec_in(
            &r,
            &["nft", "add", "rule", "ip", "firewall", "input", "iifname", &oif, "ct", "state", "new", "drop"],
        )?;
        Ok(())
    }

    /// Makes router `router` count the TCP bytes it forwards to each of `to`
    /// (addresses), read back by [`Lab::forwarded_bytes`]: what crossed a
    /// NAT, measured outside the programs under test. Connection attempts
    /// (SYN) are not counted, so a hole punch that never connects counts 0.
    pub fn count_forwarded(&self, router: usize, to: &[&str]) -> Result<(), NetnsError> {
        let r = self.host(router);
        self.exec_in(&r, &["nft", "add", "table", "ip", "accounting"])?;
        self.exec_in(
            &r,
            &["nft", "add", "chain", "ip", "accounting", "forwarded", "{ type filter hook forward priority 0 ; }"],
        )?;
        for ip in to {
            self.exec_in(
                &r,
                &[
                    "nft",
                    "add",
                    "rule",
                    "ip",
                    "accounting",
                    "forwarded",
                    "ip",
                    "daddr",
                    ip,
                    "tcp",
                    "flags",
                    "&",
                    "syn",
                    "==",
                    "0",
                    "counter",
                ],
            )?;
        }
        Ok(())
    }

    /// Bytes router `router` forwarded to `to` since [`Lab::count_forwarded`].
    pub fn forwarded_bytes(&self, router: usize, to: &str) -> Result<u64, NetnsError> {
        let mut all = vec!["ip", "netns", "exec"];
        let ns = self.host(router);
        all.extend([ns.as_str(), "nft", "list", "chain", "ip", "accounting", "forwarded"]);
        let listing = output(&all)?;
        counter_bytes(&listing, to).ok_or_else(|| NetnsError::Failed {
            command: all.join(" "),
            stderr: format!("no counter for {to} in:\n{listing}"),
        })
    }

    /// Shapes host `i`'s outgoing traffic with tc netem (e.g. "delay 20ms rate 100mbit").
    pub fn netem(&self, i: usize, spec: &str) -> Result<(), NetnsError> {
        let mut args = vec!["tc", "qdisc", "add", "dev"];
        let dev = format!("h{i}");
        args.push(&dev);
        args.extend(["root", "netem"]);
        args.extend(spec.split_whitespace());
        self.exec_in(&self.host(i), &args)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for i in 0..self.hosts {
            let _ = run(&["ip", "netns", "del", &self.host(i)]);
        }
        let _ = run(&["ip", "netns", "del", &self.bridge_ns]);
    }
}

#[cfg(test)]
mod tests {
    use super::counter_bytes;

    #[test]
    fn forwarded_bytes_are_read_from_an_nft_listing() {
        let listing = "table ip accounting {\n\tchain forwarded {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tip daddr 10.77.5.1 tcp flags ! syn counter packets 12 bytes 3456\n\t\tip daddr 10.77.5.4 tcp flags ! syn counter packets 0 bytes 0\n\t}\n}\n";
        assert_eq!(counter_bytes(listing, "10.77.5.1"), Some(3456));
        assert_eq!(counter_bytes(listing, "10.77.5.4"), Some(0));
        assert_eq!(counter_bytes(listing, "10.77.5.9"), None);
    }
}
