//! The ragtag volunteer node: a thin shell around the GoPALS engine.
//!
//! tokio drives one event loop; libp2p carries gossip and request-response;
//! candle trains on a dedicated thread; sled keeps the ledger. Every
//! decision about training and merging is the engine's (`ragtag-protocol`):
//! this crate moves bytes, keeps time, and stores state.

pub mod checkpoint;
pub mod cli;
pub mod doctor;
pub mod export;
pub mod identity;
pub mod ledger;
pub mod live_line;
pub mod manifest_file;
pub mod metrics;
pub mod net;
pub mod payload_store;
pub mod run_lookup;
pub mod runtime;
pub mod status;
pub mod status_page;
pub mod swarm_key;
pub mod trainer_thread;
pub mod wall_clock;
