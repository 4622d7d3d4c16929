//! Standardization: features shifted and scaled by statistics of a training file, the same
//! transformation applied to other files, and recorded in each output (the scaling section of
//! the format) so that it can be applied again later (`--like`).
//!
//! Dense datasets: every feature centred on its mean and divided by its standard deviation
//! (population, as scikit-learn's `StandardScaler`). Sparse datasets keep their zeros: a feature
//! every row stores (a dense column, e.g. LIBSVM text of dense data) is centred and scaled like a
//! dense one; any other is only divided by its standard deviation counting the rows that do not
//! store it as zeros (scikit-learn's `StandardScaler(with_mean=False)`), so one-hot data stays
//! sparse. A feature with no spread (constant, or never present) keeps multiplier 1.

use std::path::Path;

use super::format::{Dataset, Kind, Shape, Truth, Writer};
use super::libsvm::Converted;
use super::{DataError, Result};

/// Shifts and multipliers, one per feature: `x = (raw - shift) * multiplier`.
#[derive(Clone, Debug, PartialEq)]
pub struct Scaling {
    /// Subtracted first.
    pub shift: Vec<f32>,
    /// Then multiplied by.
    pub mult: Vec<f32>,
}

impl Scaling {
    /// Bytes that standardizing a dataset of `cols` features holds: per feature the statistics
    /// (a count, a mean and a sum of squares, 8 bytes each), the scaling (4 and 4) and a dense
    /// row's value (4).
    pub fn memory(cols: u64) -> u128 {
        36 * u128::from(cols)
    }

    /// The statistics of `d` (sparse or dense, not already standardized).
    pub fn fit(d: &Dataset) -> Result<Self> {
        not_scaled(d)?;
        let all = 0..d.rows();
        let sums = Sums::of(d, all.clone())?;
        let mean = sums.means(d.rows());
        let sq = deviations(d, all, &mean)?;
        Ok(Self::from_moments(d.rows(), &sums.count, &mean, &sq))
    }

    /// The scaling of `rows` rows whose features have stored-value counts `count`, means `mean`
    /// (over all rows, implicit zeros included) and summed squared deviations `sq` (likewise):
    /// the features stored in every row are centred, every feature with a spread is divided by
    /// its standard deviation, one without keeps multiplier 1.
    pub fn from_moments(rows: usize, count: &[f64], mean: &[f64], sq: &[f64]) -> Self {
        let n = rows.max(1) as f64;
        let cols = mean.len();
        let mut s = Self { shift: vec![0.0; cols], mult: vec![1.0; cols] };
        for j in 0..cols {
            let sd = (sq[j] / n).sqrt();
            if sd > 0.0 && (sd as f32).is_normal() {
                s.mult[j] = (1.0 / sd) as f32;
            }
            if count[j] == rows as f64 {
                s.shift[j] = mean[j] as f32;
            }
        }
        s
    }

    /// The scaling recorded in standardized dataset `d`.
    pub fn recorded(d: &Dataset) -> Result<Self> {
        let (shift, mult) = d.scaling().ok_or_else(|| {
            DataError::format(
                d.path(),
                "holds no scaling record: it was not made by `peregrine data standardize`",
            )
        })?;
        Ok(Self { shift: shift.to_vec(), mult: mult.to_vec() })
    }

    /// Features.
    pub fn cols(&self) -> usize {
        self.shift.len()
    }

    #[inline]
    fn apply(&self, j: usize, v: f32) -> f32 {
        (v - self.shift[j]) * self.mult[j]
    }
}

/// Per-feature sums over some rows of a dataset, the first pass of its statistics: values
/// stored, their sum and the sum of their squares (f64: exact counts, and sums that ranks can
/// add up).
#[derive(Clone, Debug, PartialEq)]
pub struct Sums {
    /// Values stored (rows, for dense data).
    pub count: Vec<f64>,
    /// Sum of the stored values.
    pub sum: Vec<f64>,
    /// Sum of their squares.
    pub squares: Vec<f64>,
    /// The largest magnitude stored.
    pub max_abs: Vec<f64>,
}

impl Sums {
    /// The sums over rows `rows` of `d` (sparse or dense).
    pub fn of(d: &Dataset, rows: std::ops::Range<usize>) -> Result<Self> {
        let cols = d.header().cols as usize;
        let mut s = Self {
            count: vec![0.0; cols],
            sum: vec![0.0; cols],
            squares: vec![0.0; cols],
            max_abs: vec![0.0; cols],
        };
        let mut add = |j: usize, v: f32| {
            let v = f64::from(v);
            s.count[j] += 1.0;
            s.sum[j] += v;
            s.squares[j] += v * v;
            s.max_abs[j] = s.max_abs[j].max(v.abs());
        };
        match d.kind() {
            Kind::Dense => {
                let x = d.dense()?.rows(rows);
                for row in x.features.chunks_exact(cols.max(1)) {
                    row.iter().enumerate().for_each(|(j, &v)| add(j, v));
                }
            }
            Kind::Sparse => {
                let x = d.sparse()?.rows(rows);
                x.indices.iter().zip(x.values).for_each(|(&j, &v)| add(j as usize, v));
            }
            Kind::Ratings => return Err(no_features(d.path())),
        }
        Ok(s)
    }

    /// Per-feature means over `rows` rows (implicit zeros included).
    pub fn means(&self, rows: usize) -> Vec<f64> {
        let n = rows.max(1) as f64;
        self.sum.iter().map(|s| s / n).collect()
    }
}

/// The second pass: per feature, the summed squared deviations from `mean` over rows `rows` of
/// `d`, implicit zeros (sparse) included.
pub fn deviations(d: &Dataset, rows: std::ops::Range<usize>, mean: &[f64]) -> Result<Vec<f64>> {
    let mut sq = vec![0f64; mean.len()];
    match d.kind() {
        Kind::Dense => {
            let x = d.dense()?.rows(rows);
            for row in x.features.chunks_exact(x.cols.max(1)) {
                for ((s, &v), m) in sq.iter_mut().zip(row).zip(mean) {
                    *s += (f64::from(v) - m).powi(2);
                }
            }
        }
        Kind::Sparse => {
            let x = d.sparse()?.rows(rows);
            let mut count = vec![0usize; mean.len()];
            for (&j, &v) in x.indices.iter().zip(x.values) {
                count[j as usize] += 1;
                sq[j as usize] += (f64::from(v) - mean[j as usize]).powi(2);
            }
            for j in 0..mean.len() {
                sq[j] += (x.len() - count[j]) as f64 * mean[j] * mean[j];
            }
        }
        Kind::Ratings => return Err(no_features(d.path())),
    }
    Ok(sq)
}

/// An error if `d` holds a scaling record (standardizing it again would compound the scalings).
fn not_scaled(d: &Dataset) -> Result<()> {
    if d.scaling().is_some() {
        return Err(DataError::format(
            d.path(),
            "is standardized already (it holds a scaling record); standardize the file it was made from",
        ));
    }
    Ok(())
}

/// `d` standardized by `scaling` into memory (huge pages asked for if `huge`), as [`apply`]
/// would write it but with no scaling record, for training on the fly: the rows the kernels read
/// are the standardized ones, and the user's file is left as it is. Costs the size of the copy.
pub fn standardized(d: &Dataset, scaling: &Scaling, huge: bool) -> Result<Dataset> {
    not_scaled(d)?;
    fits(d, scaling)?;
    let cols = scaling.cols();
    let mut shape = Shape {
        kind: d.kind(),
        rows: d.rows() as u64,
        cols: cols as u64,
        nnz: 0,
        classes: d.header().classes,
        users: 0,
        truth: Truth::None,
        scaled: false,
    };
    match d.kind() {
        Kind::Dense => {
            let x = d.dense()?;
            Dataset::build_in_memory(d.path(), shape, huge, |section, out| {
                match section {
                    0 => {
                        let out: &mut [f32] = bytemuck::cast_slice_mut(out);
                        for (dst, src) in
                            out.chunks_exact_mut(cols.max(1)).zip(x.features.chunks_exact(cols.max(1)))
                        {
                            for (j, (o, &v)) in dst.iter_mut().zip(src).enumerate() {
                                *o = scaling.apply(j, v);
                            }
                        }
                    }
                    1 => out.copy_from_slice(bytemuck::cast_slice(x.labels)),
                    _ => {}
                }
                Ok(())
            })
        }
        Kind::Sparse => {
            let centred: Vec<u32> = (0..cols as u32).filter(|&j| scaling.shift[j as usize] != 0.0).collect();
            let x = d.sparse()?;
            let base = x.row_ptr[0];
            let span = |r: usize| (x.row_ptr[r] - base) as usize..(x.row_ptr[r + 1] - base) as usize;
            let mut merged = Vec::new();
            shape.nnz = (0..x.len())
                .map(|r| {
                    let s = span(r);
                    merge(&x.indices[s.clone()], &x.values[s], &centred, &mut merged);
                    merged.len() as u64
                })
                .sum();
            Dataset::build_in_memory(d.path(), shape, huge, |section, out| {
                match section {
                    0 => {
                        let out: &mut [u64] = bytemuck::cast_slice_mut(out);
                        for r in 0..x.len() {
                            let s = span(r);
                            merge(&x.indices[s.clone()], &x.values[s], &centred, &mut merged);
                            out[r + 1] = out[r] + merged.len() as u64;
                        }
                    }
                    1 | 2 => {
                        let mut at = 0;
                        for r in 0..x.len() {
                            let s = span(r);
                            merge(&x.indices[s.clone()], &x.values[s], &centred, &mut merged);
                            let dst = &mut out[at..at + 4 * merged.len()];
                            if section == 1 {
                                let dst: &mut [u32] = bytemuck::cast_slice_mut(dst);
                                dst.iter_mut().zip(&merged).for_each(|(o, &(j, _))| *o = j);
                            } else {
                                let dst: &mut [f32] = bytemuck::cast_slice_mut(dst);
                                dst.iter_mut()
                                    .zip(&merged)
                                    .for_each(|(o, &(j, v))| *o = scaling.apply(j as usize, v));
                            }
                            at += 4 * merged.len();
                        }
                    }
                    3 => out.copy_from_slice(bytemuck::cast_slice(x.labels)),
                    _ => {}
                }
                Ok(())
            })
        }
        Kind::Ratings => Err(no_features(d.path())),
    }
}

/// An error unless `d`'s features fit `scaling`: as many, or (sparse) no more.
fn fits(d: &Dataset, scaling: &Scaling) -> Result<()> {
    let cols = d.header().cols as usize;
    let fits = match d.kind() {
        Kind::Sparse => cols <= scaling.cols(),
        _ => cols == scaling.cols(),
    };
    if !fits {
        return Err(DataError::format(
            d.path(),
            format!(
                "has {cols} features, the scaling {} (convert both files with the same --features)",
                scaling.cols()
            ),
        ));
    }
    Ok(())
}

/// Writes `input` standardized by `scaling` to `output`, with the scaling recorded. A sparse
/// input with fewer features than the scaling (a test file converted apart from its training
/// file) is widened to the scaling's feature count.
pub fn apply(input: &Path, scaling: &Scaling, output: &Path) -> Result<Converted> {
    let d = Dataset::open(input)?;
    not_scaled(&d)?;
    fits(&d, scaling)?;
    let cols = d.header().cols as usize;
    let mut shape = Shape {
        kind: d.kind(),
        rows: d.rows() as u64,
        cols: scaling.cols() as u64,
        nnz: 0,
        classes: d.header().classes,
        users: 0,
        truth: Truth::None,
        scaled: true,
    };
    match d.kind() {
        Kind::Dense => {
            let x = d.dense()?;
            let mut w = Writer::create(output, shape)?;
            let mut row = vec![0f32; cols];
            for src in x.features.chunks_exact(cols.max(1)) {
                for (j, (o, &v)) in row.iter_mut().zip(src).enumerate() {
                    *o = scaling.apply(j, v);
                }
                w.write(0, &row)?;
            }
            w.write(1, x.labels)?;
            w.write(5, &scaling.shift)?;
            w.write(5, &scaling.mult)?;
            w.finish()?;
        }
        Kind::Sparse => {
            // Centred features are stored in every output row (their zeros are no longer zero).
            let centred: Vec<u32> =
                (0..scaling.cols() as u32).filter(|&j| scaling.shift[j as usize] != 0.0).collect();
            let x = d.sparse()?;
            let base = x.row_ptr[0];
            let mut merged = Vec::new();
            let mut row_ptr = Vec::with_capacity(x.len() + 1);
            row_ptr.push(0u64);
            for r in 0..x.len() {
                let span = (x.row_ptr[r] - base) as usize..(x.row_ptr[r + 1] - base) as usize;
                merge(&x.indices[span.clone()], &x.values[span], &centred, &mut merged);
                row_ptr.push(row_ptr[r] + merged.len() as u64);
            }
            shape.nnz = row_ptr[x.len()];
            let mut w = Writer::create(output, shape)?;
            w.write(0, &row_ptr)?;
            drop(row_ptr);
            let (mut idx, mut val) = (Vec::new(), Vec::new());
            for r in 0..x.len() {
                let span = (x.row_ptr[r] - base) as usize..(x.row_ptr[r + 1] - base) as usize;
                merge(&x.indices[span.clone()], &x.values[span], &centred, &mut merged);
                idx.extend(merged.iter().map(|&(j, _)| j));
                if idx.len() >= 1 << 16 {
                    w.write(1, &idx)?;
                    idx.clear();
                }
            }
            w.write(1, &idx)?;
            for r in 0..x.len() {
                let span = (x.row_ptr[r] - base) as usize..(x.row_ptr[r + 1] - base) as usize;
                merge(&x.indices[span.clone()], &x.values[span], &centred, &mut merged);
                val.extend(merged.iter().map(|&(j, v)| scaling.apply(j as usize, v)));
                if val.len() >= 1 << 16 {
                    w.write(2, &val)?;
                    val.clear();
                }
            }
            w.write(2, &val)?;
            w.write(3, x.labels)?;
            w.write(5, &scaling.shift)?;
            w.write(5, &scaling.mult)?;
            w.finish()?;
        }
        Kind::Ratings => return Err(no_features(input)),
    }
    Ok(Converted { rows: d.rows() as u64, cols: scaling.cols() as u64, nnz: shape.nnz, input_bytes: 0 })
}

/// Ratings have nothing to standardize.
fn no_features(path: &Path) -> DataError {
    DataError::WrongKind {
        path: path.into(),
        expected: "sparse or dense dataset (ratings have no features to standardize)",
        found: "ratings",
    }
}

/// The row's stored `(index, value)` pairs with the centred features it lacks added as zeros,
/// in increasing index order.
fn merge(idx: &[u32], val: &[f32], centred: &[u32], out: &mut Vec<(u32, f32)>) {
    out.clear();
    let (mut i, mut c) = (0, 0);
    while i < idx.len() || c < centred.len() {
        match (idx.get(i), centred.get(c)) {
            (Some(&a), Some(&b)) if a == b => {
                out.push((a, val[i]));
                i += 1;
                c += 1;
            }
            (Some(&a), Some(&b)) if a < b => {
                out.push((a, val[i]));
                i += 1;
            }
            (Some(&a), None) => {
                out.push((a, val[i]));
                i += 1;
            }
            (_, Some(&b)) => {
                out.push((b, 0.0));
                c += 1;
            }
            (None, None) => unreachable!("the loop runs while one side has entries"),
        }
    }
}

#[cfg(test)]
mod tests;
