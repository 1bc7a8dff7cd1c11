//! The node's clock: Unix time in microseconds, the engine's time in the
//! real node. One place, so that the runtime and the trainer thread agree
//! and neither has to import the other for it.

use std::time::{SystemTime, UNIX_EPOCH};

use ragtag_protocol::time::Micros;

/// Wall-clock now, in the engine's time.
pub fn now() -> Micros {
    Micros(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64))
}
