//! The live status line of `ragtag run` on a terminal: one line at the
//! bottom (indicatif) with the round, held-out loss, peers, speed and
//! traffic, while log lines scroll above it. Off a terminal, or with
//! `--json`, there is no line and logs go to stderr untouched.

use std::{
    io::{IsTerminal, Write},
    sync::OnceLock,
    time::Duration,
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::status::{Status, human_bytes};

static LINE: OnceLock<ProgressBar> = OnceLock::new();

/// Shows the line when stderr is a terminal; returns whether it did.
pub fn start() -> bool {
    if !std::io::stderr().is_terminal() {
        return false;
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(ProgressStyle::with_template("{spinner} {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()));
    bar.enable_steady_tick(Duration::from_millis(250));
    bar.set_message("starting");
    LINE.set(bar).is_ok()
}

/// Updates the line from the node's status (nothing when there is none).
pub fn update(s: &Status) {
    if let Some(bar) = LINE.get() {
        bar.set_message(message(s));
    }
}

/// Removes the line (at exit).
pub fn finish() {
    if let Some(bar) = LINE.get() {
        bar.finish_and_clear();
    }
}

/// The line's text.
pub fn message(s: &Status) -> String {
    format!(
        "round {} · held-out {} · {} peers ({} live) · {:.0} steps/s · {}/s out {}/s in · {} updates applied · credit {}",
        s.rounds,
        s.eval_loss.map_or_else(|| "–".into(), |l| format!("{l:.4}")),
        s.connected_peers,
        s.live_nodes,
        s.speed,
        human_bytes(s.bytes_out_per_s as u64),
        human_bytes(s.bytes_in_per_s as u64),
        s.applied,
        s.credit.map_or_else(|| "–".into(), |c| format!("{c:.0}")),
    )
}

/// Where log lines go: stderr, above the live line when there is one.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LINE.get() {
            Some(bar) => bar.suspend(|| std::io::stderr().write(buf)),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_round_loss_peers_and_traffic() {
        let s = Status {
            rounds: 12,
            eval_loss: Some(1.2345),
            connected_peers: 3,
            live_nodes: 4,
            speed: 950.0,
            bytes_out_per_s: 2048.0,
            ..Status::default()
        };
        let m = message(&s);
        for part in ["round 12", "held-out 1.2345", "3 peers (4 live)", "950 steps/s", "2.0 KiB/s out"] {
            assert!(m.contains(part), "{part} missing from {m}");
        }
    }
}
