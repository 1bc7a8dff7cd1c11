//! A model's parameters as a standalone safetensors file with the model's
//! own layer names and shapes, to use the trained model outside ragtag
//! (the `safetensors` package loads it in Python without ragtag).

use std::{collections::HashMap, path::Path};

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use ragtag_protocol::manifest::ModelSpec;
use safetensors::{Dtype, tensor::TensorView};

use crate::{
    Error, Result,
    model::Model,
    params::{Layout, ParamStore},
};

/// The names, shapes and flat offsets of `spec`'s parameters (the order of
/// the flat vector every node shares).
pub fn layout_of(spec: &ModelSpec) -> Result<Layout> {
    let varmap = VarMap::new();
    Model::build(spec, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    Ok(ParamStore::from_varmap(&varmap).layout().clone())
}

/// Writes `flat` (parameters in flat order) to `path`, one tensor per
/// parameter under its layer name, with `metadata` in the header.
pub fn write_safetensors(
    spec: &ModelSpec,
    flat: &[f32],
    metadata: HashMap<String, String>,
    path: &Path,
) -> Result<Layout> {
    let layout = layout_of(spec)?;
    if layout.total() != flat.len() {
        return Err(Error::Shape(format!("{} values for a model of {} parameters", flat.len(), layout.total())));
    }
    let bytes: Vec<Vec<u8>> = layout
        .entries
        .iter()
        .map(|e| flat[e.offset..e.offset + e.len].iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let err = |m: String| Error::Checkpoint { path: path.into(), message: m };
    let views: Vec<(String, TensorView<'_>)> = layout
        .entries
        .iter()
        .zip(&bytes)
        .map(|(e, b)| TensorView::new(Dtype::F32, e.shape.clone(), b).map(|v| (e.name.clone(), v)))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    let out = safetensors::serialize(views, Some(metadata)).map_err(|e| err(e.to_string()))?;
    std::fs::write(path, out).map_err(|source| Error::Io { path: path.into(), source })?;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use safetensors::SafeTensors;

    use super::*;

    #[test]
    fn every_parameter_is_written_under_its_name_and_shape() {
        let spec = ModelSpec::Mlp { inputs: 4, hidden: vec![3], classes: 2 };
        let layout = layout_of(&spec).unwrap();
        let flat: Vec<f32> = (0..layout.total()).map(|i| i as f32).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write_safetensors(&spec, &flat, HashMap::from([("run".into(), "x".into())]), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.len(), layout.entries.len());
        for e in &layout.entries {
            let t = st.tensor(&e.name).unwrap();
            assert_eq!(t.shape(), e.shape.as_slice());
            let first = f32::from_le_bytes(t.data()[..4].try_into().unwrap());
            assert_eq!(first, e.offset as f32, "{} starts at its flat offset", e.name);
        }
        assert!(write_safetensors(&spec, &flat[1..], HashMap::new(), &path).is_err());
    }
}
