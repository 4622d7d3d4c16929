//! Seeded random train/test split of a dataset: the rows are shuffled and the first
//! `round(fraction * rows)` of the shuffled order form the test set. Both outputs keep the
//! shuffled order (so a training file read in order is already shuffled). Any kind of dataset;
//! the optional true-model section of generated data is not carried over, a scaling record is.

use std::path::Path;

use super::format::{Dataset, Kind, Shape, Truth, Writer};
use super::gen::Rng;
use super::{DataError, Result};

/// Rows written to each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Rows of the training set.
    pub train: u64,
    /// Rows of the test set.
    pub test: u64,
}

/// Splits `input` into `train` and `test` with `fraction` of the rows (`0 < fraction < 1`) in the
/// test set, shuffled with `seed`.
pub fn split(input: &Path, train: &Path, test: &Path, fraction: f64, seed: u64) -> Result<Split> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(DataError::format(input, format!("test fraction {fraction}: must be in (0, 1)")));
    }
    let d = Dataset::open(input)?;
    let n = d.rows();
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(seed, 0x5EED_5B17);
    rng.shuffle(&mut order);
    let n_test = ((fraction * n as f64).round() as usize).clamp(usize::from(n > 1), n.saturating_sub(1));
    let (te, tr) = order.split_at(n_test);
    write_rows(&d, tr, train)?;
    write_rows(&d, te, test)?;
    Ok(Split { train: tr.len() as u64, test: te.len() as u64 })
}

/// Writes rows `rows` of `d`, in that order, to `out`.
fn write_rows(d: &Dataset, rows: &[usize], out: &Path) -> Result<()> {
    let h = d.header();
    let mut shape = Shape {
        kind: d.kind(),
        rows: rows.len() as u64,
        cols: h.cols,
        nnz: 0,
        classes: h.classes,
        users: h.users,
        truth: Truth::None,
        scaled: d.scaling().is_some(),
    };
    // A standardized file's halves keep its scaling record.
    let scaling = |w: &mut Writer| -> Result<()> {
        if let Some((shift, mult)) = d.scaling() {
            w.write(5, shift)?;
            w.write(5, mult)?;
        }
        Ok(())
    };
    match d.kind() {
        Kind::Sparse => {
            let x = d.sparse()?;
            let base = x.row_ptr[0];
            let span = |r: usize| (x.row_ptr[r] - base) as usize..(x.row_ptr[r + 1] - base) as usize;
            shape.nnz = rows.iter().map(|&r| span(r).len() as u64).sum();
            let mut w = Writer::create(out, shape)?;
            let mut ptr = Vec::with_capacity(rows.len() + 1);
            ptr.push(0u64);
            for &r in rows {
                ptr.push(ptr[ptr.len() - 1] + span(r).len() as u64);
            }
            w.write(0, &ptr)?;
            for &r in rows {
                w.write(1, &x.indices[span(r)])?;
            }
            for &r in rows {
                w.write(2, &x.values[span(r)])?;
            }
            let labels: Vec<f32> = rows.iter().map(|&r| x.labels[r]).collect();
            w.write(3, &labels)?;
            scaling(&mut w)?;
            w.finish()
        }
        Kind::Dense => {
            let x = d.dense()?;
            let mut w = Writer::create(out, shape)?;
            for &r in rows {
                w.write(0, &x.features[r * x.cols..(r + 1) * x.cols])?;
            }
            let labels: Vec<u32> = rows.iter().map(|&r| x.labels[r]).collect();
            w.write(1, &labels)?;
            scaling(&mut w)?;
            w.finish()
        }
        Kind::Ratings => {
            let x = d.ratings()?;
            let mut w = Writer::create(out, shape)?;
            w.write(0, &rows.iter().map(|&r| x.users[r]).collect::<Vec<_>>())?;
            w.write(1, &rows.iter().map(|&r| x.items[r]).collect::<Vec<_>>())?;
            w.write(2, &rows.iter().map(|&r| x.ratings[r]).collect::<Vec<_>>())?;
            w.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::gen::{self, DenseSpec, RatingsSpec, SparseSpec};

    /// A scratch directory, removed when the test ends.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("peregrine-split-{name}-")).tempdir().expect("tmp dir")
    }

    #[test]
    fn every_row_lands_on_exactly_one_side() {
        let dir_tmp = tmp("rows");
        let dir = dir_tmp.path();
        let src = dir.join("r.pgd");
        gen::ratings(&RatingsSpec { rows: 1000, users: 50, items: 40, rank: 3, noise: 0.1, seed: 3 }, &src)
            .expect("gen");
        let (a, b) = (dir.join("a.pgd"), dir.join("b.pgd"));
        let s = split(&src, &a, &b, 0.1, 7).expect("split");
        assert_eq!(s, Split { train: 900, test: 100 });
        let key = |d: &Dataset| {
            let r = d.ratings().expect("ratings");
            let mut v: Vec<(u32, u32, u32)> =
                (0..r.len()).map(|i| (r.users[i], r.items[i], r.ratings[i].to_bits())).collect();
            v.sort_unstable();
            v
        };
        let orig = key(&Dataset::open(&src).expect("open"));
        let mut both = key(&Dataset::open(&a).expect("open"));
        both.extend(key(&Dataset::open(&b).expect("open")));
        both.sort_unstable();
        assert_eq!(both, orig);
        for p in [&a, &b] {
            Dataset::open(p).expect("open").verify().expect("valid");
        }
    }

    #[test]
    fn sparse_and_dense_rows_move_whole() {
        let dir_tmp = tmp("kinds");
        let dir = dir_tmp.path();
        let (s, d) = (dir.join("s.pgd"), dir.join("d.pgd"));
        gen::sparse(&SparseSpec { rows: 300, cols: 50, nnz_per_row: 5, zipf: 1.1, seed: 1 }, &s)
            .expect("gen");
        gen::dense(&DenseSpec { rows: 200, cols: 6, classes: 3, noise: 0.1, seed: 1 }, &d).expect("gen");
        for src in [&s, &d] {
            let (a, b) = (dir.join("a.pgd"), dir.join("b.pgd"));
            let sp = split(src, &a, &b, 0.25, 1).expect("split");
            let (da, db) = (Dataset::open(&a).expect("open"), Dataset::open(&b).expect("open"));
            da.verify().expect("valid");
            db.verify().expect("valid");
            assert_eq!((da.rows() as u64, db.rows() as u64), (sp.train, sp.test));
            let orig = Dataset::open(src).expect("open");
            assert_eq!(da.rows() + db.rows(), orig.rows());
            if let (Ok(x), Ok(y), Ok(o)) = (da.sparse(), db.sparse(), orig.sparse()) {
                assert_eq!(x.indices.len() + y.indices.len(), o.indices.len());
                let sum = |v: &[f32]| v.iter().map(|&f| f64::from(f)).sum::<f64>();
                assert!((sum(x.values) + sum(y.values) - sum(o.values)).abs() < 1e-3);
            }
            if let (Ok(x), Ok(y), Ok(o)) = (da.dense(), db.dense(), orig.dense()) {
                let sum = |v: &[f32]| v.iter().map(|&f| f64::from(f)).sum::<f64>();
                assert!((sum(x.features) + sum(y.features) - sum(o.features)).abs() < 1e-2);
            }
        }
    }

    #[test]
    fn bad_fractions_are_errors() {
        let dir_tmp = tmp("bad");
        let dir = dir_tmp.path();
        let src = dir.join("r.pgd");
        gen::ratings(&RatingsSpec { rows: 10, users: 5, items: 4, rank: 2, noise: 0.1, seed: 3 }, &src)
            .expect("gen");
        for f in [0.0, 1.0, -0.5, f64::NAN] {
            let e = split(&src, &dir.join("a"), &dir.join("b"), f, 1).expect_err("bad fraction");
            assert!(e.to_string().contains("test fraction"), "{e}");
        }
    }
}
