//! Helpers for ragtag's multi-process integration tests: start bootstrap
//! and node processes on loopback, read their output, stop or kill them.
//! Every process is killed when its handle drops, also on test failure.
//! [`bench`] holds the benchmarks behind BENCHMARKS.md.

pub mod bench;
pub use ragtag_simnet::netns;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

/// Lines of a child's stdout buffered at most (the child blocks beyond).
const STDOUT_LINES: usize = 1 << 16;

/// A binary of this workspace, next to the test executable's directory.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: run `cargo test --workspace` (it builds every binary)", path.display());
    path
}

/// How [`Proc::follow`] ended.
#[derive(Debug)]
pub enum Followed {
    /// The rounds asked for were reported.
    Rounds,
    /// The node exited, with this exit report.
    Exited(serde_json::Value),
    /// Neither within the timeout.
    TimedOut,
}

/// A running process with its output collected.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    /// Lines printed on stdout.
    pub stdout: mpsc::Receiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// Its working directory.
    pub dir: PathBuf,
}

impl Proc {
    /// Starts `bin` with `args` in `dir`.
    pub fn spawn(bin: &Path, args: &[String], dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("process directory");
        let mut child = Command::new(bin)
            .args(args)
            .current_dir(dir)
            .env("RUST_LOG", std::env::var("RAGTAG_TEST_LOG").unwrap_or_else(|_| "info,libp2p_kad=error".into()))
            .env("RAYON_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let (tx, rx) = mpsc::sync_channel(STDOUT_LINES);
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().expect("stderr lock").push(line);
            }
        });
        Self { child: Some(child), stdout: rx, stderr, dir: dir.to_path_buf() }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Resident memory in KiB (Linux `/proc`), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Everything printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr lock").join("\n")
    }

    /// Waits until a stderr line contains `pattern`; returns it.
    pub fn wait_stderr(&self, pattern: &str, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(l) = self.stderr.lock().expect("stderr lock").iter().find(|l| l.contains(pattern)) {
                return Some(l.clone());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The address the node printed ("listening on ...").
    pub fn listen_addr(&self, timeout: Duration) -> String {
        let line = self
            .wait_stderr("listening on ", timeout)
            .unwrap_or_else(|| panic!("no listen address; stderr:\n{}", self.stderr()));
        line.split("listening on ").nth(1).expect("address").trim().to_string()
    }

    /// Reads stdout lines until one parses as JSON with `"event" == event`.
    pub fn wait_json(&self, event: &str, timeout: Duration) -> Option<serde_json::Value> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            let line = self.stdout.recv_timeout(left).ok()?;
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && v["event"] == event
            {
                return Some(v);
            }
        }
    }

    /// Reads output until `rounds` more round reports, the exit, or
    /// `timeout`, keeping every held-out evaluation `(t, loss)` in `evals`.
    pub fn follow(&self, rounds: usize, timeout: Duration, evals: &mut Vec<(f64, f64)>) -> Followed {
        let end = Instant::now() + timeout;
        let mut seen = 0;
        while seen < rounds {
            let Ok(line) = self.stdout.recv_timeout(end.saturating_duration_since(Instant::now())) else {
                return Followed::TimedOut;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            match v["event"].as_str() {
                Some("round") => seen += 1,
                Some("eval") => {
                    if let (Some(t), Some(l)) = (v["t"].as_f64(), v["eval_loss"].as_f64()) {
                        evals.push((t, l));
                    }
                }
                Some("exit") => return Followed::Exited(v),
                _ => {}
            }
        }
        Followed::Rounds
    }

    /// The node's round reports until it exits, and its exit report (eval
    /// and other events are skipped). Panics with stderr when there is no
    /// exit within `timeout`.
    pub fn rounds_until_exit(&self, timeout: Duration) -> (Vec<serde_json::Value>, serde_json::Value) {
        let mut rounds = Vec::new();
        let end = Instant::now() + timeout;
        while let Ok(line) = self.stdout.recv_timeout(end.saturating_duration_since(Instant::now())) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            if v["event"] == "exit" {
                return (rounds, v);
            }
            if v["event"] == "round" {
                rounds.push(v);
            }
        }
        panic!("no exit within {timeout:?}:\n{}", self.stderr());
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(s) = self.child.as_mut()?.try_wait().ok()? {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Sends a signal.
    #[allow(unsafe_code)]
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: signalling our own child process.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `ragtag-bootstrap` and returns it with its address.
pub fn bootstrap(dir: &Path, extra: &[&str]) -> (Proc, String) {
    let mut args: Vec<String> = vec!["--key".into(), dir.join("bootstrap.key").display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = Proc::spawn(&bin("ragtag-bootstrap"), &args, dir);
    let addr = p
        .stdout
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("bootstrap printed no address:\n{}", p.stderr()));
    (p, addr)
}

/// Starts `ragtag run` with `args` (plus `--state DIR/state --json`).
pub fn node(dir: &Path, args: &[&str]) -> Proc {
    let mut all: Vec<String> =
        vec!["run".into(), "--state".into(), dir.join("state").display().to_string(), "--json".into()];
    all.extend(args.iter().map(|s| s.to_string()));
    Proc::spawn(&bin("ragtag"), &all, dir)
}

/// Whether the network-namespace lab can run here (root, iproute2 and, when
/// `tools` names them, e.g. `nft`, those commands). Elsewhere the caller
/// skips with a message, but under CI (`CI=true`, which runs as root and
/// installs them) a skip fails the test: a root-only test must not pass by
/// not running.
pub fn lab_available(tools: &[&str]) -> bool {
    let missing: Vec<&str> =
        tools.iter().copied().filter(|t| Command::new(t).arg("--version").output().is_err()).collect();
    let ok = netns::Lab::available() && missing.is_empty();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must run the network-namespace tests: needs root, iproute2 and {missing:?}"
        );
        eprintln!("SKIPPED: needs root, iproute2 and {missing:?} (CI installs them and runs as root)");
    }
    ok
}

/// Starts `ragtag run` inside host `i` of a namespace lab.
pub fn node_in(lab: &netns::Lab, i: usize, dir: &Path, args: &[&str]) -> Proc {
    let mut all: Vec<String> = lab.wrap(i);
    all.push(bin("ragtag").display().to_string());
    all.extend(["run".into(), "--state".into(), dir.join("state").display().to_string(), "--json".into()]);
    all.extend(args.iter().map(|s| s.to_string()));
    Proc::spawn(Path::new(&all[0]), &all[1..], dir)
}

/// Relative distance between two anchor sketches.
pub fn sketch_distance(a: &serde_json::Value, b: &serde_json::Value) -> f64 {
    let v = |x: &serde_json::Value| -> Vec<f64> {
        x.as_array().expect("sketch").iter().map(|f| f.as_f64().unwrap_or(f64::NAN)).collect()
    };
    let (a, b) = (v(a), v(b));
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    let n: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    d / n.max(1e-12)
}

/// Mean held-out loss of the evaluations `(t, loss)` in the second half of
/// a run: one evaluation of the built-in task scatters by about 0.02, the
/// mean of several much less, so swarms and controls compare on it.
pub fn late_mean(evals: &[(f64, f64)]) -> f64 {
    let half = evals.last().map_or(0.0, |e| e.0 / 2.0);
    let late: Vec<f64> = evals.iter().filter(|e| e.0 >= half).map(|e| e.1).collect();
    assert!(late.len() >= 3, "too few evaluations: {evals:?}");
    late.iter().sum::<f64>() / late.len() as f64
}

/// A TCP port free on loopback right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// One plain HTTP/1.0 GET on loopback (the node's /metrics and /status):
/// the whole answer, headers included; empty if the node does not answer
/// within 10 s.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return String::new() };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    if write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return String::new();
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf
}

/// `ragtag status --json` of the node serving metrics on `metrics`.
pub fn status_json(metrics: &str) -> serde_json::Value {
    let out =
        Command::new(bin("ragtag")).args(["status", "--metrics", metrics, "--json"]).output().expect("ragtag status");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("status: {}", String::from_utf8_lossy(&out.stderr)))
}

/// How long [`peer_client`] waits for its first connection.
const CLIENT_CONNECT: Duration = Duration::from_secs(120);

/// A network client of our own (an attacker or a spy) on `run`'s topic,
/// dialing `addr`, with the events it receives.
pub fn peer_client(
    key: &ragtag_protocol::Keypair,
    run: ragtag_protocol::ids::RunId,
    addr: &str,
) -> (ragtag_node::net::Client, tokio::sync::mpsc::Receiver<ragtag_node::net::Event>) {
    let cfg = ragtag_node::net::Config::loopback_client(
        ragtag_node::identity::libp2p_keypair(key),
        &format!("ragtag/{run}"),
        vec![addr.parse().expect("a multiaddr")],
        None,
    );
    let mut reg = prometheus_client::registry::Registry::default();
    let (client, events, _task) = ragtag_node::net::spawn(cfg, &mut reg).expect("a network client");
    (client, events)
}

/// Waits for a [`peer_client`]'s first connection, then drains its events
/// so the network task never blocks on us.
pub async fn connected(mut events: tokio::sync::mpsc::Receiver<ragtag_node::net::Event>) {
    loop {
        match tokio::time::timeout(CLIENT_CONNECT, events.recv()).await.expect("a connection").expect("network") {
            ragtag_node::net::Event::Connected(_) => break,
            _ => continue,
        }
    }
    tokio::spawn(async move { while events.recv().await.is_some() {} });
}

/// Writes the manifest of a new aggregated run (`swarm new --aggregate
/// groups`) into `dir` and returns its path.
pub fn aggregated_manifest(dir: &Path, groups: u32) -> PathBuf {
    let out = Command::new(bin("ragtag"))
        .args(["swarm", "new", "--name", "aggregated", "--aggregate", &groups.to_string(), "--out"])
        .arg(dir)
        .output()
        .expect("ragtag swarm new");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir.join("manifest.toml")
}
