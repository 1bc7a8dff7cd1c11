//! Opening a sled database that was closed a moment ago.
//!
//! sled 0.34 releases its lock on the database file from its own I/O
//! threads, after the last `Db` handle is dropped (spacejam/sled#1234), so a
//! reopen in the same process right after a close can find the lock still
//! held for a few milliseconds. A node restarted in place, a migration that
//! reopens, and our tests all do that. A genuine second opener of a node's
//! state is refused before this, by the state directory's own lock.

use std::{
    thread,
    time::{Duration, Instant},
};

/// How long [`open`] waits for a lock held by the previous handle's threads.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Pause between attempts.
const LOCK_RETRY: Duration = Duration::from_millis(10);

/// Opens `config`, waiting up to [`LOCK_WAIT`] while sled reports its lock
/// busy; any other error is returned at once.
pub(crate) fn open(config: &sled::Config) -> sled::Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(e) if lock_busy(&e) && Instant::now() < deadline => thread::sleep(LOCK_RETRY),
            result => return result,
        }
    }
}

/// sled 0.34 reports a busy lock only in the message of an `Io` error of
/// kind `Other` (config.rs, `try_lock`).
fn lock_busy(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().starts_with("could not acquire lock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_lock_released_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(dir.path());
        let held = config.open().unwrap();
        let busy = config.open().unwrap_err();
        assert!(lock_busy(&busy), "{busy}");
        let release = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        let db = open(&config).unwrap();
        release.join().unwrap();
        db.insert("k", "v").unwrap();
    }

    #[test]
    fn a_lock_held_past_the_bound_and_other_errors_are_returned() {
        let dir = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(dir.path());
        let _held = config.open().unwrap();
        let started = Instant::now();
        assert!(lock_busy(&open(&config).unwrap_err()));
        assert!(started.elapsed() >= LOCK_WAIT);

        let file = dir.path().join("a-file");
        std::fs::write(&file, b"not a directory").unwrap();
        let err = open(&sled::Config::new().path(file.join("db"))).unwrap_err();
        assert!(!lock_busy(&err), "{err}");
    }
}
