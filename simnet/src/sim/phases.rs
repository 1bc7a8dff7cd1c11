//! Local phases computed together. Phases that start at one virtual
//! instant are independent (each node trains its own replica with its own
//! trainer), so they run on every core once the instant is over; their
//! results are queued in the order the phases started, so a run is the same
//! whatever the number of cores.

use std::collections::BTreeMap;

use ragtag_models::{PhaseResult, Trainer};
use ragtag_protocol::engine::{LocalMode, LocalPhase, LocalResult};
use rayon::prelude::*;

use super::{Ev, Sim};

/// A phase whose math waits for the end of its instant.
#[derive(Debug)]
pub(super) struct DeferredPhase {
    pub(super) node: usize,
    pub(super) incarnation: u64,
    pub(super) phase: LocalPhase,
    /// Virtual time at which the phase completes.
    pub(super) done_at: f64,
}

impl Sim<'_> {
    /// Computes every deferred phase and queues their completions.
    pub(super) fn run_deferred_phases(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        // A phase of an incarnation that ended within the instant is void.
        let mut jobs = std::mem::take(&mut self.deferred);
        jobs.retain(|job| self.nodes[job.node].incarnation == job.incarnation);
        // Should a node have two, they run in turn.
        let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (j, job) in jobs.iter().enumerate() {
            by_node.entry(job.node).or_default().push(j);
        }
        let mut work: Vec<(&mut Trainer, Vec<usize>)> = Vec::with_capacity(by_node.len());
        let mut wanted = by_node.into_iter().peekable();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if let Some((_, js)) = wanted.next_if(|(node, _)| *node == i) {
                work.push((&mut n.trainer, js));
            }
        }
        let mut results: Vec<(usize, PhaseResult)> = work
            .into_par_iter()
            .flat_map_iter(|(trainer, js)| {
                js.into_iter()
                    .map(|j| {
                        let p = &jobs[j].phase;
                        trainer.set_lr_scale(p.lr_scale);
                        trainer.set_partial_step(p.partial);
                        let r = trainer
                            .run_phase(&p.anchor, p.steps, p.mode, p.pull, p.seed)
                            .expect("training on the CPU does not fail on valid input");
                        (j, r)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        results.sort_by_key(|(j, _)| *j);
        for ((_, result), job) in results.into_iter().zip(jobs) {
            let p = job.phase;
            let delta: Vec<f32> = if p.mode == LocalMode::Gradient {
                result.params.clone()
            } else {
                p.anchor.iter().zip(&result.params).map(|(a, t)| a - t).collect()
            };
            let (first_loss, lead) = (result.first_loss, p.lead);
            let local = LocalResult {
                round: p.round,
                params: result.params,
                steps: result.steps,
                partial: result.partial,
                samples: result.samples,
                loss: result.loss,
                flops: result.flops,
            };
            let ev = Ev::PhaseDone {
                node: job.node,
                incarnation: job.incarnation,
                result: Box::new(local),
                delta,
                first_loss,
                lead,
            };
            self.push(job.done_at, ev);
        }
    }
}
