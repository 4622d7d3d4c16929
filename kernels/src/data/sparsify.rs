//! A dense two-class dataset rewritten as a sparse binary-labelled one (zeros not stored), for
//! logistic regression on data that arrived as CSV or NumPy arrays.

use std::path::Path;

use super::format::{Dataset, Kind, Shape, Truth, Writer};
use super::libsvm::Converted;
use super::{DataError, Result};

/// Writes dense dataset `input` (two classes: class 1 is the positive label) to `output` as a
/// sparse binary-labelled dataset holding its nonzero features.
pub fn sparsify(input: &Path, output: &Path) -> Result<Converted> {
    let d = Dataset::open(input)?;
    let x = d.dense().map_err(|_| DataError::WrongKind {
        path: input.into(),
        expected: "dense dataset",
        found: d.kind().name(),
    })?;
    if x.classes != 2 {
        return Err(DataError::format(
            input,
            format!("{} classes: a sparse binary-labelled dataset needs two", x.classes),
        ));
    }
    let cols = x.cols.max(1);
    let mut row_ptr = Vec::with_capacity(x.len() + 1);
    row_ptr.push(0u64);
    for row in x.features.chunks_exact(cols) {
        let n = row.iter().filter(|&&v| v != 0.0).count() as u64;
        row_ptr.push(row_ptr[row_ptr.len() - 1] + n);
    }
    let nnz = row_ptr[x.len()];
    let shape = Shape {
        kind: Kind::Sparse,
        rows: x.len() as u64,
        cols: x.cols as u64,
        nnz,
        classes: 2,
        users: 0,
        truth: Truth::None,
        scaled: false,
    };
    let mut w = Writer::create(output, shape)?;
    w.write(0, &row_ptr)?;
    drop(row_ptr);
    let mut buf = Vec::with_capacity(1 << 16);
    for row in x.features.chunks_exact(cols) {
        buf.extend((0..x.cols as u32).filter(|&j| row[j as usize] != 0.0));
        if buf.len() >= 1 << 16 {
            w.write(1, &buf)?;
            buf.clear();
        }
    }
    w.write(1, &buf)?;
    let mut vals: Vec<f32> = Vec::with_capacity(1 << 16);
    for row in x.features.chunks_exact(cols) {
        vals.extend(row.iter().filter(|&&v| v != 0.0));
        if vals.len() >= 1 << 16 {
            w.write(2, &vals)?;
            vals.clear();
        }
    }
    w.write(2, &vals)?;
    let labels: Vec<f32> = x.labels.iter().map(|&y| y as f32).collect();
    w.write(3, &labels)?;
    w.finish()?;
    Ok(Converted { rows: x.len() as u64, cols: x.cols as u64, nnz, input_bytes: 0 })
}
