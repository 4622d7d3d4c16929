//! NumPy `.npy` arrays to a dense multiclass dataset: a features array of shape `(rows, cols)`
//! (or `(rows,)`: one column) and a labels array of shape `(rows,)` or `(rows, 1)`.
//!
//! - Format versions 1.0, 2.0 and 3.0; C or Fortran order; little-endian (or single-byte) `bool`,
//!   `int8..int64`, `uint8..uint64`, `float32` and `float64`. Big-endian arrays, other types
//!   (`float16`, complex, strings, objects) and other shapes are errors naming the file and what
//!   was found.
//! - Labels are whole numbers `0..65535` (of an integer, bool or float array); the classes are
//!   `0..max + 1`. A feature that is not a finite number (NaN: NumPy's missing value) is an error
//!   naming its row and column (from 0, as NumPy indexes). Nothing is written unless both files
//!   convert.

use std::path::Path;

use super::error::{DataError, Result};
use super::format::{Kind, Shape, Truth, Writer};

/// What a conversion found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyConverted {
    /// Rows.
    pub rows: u64,
    /// Feature columns.
    pub cols: u64,
    /// Classes (`max label + 1`).
    pub classes: u32,
    /// The arrays' types, as NumPy names them (`float32`, `int64`).
    pub dtypes: (&'static str, &'static str),
}

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    Bool,
    Int(usize),
    Uint(usize),
    Float(usize),
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Self::Bool => 1,
            Self::Int(n) | Self::Uint(n) | Self::Float(n) => n,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::Int(1) => "int8",
            Self::Int(2) => "int16",
            Self::Int(4) => "int32",
            Self::Int(_) => "int64",
            Self::Uint(1) => "uint8",
            Self::Uint(2) => "uint16",
            Self::Uint(4) => "uint32",
            Self::Uint(_) => "uint64",
            Self::Float(4) => "float32",
            Self::Float(_) => "float64",
        }
    }

    /// Element `b` (its bytes, little-endian) as a float.
    fn value(self, b: &[u8]) -> f64 {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        let u = u64::from_le_bytes(w);
        match self {
            Self::Bool => f64::from(u8::from(u != 0)),
            Self::Uint(_) => u as f64,
            Self::Int(n) => {
                let shift = 64 - 8 * n as u32;
                ((u << shift) as i64 >> shift) as f64
            }
            Self::Float(4) => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Self::Float(_) => f64::from_bits(u),
        }
    }
}

/// A parsed `.npy` file: its type, shape, order and data bytes.
struct Array {
    dtype: Dtype,
    shape: Vec<u64>,
    fortran: bool,
    bytes: Vec<u8>,
    data: usize,
}

impl Array {
    fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(DataError::io(path, "reading"))?;
        let bad = |d: String| DataError::format(path, d);
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err(bad(
                "not a NumPy .npy file (no \\x93NUMPY magic): save arrays with numpy.save".into()
            ));
        }
        let (len, start) = match bytes[6] {
            1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
            2 | 3 if bytes.len() >= 12 => {
                (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
            }
            v => return Err(bad(format!(".npy format version {v}.{}: 1.0, 2.0 and 3.0 are read", bytes[7]))),
        };
        let header = bytes.get(start..start + len).ok_or_else(|| {
            bad(format!("truncated header: {len} bytes announced, {} there", bytes.len() - start))
        })?;
        let header = String::from_utf8_lossy(header).into_owned();
        let descr = dict_value(&header, "descr")
            .and_then(|v| v.strip_prefix('\'').and_then(|v| v.split('\'').next()).map(str::to_owned))
            .ok_or_else(|| bad(format!("header without a 'descr' string: {}", header.trim())))?;
        let dtype = parse_dtype(&descr).map_err(|d| bad(format!("dtype '{descr}': {d}")))?;
        let fortran = match dict_value(&header, "fortran_order") {
            Some(v) if v.starts_with("True") => true,
            Some(v) if v.starts_with("False") => false,
            _ => return Err(bad(format!("header without 'fortran_order': {}", header.trim()))),
        };
        let shape = dict_value(&header, "shape")
            .and_then(|v| v.strip_prefix('('))
            .and_then(|v| v.split(')').next())
            .ok_or_else(|| bad(format!("header without a 'shape' tuple: {}", header.trim())))?;
        let shape: Vec<u64> = shape
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.trim_end_matches('L').parse::<u64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad(format!("shape ({shape}) is not a tuple of whole numbers")))?;
        let data = start + len;
        let want = shape
            .iter()
            .try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {shape:?} is too large")))?;
        let have = (bytes.len() - data) as u64;
        if have < want {
            return Err(bad(format!(
                "truncated: shape {shape:?} of {} needs {want} bytes of data, the file has {have}",
                dtype.name()
            )));
        }
        Ok(Self { dtype, shape, fortran, bytes, data })
    }

    /// Element `(r, c)` of a 2-D array of `rows x cols` (a 1-D array is one column).
    fn at(&self, r: u64, c: u64, rows: u64, cols: u64) -> f64 {
        let i = if self.fortran { c * rows + r } else { r * cols + c };
        let s = self.dtype.size();
        let o = self.data + i as usize * s;
        self.dtype.value(&self.bytes[o..o + s])
    }
}

/// The text after `'key':` in a header dict.
fn dict_value<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let at = header.find(&format!("'{key}'"))?;
    let rest = &header[at + key.len() + 2..];
    Some(rest.trim_start().strip_prefix(':')?.trim_start())
}

fn parse_dtype(d: &str) -> std::result::Result<Dtype, String> {
    if !d.is_ascii() {
        return Err("not a plain numeric type".into());
    }
    let (order, code) = d.split_at(1.min(d.len()));
    let (kind, size) = code.split_at(1.min(code.len()));
    let size: usize = size.parse().map_err(|_| "not a plain numeric type".to_string())?;
    if order == ">" && size > 1 {
        return Err("big-endian: convert with array.astype('<f4') first".into());
    }
    if !matches!(order, "<" | "|" | "=" | ">") {
        return Err("not a plain numeric type".into());
    }
    match (kind, size) {
        ("b", 1) => Ok(Dtype::Bool),
        ("i", 1 | 2 | 4 | 8) => Ok(Dtype::Int(size)),
        ("u", 1 | 2 | 4 | 8) => Ok(Dtype::Uint(size)),
        ("f", 4 | 8) => Ok(Dtype::Float(size)),
        ("f", _) => Err("float16 and longer floats are not read: use float32 or float64".into()),
        _ => Err("bool, int, uint, float32 and float64 arrays are read".into()),
    }
}

/// Converts features `features` and labels `labels` (`.npy`) to a dense dataset at `output`.
pub fn convert(features: &Path, labels: &Path, output: &Path) -> Result<NpyConverted> {
    let x = Array::read(features)?;
    let y = Array::read(labels)?;
    let (rows, cols) = match x.shape[..] {
        [r, c] => (r, c),
        [r] => (r, 1),
        ref s => {
            return Err(DataError::format(
                features,
                format!("features of shape {s:?}: a 2-D (rows, features) array is needed"),
            ))
        }
    };
    match y.shape[..] {
        [n] | [n, 1] if n == rows => {}
        [_] | [_, 1] => {
            return Err(DataError::format(
                labels,
                format!("{} labels for {rows} rows of {}", y.shape[0], features.display()),
            ))
        }
        ref s => {
            return Err(DataError::format(
                labels,
                format!("labels of shape {s:?}: one label per row is needed"),
            ))
        }
    }
    if rows == 0 || cols == 0 {
        return Err(DataError::format(features, format!("shape ({rows}, {cols}): no data")));
    }
    let mut ys = Vec::with_capacity(rows as usize);
    for r in 0..rows {
        let v = y.at(r, 0, rows, 1);
        if !(v.fract() == 0.0 && (0.0..65536.0).contains(&v)) {
            return Err(DataError::format(
                labels,
                format!("label {v} at index {r}: labels must be whole numbers 0..65535 (the classes)"),
            ));
        }
        ys.push(v as u32);
    }
    let classes = ys.iter().max().map_or(0, |&m| m + 1);
    if ys.iter().all(|&v| v == ys[0]) {
        return Err(DataError::format(labels, format!("one class only ({}): nothing to learn", ys[0])));
    }
    let shape =
        Shape { kind: Kind::Dense, rows, cols, nnz: 0, classes, users: 0, truth: Truth::None, scaled: false };
    let mut w = Writer::create(output, shape)?;
    let mut row = vec![0f32; cols as usize];
    for r in 0..rows {
        for (c, v) in row.iter_mut().enumerate() {
            let x = x.at(r, c as u64, rows, cols);
            *v = x as f32;
            if !v.is_finite() {
                let what = if x.is_nan() { "a missing value (NaN)" } else { "not a finite float32" };
                return Err(DataError::format(features, format!("row {r}, column {c}: {x} is {what}")));
            }
        }
        w.write(0, &row)?;
    }
    w.write(1, &ys)?;
    w.finish()?;
    Ok(NpyConverted { rows, cols, classes, dtypes: (x.dtype.name(), y.dtype.name()) })
}

#[cfg(test)]
mod tests;
