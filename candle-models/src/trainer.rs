//! The inner training loop: from an anchor, H AdamW steps (or one gradient)
//! on this node's data shard; held-out evaluation; flat parameter I/O.

use std::{path::PathBuf, sync::Arc, time::Instant};

use candle_core::{DType, Tensor};
use candle_nn::{VarBuilder, VarMap};
use ragtag_protocol::{
    engine::{LocalMode, PullConfig},
    manifest::{DataSpec, ModelSpec, TrainingSpec},
    rng::SeededRng,
};

use crate::{
    Error, Result,
    data::{Batch, Dataset, Sampler, Shard},
    device::{DeviceChoice, SelectedDevice, select},
    memory,
    model::Model,
    optim::AdamW,
    params::{Layout, ParamStore},
};

/// Everything a trainer needs.
#[derive(Clone, Debug)]
pub struct TrainerConfig {
    /// The model.
    pub model: ModelSpec,
    /// The data.
    pub data: DataSpec,
    /// Inner optimiser and batch.
    pub training: TrainingSpec,
    /// The run's seed (weights, synthetic data, held-out set).
    pub seed: u64,
    /// This node's seed (its training stream).
    pub node_seed: u64,
    /// This node's shard.
    pub shard: Shard,
    /// The data file, for file-backed data.
    pub data_path: Option<PathBuf>,
    /// Where to train.
    pub device: DeviceChoice,
    /// Force a micro-batch (gradient accumulation); `None` plans from memory.
    pub micro_batch: Option<usize>,
}

/// What a local phase produced.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// Parameters after the phase (train mode) or the gradient (gradient mode).
    pub params: Vec<f32>,
    /// Whole steps taken (gradient or pull).
    pub steps: u32,
    /// The batch fraction of the partial step taken after them (0: none).
    pub partial: f32,
    /// Samples processed.
    pub samples: u64,
    /// Mean training loss over the gradient steps.
    pub loss: f32,
    /// Training loss of the first gradient step, at the anchor: the loss of
    /// the examples this node drew, at the model every node starts from.
    pub first_loss: f32,
    /// Wall time of the phase.
    pub elapsed_s: f64,
    /// `||theta - anchor||` per parameter tensor, in layout order.
    pub layer_update_norms: Vec<f32>,
    /// Estimated floating-point operations.
    pub flops: f64,
}

/// Held-out quality.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalResult {
    /// Mean cross-entropy (nats).
    pub loss: f32,
    /// Fraction of correct top-1 predictions.
    pub accuracy: f32,
    /// Samples (positions for text) evaluated.
    pub samples: usize,
}

/// A model, its optimiser state, and this node's data stream on a device.
#[derive(Debug)]
pub struct Trainer {
    model: Model,
    params: ParamStore,
    opt: AdamW,
    dataset: Arc<Dataset>,
    sampler: Sampler,
    device: SelectedDevice,
    training: TrainingSpec,
    micro_batch: usize,
    node_seed: u64,
    shard: Shard,
    lr_scale: f64,
    /// Rows of the partial step that ends each phase (0: none).
    partial_rows: usize,
}

/// Held-out samples evaluated per forward pass.
const EVAL_CHUNK: usize = 256;

impl Trainer {
    /// Opens the data and builds the trainer.
    pub fn new(cfg: TrainerConfig) -> Result<Self> {
        let dataset = Arc::new(Self::open_dataset(&cfg)?);
        Self::with_dataset(cfg, dataset)
    }

    /// Opens the data `cfg` names, to share among trainers.
    pub fn open_dataset(cfg: &TrainerConfig) -> Result<Dataset> {
        Dataset::open(&cfg.data, &cfg.model, cfg.seed, cfg.data_path.as_deref(), cfg.training.eval_samples as usize)
    }

    /// Builds a trainer over an already opened dataset (the simulator
    /// shares one across many nodes).
    pub fn with_dataset(cfg: TrainerConfig, dataset: Arc<Dataset>) -> Result<Self> {
        let device = select(cfg.device)?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device.device);
        let model = Model::build(&cfg.model, vb)?;
        if model.classes() != dataset.classes() {
            return Err(Error::Shape(format!(
                "model has {} outputs, data {} classes",
                model.classes(),
                dataset.classes()
            )));
        }
        let params = ParamStore::from_varmap(&varmap);
        params.init(cfg.seed, model.init_scheme())?;
        let opt = AdamW::new(params.vars(), &cfg.training)?;
        let batch = cfg.training.batch_size as usize;
        let micro_batch = match cfg.micro_batch {
            Some(m) => m.clamp(1, batch),
            None => {
                let budget = if device.device.is_cpu() { memory::available_cpu_bytes() } else { None };
                match budget {
                    Some(b) => {
                        memory::plan_micro_batch(params.len(), model.activation_bytes_per_sample(), batch, b * 8 / 10)?
                    }
                    None => batch,
                }
            }
        };
        if micro_batch < batch {
            tracing::warn!(micro_batch, batch, "not enough memory for the whole batch: accumulating gradients");
        }
        let sampler = dataset.sampler(cfg.node_seed, cfg.shard);
        Ok(Self {
            model,
            params,
            opt,
            dataset,
            sampler,
            device,
            training: cfg.training,
            micro_batch,
            node_seed: cfg.node_seed,
            shard: cfg.shard,
            lr_scale: 1.0,
            partial_rows: 0,
        })
    }

    /// Scales the manifest's inner learning rate for the phases that follow
    /// (the engine's schedule: `LocalPhase::lr_scale`). Values outside
    /// (0, 1] are clamped to it.
    pub fn set_lr_scale(&mut self, scale: f32) {
        self.lr_scale = if scale.is_finite() { (scale as f64).clamp(1e-6, 1.0) } else { 1.0 };
    }

    /// Ends the train-mode phases that follow with one more step on this
    /// fraction of a batch (the engine's `LocalPhase::partial`: the rest of
    /// a tick too short for a whole step); 0 for none. At least one row,
    /// less than a whole batch (so none with batches of one row).
    pub fn set_partial_step(&mut self, fraction: f32) {
        let batch = self.training.batch_size as usize;
        self.partial_rows = if fraction > 0.0 && fraction.is_finite() && batch > 1 {
            ((fraction.min(1.0) * batch as f32).round() as usize).clamp(1, batch - 1)
        } else {
            0
        };
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    /// Names, shapes and offsets of the flat vector.
    pub fn layout(&self) -> &Layout {
        self.params.layout()
    }

    /// The device in use.
    pub fn device(&self) -> &SelectedDevice {
        &self.device
    }

    /// The dataset (held-out set, floors).
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// The micro-batch in use.
    pub fn micro_batch(&self) -> usize {
        self.micro_batch
    }

    /// Current parameters, flat.
    pub fn export_params(&self) -> Result<Vec<f32>> {
        self.params.export()
    }

    /// Sets the parameters from a flat vector.
    pub fn import_params(&self, flat: &[f32]) -> Result<()> {
        self.params.import(flat)
    }

    /// The model (for benchmarks and tests).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Loss and gradients on one batch (accumulated over micro-batches).
    fn loss_and_grads(&mut self, batch: &Batch) -> Result<(f32, Vec<Option<Tensor>>)> {
        let n = batch.samples();
        let parts = n.div_ceil(self.micro_batch).max(1);
        let mut total: Vec<Option<Tensor>> = vec![None; self.params.vars().len()];
        let mut loss_sum = 0.0f32;
        for p in 0..parts {
            let range = p * self.micro_batch..((p + 1) * self.micro_batch).min(n);
            let weight = range.len() as f64 / n as f64;
            let part = if parts == 1 { batch.clone() } else { batch.slice(range) };
            let (x, y) = part.to_tensors(&self.device.device)?;
            let logits = self.model.forward(&x)?;
            let loss = crate::model::cross_entropy(&logits, &y)?;
            loss_sum += loss.to_scalar::<f32>()? * weight as f32;
            let grads = loss.backward()?;
            for (slot, var) in total.iter_mut().zip(self.params.vars()) {
                if let Some(g) = grads.get(var.as_tensor()) {
                    let g = if parts == 1 { g.clone() } else { g.affine(weight, 0.0)? };
                    *slot = Some(match slot.take() {
                        Some(acc) => (acc + g)?,
                        None => g,
                    });
                }
            }
        }
        Ok((loss_sum, total))
    }

    /// One local phase from `anchor`: `steps` inner AdamW steps (train
    /// mode; with pull steps at probability `pull.p`), or the gradient at
    /// the anchor (gradient mode).
    pub fn run_phase(
        &mut self,
        anchor: &[f32],
        steps: u32,
        mode: LocalMode,
        pull: PullConfig,
        seed: u64,
    ) -> Result<PhaseResult> {
        self.run_phase_with(anchor, steps, mode, pull, seed, |_, _| true)
    }

    /// [`Trainer::run_phase`], calling `go_on(step, next)` after every
    /// inner step, where `next` is the batch fraction of the step that
    /// would follow (1 for a whole one, the partial step's fraction, 0 when
    /// the phase is done): returning false ends the phase early (a
    /// deadline), and the caller may use the call to pace the steps
    /// (emulated slow hardware).
    pub fn run_phase_with(
        &mut self,
        anchor: &[f32],
        steps: u32,
        mode: LocalMode,
        pull: PullConfig,
        seed: u64,
        mut go_on: impl FnMut(u32, f32) -> bool,
    ) -> Result<PhaseResult> {
        let start = Instant::now();
        self.params.import(anchor)?;
        let batch_size = self.training.batch_size as usize;
        let flops_per_step = 3.0 * self.model.forward_flops_per_sample() * batch_size as f64;
        if mode == LocalMode::Gradient {
            let batch = self.sampler.next_batch(batch_size);
            let (loss, grads) = self.loss_and_grads(&batch)?;
            // The one step is the whole phase: the caller still paces it.
            go_on(1, 0.0);
            let mut flat = Vec::with_capacity(self.params.len());
            for (g, e) in grads.iter().zip(&self.params.layout().entries) {
                match g {
                    Some(g) => flat.extend(g.flatten_all()?.to_vec1::<f32>()?),
                    None => flat.extend(std::iter::repeat_n(0.0, e.len)),
                }
            }
            return Ok(PhaseResult {
                layer_update_norms: vec![0.0; self.params.layout().entries.len()],
                params: flat,
                steps: 1,
                partial: 0.0,
                samples: batch_size as u64,
                loss,
                first_loss: loss,
                elapsed_s: start.elapsed().as_secs_f64(),
                flops: flops_per_step,
            });
        }
        let p = pull.p.clamp(0.0, 0.99) as f64;
        let lr_scale = self.lr_scale / (1.0 - p);
        let mut rng = SeededRng::derive(seed, "pull");
        let anchors: Option<Vec<Tensor>> = if p > 0.0 {
            Some(
                self.params
                    .layout()
                    .entries
                    .iter()
                    .map(|e| {
                        Tensor::from_slice(&anchor[e.offset..e.offset + e.len], e.shape.as_slice(), &self.device.device)
                    })
                    .collect::<candle_core::Result<_>>()?,
            )
        } else {
            None
        };
        let (mut loss_sum, mut grad_steps, mut taken, mut first_loss) = (0.0f64, 0u32, 0u32, f32::NAN);
        let mut samples = 0u64;
        let mut tally = |loss: f32, rows: usize| {
            loss_sum += loss as f64;
            if grad_steps == 0 {
                first_loss = loss;
            }
            grad_steps += 1;
            samples += rows as u64;
        };
        let partial_rows = self.partial_rows;
        let mut partial = 0.0f32;
        while taken < steps {
            taken += 1;
            if let Some(anchors) = anchors.as_ref().filter(|_| rng.bernoulli(p)) {
                // Pull: theta += lambda (anchor - theta).
                for (var, a) in self.params.vars().iter().zip(anchors) {
                    let t = var.as_tensor();
                    var.set(&(t + ((a - t)? * pull.lambda as f64)?)?)?;
                }
            } else {
                let loss = self.gradient_step(batch_size, lr_scale)?;
                tally(loss, batch_size);
            }
            let next = if taken < steps { 1.0 } else { partial_rows as f32 / batch_size as f32 };
            if !go_on(taken, next) {
                break;
            }
            if taken == steps && partial_rows > 0 {
                // The rest of the tick: one step on part of a batch, at the
                // same rate (its gradient is the mean over fewer rows).
                let loss = self.gradient_step(partial_rows, lr_scale)?;
                tally(loss, partial_rows);
                partial = next;
                go_on(taken, 0.0);
            }
        }
        let params = self.params.export()?;
        let layer_update_norms = self
            .params
            .layout()
            .entries
            .iter()
            .map(|e| {
                let r = e.offset..e.offset + e.len;
                params[r.clone()].iter().zip(&anchor[r]).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt()
                    as f32
            })
            .collect();
        Ok(PhaseResult {
            params,
            steps: taken,
            partial,
            samples,
            loss: if grad_steps > 0 { (loss_sum / grad_steps as f64) as f32 } else { f32::NAN },
            first_loss,
            elapsed_s: start.elapsed().as_secs_f64(),
            layer_update_norms,
            flops: 3.0 * self.model.forward_flops_per_sample() * samples as f64,
        })
    }

    /// One inner AdamW step on the next `rows` of this node's data; returns
    /// its training loss.
    fn gradient_step(&mut self, rows: usize, lr_scale: f64) -> Result<f32> {
        let batch = self.sampler.next_batch(rows);
        let (loss, grads) = self.loss_and_grads(&batch)?;
        self.opt.step(self.params.vars(), &grads, lr_scale)?;
        Ok(loss)
    }

    /// `steps` inner AdamW steps on one fixed batch (benchmarks: the step
    /// without data generation). Returns the last loss.
    pub fn train_steps_on(&mut self, batch: &Batch, steps: u32) -> Result<f32> {
        let mut loss = f32::NAN;
        for _ in 0..steps {
            let (l, grads) = self.loss_and_grads(batch)?;
            self.opt.step(self.params.vars(), &grads, 1.0)?;
            loss = l;
        }
        Ok(loss)
    }

    /// A training batch from this node's stream (benchmarks).
    pub fn sample_batch(&mut self) -> Batch {
        self.sampler.next_batch(self.training.batch_size as usize)
    }

    /// Held-out loss and accuracy of `params` (or of the current parameters).
    pub fn evaluate(&mut self, params: Option<&[f32]>) -> Result<EvalResult> {
        if let Some(p) = params {
            self.params.import(p)?;
        }
        let eval = self.dataset.eval_set().clone();
        let n = eval.samples();
        let (mut loss_sum, mut correct, mut count) = (0.0f64, 0usize, 0usize);
        for start in (0..n).step_by(EVAL_CHUNK) {
            let part = eval.slice(start..(start + EVAL_CHUNK).min(n));
            let (x, y) = part.to_tensors(&self.device.device)?;
            let logits = self.model.forward(&x)?;
            let m = y.dims1()?;
            loss_sum += crate::model::cross_entropy(&logits, &y)?.to_scalar::<f32>()? as f64 * m as f64;
            let pred = logits.argmax(candle_core::D::Minus1)?;
            correct += pred.eq(&y)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? as usize;
            count += m;
        }
        Ok(EvalResult {
            loss: (loss_sum / count.max(1) as f64) as f32,
            accuracy: correct as f32 / count.max(1) as f32,
            samples: count,
        })
    }

    /// A fixed probe for [`Trainer::representation_similarity`]: the first
    /// samples of the held-out set (every node and run of one dataset draws
    /// the same), as many as make about `rows` representation rows (a
    /// sequence makes one per position).
    pub fn probe_batch(&self, rows: usize) -> Batch {
        let per_sample = match self.model.input_kind() {
            crate::model::InputKind::Tokens { context, .. } => context,
            _ => 1,
        };
        let eval = self.dataset.eval_set();
        eval.slice(0..(rows / per_sample).max(1).min(eval.samples()))
    }

    /// Per hidden layer, the linear CKA of models `a` and `b` on `probe`
    /// (`None` for a layer constant over the probe): whether two models,
    /// e.g. a straggler's at the end of its round and the anchor it started
    /// from, compute alike. Leaves the trainer's parameters at `b`.
    pub fn representation_similarity(
        &mut self,
        a: &[f32],
        b: &[f32],
        probe: &Batch,
    ) -> Result<Vec<(String, Option<f64>)>> {
        let (x, _) = probe.to_tensors(&self.device.device)?;
        let hidden = |params: &[f32]| -> Result<Vec<(String, Tensor)>> {
            self.params.import(params)?;
            Ok(self.model.forward_with_hidden(&x)?.1)
        };
        let (ha, hb) = (hidden(a)?, hidden(b)?);
        ha.into_iter()
            .zip(hb)
            .map(|((name, ta), (_, tb))| Ok((name, crate::representation::linear_cka(&ta, &tb)?)))
            .collect()
    }

    /// The optimiser (for checkpoints).
    pub(crate) fn optimizer(&self) -> &AdamW {
        &self.opt
    }

    /// The optimiser, mutable (for restoring checkpoints).
    pub(crate) fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.opt
    }

    /// Batches drawn from this node's stream (for checkpoints).
    pub(crate) fn batches_drawn(&self) -> u64 {
        self.sampler.drawn()
    }

    /// Moves the data stream to where a checkpoint left it.
    pub(crate) fn resume_stream(&mut self, drawn: u64) {
        self.sampler = self.dataset.sampler(self.node_seed, self.shard);
        self.sampler.skip(drawn, self.training.batch_size as usize);
    }

    /// The parameter store (for checkpoints).
    pub(crate) fn params(&self) -> &ParamStore {
        &self.params
    }
}
