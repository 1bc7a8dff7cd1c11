//! The heart of ragtag, with no IO in it.
//!
//! This crate holds everything two ragtag nodes must agree on byte for byte
//! — identities, the swarm manifest and its run id, the versioned wire
//! messages with their size limits, signatures, update payload codecs,
//! validation, ledger record formats — and the GoPALS engine: the
//! deterministic state machine that decides when to train, what to publish
//! and how to merge what others published. It never reads a clock, a socket,
//! a file or the OS's randomness: time and seeds are inputs, so the node and
//! the simulator drive the very same code (the sans-IO shape of quinn-proto).
//!
//! The modules form layers; each uses only the layers below it:
//! 1. `ids`, `rng`, `time` (with tick mode's clock stretch), `reject` (the
//!    reasons for refusing peer input), `codec`, `sorted_walk`; then
//!    `identity` and `version` over `ids`.
//! 2. `ledger`: the signed records and receipts.
//! 3. `wire`: the messages, which carry ledger records, and their limits;
//!    `aggregate`: the signed sums of aggregated dissemination.
//! 4. `chunks` (reassembly of chunked payloads and states) and `validate`
//!    (what a peer's update must pass before it is used).
//! 5. `engine` (its configuration included) and, over it, `manifest`.

pub mod aggregate;
pub mod chunks;
pub mod codec;
pub mod engine;
pub mod identity;
pub mod ids;
pub mod ledger;
pub mod manifest;
pub mod reject;
pub mod rng;
mod sorted_walk;
pub mod time;
pub mod validate;
pub mod version;
pub mod wire;

pub use identity::{Keypair, Signed};
pub use ids::{Hash32, NodeId, RunId, UpdateId};
pub use time::Micros;
