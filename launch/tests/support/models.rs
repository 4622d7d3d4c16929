//! Reading the model files runs write (`model.safetensors`), shared by the test binaries.

use std::path::Path;

/// A safetensors file's f32 tensors, read by its documented layout (8-byte header length, JSON
/// header with each tensor's dtype, shape and data offsets, then the data).
pub fn safetensors_f32(path: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).expect("read model");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json header");
    let data = &bytes[8 + n..];
    let mut out = std::collections::BTreeMap::new();
    for (name, t) in header.as_object().expect("object") {
        if name == "__metadata__" {
            continue;
        }
        assert_eq!(t["dtype"], "F32", "{name}");
        let off: Vec<usize> = t["data_offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|v| v.as_u64().expect("u64") as usize)
            .collect();
        let v = data[off[0]..off[1]]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(name.clone(), v);
    }
    out
}

/// Largest difference between two model files' parameters, relative to each tensor's largest
/// magnitude.
#[allow(dead_code)]
pub fn model_distance(a: &Path, b: &Path) -> f32 {
    let (a, b) = (safetensors_f32(a), safetensors_f32(b));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "different tensors");
    a.iter()
        .map(|(name, x)| {
            let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            x.iter().zip(&b[name]).map(|(p, q)| (p - q).abs() / scale).fold(0f32, f32::max)
        })
        .fold(0f32, f32::max)
}
