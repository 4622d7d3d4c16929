//! Trained models as safetensors files: one f32 tensor per parameter block (names and shapes
//! from [`Export::blocks`], each in its shape's order whatever order the model computes in), the
//! model's constants (MF's `mean`), the scaling of standardized training data when there was one
//! (`scaling.shift`, `scaling.mult`), and string metadata: `format = peregrine-model`, the
//! model and what rebuilds it (`features`, `classes`, `hidden`, `k`, `intercept`), and how it was
//! trained (`scheme`, `optimizer`, `iterations`, `ranks`, `train_data`, and `standardized =
//! on-the-fly` when `train --standardize` scaled raw data as it read it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use peregrine_core::model::Export;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::AppError;
use crate::preempt::write_atomically;

/// The `format` metadata value.
pub const FORMAT: &str = "peregrine-model";
/// The metadata key saying how the scaling was applied in training ...
pub const STANDARDIZED: &str = "standardized";
/// ... its value when the training data was raw and scaled as it was read (`train
/// --standardize`): data to predict is then raw too, and scaled alike.
pub const ON_THE_FLY: &str = "on-the-fly";
/// The file name in a run directory.
pub const FILE_NAME: &str = "model.safetensors";

/// The model file `path` names: the file itself, or a run directory's [`FILE_NAME`].
pub fn file_of(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(FILE_NAME)
    } else {
        path.to_owned()
    }
}

/// The run directory a model `path` (a file or a directory) belongs to: the directory given, or
/// the one holding a [`FILE_NAME`]; `None` for a model file of another name (anywhere).
pub fn run_dir_of(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        return Some(path.to_owned());
    }
    let parent = path.parent()?;
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    (path.file_name()? == FILE_NAME).then(|| parent.to_owned())
}

/// A model file read back.
#[derive(Debug)]
pub struct Saved {
    /// Its path.
    pub path: PathBuf,
    /// String metadata.
    pub meta: HashMap<String, String>,
    /// Tensors: shape and values.
    pub tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

fn bad(path: &Path, detail: impl Into<String>) -> AppError {
    AppError::Data { what: path.display().to_string(), detail: detail.into() }
}

/// Writes `params` of `model` to `path` (atomically: a temporary file renamed into place).
pub fn save(
    path: &Path,
    model: &impl Export,
    params: &[f32],
    meta: HashMap<String, String>,
    scaling: Option<(&[f32], &[f32])>,
) -> Result<(), AppError> {
    let blocks: Vec<_> = model.blocks().into_iter().map(|b| (b.values(params), b)).collect();
    let mut views = Vec::new();
    for (values, b) in &blocks {
        let v = TensorView::new(Dtype::F32, b.shape.clone(), bytemuck::cast_slice(values))
            .map_err(|e| AppError::Train(format!("{}: tensor {}: {e}", path.display(), b.name)))?;
        views.push((b.name.clone(), v));
    }
    let constants = model.constants();
    for (name, v) in &constants {
        let t = TensorView::new(Dtype::F32, vec![v.len()], bytemuck::cast_slice(v))
            .map_err(|e| AppError::Train(format!("{}: tensor {name}: {e}", path.display())))?;
        views.push(((*name).to_owned(), t));
    }
    if let Some((shift, mult)) = scaling {
        for (name, v) in [("scaling.shift", shift), ("scaling.mult", mult)] {
            let t = TensorView::new(Dtype::F32, vec![v.len()], bytemuck::cast_slice(v))
                .map_err(|e| AppError::Train(format!("{}: tensor {name}: {e}", path.display())))?;
            views.push((name.to_owned(), t));
        }
    }
    let mut meta = meta;
    meta.insert("format".into(), FORMAT.into());
    let data = safetensors::serialize(views, Some(meta))
        .map_err(|e| AppError::Train(format!("{}: {e}", path.display())))?;
    write_atomically(path, &data)
}

/// Writes the same tensors as [`save`] as NumPy files, one per tensor, `<dir>/<name>.npy`
/// (format 1.0, little-endian f32, C order), and the metadata as `<dir>/meta.json`; each file
/// written aside and renamed.
pub fn save_npy(
    dir: &Path,
    model: &impl Export,
    params: &[f32],
    meta: &HashMap<String, String>,
    scaling: Option<(&[f32], &[f32])>,
) -> Result<(), AppError> {
    let blocks: Vec<_> = model.blocks().into_iter().map(|b| (b.values(params), b)).collect();
    let mut tensors: Vec<(String, Vec<usize>, &[f32])> =
        blocks.iter().map(|(values, b)| (b.name.clone(), b.shape.clone(), &values[..])).collect();
    let constants = model.constants();
    for (name, v) in &constants {
        tensors.push(((*name).to_owned(), vec![v.len()], &v[..]));
    }
    if let Some((shift, mult)) = scaling {
        tensors.push(("scaling.shift".into(), vec![shift.len()], shift));
        tensors.push(("scaling.mult".into(), vec![mult.len()], mult));
    }
    for (name, shape, values) in tensors {
        write_atomically(&dir.join(format!("{name}.npy")), &npy(&shape, values))?;
    }
    let mut meta = meta.clone();
    meta.insert("format".into(), FORMAT.into());
    let text = serde_json::to_string_pretty(&meta).map_err(|e| AppError::Train(e.to_string()))?;
    write_atomically(&dir.join("meta.json"), text.as_bytes())
}

/// A NumPy `.npy` file (format 1.0) of little-endian f32 `values` of `shape`.
fn npy(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dims: String = match shape {
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64 and
    // ended by a newline.
    let pad = (64 - (10 + header.len() + 1) % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    out
}

/// The index of the first value of `values` that is not a finite number (NaN or infinite).
pub fn first_not_finite(values: &[f32]) -> Option<usize> {
    values.iter().position(|v| !v.is_finite())
}

/// Little-endian f32 values from a tensor's bytes (any alignment).
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

impl Saved {
    /// Reads a model file, or the model file of a run directory. A tensor with a value that is
    /// not a finite number (a run that diverged) is an error naming the tensor and the index.
    pub fn load(path: &Path) -> Result<Self, AppError> {
        let path = file_of(path);
        let data = std::fs::read(&path)
            .map_err(|source| AppError::Io { what: format!("reading {}", path.display()), source })?;
        let st = SafeTensors::deserialize(&data)
            .map_err(|e| bad(&path, format!("not a safetensors file ({e})")))?;
        let (_, header) = SafeTensors::read_metadata(&data)
            .map_err(|e| bad(&path, format!("not a safetensors file ({e})")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        if meta.get("format").map(String::as_str) != Some(FORMAT) {
            return Err(bad(
                &path,
                format!("a safetensors file, but not a Peregrine model (no metadata format = {FORMAT})"),
            ));
        }
        let mut tensors = HashMap::new();
        for (name, t) in st.tensors() {
            if t.dtype() != Dtype::F32 {
                return Err(bad(&path, format!("tensor {name} is {:?}, expected F32", t.dtype())));
            }
            let values = f32s(t.data());
            if let Some(i) = first_not_finite(&values) {
                return Err(bad(
                    &path,
                    format!(
                        "tensor `{name}` holds {} at index {i} (of {}): not a model to apply (did its \
                         training diverge?)",
                        values[i],
                        values.len()
                    ),
                ));
            }
            tensors.insert(name, (t.shape().to_vec(), values));
        }
        Ok(Self { path, meta, tensors })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Result<&str, AppError> {
        self.meta.get(key).map(String::as_str).ok_or_else(|| bad(&self.path, format!("no metadata `{key}`")))
    }

    /// The parameter vector of `model`, whose blocks must all be here with their shapes: checked
    /// before the vector is allocated, so that a model whose metadata describes more than its
    /// tensors hold (`hidden`) is refused, not allocated.
    pub fn params_for(&self, model: &impl Export) -> Result<Vec<f32>, AppError> {
        let blocks = model.blocks();
        let mut found = Vec::with_capacity(blocks.len());
        for b in &blocks {
            let (shape, values) = self
                .tensors
                .get(&b.name)
                .ok_or_else(|| bad(&self.path, format!("no tensor `{}`", b.name)))?;
            if *shape != b.shape {
                return Err(bad(
                    &self.path,
                    format!("tensor `{}` has shape {shape:?}, the data needs {:?}", b.name, b.shape),
                ));
            }
            found.push(values);
        }
        let mut params = vec![0.0f32; model.layout().params];
        for (b, values) in blocks.iter().zip(found) {
            b.place(values, &mut params);
        }
        Ok(params)
    }

    /// Whether the training data was raw and standardized as it was read ([`ON_THE_FLY`]).
    pub fn standardized_on_the_fly(&self) -> bool {
        self.meta.get(STANDARDIZED).is_some_and(|v| v == ON_THE_FLY)
    }

    /// The scaling of the training data, if it was standardized.
    pub fn scaling(&self) -> Option<(&[f32], &[f32])> {
        let s = self.tensors.get("scaling.shift")?;
        let m = self.tensors.get("scaling.mult")?;
        Some((&s.1, &m.1))
    }
}
