//! What the node shows about itself: the gauges and the [`Status`] that
//! the status page, `ragtag status` and the live line read.

use std::time::Instant;

use super::{CREDIT_EVERY, Node, now, phases};
use crate::status::Status;

impl Node {
    /// Peer scores and connection kinds from the network task.
    pub(super) async fn refresh_net_info(&mut self) {
        if let Ok(info) = self.net.info().await {
            self.peer_scores = info.scores.iter().map(|(p, s)| (p.to_string(), *s)).collect();
            self.peer_table.connection_kinds(&info.kinds);
            self.bulk_waits = info.bulk_waits.into_iter().collect();
        }
    }

    /// Sets the gauges and publishes the status that the status page,
    /// `ragtag status` and the live line show.
    pub(super) fn refresh_status(&mut self) {
        let stats = self.engine.stats();
        let uptime = self.started.elapsed().as_secs_f64();
        let utilisation = if uptime > 0.0 { (self.busy_s / uptime).min(1.0) } else { 0.0 };
        self.metrics.connected_peers.set(self.connected.len() as i64);
        self.metrics.live_nodes.set(self.engine.live_nodes() as i64);
        self.metrics.utilisation.set(utilisation);
        self.metrics.speed.set(self.engine.speed() as f64);
        let state = self.phase.describe();
        let (on, phase_s) = self.phase.waiting_on();
        for w in phases::PhaseWatch::WAITS {
            self.metrics.waiting.get_or_create(&crate::metrics::WaitLabel { on: w.into() }).set(i64::from(w == on));
        }
        self.metrics.phase_seconds.set(phase_s);
        let idle = self.engine.idle_at(now());
        self.metrics.set_idle(&idle);
        // The one place the gauge is set: a cooldown moves the rate with the
        // clock, not only at the plateau schedule's events.
        let lr_scale = self.engine.lr_scale(now());
        self.metrics.inner_lr_scale.set(lr_scale as f64);
        if self.credit.is_none_or(|(_, at)| at.elapsed() >= CREDIT_EVERY) {
            let vouchers = match &self.opts.allow {
                Some(allowed) => ragtag_protocol::ledger::Vouchers::Allowlist(allowed.clone()),
                None => ragtag_protocol::ledger::Vouchers::AcceptedByOwner,
            };
            match crate::ledger::summary(&self.ledger, 1, &vouchers) {
                Ok(s) => self.credit = Some((s.me.credit, Instant::now())),
                Err(e) => tracing::debug!("credit not computed: {e}"),
            }
        }
        let (bytes_out_per_s, bytes_in_per_s) = self.peer_table.traffic(self.bytes_out, self.bytes_in);
        let peers = self.peer_table.rows(&self.engine, now(), &self.connected, &self.peer_scores);
        let s = Status {
            version: env!("CARGO_PKG_VERSION").into(),
            node_id: self.me.to_hex(),
            peer_id: self.net.local_peer_id().to_string(),
            run_id: self.engine.run_id().to_string(),
            run_name: self.opts.manifest.name.clone(),
            strategy: self.opts.manifest.engine.strategy.name().into(),
            device: self.trainer.info.device.clone(),
            listen_addrs: self.listen.iter().map(|a| a.to_string()).collect(),
            reachability: self.reachability.label().to_owned(),
            uptime_s: uptime,
            round: self.engine.round(),
            outer_rounds: self.engine.outer_rounds(),
            applied: stats.applied,
            rejected: self.rejected.clone(),
            connected_peers: self.connected.len(),
            live_nodes: self.engine.live_nodes(),
            speed: self.engine.speed(),
            train_loss: stats.last_loss.is_finite().then_some(stats.last_loss).filter(|_| stats.rounds > 0),
            eval_loss: self.eval.map(|e| e.loss),
            eval_accuracy: self.eval.map(|e| e.accuracy),
            utilisation,
            idle_s: idle.seconds_by_name(),
            bytes_out: self.bytes_out,
            bytes_in: self.bytes_in,
            ledger_records: self.ledger_records,
            state,
            peer_scores: self.peer_scores.clone(),
            staleness_histogram: stats.staleness_histogram,
            rounds: stats.rounds,
            samples: stats.samples,
            model: self.opts.manifest.model.to_string(),
            data: self.trainer.info.data.clone(),
            eval_history: self.peer_table.evals(),
            credit: self.credit.map(|(c, _)| c),
            inner_lr_scale: lr_scale,
            peers,
            bytes_out_per_s,
            bytes_in_per_s,
            bytes_in_by_connection: self.bytes_in_by_connection.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            hole_punch: self.hole_punch.clone(),
            sums: self.opts.manifest.engine.aggregation.map(|_| self.sum_counts.clone()),
        };
        crate::live_line::update(&s);
        *self.status.write().expect("status lock") = s;
    }
}
