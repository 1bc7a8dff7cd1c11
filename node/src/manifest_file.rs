//! Run manifests on disk (TOML) and `ragtag swarm new`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use ragtag_protocol::{
    engine::{EngineOverrides, Strategy},
    ids::Hash32,
    manifest::{DataSpec, Manifest, ModelSpec, TrainingSpec},
};

mod engine_rationale;

/// Manifest file errors.
#[derive(Debug, thiserror::Error)]
pub enum ManifestFileError {
    /// The file cannot be read or written.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The TOML is invalid.
    #[error("{0}: {1}")]
    Parse(PathBuf, String),
    /// The manifest is invalid.
    #[error("{0}: {1}")]
    Invalid(PathBuf, String),
    /// A `--data` or `--model` choice is not understood.
    #[error("{0}")]
    Choice(String),
}

/// Reads and validates a manifest.
pub fn read(path: &Path) -> Result<Manifest, ManifestFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| ManifestFileError::Io(path.into(), e))?;
    let m: Manifest = toml::from_str(&text).map_err(|e| ManifestFileError::Parse(path.into(), e.to_string()))?;
    m.validate().map_err(|e| ManifestFileError::Invalid(path.into(), e.to_string()))?;
    Ok(m)
}

/// Writes a manifest as TOML, with its run id in a comment.
pub fn write(m: &Manifest, path: &Path) -> Result<(), ManifestFileError> {
    let body = toml::to_string_pretty(m).map_err(|e| ManifestFileError::Parse(path.into(), e.to_string()))?;
    let text = format!("# ragtag run manifest; run id {}\n{body}", m.run_id());
    std::fs::write(path, text).map_err(|e| ManifestFileError::Io(path.into(), e))
}

/// What `ragtag swarm new` was asked for.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Human name.
    pub name: String,
    /// A private swarm.
    pub private: bool,
    /// `teacher`, `markov`, `text:PATH`, `digits:PATH`, `idx:IMAGES,LABELS`.
    pub data: String,
    /// `mlp`, `cnn`, `transformer`, or empty for the data's default.
    pub model: Option<String>,
    /// The MLP's hidden widths (default 64, 64).
    pub hidden: Option<Vec<u32>>,
    /// The transformer's context, width, layers and heads.
    pub transformer: Option<[u32; 4]>,
    /// The strategy.
    pub strategy: Strategy,
    /// Engine changes.
    pub overrides: EngineOverrides,
    /// Seed of the initial weights.
    pub seed: u64,
    /// Start of the run's clock (Unix ms).
    pub start_ms: u64,
}

fn file_hash(path: &str) -> Result<(Hash32, Vec<u8>), ManifestFileError> {
    let bytes = std::fs::read(path).map_err(|e| ManifestFileError::Io(path.into(), e))?;
    Ok((Hash32::of(&bytes), bytes))
}

/// Builds the manifest of a new run. File-backed data is hashed, so every
/// node must hold the same bytes.
pub fn new_run(r: &NewRun) -> Result<Manifest, ManifestFileError> {
    let name_of = |p: &str| Path::new(p).file_name().map_or_else(|| p.to_string(), |n| n.to_string_lossy().to_string());
    let (data, default_model) = match r.data.split_once(':').unwrap_or((r.data.as_str(), "")) {
        ("teacher", _) => (
            DataSpec::Teacher { inputs: 32, classes: 10, hidden: 16, temperature: 0.5, test_samples: 2048 },
            ModelSpec::Mlp { inputs: 32, hidden: vec![64, 64], classes: 10 },
        ),
        ("markov", _) => (
            DataSpec::Markov { vocab: 32, branching: 4, test_chars: 32_768 },
            ModelSpec::CharTransformer { vocab: 32, context: 64, width: 128, layers: 2, heads: 4 },
        ),
        ("text", path) => {
            let (hash, bytes) = file_hash(path)?;
            let text = std::str::from_utf8(&bytes)
                .map_err(|e| ManifestFileError::Choice(format!("{path}: not UTF-8: {e}")))?;
            let vocab = text.chars().collect::<std::collections::BTreeSet<_>>().len() as u32;
            (
                DataSpec::TextFile { name: name_of(path), hash },
                ModelSpec::CharTransformer { vocab, context: 128, width: 256, layers: 4, heads: 4 },
            )
        }
        ("digits", path) => (
            DataSpec::DigitsCsv { name: name_of(path), hash: file_hash(path)?.0 },
            ModelSpec::Cnn { side: 8, channels: [16, 32], hidden: 64, classes: 10 },
        ),
        ("idx", paths) => {
            let (images, labels) = paths
                .split_once(',')
                .ok_or_else(|| ManifestFileError::Choice("idx data is idx:IMAGES,LABELS".into()))?;
            (
                DataSpec::Idx {
                    name: name_of(images),
                    images_hash: file_hash(images)?.0,
                    labels_hash: file_hash(labels)?.0,
                },
                ModelSpec::Cnn { side: 28, channels: [16, 32], hidden: 128, classes: 10 },
            )
        }
        (other, _) => {
            return Err(ManifestFileError::Choice(format!(
                "unknown data {other:?}: use teacher, markov, text:PATH, digits:PATH or idx:IMAGES,LABELS"
            )));
        }
    };
    let mut model = match r.model.as_deref() {
        None | Some("") => default_model,
        Some(kind) => adapt_model(kind, &default_model)?,
    };
    if let Some(widths) = &r.hidden {
        let ModelSpec::Mlp { hidden, .. } = &mut model else {
            return Err(ManifestFileError::Choice("--hidden sets the MLP's widths: use it with --model mlp".into()));
        };
        hidden.clone_from(widths);
    }
    if let Some([c, w, l, h]) = r.transformer {
        let ModelSpec::CharTransformer { context, width, layers, heads, .. } = &mut model else {
            return Err(ManifestFileError::Choice(
                "--transformer sets the transformer's size: use it with text data".into(),
            ));
        };
        if !w.is_multiple_of(h) {
            return Err(ManifestFileError::Choice(format!("--transformer: width {w} must divide by heads {h}")));
        }
        (*context, *width, *layers, *heads) = (c, w, l, h);
    }
    let mut training = TrainingSpec::default();
    let transformer = matches!(model, ModelSpec::CharTransformer { .. });
    if transformer {
        training.batch_size = 16;
        training.lr = 1e-3;
        training.eval_samples = 256;
    }
    let engine = r.overrides.apply(r.strategy);
    let default_for = if transformer { "the default for the transformer" } else { "the default" };
    let mut rationale = BTreeMap::from([
        ("lr".to_string(), format!("{}: {default_for}, not probed on this data", training.lr)),
        ("batch_size".to_string(), format!("{}: {default_for}", training.batch_size)),
        (
            "adamw".to_string(),
            format!(
                "betas ({}, {}), weight decay {}, clip {}: DESIGN's inner defaults",
                training.beta1, training.beta2, training.weight_decay, training.clip
            ),
        ),
        ("eval_samples".to_string(), format!("{}: {default_for}", training.eval_samples)),
        (
            "h".to_string(),
            match r.overrides.h {
                Some(h) => format!("{h}: chosen by the run's creator"),
                None if r.strategy == Strategy::Ddp => format!("{}: ddp steps on every gradient", engine.h),
                None => format!(
                    "{}: the {} preset. Fewer inner steps per round needed fewer samples to a target (the \
                     simulated char transformer: 1.38x ddp's at H = 20, 1.75x at 50) for more bytes per sample (BENCHMARKS.md, \
                     rounds of H = 20)",
                    engine.h,
                    r.strategy.name()
                ),
            },
        ),
        (
            "outer".to_string(),
            format!(
                "{:?} eta {} beta {}{}, warm-up {} rounds: the {} preset",
                engine.outer.kind,
                engine.outer.eta,
                engine.outer.beta,
                engine
                    .outer
                    .beta_early
                    .map_or_else(String::new, |b| format!(" ({b} until the inner rate first falls)")),
                engine.outer.warmup_rounds,
                r.strategy.name()
            ),
        ),
        (
            "model".to_string(),
            "the data's default model, or the creator's --model, --hidden and --transformer".to_string(),
        ),
        ("inner_lr".to_string(), engine.inner_lr.describe()),
    ]);
    let o = &r.overrides;
    let creator_set: Vec<&str> = [
        (
            "schedule",
            o.grace.or(o.margin).is_some()
                || o.period_ms.is_some()
                || o.overlap.or(o.partial_step).or(o.lead).is_some(),
        ),
        ("staleness", o.weight.is_some() || o.measure.is_some() || o.tau_max.is_some()),
        ("codec", o.codec.is_some() || o.error_feedback.is_some()),
        ("anti_entropy", o.anti_entropy_every.is_some()),
        ("aggregation", o.aggregation.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    rationale.extend(engine_rationale::engine_entries(&engine, r.strategy, &creator_set));
    if let Some(c) = engine.cooldown {
        rationale.insert("cooldown".to_string(), c.describe());
        if r.overrides.inner_lr.is_none() {
            rationale.insert(
                "inner_lr".to_string(),
                "constant until the cooldown: with a budget, the plateau schedule's halvings (at 1/32 of the rate \
                 52 s into a 200-s teacher-digits run) leave the cooldown nothing to do; the whole rate until the \
                 last fifth, then the cooldown, ended lower by 200 s on teacher-digits and char-shakespeare (2 seeds each) and \
                 on one cnn-digits seed of two (BENCHMARKS.md, a budget's cooldown)"
                    .to_string(),
            );
        }
    }
    let m = Manifest {
        format: Manifest::FORMAT,
        name: r.name.clone(),
        start_ms: r.start_ms,
        seed: r.seed,
        model,
        data,
        training,
        engine,
        private: r.private,
        rationale,
    };
    m.validate().map_err(|e| ManifestFileError::Choice(e.to_string()))?;
    Ok(m)
}

/// The requested model kind with the data's input and output sizes.
fn adapt_model(kind: &str, default: &ModelSpec) -> Result<ModelSpec, ManifestFileError> {
    let (inputs, classes) = match default {
        ModelSpec::Mlp { inputs, classes, .. } => (*inputs, *classes),
        ModelSpec::Cnn { side, classes, .. } => (side * side, *classes),
        ModelSpec::CharTransformer { vocab, .. } => (*vocab, *vocab),
    };
    match (kind, default) {
        ("mlp", ModelSpec::CharTransformer { .. }) | ("cnn", ModelSpec::CharTransformer { .. }) => {
            Err(ManifestFileError::Choice("text data needs the transformer model".into()))
        }
        ("mlp", _) => Ok(ModelSpec::Mlp { inputs, hidden: vec![64, 64], classes }),
        ("cnn", ModelSpec::Cnn { .. }) => Ok(default.clone()),
        ("cnn", _) => Err(ManifestFileError::Choice("the CNN needs image data (digits or idx)".into())),
        ("transformer", ModelSpec::CharTransformer { .. }) => Ok(default.clone()),
        ("transformer", _) => {
            Err(ManifestFileError::Choice("the transformer needs text data (markov or text:PATH)".into()))
        }
        (other, _) => Err(ManifestFileError::Choice(format!("unknown model {other:?}: use mlp, cnn or transformer"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(data: &str) -> NewRun {
        NewRun {
            name: "t".into(),
            private: false,
            data: data.into(),
            model: None,
            hidden: None,
            transformer: None,
            strategy: Strategy::Gopals,
            overrides: EngineOverrides::default(),
            seed: 1,
            start_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn toml_round_trip_keeps_the_run_id() {
        let dir = tempfile::tempdir().unwrap();
        for m in [new_run(&run("teacher")).unwrap(), new_run(&run("markov")).unwrap(), Manifest::builtin(Strategy::Ddp)]
        {
            let p = dir.path().join("m.toml");
            write(&m, &p).unwrap();
            let back = read(&p).unwrap();
            assert_eq!(back, m);
            assert_eq!(back.run_id(), m.run_id());
        }
    }

    /// A budget's cooldown is in the manifest with its reason, survives the
    /// file, and a broken one is refused when the manifest is checked.
    #[test]
    fn a_cooldown_is_written_with_its_reason_and_checked() {
        use ragtag_protocol::engine::{cooldown::Cooldown, inner_lr::InnerLr};
        let dir = tempfile::tempdir().unwrap();
        let mut r = run("teacher");
        r.overrides.cooldown = Some(Cooldown::for_budget(200, 0.2).unwrap());
        let m = new_run(&r).unwrap();
        assert_eq!(m.engine.cooldown, Some(Cooldown { start_s: 160, end_s: 200, final_scale: 0.0 }));
        assert!(m.rationale["cooldown"].contains("from 160 s to 200 s"), "{}", m.rationale["cooldown"]);
        let p = dir.path().join("m.toml");
        write(&m, &p).unwrap();
        assert_eq!(read(&p).unwrap(), m);
        assert_eq!(m.engine.inner_lr, InnerLr::Constant, "the whole rate until the cooldown");
        assert!(m.rationale["inner_lr"].starts_with("constant until the cooldown"));
        r.overrides.inner_lr = Some(InnerLr::PLATEAU);
        assert_eq!(new_run(&r).unwrap().engine.inner_lr, InnerLr::PLATEAU, "unless the creator asks");
        let plain = new_run(&run("teacher")).unwrap();
        assert!(!plain.rationale.contains_key("cooldown"), "no budget, no cooldown");
        assert_eq!(plain.engine.inner_lr, InnerLr::PLATEAU);
        r.overrides.cooldown = Some(Cooldown { start_s: 200, end_s: 100, final_scale: 0.0 });
        assert!(new_run(&r).unwrap_err().to_string().contains("cooldown must start before it ends"));
    }

    /// Every engine setting of a new run says why it has its value, within
    /// the manifest's bound on an entry, and a creator's choice says so.
    #[test]
    fn the_schedule_staleness_codec_and_anti_entropy_have_their_reasons() {
        for strategy in [Strategy::Gopals, Strategy::Ddp, Strategy::GopalsAsync] {
            let mut r = run("teacher");
            r.strategy = strategy;
            let m = new_run(&r).unwrap();
            for key in ["schedule", "staleness", "codec", "anti_entropy", "aggregation", "h", "outer", "inner_lr", "lr"]
            {
                let text = m.rationale.get(key).unwrap_or_else(|| panic!("{strategy:?}: no reason for {key}"));
                assert!(key.len() + text.len() <= ragtag_protocol::manifest::MAX_RATIONALE_BYTES, "{key}: {text}");
                assert!(!text.contains("chosen by"), "{key}: {text}");
            }
        }
        let m = new_run(&run("teacher")).unwrap();
        assert!(m.rationale["schedule"].contains("partial step on, lead steps on, overlap off: the gopals preset"));
        let mut r = run("teacher");
        r.overrides.partial_step = Some(false);
        r.overrides.anti_entropy_every = Some(0);
        let m = new_run(&r).unwrap();
        let schedule = &m.rationale["schedule"];
        assert!(
            schedule.contains("partial step off, lead steps on, overlap off: chosen by the run's creator"),
            "{schedule}"
        );
        assert!(m.rationale["anti_entropy"].starts_with("off: chosen by the run's creator"));
        assert!(m.rationale["staleness"].contains("the gopals preset"));
        let mut r = run("teacher");
        r.overrides.aggregation = Some(ragtag_protocol::aggregate::AggregationConfig::with_groups(8));
        let m = new_run(&r).unwrap();
        m.engine.validate().unwrap();
        let aggregation = &m.rationale["aggregation"];
        assert!(aggregation.starts_with("8 groups, 3 aggregators, quorum 2"), "{aggregation}");
        assert!(aggregation.contains("chosen by the run's creator"), "{aggregation}");
        assert!("aggregation".len() + aggregation.len() <= ragtag_protocol::manifest::MAX_RATIONALE_BYTES);
    }

    #[test]
    fn file_data_is_hashed_and_bad_choices_are_explained() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, "hello world").unwrap();
        let m = new_run(&run(&format!("text:{}", p.display()))).unwrap();
        assert!(matches!(m.model, ModelSpec::CharTransformer { vocab: 8, .. }));
        assert!(new_run(&run("nope")).unwrap_err().to_string().contains("unknown data"));
        let mut r = run("teacher");
        r.model = Some("cnn".into());
        assert!(new_run(&r).unwrap_err().to_string().contains("image data"));
        let mut r = run(&format!("text:{}", p.display()));
        r.transformer = Some([16, 32, 1, 4]);
        let m = new_run(&r).unwrap();
        assert!(matches!(m.model, ModelSpec::CharTransformer { context: 16, width: 32, layers: 1, heads: 4, .. }));
        r.transformer = Some([16, 30, 1, 4]);
        assert!(new_run(&r).unwrap_err().to_string().contains("divide by heads"));
        let mut r = run("teacher");
        r.transformer = Some([16, 32, 1, 4]);
        assert!(new_run(&r).unwrap_err().to_string().contains("text data"));
    }
}
