//! ragtag's heterogeneity lab.
//!
//! Runs many nodes in one process in virtual time: every node is the real
//! GoPALS engine of `ragtag-protocol` driving a real trainer of
//! `ragtag-models` (the math is real, candle on the CPU); only the clock,
//! the compute time (`step_cost / speed`) and the network (latency,
//! bandwidth, loss, partitions) are modelled. The same scenario and seed
//! give the same result, bit for bit. `compare` runs every strategy on the
//! same scenario and writes a table, JSON, CSV and PNG plots.

pub mod ablation;
pub mod compare;
pub mod measure;
pub mod netns;
pub mod network;
pub mod outputs;
pub mod plot;
pub mod real;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod speed;
pub mod study;
