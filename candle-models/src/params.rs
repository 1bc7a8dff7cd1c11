//! The model's parameters as one flat vector, sorted by name.
//!
//! Every node must agree on the order of parameters on the wire; candle's
//! `VarMap` iterates a `HashMap`, so we sort by name once and keep that
//! order. Initial values come from our seeded RNG, never candle's.

use candle_core::{Device, Shape, Tensor, Var};
use candle_nn::VarMap;
use ragtag_protocol::rng::SeededRng;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One parameter tensor's place in the flat vector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutEntry {
    /// Its name in the model.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Where it starts in the flat vector.
    pub offset: usize,
    /// How many values.
    pub len: usize,
}

/// Names, shapes and offsets of every parameter, in flat order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The entries, sorted by name.
    pub entries: Vec<LayoutEntry>,
}

impl Layout {
    /// Total number of values.
    pub fn total(&self) -> usize {
        self.entries.last().map_or(0, |e| e.offset + e.len)
    }
}

/// The trainable variables of a model, sorted by name.
#[derive(Debug)]
pub struct ParamStore {
    names: Vec<String>,
    vars: Vec<Var>,
    layout: Layout,
}

impl ParamStore {
    /// Collects the variables of `varmap`, sorted by name.
    pub fn from_varmap(varmap: &VarMap) -> Self {
        let data = varmap.data().lock().expect("varmap lock poisoned");
        let mut named: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        drop(data);
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let mut offset = 0;
        let entries = named
            .iter()
            .map(|(name, var)| {
                let shape = var.as_tensor().dims().to_vec();
                let len = shape.iter().product();
                let e = LayoutEntry { name: name.clone(), shape, offset, len };
                offset += len;
                e
            })
            .collect();
        let (names, vars) = named.into_iter().unzip();
        Self { names, vars, layout: Layout { entries } }
    }

    /// Initialises every parameter from `seed`, by name and `scheme`.
    pub fn init(&self, seed: u64, scheme: InitScheme) -> Result<()> {
        let mut rng = SeededRng::derive(seed, "init");
        for (entry, var) in self.layout.entries.iter().zip(&self.vars) {
            let values = init_values(&entry.name, &entry.shape, scheme, &mut rng);
            let t = Tensor::from_vec(values, entry.shape.as_slice(), var.device())?;
            var.set(&t)?;
        }
        Ok(())
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.layout.total()
    }

    /// True for a model without parameters.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The variables, in flat order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Their names, in flat order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// All parameters as one vector (exact copy).
    pub fn export(&self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.len());
        for var in &self.vars {
            out.extend(var.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// Sets all parameters from one vector (exact).
    pub fn import(&self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.len() {
            return Err(Error::Shape(format!("flat vector has {} values, model has {}", flat.len(), self.len())));
        }
        for (entry, var) in self.layout.entries.iter().zip(&self.vars) {
            let t = Tensor::from_slice(
                &flat[entry.offset..entry.offset + entry.len],
                entry.shape.as_slice(),
                var.device(),
            )?;
            var.set(&t)?;
        }
        Ok(())
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vars.first().map_or(Device::Cpu, |v| v.device().clone())
    }
}

/// How weights are drawn (biases are always zero, norm gains one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InitScheme {
    /// PyTorch's default for linear and conv layers: uniform in ±1/sqrt(fan_in).
    FanIn,
    /// GPT-2: every weight N(0, 0.02), residual projections (names ending
    /// in `_proj` or `_out`) N(0, 0.02 / sqrt(2 layers)).
    Gpt2 {
        /// Transformer blocks.
        layers: usize,
    },
}

fn init_values(name: &str, shape: &[usize], scheme: InitScheme, rng: &mut SeededRng) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut parts = name.rsplit('.');
    let leaf = parts.next().unwrap_or(name);
    let module = parts.next().unwrap_or("");
    let is_norm = module.starts_with("ln") || module.contains("norm");
    if leaf == "bias" {
        vec![0.0; n]
    } else if is_norm {
        vec![1.0; n]
    } else if let InitScheme::Gpt2 { layers } = scheme {
        let residual = module.ends_with("_proj") || module.ends_with("_out");
        let std = if residual { 0.02 / (2.0 * layers.max(1) as f64).sqrt() } else { 0.02 };
        (0..n).map(|_| (rng.normal() * std) as f32).collect()
    } else {
        let fan_in: usize = Shape::from_dims(shape).dims().iter().skip(1).product::<usize>().max(1);
        let bound = 1.0 / (fan_in as f64).sqrt();
        (0..n).map(|_| rng.uniform_range(-bound, bound) as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;
    use candle_nn::VarBuilder;

    use super::*;

    fn store(seed: u64) -> ParamStore {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        candle_nn::linear(4, 3, vb.pp("b")).unwrap();
        candle_nn::linear(3, 2, vb.pp("a")).unwrap();
        let s = ParamStore::from_varmap(&vm);
        s.init(seed, InitScheme::FanIn).unwrap();
        s
    }

    #[test]
    fn layout_is_sorted_by_name() {
        let s = store(1);
        let names: Vec<&str> = s.layout().entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a.bias", "a.weight", "b.bias", "b.weight"]);
        assert_eq!(s.len(), 2 + 6 + 3 + 12);
    }

    #[test]
    fn export_import_round_trip_is_exact_and_init_is_seeded() {
        let a = store(7);
        let b = store(7);
        assert_eq!(a.export().unwrap(), b.export().unwrap());
        let c = store(8);
        assert_ne!(a.export().unwrap(), c.export().unwrap());
        let flat: Vec<f32> = (0..a.len()).map(|i| i as f32 * 0.1 - 1.0).collect();
        a.import(&flat).unwrap();
        assert_eq!(a.export().unwrap(), flat);
        assert!(a.import(&flat[1..]).is_err());
    }
}
