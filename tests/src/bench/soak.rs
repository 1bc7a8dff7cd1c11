//! Soak: many `ragtag` processes on loopback for minutes. Memory of every
//! process near the start and near the end (it must stay flat), their TCP
//! connections, updates applied per second, and every warning or error
//! they logged.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::Figure;

/// Lines of output kept per process stream until the run ends.
const LINE_BUFFER: usize = 1 << 16;

/// A process's memory in MiB (Linux), if it still runs.
#[derive(Clone, Copy)]
struct Memory {
    /// Resident: what `ps` and `top` show.
    rss: f64,
    /// Anonymous: the process's own pages (heap, stacks). The rest of the
    /// resident size is pages of the binary and libraries, shared by all
    /// 16 processes and the same from the first minute (about 16 MiB here).
    private: f64,
}

fn memory(pid: u32) -> Option<Memory> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let kib: f64 = rollup.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some(Memory { rss: field("Rss:")?, private: field("Anonymous:")? })
}

/// A process's established TCP connections (Linux): its socket inodes
/// matched against the kernel's table. Duplicate connections to one peer
/// each hold their own buffers, so this explains memory that tracks it.
fn connections(pid: u32) -> Option<usize> {
    let sockets: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| Some(l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string()))
        .collect();
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
        // Columns: sl local remote st ... inode (the tenth); state 01 is ESTABLISHED.
        n += text
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|c| c.len() > 9 && c[3] == "01" && sockets.contains(c[9]))
            .count();
    }
    Some(n)
}

/// A node process of a benchmark, its output read continuously.
pub(super) struct Soaked {
    pub(super) child: Child,
    pub(super) stdout: mpsc::Receiver<String>,
    pub(super) stderr: mpsc::Receiver<String>,
}

impl Soaked {
    /// The address the node printed it listens on (within 30 s).
    pub(super) fn listen_addr(&self) -> Option<String> {
        self.stderr
            .recv_timeout(Duration::from_secs(30))
            .into_iter()
            .chain(self.stderr.iter())
            .find_map(|l| l.strip_prefix("listening on ").map(str::to_string))
    }
}

/// Starts `ragtag run` for `duration_s` seconds, one rayon thread, warnings
/// only; `extra` goes on its command line.
pub(super) fn spawn(
    ragtag: &Path,
    state: &Path,
    duration_s: u64,
    bootstrap: Option<&str>,
    extra: &[String],
) -> std::io::Result<Soaked> {
    let mut cmd = Command::new(ragtag);
    cmd.args(["run", "--json", "--duration", &duration_s.to_string(), "--state"])
        .arg(state)
        .args(extra)
        .env("RAYON_NUM_THREADS", "1")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(addr) = bootstrap {
        cmd.args(["--bootstrap", addr]);
    }
    let mut child = cmd.spawn()?;
    let lines = |r: Box<dyn std::io::Read + Send>| {
        // Read continuously so a node never blocks on a full pipe; a 10-minute
        // run prints about a thousand lines, far below this bound.
        let (tx, rx) = mpsc::sync_channel(LINE_BUFFER);
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        rx
    };
    let stdout = lines(Box::new(child.stdout.take().expect("piped")));
    let stderr = lines(Box::new(child.stderr.take().expect("piped")));
    Ok(Soaked { child, stdout, stderr })
}

/// Runs `nodes` processes of the built-in run for `duration_s` seconds.
pub fn run(ragtag: &Path, nodes: usize, duration_s: u64) -> Vec<Figure> {
    let fail = |why: String| vec![Figure::new("soak", "soak run", f64::NAN, "").with_note(why)];
    let dir = std::env::temp_dir().join(format!("ragtag-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = match spawn(ragtag, &dir.join("n0"), duration_s + 10, None, &[]) {
        Ok(p) => p,
        Err(e) => return fail(format!("cannot start {}: {e}", ragtag.display())),
    };
    let Some(addr) = first.listen_addr() else {
        return fail("the first node printed no address".into());
    };
    let mut procs = vec![first];
    for i in 1..nodes {
        match spawn(ragtag, &dir.join(format!("n{i}")), duration_s, Some(&addr), &[]) {
            Ok(p) => procs.push(p),
            Err(e) => return fail(format!("cannot start node {i}: {e}")),
        }
    }
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(30));
    let sample = |procs: &[Soaked]| procs.iter().map(|p| memory(p.child.id())).collect::<Vec<_>>();
    let count =
        |procs: &[Soaked]| procs.iter().filter_map(|p| connections(p.child.id())).map(|n| n as f64).collect::<Vec<_>>();
    let early_all = sample(&procs);
    let early_conns = count(&procs);
    // Halfway: growth over the second half says whether memory levels off.
    let half = duration_s / 2;
    std::thread::sleep(Duration::from_secs(half.saturating_sub(30)));
    let middle_all = sample(&procs);
    std::thread::sleep(Duration::from_secs(duration_s.saturating_sub(10).saturating_sub(half.max(30))));
    let late_all = sample(&procs);
    let late_conns = count(&procs);
    let each: Vec<String> = early_all
        .iter()
        .zip(&late_all)
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => format!("{:.1}->{:.1}", a.rss, b.rss),
            _ => "gone".into(),
        })
        .collect();
    let pick = |f: fn(&Memory) -> f64| {
        let of = |v: &[Option<Memory>]| v.iter().flatten().map(f).collect::<Vec<f64>>();
        (of(&early_all), of(&middle_all), of(&late_all))
    };
    let (early, middle, late) = pick(|m| m.rss);
    let (early_own, middle_own, late_own) = pick(|m| m.private);
    let mut applied = Vec::new();
    let mut losses = Vec::new();
    let mut last_live = Vec::new();
    let mut problems = Vec::new();
    let mut clean = 0;
    for p in &mut procs {
        if p.child.wait().is_ok_and(|s| s.success()) {
            clean += 1;
        }
        let events: Vec<serde_json::Value> =
            p.stdout.try_iter().filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok()).collect();
        let v = events.iter().rfind(|e| e["event"] == "exit").cloned().unwrap_or_default();
        if let Some(a) = v["outcome"]["applied"].as_f64() {
            applied.push(a);
        }
        if let Some(l) = v["outcome"]["eval_loss"].as_f64() {
            losses.push(l);
        }
        if let Some(l) = events.iter().rfind(|e| e["event"] == "round").and_then(|r| r["live"].as_f64()) {
            last_live.push(l);
        }
        problems.extend(p.stderr.try_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")));
    }
    let wall = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let growth = mean(&late) / mean(&early).max(1e-9);
    let mut logged: Vec<String> = problems.iter().take(3).cloned().collect();
    logged.iter_mut().for_each(|s| s.truncate(160));
    let (mid_s, end_s) = (half.max(30), duration_s.saturating_sub(10));
    vec![
        Figure::new(
            "soak",
            &format!("memory per process after 30 s ({} processes, baseline)", early.len()),
            mean(&early),
            "MiB",
        )
        .with_note(format!("max {:.1} MiB", max(&early))),
        Figure::new("soak", &format!("memory per process after {mid_s} s"), mean(&middle), "MiB")
            .with_ratio(mean(&middle) / mean(&early).max(1e-9), "x the early figure")
            .with_note(format!("max {:.1} MiB", max(&middle))),
        Figure::new("soak", &format!("memory per process after {end_s} s"), mean(&late), "MiB")
            .with_ratio(growth, "x the early figure")
            .with_note(format!(
                "max {:.1} MiB; {:.3} x the halfway figure; each process, 30 s -> {end_s} s: {}",
                max(&late),
                mean(&late) / mean(&middle).max(1e-9),
                each.join(", ")
            )),
        Figure::new("soak", "private (anonymous) memory per process after 30 s (baseline)", mean(&early_own), "MiB"),
        Figure::new("soak", &format!("private memory per process after {mid_s} s"), mean(&middle_own), "MiB")
            .with_ratio(mean(&middle_own) / mean(&early_own).max(1e-9), "x the early figure"),
        Figure::new("soak", &format!("private memory per process after {end_s} s"), mean(&late_own), "MiB")
            .with_ratio(mean(&late_own) / mean(&early_own).max(1e-9), "x the early figure")
            .with_note(format!("{:.3} x the halfway figure", mean(&late_own) / mean(&middle_own).max(1e-9))),
        Figure::new("soak", "TCP connections per process after 30 s", mean(&early_conns), "connections")
            .with_note(format!("{} peers each; max {}", nodes - 1, max(&early_conns))),
        Figure::new("soak", &format!("TCP connections per process after {end_s} s"), mean(&late_conns), "connections")
            .with_note(format!("max {}", max(&late_conns))),
        Figure::new("soak", "updates applied per second per process", mean(&applied) / duration_s as f64, "updates/s")
            .with_note(format!(
                "{} of {nodes} processes reported, {clean} exited cleanly, {wall:.0} s wall",
                applied.len()
            )),
        // A swarm that falls apart still applies updates (its own): these
        // say whether the processes stayed one swarm.
        Figure::new("soak", "peers heard in each process's last round (mean)", mean(&last_live), "nodes")
            .with_note(format!("min {:.0} of {nodes}", min(&last_live))),
        Figure::new("soak", "final held-out loss, worst process", max(&losses), "nats").with_note(format!(
            "best {:.4}, {} processes reported",
            min(&losses),
            losses.len()
        )),
        Figure::new("soak", "warnings and errors logged (all processes)", problems.len() as f64, "lines")
            .with_note(if logged.is_empty() { "none".into() } else { logged.join(" | ") }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_counts_this_process_s_established_sockets() {
        let me = std::process::id();
        let before = connections(me).expect("this process runs");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _out = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_in, _) = listener.accept().unwrap();
        // Both ends belong to this process; no other test here opens sockets.
        assert!(connections(me).unwrap() >= before + 2);
        assert_eq!(connections(u32::MAX), None, "no such process");
    }
}
