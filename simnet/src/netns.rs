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
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|source| NetnsError::Spawn { command: args.join(" "), source })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Failed { command: args.join(" "), stderr: String::from_utf8_lossy(&out.stderr).trim().into() })
    }
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
        let probe = format!("rt-probe-{}", std::process::id());
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
    /// `inside` gets 10.78.<net>.2 with the router at 10.78.<net>.1.
    pub fn nat(&self, router: usize, inside: usize, net: u8) -> Result<(), NetnsError> {
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
        self.exec_in(&r, &["nft", "add", "rule", "ip", "nat", "post", "oifname", &format!("h{router}"), "masquerade"])?;
        Ok(())
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
