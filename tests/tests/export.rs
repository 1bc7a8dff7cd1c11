//! Taking the model home: after a short run, `ragtag export` writes the
//! replica as safetensors with the model's layer names and shapes, and the
//! values are exactly the node's checkpointed replica.

use std::{process::Command, time::Duration};

use ragtag_protocol::{engine::Strategy, manifest::Manifest};
use ragtag_tests::{bin, node};
use safetensors::SafeTensors;

#[test]
fn export_writes_the_replica_with_layer_names() {
    let dir = tempfile::tempdir().unwrap();
    let p = node(dir.path(), &["--max-rounds", "3"]);
    p.wait_json("exit", Duration::from_secs(120)).unwrap_or_else(|| panic!("no exit:\n{}", p.stderr()));
    let state = dir.path().join("state");
    let out = dir.path().join("model.safetensors");
    let run =
        Command::new(bin("ragtag")).args(["export", "--state"]).arg(&state).arg("--out").arg(&out).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    let manifest = Manifest::builtin(Strategy::Gopals);
    let layout = ragtag_models::export::layout_of(&manifest.model).unwrap();
    let replica = ragtag_node::checkpoint::load_engine(&state, manifest.run_id()).unwrap().unwrap().replica.anchor;
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), layout.entries.len());
    assert!(layout.entries.iter().any(|e| e.name.ends_with("weight")), "{:?}", layout.entries);
    let mut values = Vec::new();
    for e in &layout.entries {
        let t = st.tensor(&e.name).unwrap_or_else(|_| panic!("no tensor {}", e.name));
        assert_eq!(t.shape(), e.shape.as_slice(), "{}", e.name);
        values.extend(t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())));
    }
    assert_eq!(values, replica, "the file holds the replica, in the shared flat order");
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["run_id"], manifest.run_id().to_string());
}
