//! Training tests on every dataset: held-out loss falls, digits reach 90%,
//! the char transformer beats the unigram entropy of real text, runs are
//! deterministic, checkpoints resume exactly.

use std::path::{Path, PathBuf};

use ragtag_models::{Trainer, TrainerConfig, data::Shard, device::DeviceChoice};
use ragtag_protocol::{
    engine::{LocalMode, PullConfig},
    ids::Hash32,
    manifest::{DataSpec, ModelSpec, TrainingSpec},
};

const NO_PULL: PullConfig = PullConfig { p: 0.0, lambda: 0.0 };

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

fn file_hash(path: &Path) -> Hash32 {
    Hash32::of(&std::fs::read(path).unwrap())
}

fn config(model: ModelSpec, data: DataSpec, path: Option<PathBuf>, training: TrainingSpec) -> TrainerConfig {
    TrainerConfig {
        model,
        data,
        training,
        seed: 42,
        node_seed: 1,
        shard: Shard::ALL,
        data_path: path,
        device: DeviceChoice::Cpu,
        micro_batch: None,
    }
}

/// Trains `steps` inner steps in phases of 25 and returns (loss before, after).
fn train(t: &mut Trainer, steps: u32) -> (f32, f32) {
    let before = t.evaluate(None).unwrap().loss;
    let mut params = t.export_params().unwrap();
    for phase in 0..steps.div_ceil(25) {
        params = t.run_phase(&params, 25, LocalMode::Train, NO_PULL, phase as u64).unwrap().params;
    }
    let after = t.evaluate(Some(&params)).unwrap().loss;
    (before, after)
}

fn teacher() -> TrainerConfig {
    config(
        ModelSpec::Mlp { inputs: 16, hidden: vec![64], classes: 8 },
        DataSpec::Teacher { inputs: 16, classes: 8, hidden: 32, temperature: 0.5, test_samples: 1024 },
        None,
        TrainingSpec { batch_size: 64, lr: 3e-3, ..TrainingSpec::default() },
    )
}

#[test]
fn teacher_task_loss_falls_toward_the_floor() {
    let mut t = Trainer::new(teacher()).unwrap();
    let floor = t.dataset().floor.unwrap();
    let (before, after) = train(&mut t, 300);
    eprintln!("teacher: held-out loss {before:.4} -> {after:.4} (floor {floor:.4})");
    assert!(after < before - 0.3, "{before} -> {after}");
    assert!(after > floor - 0.1, "cannot beat the teacher: {after} vs floor {floor}");
}

/// Backprop reaches every parameter tensor of every model: the gradient at
/// the initial parameters is non-zero in each. (candle-nn's fused layer
/// norm and last-dim softmax have no backward: with them only the
/// transformer's head got a gradient.)
#[test]
fn every_parameter_tensor_of_every_model_gets_a_gradient() {
    let markov = DataSpec::Markov { vocab: 16, branching: 3, test_chars: 1024 };
    let digits = testdata("digits.csv");
    let digits_data = DataSpec::DigitsCsv { name: "digits".into(), hash: file_hash(&digits) };
    let training = TrainingSpec { batch_size: 8, ..TrainingSpec::default() };
    let configs = [
        teacher(),
        config(
            ModelSpec::Cnn { side: 8, channels: [4, 8], hidden: 16, classes: 10 },
            digits_data,
            Some(digits),
            training,
        ),
        config(
            ModelSpec::CharTransformer { vocab: 16, context: 16, width: 32, layers: 2, heads: 4 },
            markov,
            None,
            training,
        ),
    ];
    for cfg in configs {
        let model = cfg.model.clone();
        let mut t = Trainer::new(cfg).unwrap();
        let params = t.export_params().unwrap();
        let grad = t.run_phase(&params, 1, LocalMode::Gradient, NO_PULL, 0).unwrap().params;
        for e in &t.layout().entries {
            let norm: f32 = grad[e.offset..e.offset + e.len].iter().map(|g| g * g).sum::<f32>().sqrt();
            assert!(norm > 0.0, "{model}: no gradient reaches {}", e.name);
        }
    }
}

#[test]
fn markov_text_loss_falls_toward_the_entropy_rate() {
    let cfg = config(
        ModelSpec::CharTransformer { vocab: 16, context: 16, width: 32, layers: 1, heads: 2 },
        DataSpec::Markov { vocab: 16, branching: 3, test_chars: 8192 },
        None,
        TrainingSpec { batch_size: 16, lr: 1e-2, ..TrainingSpec::default() },
    );
    let mut t = Trainer::new(cfg).unwrap();
    let floor = t.dataset().floor.unwrap();
    let (before, after) = train(&mut t, 800);
    eprintln!("markov: held-out loss {before:.4} -> {after:.4} (floor {floor:.4})");
    assert!(after < before - 0.5, "{before} -> {after}");
    assert!(after < floor + 0.3, "{after} vs floor {floor}");
}

#[test]
fn char_transformer_on_shakespeare_beats_the_unigram_entropy() {
    let path = testdata("shakespeare-excerpt.txt");
    let vocab = std::fs::read_to_string(&path).unwrap().chars().collect::<std::collections::BTreeSet<_>>().len();
    let cfg = config(
        ModelSpec::CharTransformer { vocab: vocab as u32, context: 32, width: 64, layers: 2, heads: 4 },
        DataSpec::TextFile { name: "shakespeare".into(), hash: file_hash(&path) },
        Some(path),
        TrainingSpec { batch_size: 16, lr: 1e-2, eval_samples: 256, ..TrainingSpec::default() },
    );
    let mut t = Trainer::new(cfg).unwrap();
    let unigram = t.dataset().unigram_entropy.unwrap();
    let (before, after) = train(&mut t, 600);
    eprintln!("shakespeare: held-out loss {before:.4} -> {after:.4} nats (unigram entropy {unigram:.4})");
    assert!(after < unigram - 0.3, "{after} vs unigram {unigram}");
}

fn digits(model: ModelSpec) -> TrainerConfig {
    let path = testdata("digits.csv");
    config(
        model,
        DataSpec::DigitsCsv { name: "digits".into(), hash: file_hash(&path) },
        Some(path),
        TrainingSpec { batch_size: 32, lr: 3e-3, ..TrainingSpec::default() },
    )
}

#[test]
fn mlp_reaches_90_percent_on_digits() {
    let mut t = Trainer::new(digits(ModelSpec::Mlp { inputs: 64, hidden: vec![64], classes: 10 })).unwrap();
    let (before, after) = train(&mut t, 400);
    let acc = t.evaluate(None).unwrap().accuracy;
    eprintln!("digits mlp: held-out loss {before:.4} -> {after:.4}, accuracy {acc:.3}");
    assert!(acc >= 0.9, "accuracy {acc}");
}

#[test]
fn cnn_learns_digits() {
    let mut t = Trainer::new(digits(ModelSpec::Cnn { side: 8, channels: [8, 16], hidden: 32, classes: 10 })).unwrap();
    let (before, after) = train(&mut t, 300);
    let acc = t.evaluate(None).unwrap().accuracy;
    eprintln!("digits cnn: held-out loss {before:.4} -> {after:.4}, accuracy {acc:.3}");
    assert!(after < before - 1.0 && acc >= 0.85, "{before} -> {after}, accuracy {acc}");
}

/// Writes an IDX pair: 8x8 images with one bright 4x4 quadrant (the class).
fn write_idx(dir: &Path, n: u32) -> PathBuf {
    let mut images = 0x0803u32.to_be_bytes().to_vec();
    for d in [n, 8, 8] {
        images.extend(d.to_be_bytes());
    }
    let mut labels = 0x0801u32.to_be_bytes().to_vec();
    labels.extend(n.to_be_bytes());
    for i in 0..n {
        let class = i % 4;
        for r in 0..8u32 {
            for c in 0..8u32 {
                let q = (r / 4) * 2 + c / 4;
                let noise = (i * 31 + r * 7 + c * 13) % 60;
                images.push(if q == class { 180 + noise as u8 } else { noise as u8 });
            }
        }
        labels.push(class as u8);
    }
    let (ip, lp) = (dir.join("images.idx"), dir.join("labels.idx"));
    std::fs::write(&ip, &images).unwrap();
    std::fs::write(&lp, &labels).unwrap();
    PathBuf::from(format!("{},{}", ip.display(), lp.display()))
}

#[test]
fn cnn_learns_idx_images() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write_idx(dir.path(), 400);
    let images_hash = file_hash(&dir.path().join("images.idx"));
    let labels_hash = file_hash(&dir.path().join("labels.idx"));
    let cfg = config(
        ModelSpec::Cnn { side: 8, channels: [4, 8], hidden: 16, classes: 4 },
        DataSpec::Idx { name: "quadrants".into(), images_hash, labels_hash },
        Some(spec),
        TrainingSpec { batch_size: 32, lr: 5e-3, ..TrainingSpec::default() },
    );
    let mut t = Trainer::new(cfg).unwrap();
    let (before, after) = train(&mut t, 150);
    eprintln!("idx cnn: held-out loss {before:.4} -> {after:.4}");
    assert!(after < before * 0.5, "{before} -> {after}");
}

#[test]
fn wrong_file_is_refused_with_a_clear_error() {
    let mut cfg = digits(ModelSpec::Mlp { inputs: 64, hidden: vec![8], classes: 10 });
    cfg.data = DataSpec::DigitsCsv { name: "digits".into(), hash: Hash32([0; 32]) };
    let e = Trainer::new(cfg.clone()).unwrap_err().to_string();
    assert!(e.contains("does not match"), "{e}");
    cfg.data_path = Some(PathBuf::from("/nonexistent/digits.csv"));
    let e = Trainer::new(cfg.clone()).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/digits.csv"), "{e}");
    cfg.data_path = None;
    assert!(Trainer::new(cfg).unwrap_err().to_string().contains("--data"));
}

fn train_params(cfg: TrainerConfig, phases: u32) -> Vec<f32> {
    let mut t = Trainer::new(cfg).unwrap();
    let mut params = t.export_params().unwrap();
    for phase in 0..phases {
        params = t.run_phase(&params, 10, LocalMode::Train, NO_PULL, phase as u64).unwrap().params;
    }
    params
}

#[test]
fn same_seed_gives_identical_parameters() {
    let a = train_params(teacher(), 3);
    let b = train_params(teacher(), 3);
    assert_eq!(a, b);
    let mut other = teacher();
    other.seed = 43;
    assert_ne!(a, train_params(other, 3));
}

#[test]
fn checkpoint_resume_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("trainer.safetensors");
    let mut a = Trainer::new(teacher()).unwrap();
    let mut p = a.export_params().unwrap();
    p = a.run_phase(&p, 15, LocalMode::Train, NO_PULL, 0).unwrap().params;
    a.save_checkpoint(&ck).unwrap();
    let uninterrupted = a.run_phase(&p, 15, LocalMode::Train, NO_PULL, 1).unwrap().params;

    let mut b = Trainer::new(teacher()).unwrap();
    b.load_checkpoint(&ck).unwrap();
    assert_eq!(b.export_params().unwrap(), p);
    let resumed = b.run_phase(&p, 15, LocalMode::Train, NO_PULL, 1).unwrap().params;
    assert_eq!(resumed, uninterrupted);

    // Other safetensors readers see named f32 tensors.
    let bytes = std::fs::read(&ck).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.names().contains(&"param/l0.weight"));
    assert!(Trainer::new(teacher()).unwrap().load_checkpoint(&dir.path().join("missing")).is_err());
}

#[test]
fn pull_steps_and_gradient_mode() {
    let mut t = Trainer::new(teacher()).unwrap();
    let anchor = t.export_params().unwrap();
    let full_pull = PullConfig { p: 0.5, lambda: 1.0 };
    let r = t.run_phase(&anchor, 20, LocalMode::Train, full_pull, 3).unwrap();
    assert_eq!(r.steps, 20);
    assert!(r.samples < 20 * 64 && r.samples > 0, "some steps were pulls: {}", r.samples);
    let mut paced = Vec::new();
    let g = t
        .run_phase_with(&anchor, 1, LocalMode::Gradient, NO_PULL, 0, |step, _| {
            paced.push(step);
            true
        })
        .unwrap();
    assert_eq!(paced, [1], "the gradient step is paced like any inner step");
    assert_eq!(g.params.len(), anchor.len());
    assert!(g.params.iter().any(|v| *v != 0.0));
    assert_eq!(g.layer_update_norms.len(), t.layout().entries.len());
}

#[test]
fn gradient_accumulation_matches_the_full_batch() {
    let mut whole = teacher();
    whole.micro_batch = Some(64);
    let mut parts = teacher();
    parts.micro_batch = Some(16);
    let a = train_params(whole, 2);
    let b = train_params(parts, 2);
    let max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(max_diff < 1e-4, "max difference {max_diff}");
}

/// Child mode of the thread-count test: trains and prints a hash of the parameters.
#[test]
fn thread_count_child() {
    if std::env::var("RAGTAG_THREAD_CHILD").is_err() {
        return;
    }
    let p = train_params(teacher(), 2);
    let bytes: Vec<u8> = p.iter().flat_map(|v| v.to_le_bytes()).collect();
    println!("PARAMS_HASH={}", Hash32::of(&bytes));
}

#[test]
fn same_seed_is_bit_identical_on_any_thread_count() {
    let run = |threads: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "thread_count_child", "--nocapture"])
            .env("RAGTAG_THREAD_CHILD", "1")
            .env("RAYON_NUM_THREADS", threads)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .find_map(|l| l.strip_prefix("PARAMS_HASH=").map(str::to_string))
            .unwrap_or_else(|| panic!("{text}"))
    };
    assert_eq!(run("1"), run("2"));
    assert_eq!(run("1"), run("3"));
}

/// Linear CKA of hidden representations, layer by layer, for every model:
/// a model is alike to itself, a few small training steps move it a little,
/// and an independently initialised model is further away than that. (At
/// the usual rates ten AdamW steps move the transformer's embeddings, drawn
/// at std 0.02, by more than their size: CKA then falls below that of
/// another initialisation.)
#[test]
fn every_model_compares_its_hidden_representations_layer_by_layer() {
    let markov = DataSpec::Markov { vocab: 16, branching: 3, test_chars: 1024 };
    let training = TrainingSpec { batch_size: 16, lr: 3e-3, ..TrainingSpec::default() };
    let cnn = ModelSpec::Cnn { side: 8, channels: [4, 8], hidden: 16, classes: 10 };
    let transformer = ModelSpec::CharTransformer { vocab: 16, context: 16, width: 32, layers: 2, heads: 4 };
    let cases = [
        (teacher(), vec!["l0"]),
        (digits(cnn), vec!["conv1", "conv2", "fc1"]),
        (config(transformer, markov, None, training), vec!["h0", "h1"]),
    ];
    for (mut cfg, layers) in cases {
        cfg.training.lr = 1e-4;
        let model = cfg.model.clone();
        let other = Trainer::new(TrainerConfig { seed: 43, ..cfg.clone() }).unwrap().export_params().unwrap();
        let mut t = Trainer::new(cfg).unwrap();
        let probe = t.probe_batch(256);
        let start = t.export_params().unwrap();
        let trained = t.run_phase(&start, 10, LocalMode::Train, NO_PULL, 0).unwrap().params;
        let same = t.representation_similarity(&start, &start, &probe).unwrap();
        let moved = t.representation_similarity(&trained, &start, &probe).unwrap();
        let unrelated = t.representation_similarity(&other, &start, &probe).unwrap();
        let names: Vec<&str> = same.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, layers, "{model}");
        for (((name, s), (_, m)), (_, u)) in same.iter().zip(&moved).zip(&unrelated) {
            let (s, m, u) = (s.unwrap(), m.unwrap(), u.unwrap());
            eprintln!("{model} {name}: itself {s:.6}, after 10 steps {m:.4}, another initialisation {u:.4}");
            assert!((s - 1.0).abs() < 1e-6, "{model} {name}: {s}");
            assert!(m < 1.0 && u < m, "{model} {name}: trained {m}, unrelated {u}");
        }
    }
}

#[test]
fn a_partial_step_ends_the_phase_on_part_of_a_batch() {
    let mut t = Trainer::new(teacher()).unwrap();
    let batch = u64::from(teacher().training.batch_size);
    let anchor = t.export_params().unwrap();
    t.set_partial_step(0.5);
    let mut seen = Vec::new();
    let r = t
        .run_phase_with(&anchor, 3, LocalMode::Train, NO_PULL, 0, |step, next| {
            seen.push((step, next));
            true
        })
        .unwrap();
    assert_eq!((r.steps, r.partial, r.samples), (3, 0.5, 3 * batch + batch / 2));
    // The caller learns the size of each next step (a deadline check), and
    // paces the partial one too.
    assert_eq!(seen, [(1, 1.0), (2, 1.0), (3, 0.5), (3, 0.0)]);
    // Same seed, same first three batches: the partial step is what differs.
    let whole = Trainer::new(teacher()).unwrap().run_phase(&anchor, 3, LocalMode::Train, NO_PULL, 0).unwrap();
    assert_eq!(whole.samples, 3 * batch);
    assert_ne!(whole.params, r.params);
    // A caller whose deadline leaves no room for it skips it.
    let cut = t.run_phase_with(&anchor, 3, LocalMode::Train, NO_PULL, 0, |_, next| next >= 1.0).unwrap();
    assert_eq!((cut.steps, cut.partial, cut.samples), (3, 0.0, 3 * batch));
    t.set_partial_step(0.0);
    assert_eq!(t.run_phase(&anchor, 3, LocalMode::Train, NO_PULL, 0).unwrap().samples, 3 * batch);
    // Batches of one row have no part to take.
    let mut one = teacher();
    one.training.batch_size = 1;
    let mut t = Trainer::new(one).unwrap();
    t.set_partial_step(0.9);
    let r = t.run_phase(&anchor, 3, LocalMode::Train, NO_PULL, 0).unwrap();
    assert_eq!((r.steps, r.partial, r.samples), (3, 0.0, 3));
}
