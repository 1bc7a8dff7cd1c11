//! Datasets: synthetic tasks with a known optimum, text files, digits CSV
//! and IDX images; a fixed held-out split (the same on every node) and a
//! per-node training stream.

mod digits;
mod idx;
mod markov;
mod teacher;
mod text;

use std::{path::Path, sync::Arc};

use candle_core::{Device, Tensor};
pub use markov::MarkovChain;
use ragtag_protocol::{
    manifest::{DataSpec, ModelSpec},
    rng::SeededRng,
};
pub use teacher::Teacher;

use crate::{Error, Result, model::InputKind};

/// Model inputs of a batch, on the host.
#[derive(Clone, Debug, PartialEq)]
pub enum Inputs {
    /// `[n, width]` features.
    Features {
        /// Row-major values.
        data: Vec<f32>,
        /// Features per sample.
        width: usize,
    },
    /// `[n, 1, side, side]` images.
    Images {
        /// Row-major pixels.
        data: Vec<f32>,
        /// Image side.
        side: usize,
    },
    /// `[n, len]` token ids.
    Tokens {
        /// Row-major ids.
        data: Vec<u32>,
        /// Tokens per sequence.
        len: usize,
    },
}

/// A batch: inputs, and one target per output position.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The inputs.
    pub inputs: Inputs,
    /// Target class per sample (per position for sequences).
    pub targets: Vec<u32>,
}

impl Batch {
    /// Samples in the batch (sequences for tokens).
    pub fn samples(&self) -> usize {
        match &self.inputs {
            Inputs::Features { data, width } => data.len() / width,
            Inputs::Images { data, side } => data.len() / (side * side),
            Inputs::Tokens { data, len } => data.len() / len,
        }
    }

    /// The inputs and targets as tensors on `device`.
    pub fn to_tensors(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        let n = self.samples();
        let x = match &self.inputs {
            Inputs::Features { data, width } => Tensor::from_slice(data, (n, *width), device)?,
            Inputs::Images { data, side } => Tensor::from_slice(data, (n, 1, *side, *side), device)?,
            Inputs::Tokens { data, len } => Tensor::from_slice(data, (n, *len), device)?,
        };
        let y = Tensor::from_slice(&self.targets, self.targets.len(), device)?;
        Ok((x, y))
    }

    /// Samples `range` of this batch.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Batch {
        let per_target = self.targets.len() / self.samples().max(1);
        let targets = self.targets[range.start * per_target..range.end * per_target].to_vec();
        let inputs = match &self.inputs {
            Inputs::Features { data, width } => {
                Inputs::Features { data: data[range.start * width..range.end * width].to_vec(), width: *width }
            }
            Inputs::Images { data, side } => {
                let s = side * side;
                Inputs::Images { data: data[range.start * s..range.end * s].to_vec(), side: *side }
            }
            Inputs::Tokens { data, len } => {
                Inputs::Tokens { data: data[range.start * len..range.end * len].to_vec(), len: *len }
            }
        };
        Batch { inputs, targets }
    }
}

/// Which part of the training data a node draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This node's shard.
    pub index: u64,
    /// Shards in all (1 = everyone draws from all of it, in their own order).
    pub count: u64,
}

impl Shard {
    /// The whole training set.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// The shard of a node, from its id bytes, among `count` shards.
    pub fn of_node(node_id: &[u8], count: u64) -> Shard {
        let h = blake3::hash(node_id);
        let v = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
        Shard { index: v % count.max(1), count: count.max(1) }
    }
}

/// Labelled examples held in memory (digits, IDX).
#[derive(Debug)]
pub(crate) struct Examples {
    pub(crate) features: Vec<f32>,
    pub(crate) labels: Vec<u32>,
    pub(crate) width: usize,
}

impl Examples {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn gather(&self, idx: &[usize], kind: InputKind) -> Batch {
        let mut data = Vec::with_capacity(idx.len() * self.width);
        let mut targets = Vec::with_capacity(idx.len());
        for &i in idx {
            data.extend_from_slice(&self.features[i * self.width..(i + 1) * self.width]);
            targets.push(self.labels[i]);
        }
        let inputs = match kind {
            InputKind::Image(side) => Inputs::Images { data, side },
            _ => Inputs::Features { data, width: self.width },
        };
        Batch { inputs, targets }
    }
}

/// Where training samples come from.
#[derive(Debug, Clone)]
enum TrainData {
    Teacher(Arc<Teacher>),
    Markov(Arc<MarkovChain>),
    Text(Arc<Vec<u32>>),
    Examples(Arc<Examples>),
}

/// A dataset of a run: the training data, the held-out set, and the
/// reference losses that put results in context.
#[derive(Debug)]
pub struct Dataset {
    train: TrainData,
    eval: Batch,
    input: InputKind,
    classes: usize,
    /// The best achievable held-out loss (teacher's own loss, Markov entropy rate), when known.
    pub floor: Option<f32>,
    /// Entropy of the character frequencies (text), in nats.
    pub unigram_entropy: Option<f32>,
    /// A description for logs and reports.
    pub description: String,
}

/// Samples from the eval stream of synthetic sources.
const EVAL_SEED_LABEL: &str = "eval";

impl Dataset {
    /// Opens the data of a run. `file` is required for file-backed data
    /// (`images` then `labels` for IDX, separated by a comma); `eval_samples`
    /// bounds the held-out set.
    pub fn open(
        spec: &DataSpec,
        model: &ModelSpec,
        seed: u64,
        file: Option<&Path>,
        eval_samples: usize,
    ) -> Result<Self> {
        let input = input_kind(model);
        let classes = match model {
            ModelSpec::Mlp { classes, .. } | ModelSpec::Cnn { classes, .. } => *classes as usize,
            ModelSpec::CharTransformer { vocab, .. } => *vocab as usize,
        };
        let need_file =
            || file.ok_or_else(|| Error::Mismatch("this run's data is a file: pass its path (--data PATH)".into()));
        let ds = match spec {
            DataSpec::Teacher { inputs, classes: c, hidden, temperature, test_samples } => {
                check(matches!(input, InputKind::Features(w) if w == *inputs as usize), "teacher inputs vs model")?;
                check(*c as usize == classes, "teacher classes vs model")?;
                let t = Arc::new(Teacher::new(*inputs as usize, *hidden as usize, *c as usize, *temperature, seed));
                let mut rng = SeededRng::derive(seed, EVAL_SEED_LABEL);
                let n = (*test_samples as usize).min(eval_samples.max(1));
                let eval = t.batch(n, &mut rng);
                let floor = t.bayes_loss(&eval);
                Dataset {
                    description: format!("teacher task ({inputs} inputs, {c} classes, floor {floor:.4} nats)"),
                    train: TrainData::Teacher(t),
                    eval,
                    input,
                    classes,
                    floor: Some(floor),
                    unigram_entropy: None,
                }
            }
            DataSpec::Markov { vocab, branching, test_chars } => {
                let InputKind::Tokens { context, vocab: mv } = input else {
                    return Err(Error::Shape("Markov text needs the char transformer".into()));
                };
                check(mv == *vocab as usize, "markov vocabulary vs model")?;
                let chain = Arc::new(MarkovChain::new(*vocab as usize, *branching as usize, seed));
                let mut rng = SeededRng::derive(seed, EVAL_SEED_LABEL);
                let sequences = ((*test_chars as usize) / (context + 1)).clamp(1, eval_samples.max(1));
                let eval = chain.batch(sequences, context, &mut rng);
                // Every position sees its current character, so the best
                // loss is the entropy rate at every position.
                let floor = chain.entropy_rate() as f32;
                let unigram = chain.stationary_entropy() as f32;
                Dataset {
                    description: format!(
                        "markov text (vocab {vocab}, entropy rate {:.4} nats/char)",
                        chain.entropy_rate()
                    ),
                    train: TrainData::Markov(chain),
                    eval,
                    input,
                    classes,
                    floor: Some(floor),
                    unigram_entropy: Some(unigram),
                }
            }
            DataSpec::TextFile { hash, .. } => {
                let InputKind::Tokens { context, vocab } = input else {
                    return Err(Error::Shape("text needs the char transformer".into()));
                };
                let path = need_file()?;
                let corpus = text::Corpus::load(path)?;
                if corpus.hash != *hash {
                    return Err(Error::Mismatch(format!(
                        "{} hashes to {}, the run expects {}",
                        path.display(),
                        corpus.hash,
                        hash
                    )));
                }
                check(corpus.vocab.len() == vocab, "text vocabulary vs model")?;
                let (train, eval) = corpus.split(context, eval_samples);
                Dataset {
                    description: format!("{} ({} chars, vocab {})", path.display(), corpus.tokens.len(), vocab),
                    unigram_entropy: Some(corpus.unigram_entropy()),
                    train: TrainData::Text(Arc::new(train)),
                    eval,
                    input,
                    classes,
                    floor: None,
                }
            }
            DataSpec::DigitsCsv { hash, .. } => {
                let path = need_file()?;
                let (examples, file_hash) = digits::load(path)?;
                if file_hash != *hash {
                    return Err(Error::Mismatch(format!("{} does not match the run's digits file", path.display())));
                }
                Self::from_examples(examples, input, classes, eval_samples, path)?
            }
            DataSpec::Idx { images_hash, labels_hash, .. } => {
                let path = need_file()?;
                let (examples, ih, lh) = idx::load_pair(path)?;
                if ih != *images_hash || lh != *labels_hash {
                    return Err(Error::Mismatch(format!("{} does not match the run's IDX files", path.display())));
                }
                Self::from_examples(examples, input, classes, eval_samples, path)?
            }
        };
        Ok(ds)
    }

    fn from_examples(ex: Examples, input: InputKind, classes: usize, eval_samples: usize, path: &Path) -> Result<Self> {
        match input {
            InputKind::Features(w) if w == ex.width => {}
            InputKind::Image(side) if side * side == ex.width => {}
            other => {
                return Err(Error::Shape(format!(
                    "{} has {} features; model wants {other:?}",
                    path.display(),
                    ex.width
                )));
            }
        }
        if let Some(bad) = ex.labels.iter().find(|l| **l as usize >= classes) {
            return Err(Error::Shape(format!("label {bad} but the model has {classes} classes")));
        }
        // Every fifth example is held out (fixed, the same on every node).
        let held: Vec<usize> = (0..ex.len()).filter(|i| i % 5 == 0).take(eval_samples.max(1)).collect();
        let eval = ex.gather(&held, input);
        let n = ex.len();
        Ok(Dataset {
            description: format!("{} ({n} examples, {} held out)", path.display(), held.len()),
            train: TrainData::Examples(Arc::new(ex)),
            eval,
            input,
            classes,
            floor: None,
            unigram_entropy: None,
        })
    }

    /// The held-out set.
    pub fn eval_set(&self) -> &Batch {
        &self.eval
    }

    /// Output classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// A training stream for one node: its own seed and shard.
    pub fn sampler(&self, node_seed: u64, shard: Shard) -> Sampler {
        Sampler {
            train: self.train.clone(),
            input: self.input,
            rng: SeededRng::derive(node_seed, "train"),
            shard,
            order: Vec::new(),
            pos: 0,
            drawn: 0,
        }
    }
}

fn check(ok: bool, what: &str) -> Result<()> {
    if ok { Ok(()) } else { Err(Error::Shape(format!("{what} disagree"))) }
}

fn input_kind(model: &ModelSpec) -> InputKind {
    match model {
        ModelSpec::Mlp { inputs, .. } => InputKind::Features(*inputs as usize),
        ModelSpec::Cnn { side, .. } => InputKind::Image(*side as usize),
        ModelSpec::CharTransformer { context, vocab, .. } => {
            InputKind::Tokens { context: *context as usize, vocab: *vocab as usize }
        }
    }
}

/// One node's stream of training batches.
#[derive(Debug)]
pub struct Sampler {
    train: TrainData,
    input: InputKind,
    rng: SeededRng,
    shard: Shard,
    order: Vec<usize>,
    pos: usize,
    drawn: u64,
}

impl Sampler {
    /// Batches drawn so far (saved in checkpoints).
    pub fn drawn(&self) -> u64 {
        self.drawn
    }

    /// Draws and discards `count` batches of `n`: resumes a stream at the
    /// position a checkpoint recorded.
    pub fn skip(&mut self, count: u64, n: usize) {
        for _ in 0..count {
            self.next_batch(n);
        }
    }

    /// The next batch of `n` samples.
    pub fn next_batch(&mut self, n: usize) -> Batch {
        self.drawn += 1;
        match self.train.clone() {
            TrainData::Teacher(t) => t.batch(n, &mut self.rng),
            TrainData::Markov(c) => {
                let InputKind::Tokens { context, .. } = self.input else { unreachable!("checked at open") };
                c.batch(n, context, &mut self.rng)
            }
            TrainData::Text(tokens) => {
                let InputKind::Tokens { context, .. } = self.input else { unreachable!("checked at open") };
                text::random_windows(&tokens, n, context, self.shard, &mut self.rng)
            }
            TrainData::Examples(ex) => {
                let idx: Vec<usize> = (0..n).map(|_| self.next_example(&ex)).collect();
                ex.gather(&idx, self.input)
            }
        }
    }

    /// Epoch-shuffled order over this shard's training examples.
    fn next_example(&mut self, ex: &Examples) -> usize {
        if self.pos >= self.order.len() {
            self.order = (0..ex.len())
                .filter(|i| i % 5 != 0)
                .filter(|i| (*i as u64 / 5) % self.shard.count == self.shard.index)
                .collect();
            if self.order.is_empty() {
                self.order = (0..ex.len()).filter(|i| i % 5 != 0).collect();
            }
            self.rng.shuffle(&mut self.order);
            self.pos = 0;
        }
        self.pos += 1;
        self.order[self.pos - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn teacher_spec() -> (DataSpec, ModelSpec) {
        (
            DataSpec::Teacher { inputs: 8, classes: 4, hidden: 16, temperature: 0.5, test_samples: 256 },
            ModelSpec::Mlp { inputs: 8, hidden: vec![16], classes: 4 },
        )
    }

    #[test]
    fn eval_set_is_the_same_for_every_node_and_streams_differ() {
        let (d, m) = teacher_spec();
        let a = Dataset::open(&d, &m, 5, None, 1000).unwrap();
        let b = Dataset::open(&d, &m, 5, None, 1000).unwrap();
        assert_eq!(a.eval_set(), b.eval_set());
        let mut s1 = a.sampler(1, Shard::ALL);
        let mut s2 = a.sampler(2, Shard::ALL);
        assert_ne!(s1.next_batch(4), s2.next_batch(4));
        let mut s1b = b.sampler(1, Shard::ALL);
        let mut s1 = a.sampler(1, Shard::ALL);
        assert_eq!(s1.next_batch(4), s1b.next_batch(4));
    }

    #[test]
    fn mismatched_model_is_refused() {
        let (d, _) = teacher_spec();
        let wrong = ModelSpec::Mlp { inputs: 9, hidden: vec![16], classes: 4 };
        assert!(matches!(Dataset::open(&d, &wrong, 1, None, 10), Err(Error::Shape(_))));
    }

    #[test]
    fn shards_come_from_node_ids() {
        let s = Shard::of_node(b"node-a", 8);
        assert!(s.index < 8);
        assert_eq!(s, Shard::of_node(b"node-a", 8));
    }

    #[test]
    fn batch_slices_keep_targets_aligned() {
        let b = Batch { inputs: Inputs::Tokens { data: (0..12).collect(), len: 3 }, targets: (100..112).collect() };
        let s = b.slice(1..3);
        assert_eq!(s.samples(), 2);
        assert_eq!(s.inputs, Inputs::Tokens { data: (3..9).collect(), len: 3 });
        assert_eq!(s.targets, (103..109).collect::<Vec<u32>>());
    }
}
