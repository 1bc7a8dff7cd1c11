//! The simulated network: per-message latency plus upload time through the
//! sender's (queued) uplink, random loss, and partitions.

use ragtag_protocol::rng::SeededRng;

use crate::scenario::NetworkSpec;

/// Network state: uplink queues, partition groups, loss draws.
#[derive(Debug)]
pub struct Network {
    latency_s: f64,
    upload_bytes_per_s: f64,
    loss: f64,
    uplink_free_at: Vec<f64>,
    group: Vec<u32>,
    rng: SeededRng,
    /// Bytes each node has sent.
    pub bytes_sent: Vec<u64>,
    /// Bytes each node has received.
    pub bytes_received: Vec<u64>,
    /// Messages lost (random loss or partition).
    pub lost: u64,
}

impl Network {
    /// A network of `nodes` with `spec`.
    pub fn new(spec: &NetworkSpec, nodes: usize, seed: u64) -> Self {
        Self {
            latency_s: spec.latency_ms / 1000.0,
            upload_bytes_per_s: spec.upload_mbit * 1e6 / 8.0,
            loss: spec.loss,
            uplink_free_at: vec![0.0; nodes],
            group: vec![0; nodes],
            rng: SeededRng::derive(seed, "network"),
            bytes_sent: vec![0; nodes],
            bytes_received: vec![0; nodes],
            lost: 0,
        }
    }

    /// Splits the nodes into groups (nodes not listed stay in group 0).
    pub fn partition(&mut self, groups: &[Vec<u32>]) {
        self.group.iter_mut().for_each(|g| *g = 0);
        for (i, g) in groups.iter().enumerate() {
            for n in g {
                self.group[*n as usize] = i as u32 + 1;
            }
        }
    }

    /// Heals any partition.
    pub fn heal(&mut self) {
        self.group.iter_mut().for_each(|g| *g = 0);
    }

    /// True when `a` and `b` can talk.
    pub fn connected(&self, a: usize, b: usize) -> bool {
        self.group[a] == self.group[b]
    }

    /// Sends `bytes` from `from` to `to` at `now`: the arrival time, or
    /// `None` when the message is lost. The sender's uplink is busy for
    /// the upload time (messages queue behind each other).
    pub fn send(&mut self, now: f64, from: usize, to: usize, bytes: usize) -> Option<f64> {
        self.bytes_sent[from] += bytes as u64;
        let start = now.max(self.uplink_free_at[from]);
        let done = start + bytes as f64 / self.upload_bytes_per_s;
        self.uplink_free_at[from] = done;
        if !self.connected(from, to) || (self.loss > 0.0 && self.rng.bernoulli(self.loss)) {
            self.lost += 1;
            return None;
        }
        self.bytes_received[to] += bytes as u64;
        Some(done + self.latency_s)
    }

    /// Sends the same `bytes` from `from` to each of `to` back to back
    /// through the sender's uplink, as one wave: returns the receivers that
    /// will get it (not partitioned off, not lost) and when the last copy
    /// has arrived (a slight delay for the first receivers, in exchange for
    /// one event per wave instead of one per receiver).
    pub fn send_wave(&mut self, now: f64, from: usize, to: &[usize], bytes: usize) -> (Vec<usize>, f64) {
        let total = bytes * to.len();
        self.bytes_sent[from] += total as u64;
        let start = now.max(self.uplink_free_at[from]);
        let done = start + total as f64 / self.upload_bytes_per_s;
        self.uplink_free_at[from] = done;
        let mut reached = Vec::with_capacity(to.len());
        for &t in to {
            if !self.connected(from, t) || (self.loss > 0.0 && self.rng.bernoulli(self.loss)) {
                self.lost += 1;
            } else {
                self.bytes_received[t] += bytes as u64;
                reached.push(t);
            }
        }
        (reached, done + self.latency_s)
    }

    /// The one-way latency.
    pub fn latency_s(&self) -> f64 {
        self.latency_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uplink_queues_and_partitions_drop() {
        let spec = NetworkSpec { latency_ms: 10.0, upload_mbit: 8.0, loss: 0.0, request_timeout_s: 1.0 };
        let mut n = Network::new(&spec, 3, 1);
        // 1 MB/s uplink: 1000 bytes take 1 ms.
        assert!((n.send(0.0, 0, 1, 1000).unwrap() - 0.011).abs() < 1e-9);
        assert!((n.send(0.0, 0, 2, 1000).unwrap() - 0.012).abs() < 1e-9);
        n.partition(&[vec![0], vec![1, 2]]);
        assert!(n.send(1.0, 0, 1, 10).is_none());
        assert!(n.send(1.0, 1, 2, 10).is_some());
        n.heal();
        assert!(n.send(2.0, 0, 1, 10).is_some());
        assert_eq!(n.bytes_sent[0], 2020);
        assert_eq!(n.bytes_received[1], 1010);
        assert_eq!(n.lost, 1);
        n.partition(&[vec![0, 1], vec![2]]);
        let (reached, at) = n.send_wave(3.0, 0, &[1, 2], 500);
        assert_eq!(reached, vec![1]);
        assert!((at - 3.011).abs() < 1e-9, "{at}");
    }
}
