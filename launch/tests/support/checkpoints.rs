//! Rewriting a run's checkpoint as a version of Peregrine that wrote other figures would have
//! written it, its checksum recomputed by the documented rule (launch/src/checkpoint.rs: CRC-32
//! of every metadata entry but `checksum` in key order, then the tensors `params`, `state`,
//! `scheme` and `best`, each preceded by its length as a little-endian u64).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

/// Rewrites the checkpoint at `path` with `edit` applied to its metadata and its parameters
/// (f32), under a checksum that matches the result.
pub fn reseal(path: &Path, edit: impl FnOnce(&mut HashMap<String, String>, &mut Vec<f32>)) {
    let bytes = std::fs::read(path).expect("read the checkpoint");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
    let mut meta = header.metadata().clone().expect("metadata");
    let mut params: Vec<f32> = st
        .tensor("params")
        .expect("params")
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    edit(&mut meta, &mut params);
    let p: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (state, scheme) = (st.tensor("state").expect("state"), st.tensor("scheme").expect("scheme"));
    let best = st.tensor("best").expect("best");
    let mut h = crc32fast::Hasher::new();
    let mut field = |b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    let mut keys: Vec<&String> = meta.keys().filter(|k| *k != "checksum").collect();
    keys.sort();
    for k in keys {
        field(k.as_bytes());
        field(meta[k].as_bytes());
    }
    for t in [&p[..], state.data(), scheme.data(), best.data()] {
        field(t);
    }
    meta.insert("checksum".into(), format!("{:08x}", h.finalize()));
    let views = [
        ("params", TensorView::new(safetensors::Dtype::F32, vec![params.len()], &p).expect("params")),
        ("state", state),
        ("scheme", scheme),
        ("best", best),
    ];
    std::fs::write(path, safetensors::serialize(views, Some(meta)).expect("serialize")).expect("write");
}
