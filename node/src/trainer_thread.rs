//! The trainer on its own OS thread: candle's blocking compute never runs
//! on a tokio worker. Commands arrive on a bounded channel; results go back
//! to the event loop on another bounded channel.

use std::{
    path::PathBuf,
    sync::{Arc, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use ragtag_models::{
    EvalResult, Trainer, TrainerConfig,
    data::Batch,
    update_trace::{PROBE_ROWS, UpdateTrace},
};
use ragtag_protocol::engine::{LocalMode, LocalPhase, LocalResult, MIN_PARTIAL_STEP, PullConfig};

/// Commands queued for the trainer at most.
const COMMAND_CAPACITY: usize = 4;
/// Inner steps of the start-up speed measurement.
const BENCH_STEPS: u32 = 3;

/// Work for the trainer thread.
#[derive(Debug)]
pub enum TrainerCommand {
    /// Run a local phase.
    Phase(LocalPhase),
    /// Evaluate these parameters on the held-out set.
    Evaluate {
        /// Parameters.
        params: Arc<Vec<f32>>,
        /// Echoed back.
        tag: u64,
    },
    /// Save the trainer's checkpoint (parameters and AdamW state).
    Checkpoint(PathBuf),
    /// Restore the trainer's checkpoint.
    Restore(PathBuf),
    /// Stop the thread.
    Shutdown,
}

/// Why the trainer could not start or checkpoint: the node stops or logs it.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// The model, data or device failed.
    #[error(transparent)]
    Model(#[from] ragtag_models::Error),
    /// The OS would not start the thread.
    #[error("cannot start the trainer thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The thread ended before reporting its start.
    #[error("the trainer thread died during start-up")]
    DiedAtStart,
}

/// What the trainer thread reports.
#[derive(Debug)]
pub enum TrainerReply {
    /// A local phase finished.
    PhaseDone {
        /// For the engine.
        result: LocalResult,
        /// Wall time of the compute (before any slowdown).
        compute_s: f64,
        /// Wall time including the slowdown.
        total_s: f64,
        /// The study's measurements of the round (`--trace-updates`).
        trace: Option<Box<UpdateTrace>>,
    },
    /// An evaluation finished.
    Evaluated {
        /// The tag sent.
        tag: u64,
        /// Held-out loss and accuracy.
        result: EvalResult,
    },
    /// A checkpoint was written or restored.
    Checkpointed(Result<PathBuf, TrainerError>),
    /// A local phase failed; the thread goes on.
    PhaseFailed {
        /// The phase's round.
        round: u64,
        /// What failed.
        error: String,
    },
    /// Something else failed (an evaluation); the thread goes on.
    Failed(String),
}

/// Why a command did not reach the trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Its queue is full: try again once it replies.
    #[error("the trainer's queue is full")]
    Full,
    /// The thread has ended.
    #[error("the trainer thread has ended")]
    Gone,
}

/// What the trainer learned at start-up.
#[derive(Debug, Clone)]
pub struct TrainerInfo {
    /// Initial parameters (the run's seeded initialisation).
    pub initial: Vec<f32>,
    /// Inner steps per second on this device, slowdown included.
    pub steps_per_s: f32,
    /// The device, in words.
    pub device: String,
    /// Why `auto` fell back to the CPU, if it did.
    pub fallback_reason: Option<String>,
    /// What the run trains on, in words (with its loss floor when known).
    pub data: String,
    /// Best achievable held-out loss, when the data knows it.
    pub floor: Option<f32>,
    /// Unigram entropy of text data.
    pub unigram_entropy: Option<f32>,
    /// Forward FLOPs per sample.
    pub flops_per_sample: f64,
    /// Micro-batch in use.
    pub micro_batch: usize,
}

/// A handle to the trainer thread.
#[derive(Debug)]
pub struct TrainerHandle {
    tx: mpsc::SyncSender<TrainerCommand>,
    thread: Option<JoinHandle<()>>,
    /// Start-up facts.
    pub info: TrainerInfo,
}

impl TrainerHandle {
    /// Queues a command; fails when the thread is gone or the queue is full.
    pub fn send(&self, cmd: TrainerCommand) -> Result<(), SendError> {
        self.tx.try_send(cmd).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => SendError::Full,
            mpsc::TrySendError::Disconnected(_) => SendError::Gone,
        })
    }

    /// Stops the thread and waits for it.
    pub fn shutdown(mut self) {
        let _ = self.tx.send(TrainerCommand::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Emulated slower hardware, for heterogeneous swarms on one machine: an
/// inner step is stretched to `slowdown` times its compute, and to at least
/// `step_floor` (the simulator's real mode gives every node its scenario's
/// step cost). The stretch is spent sleeping and counts as busy time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// Each step takes this many times its compute (at least 1).
    pub slowdown: f64,
    /// Each step takes at least this long.
    pub step_floor: Duration,
}

impl Pace {
    /// How long a step of `compute` takes on the emulated hardware.
    pub fn emulated(&self, compute: Duration) -> Duration {
        self.emulated_part(compute, 1.0)
    }

    /// The same for a step on `share` of a batch (a partial step): its
    /// floor is that share of a whole step's.
    pub fn emulated_part(&self, compute: Duration, share: f32) -> Duration {
        let floor = if share >= 1.0 { self.step_floor } else { self.step_floor.mul_f64(f64::from(share.max(0.0))) };
        compute.mul_f64(self.slowdown.max(1.0)).max(floor)
    }
}

/// Starts the trainer thread: builds the model and data on the device,
/// measures the speed (as paced), then serves commands; with `trace`, each
/// finished phase carries its [`UpdateTrace`].
pub fn spawn(
    cfg: TrainerConfig,
    pace: Pace,
    trace: bool,
    replies: tokio::sync::mpsc::Sender<TrainerReply>,
) -> Result<TrainerHandle, TrainerError> {
    let (tx, rx) = mpsc::sync_channel::<TrainerCommand>(COMMAND_CAPACITY);
    let (info_tx, info_rx) = mpsc::sync_channel::<Result<TrainerInfo, TrainerError>>(1);
    let thread = std::thread::Builder::new()
        .name("ragtag-trainer".into())
        .spawn(move || {
            let mut trainer = match start(&cfg, pace) {
                Ok((t, info)) => {
                    let _ = info_tx.send(Ok(info));
                    t
                }
                Err(e) => {
                    let _ = info_tx.send(Err(e));
                    return;
                }
            };
            let probe = trace.then(|| trainer.probe_batch(PROBE_ROWS));
            serve(&mut trainer, pace, probe.as_ref(), rx, replies);
        })
        .map_err(TrainerError::Thread)?;
    let info = info_rx.recv().map_err(|_| TrainerError::DiedAtStart)??;
    Ok(TrainerHandle { tx, thread: Some(thread), info })
}

fn start(cfg: &TrainerConfig, pace: Pace) -> Result<(Trainer, TrainerInfo), TrainerError> {
    let trainer = Trainer::new(cfg.clone())?;
    let initial = trainer.export_params()?;
    // Measure the speed on a throwaway trainer, so the real one starts
    // from the run's exact initial state.
    let mut bench = Trainer::with_dataset(cfg.clone(), trainer.dataset().clone())?;
    let t = Instant::now();
    bench.run_phase(&initial, BENCH_STEPS, LocalMode::Train, PullConfig { p: 0.0, lambda: 0.0 }, 0)?;
    let per_step = pace.emulated(t.elapsed() / BENCH_STEPS).as_secs_f64();
    let ds = trainer.dataset();
    let info = TrainerInfo {
        initial,
        steps_per_s: (1.0 / per_step.max(1e-6)) as f32,
        device: trainer.device().description.clone(),
        fallback_reason: trainer.device().fallback_reason.clone(),
        floor: ds.floor,
        data: ds.description.clone(),
        unigram_entropy: ds.unigram_entropy,
        flops_per_sample: trainer.model().forward_flops_per_sample(),
        micro_batch: trainer.micro_batch(),
    };
    Ok((trainer, info))
}

/// The study's measurements of a phase from `anchor` that ended at
/// `local` (the similarity leaves the trainer's parameters at the anchor;
/// the next phase imports its own).
fn trace_of(
    trainer: &mut Trainer,
    probe: &Batch,
    anchor: &[f32],
    r: &ragtag_models::PhaseResult,
) -> Option<Box<UpdateTrace>> {
    let similarity = match trainer.representation_similarity(&r.params, anchor, probe) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("representation similarity not measured: {e}");
            Vec::new()
        }
    };
    UpdateTrace::of(trainer.layout(), anchor, &r.params, r.steps, r.first_loss, similarity).map(Box::new)
}

fn serve(
    trainer: &mut Trainer,
    pace: Pace,
    probe: Option<&Batch>,
    rx: mpsc::Receiver<TrainerCommand>,
    replies: tokio::sync::mpsc::Sender<TrainerReply>,
) {
    while let Ok(cmd) = rx.recv() {
        let reply = match cmd {
            TrainerCommand::Shutdown => break,
            TrainerCommand::Phase(p) => {
                let start = Instant::now();
                // The engine's deadline (Unix µs) as a monotonic instant.
                let deadline = p.deadline.map(|d| {
                    let left = d.0.saturating_sub(crate::wall_clock::now().0);
                    start + Duration::from_micros(left)
                });
                let mut compute = Duration::ZERO;
                let mut last = Instant::now();
                // After each step: pace it, then go on only if the next
                // step (`next` of a whole one: a partial step is shorter)
                // would end before the deadline.
                let mut share = 1.0f32;
                let go_on = |_step: u32, next: f32| {
                    let step = last.elapsed();
                    compute += step;
                    let emulated = pace.emulated_part(step, share);
                    if emulated > step {
                        std::thread::sleep(emulated - step);
                    }
                    last = Instant::now();
                    let whole = emulated.div_f32(share.max(MIN_PARTIAL_STEP));
                    share = if next > 0.0 { next.min(1.0) } else { share };
                    deadline.is_none_or(|d| Instant::now() + whole.mul_f32(next.max(0.0)) < d)
                };
                trainer.set_lr_scale(p.lr_scale);
                trainer.set_partial_step(p.partial);
                match trainer.run_phase_with(&p.anchor, p.steps, p.mode, p.pull, p.seed, go_on) {
                    Ok(r) => {
                        let compute_s = compute.as_secs_f64();
                        let total_s = start.elapsed().as_secs_f64();
                        let trace = probe
                            .filter(|_| p.mode == LocalMode::Train)
                            .and_then(|probe| trace_of(trainer, probe, &p.anchor, &r));
                        TrainerReply::PhaseDone {
                            result: LocalResult {
                                round: p.round,
                                params: r.params,
                                steps: r.steps,
                                partial: r.partial,
                                samples: r.samples,
                                loss: r.loss,
                                flops: r.flops,
                            },
                            compute_s,
                            total_s,
                            trace,
                        }
                    }
                    Err(e) => TrainerReply::PhaseFailed { round: p.round, error: e.to_string() },
                }
            }
            TrainerCommand::Evaluate { params, tag } => match trainer.evaluate(Some(&params)) {
                Ok(result) => TrainerReply::Evaluated { tag, result },
                Err(e) => TrainerReply::Failed(format!("evaluation: {e}")),
            },
            TrainerCommand::Checkpoint(path) => {
                TrainerReply::Checkpointed(trainer.save_checkpoint(&path).map(|_| path).map_err(TrainerError::from))
            }
            TrainerCommand::Restore(path) => {
                TrainerReply::Checkpointed(trainer.load_checkpoint(&path).map(|_| path).map_err(TrainerError::from))
            }
        };
        if replies.blocking_send(reply).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_stretches_steps_by_factor_and_floor() {
        let ms = Duration::from_millis;
        let slow = Pace { slowdown: 4.0, step_floor: Duration::ZERO };
        assert_eq!(slow.emulated(ms(10)), ms(40));
        let floor = Pace { slowdown: 1.0, step_floor: ms(100) };
        assert_eq!(floor.emulated(ms(10)), ms(100));
        // Hardware slower than the floor is not sped up.
        assert_eq!(floor.emulated(ms(300)), ms(300));
        // A factor below 1 never speeds a step up.
        assert_eq!(Pace { slowdown: 0.5, step_floor: Duration::ZERO }.emulated(ms(10)), ms(10));
        // A partial step's floor is its share of a whole one's.
        assert_eq!(floor.emulated_part(ms(10), 0.5), ms(50));
        assert_eq!(floor.emulated_part(ms(80), 0.5), ms(80));
    }
}
