//! Acting on engine outputs (compute, dissemination, fetches) and
//! delivering what the network carries.

use std::sync::Arc;

use ragtag_protocol::engine::{EngineEvent, Input, Output};

use super::{
    Delivery, Ev, HAVE_BYTES, HEARTBEAT_BYTES, INLINE_PAYLOAD_BYTES, Published, REQUEST_BYTES, SIGNED_OVERHEAD,
    STORE_RETAIN_S, Sim, phases::DeferredPhase,
};

impl Sim<'_> {
    pub(super) fn act(&mut self, k: usize, out: Output) {
        let me = self.nodes[k].id;
        match out {
            Output::StartLocalPhase(mut p) => {
                let n = &mut self.nodes[k];
                let steps = if p.mode == ragtag_protocol::engine::LocalMode::Gradient { 1 } else { p.steps };
                let deadline = p.deadline.map(|d| d.as_secs_f64());
                let (steps, partial, duration) =
                    n.profile.phase_until(self.now, steps, p.partial, self.scenario.step_cost_s, deadline);
                if p.mode != ragtag_protocol::engine::LocalMode::Gradient {
                    p.steps = steps;
                    p.partial = partial;
                }
                n.phase_started(self.now);
                // The math runs with the other phases of this instant.
                let (node, incarnation, done_at) = (k, n.incarnation, self.now + duration);
                self.deferred.push(DeferredPhase { node, incarnation, phase: p, done_at });
            }
            Output::Publish(p) => {
                self.published += 1;
                self.nodes[k].published += 1;
                let id = p.announcement.id;
                let ann_bytes = postcard::to_allocvec(&p.announcement).map_or(256, |v| v.len()) + SIGNED_OVERHEAD;
                let payload_len = p.payload.len();
                self.store.insert(id, Published { announcement: p.announcement, payload: p.payload });
                self.store_order.push_back((self.now, id));
                while self.store_order.front().is_some_and(|(t, _)| *t + STORE_RETAIN_S < self.now) {
                    let (_, old) = self.store_order.pop_front().expect("checked");
                    self.store.remove(&old);
                }
                // Every strategy's update, ddp's gradients included, travels
                // as the node sends it: inline in gossip when small enough,
                // else announced and fetched by each peer.
                // Aggregated, an update goes to its group's aggregators only.
                let receivers = if p.to.is_empty() {
                    self.others(k)
                } else {
                    let mut to: Vec<usize> = p.to.iter().filter_map(|n| self.index_of.get(n).copied()).collect();
                    to.retain(|j| *j != k && self.live(*j));
                    to
                };
                let inline = payload_len <= INLINE_PAYLOAD_BYTES;
                let wire_bytes = if inline { ann_bytes + payload_len } else { ann_bytes };
                let what = if inline { Delivery::Update { id, from: me } } else { Delivery::Announce { id, from: me } };
                self.broadcast(k, &receivers, wire_bytes, what);
            }
            Output::FetchPayload { id, from, .. } | Output::FetchAnnouncement { id, from } => {
                let src = self.index_of.get(&from).copied();
                let timeout = self.now + self.scenario.network.request_timeout_s;
                let ok = match (src, self.store.get(&id)) {
                    (Some(s), Some(pb)) if self.live(s) && self.network.connected(k, s) => {
                        let bytes = pb.payload.len() + 16;
                        let lat = self.network.latency_s();
                        // The request reaches the holder, which then sends the payload back.
                        self.network.send(self.now, k, s, REQUEST_BYTES);
                        match self.network.send(self.now + lat, s, k, bytes) {
                            Some(at) => {
                                let what = if matches!(out, Output::FetchAnnouncement { .. }) {
                                    Delivery::Update { id, from }
                                } else {
                                    Delivery::Payload { id }
                                };
                                self.push(at, Ev::Deliver { node: k, what });
                                true
                            }
                            None => false,
                        }
                    }
                    _ => false,
                };
                if !ok {
                    self.push(timeout, Ev::Deliver { node: k, what: Delivery::FetchFailed { id, from } });
                }
            }
            Output::PublishAggregate { announcement, body } => {
                let bytes = postcard::to_allocvec(&announcement).map_or(256, |v| v.len()) + SIGNED_OVERHEAD;
                let sum = (announcement.key, announcement.group, announcement.body_hash);
                self.aggregates.insert(sum, body);
                self.aggregate_order.push_back((self.now, sum));
                while self.aggregate_order.front().is_some_and(|(t, _)| *t + STORE_RETAIN_S < self.now) {
                    let (_, old) = self.aggregate_order.pop_front().expect("checked");
                    self.aggregates.remove(&old);
                    self.sum_holders.remove(&old);
                    self.sum_waiters.retain(|(s, _), _| *s != old);
                }
                self.hold_sum(k, sum);
                let receivers = self.others(k);
                self.broadcast(k, &receivers, bytes, Delivery::AggregateAnnounce(Arc::new(announcement)));
            }
            Output::SendAggregate { key, group, hash, to, .. } => {
                let sum = (key, group, hash);
                for j in to.iter().filter_map(|n| self.index_of.get(n).copied()).collect::<Vec<_>>() {
                    if j != k && self.live(j) {
                        let now = self.now;
                        self.serve_sum(k, j, sum, now);
                    }
                }
            }
            Output::FetchAggregate { key, group, from, hash, .. } => {
                let sum = (key, group, hash);
                let src = self.index_of.get(&from).copied().filter(|s| self.live(*s) && self.network.connected(k, *s));
                let timeout = self.now + self.scenario.network.request_timeout_s;
                let failed = Ev::Deliver { node: k, what: Delivery::AggregateFetchFailed { key, group, from } };
                match src {
                    Some(s) if self.aggregates.contains_key(&sum) => {
                        self.network.send(self.now, k, s, REQUEST_BYTES);
                        if self.sum_holders.get(&sum).is_some_and(|h| h.contains(&s)) {
                            let asked_at = self.now + self.network.latency_s();
                            self.serve_sum(s, k, sum, asked_at);
                        } else {
                            // The holder answers once it has the sum (it
                            // is fetching it from its own parent).
                            self.sum_waiters.entry((sum, s)).or_default().push(k);
                        }
                        self.push(timeout, failed);
                    }
                    _ => self.push(timeout, failed),
                }
            }
            Output::AnnounceHeld { id, .. } => {
                let receivers = self.others(k);
                self.broadcast(k, &receivers, HAVE_BYTES, Delivery::Holder { id, from: me });
            }
            Output::SendHeartbeat(hb) => {
                let receivers = self.others(k);
                self.broadcast(k, &receivers, HEARTBEAT_BYTES, Delivery::Heartbeat(Arc::new(hb)));
            }
            Output::AntiEntropy { peer, digest } => {
                if let Some(&j) = self.index_of.get(&peer) {
                    let bytes = postcard::to_allocvec(&digest).map_or(1024, |v| v.len());
                    self.send(k, j, bytes, Delivery::Digest { from: k, digest: Arc::new(digest), reply: true });
                }
            }
            Output::FetchAnchor { from } => {
                if let Some(&j) = self.index_of.get(&from)
                    && let Some(e) = self.nodes[j].engine.as_ref()
                {
                    let state = e.replica_state();
                    let bytes = 4 * (state.anchor.len() + state.outer.momentum.len()) + 1024;
                    self.send(j, k, bytes, Delivery::Anchor { from, state: Arc::new(state) });
                }
            }
            Output::Record(_) => {}
            Output::Event(ev) => self.count(ev),
        }
    }

    /// Node `k` holds `sum` now: it serves the fetches that waited for it.
    fn hold_sum(&mut self, k: usize, sum: super::SumKey) {
        self.sum_holders.entry(sum).or_default().insert(k);
        for w in self.sum_waiters.remove(&(sum, k)).unwrap_or_default() {
            if self.live(w) && self.network.connected(k, w) {
                let now = self.now;
                self.serve_sum(k, w, sum, now);
            }
        }
    }

    /// Sends `sum`'s body from holder `s` to `to`, starting at `start`.
    fn serve_sum(&mut self, s: usize, to: usize, sum: super::SumKey, start: f64) {
        let Some(len) = self.aggregates.get(&sum).map(|b| b.len()) else { return };
        let from = self.nodes[s].id;
        let (key, group, hash) = sum;
        if let Some(at) = self.network.send(start, s, to, len + 16) {
            self.push(at, Ev::Deliver { node: to, what: Delivery::AggregateBody { key, group, from, hash } });
        }
    }

    /// Live nodes other than `k`.
    fn others(&self, k: usize) -> Vec<usize> {
        (0..self.nodes.len()).filter(|j| *j != k && self.live(*j)).collect()
    }

    /// Sends one message to many peers in waves through `k`'s uplink.
    fn broadcast(&mut self, k: usize, receivers: &[usize], bytes: usize, what: Delivery) {
        const WAVES: usize = 8;
        let per_wave = receivers.len().div_ceil(WAVES).max(1);
        for wave in receivers.chunks(per_wave) {
            let (reached, at) = self.network.send_wave(self.now, k, wave, bytes);
            if !reached.is_empty() {
                self.push(at, Ev::Wave { nodes: reached, what: what.clone() });
            }
        }
    }

    fn count(&mut self, ev: EngineEvent) {
        match ev {
            EngineEvent::Applied { staleness, .. } => self.tally.staleness_histogram[(staleness as usize).min(7)] += 1,
            EngineEvent::Dropped { reason, .. } => {
                *self.tally.dropped.entry(reason.name().to_string()).or_insert(0) += 1
            }
            EngineEvent::AnchorsAveraged { .. } => self.tally.anchors_averaged += 1,
            EngineEvent::AnchorRefused { reason, .. } => {
                *self.tally.anchors_refused.entry(reason.name().to_string()).or_insert(0) += 1
            }
            EngineEvent::FetchAbandoned { .. } => self.tally.fetches_abandoned += 1,
            EngineEvent::AggregateRefused { reason, .. } => {
                *self.tally.dropped.entry(format!("aggregate_{}", reason.name())).or_insert(0) += 1
            }
            EngineEvent::AggregateMissed { .. } => self.tally.aggregates_missed += 1,
            EngineEvent::InnerLrChanged { scale, change } => {
                *self.tally.inner_lr_changes.entry(change.name().to_string()).or_insert(0) += 1;
                self.tally.inner_lr_scale_min = Some(self.tally.inner_lr_scale_min.map_or(scale, |m| m.min(scale)));
            }
            _ => {}
        }
    }

    pub(super) fn deliver(&mut self, node: usize, what: Delivery) {
        if !self.live(node) {
            return;
        }
        let input = match what {
            Delivery::Update { id, from } => match self.store.get(&id) {
                Some(p) => Input::Update { announcement: p.announcement.clone(), from, payload: p.payload.clone() },
                None => return,
            },
            Delivery::Announce { id, from } => match self.store.get(&id) {
                Some(p) => Input::Announcement { announcement: p.announcement.clone(), from },
                None => return,
            },
            Delivery::Payload { id } => match self.store.get(&id) {
                Some(p) => Input::Payload { id, bytes: p.payload.clone() },
                None => return,
            },
            Delivery::Holder { id, from } => Input::PayloadSource { id, from },
            Delivery::FetchFailed { id, from } => Input::FetchFailed { id, from, reason: None },
            Delivery::Heartbeat(hb) => Input::Heartbeat(hb.as_ref().clone()),
            Delivery::Digest { from, digest, reply } => {
                if reply && let Some(e) = self.nodes[node].engine.as_ref() {
                    let back = e.digest();
                    let bytes = postcard::to_allocvec(&back).map_or(1024, |v| v.len());
                    self.send(node, from, bytes, Delivery::Digest { from: node, digest: Arc::new(back), reply: false });
                }
                Input::PeerDigest { from: self.nodes[from].id, digest: digest.as_ref().clone() }
            }
            Delivery::Anchor { from, state } => Input::PeerAnchor { from, state: Box::new(state.as_ref().clone()) },
            Delivery::AggregateAnnounce(a) => {
                Input::AggregateAnnouncement { announcement: a.as_ref().clone(), from: a.aggregator }
            }
            Delivery::AggregateBody { key, group, from, hash } => match self.aggregates.get(&(key, group, hash)) {
                Some(bytes) => {
                    let bytes = bytes.clone();
                    self.hold_sum(node, (key, group, hash));
                    Input::AggregateBody { key, group, from, bytes }
                }
                None => Input::AggregateFetchFailed { key, group, from },
            },
            Delivery::AggregateFetchFailed { key, group, from } => Input::AggregateFetchFailed { key, group, from },
        };
        self.handle(node, input);
    }
}
