//! Trainer checkpoints in safetensors: parameters (`param/<name>`), AdamW
//! moments (`adam_m/<name>`, `adam_v/<name>`) and the step count in the
//! header metadata, so any safetensors reader can load the weights.

use std::{collections::HashMap, path::Path};

use candle_core::{Device, Tensor};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::{Error, Result, Trainer};

/// Metadata key naming the format.
const FORMAT_KEY: &str = "format";
const FORMAT: &str = "ragtag-trainer-v1";
const STEP_KEY: &str = "adam_step";
const DRAWN_KEY: &str = "batches_drawn";

fn ck_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.into(), message: message.into() }
}

fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(le_bytes(&t.flatten_all()?.to_vec1::<f32>()?))
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Trainer {
    /// Writes parameters and optimiser state to `path` (atomically: a
    /// temporary file renamed over the target).
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let params = self.params();
        let (m, v) = self.optimizer().moments()?;
        let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (i, e) in params.layout().entries.iter().enumerate() {
            blobs.push((format!("param/{}", e.name), e.shape.clone(), host_bytes(params.vars()[i].as_tensor())?));
            blobs.push((format!("adam_m/{}", e.name), e.shape.clone(), le_bytes(&m[i])));
            blobs.push((format!("adam_v/{}", e.name), e.shape.clone(), le_bytes(&v[i])));
        }
        let views: Vec<(String, TensorView<'_>)> = blobs
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(Dtype::F32, shape.clone(), bytes).map(|view| (name.clone(), view))
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| ck_err(path, e.to_string()))?;
        let meta: HashMap<String, String> = [
            (FORMAT_KEY.to_string(), FORMAT.to_string()),
            (STEP_KEY.to_string(), self.optimizer().steps().to_string()),
            (DRAWN_KEY.to_string(), self.batches_drawn().to_string()),
        ]
        .into();
        let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| ck_err(path, e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &bytes).map_err(|source| Error::Io { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, path).map_err(|source| Error::Io { path: path.into(), source })?;
        Ok(())
    }

    /// Restores parameters and optimiser state from `path`.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| ck_err(path, e.to_string()))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| ck_err(path, e.to_string()))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        if meta.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
            return Err(ck_err(path, "not a ragtag trainer checkpoint"));
        }
        let number = |key: &str| -> Result<u64> {
            meta.get(key).and_then(|s| s.parse().ok()).ok_or_else(|| ck_err(path, format!("missing {key}")))
        };
        let (step, drawn) = (number(STEP_KEY)?, number(DRAWN_KEY)?);
        let device: Device = self.params().device();
        let load = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let view = st.tensor(name).map_err(|_| ck_err(path, format!("missing tensor {name}")))?;
            if view.dtype() != Dtype::F32 || view.shape() != shape {
                return Err(ck_err(
                    path,
                    format!("tensor {name} has {:?} {:?}, expected F32 {shape:?}", view.dtype(), view.shape()),
                ));
            }
            let values: Vec<f32> =
                view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            Ok(Tensor::from_vec(values, shape, &device)?)
        };
        let entries = self.params().layout().entries.clone();
        let mut flat = Vec::with_capacity(self.num_params());
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for e in &entries {
            flat.extend(load(&format!("param/{}", e.name), &e.shape)?.flatten_all()?.to_vec1::<f32>()?);
            m.push(load(&format!("adam_m/{}", e.name), &e.shape)?.flatten_all()?.to_vec1::<f32>()?);
            v.push(load(&format!("adam_v/{}", e.name), &e.shape)?.flatten_all()?.to_vec1::<f32>()?);
        }
        self.import_params(&flat)?;
        self.optimizer_mut().restore(step, m, v)?;
        self.resume_stream(drawn);
        Ok(())
    }
}
