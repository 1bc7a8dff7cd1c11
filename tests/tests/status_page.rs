//! The status page in a real browser: a two-node swarm, headless Chromium
//! loads the first node's page, the peer table lists the other node, the
//! loss chart has points and the idle time is broken down; a screenshot is
//! saved under target/. Where no browser is installed the test says so and
//! passes, except in CI (`CI=true`), which installs one and must run it.

use std::{path::PathBuf, process::Command, time::Duration};

use ragtag_tests::{free_port, http_get, node};

const T: Duration = Duration::from_secs(120);

fn browser() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        let out = Command::new("which").arg(name).output().ok()?;
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
}

/// Runs headless Chromium on `url` with `args` (a fresh profile each time).
fn chromium(bin: &PathBuf, args: &[&str], url: &str) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    Command::new(bin)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs")
}

#[test]
fn the_status_page_shows_the_peer_and_the_loss_chart_in_a_browser() {
    let Some(bin) = browser() else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI must run the browser test: install chromium");
        eprintln!("SKIPPED: no chromium on this machine (apt-get install chromium); CI runs this test");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let a = node(&dir.path().join("a"), &["--max-rounds", "60", "--eval-every", "2", "--metrics", &metrics]);
    let addr = a.listen_addr(T);
    let b = node(&dir.path().join("b"), &["--bootstrap", &addr, "--max-rounds", "60"]);
    let b_peer = b.listen_addr(T).rsplit("/p2p/").next().unwrap().to_string();
    for _ in 0..3 {
        a.wait_json("eval", T).unwrap_or_else(|| panic!("a evaluates nothing:\n{}", a.stderr()));
    }
    // One refresh of the status (every second) after the third evaluation.
    std::thread::sleep(Duration::from_millis(1500));
    let url = format!("http://{metrics}/");
    let dom = chromium(&bin, &["--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("<table id=\"peers\">"), "no peer table:\n{dom}");
    let peers = dom.split("<table id=\"peers\">").nth(1).unwrap().split("</table>").next().unwrap();
    assert!(peers.contains(&b_peer), "the peer table does not list b ({b_peer}):\n{peers}");
    let points: usize =
        dom.split("data-points=\"").nth(1).and_then(|s| s.split('"').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(points >= 3, "the chart has {points} points:\n{dom}");
    // Where the idle time went: the page, the JSON status and /metrics.
    assert!(dom.contains("idle, share of uptime"), "no idle row:\n{dom}");
    let status = ragtag_tests::status_json(&metrics);
    assert!(status["idle_s"]["startup"].as_f64().is_some_and(|s| s > 0.0), "{}", status["idle_s"]);
    let text = http_get(&metrics, "/metrics");
    assert!(text.contains("ragtag_idle_seconds_total{reason=\"startup\"}"), "{text}");
    let polyline = dom.split("<polyline").nth(1).expect("a loss line");
    assert!(polyline.split(" points=\"").nth(1).unwrap().split('"').next().unwrap().split(' ').count() >= 3);

    // Under the target directory wherever it is (CARGO_TARGET_DIR moves it).
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(&bin, &[&format!("--screenshot={}", shot.display()), "--window-size=1100,1500"], &url);
    assert!(
        std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000),
        "no screenshot at {}: {}",
        shot.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
