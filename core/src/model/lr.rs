//! Binary logistic regression over sparse rows: a worker reads and updates only the weights of
//! the features its rows touch.

use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Dataset, Kind, SparseRows};
use peregrine_kernels::lr::{self, Csr, SparseGrad};

use super::{
    Baseline, Block, Built, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError, Sets,
};

/// Logistic regression: `p(y = 1 | x) = sigmoid(w . x + b)`, log-loss. The intercept `b` (on
/// by default) is the last parameter, after the feature weights; every chunk reads and updates
/// it.
#[derive(Debug)]
pub struct LogReg {
    data: Sets,
    lr: f32,
    /// Feature weights (the dataset's columns).
    dim: usize,
    intercept: bool,
    /// L2 weight of the feature weights (not of the intercept), applied where rows touch them.
    l2: f32,
    /// Hashed features ([`with_hash_bits`](Self::with_hash_bits)): the bits of a bucket.
    hash_bits: Option<u32>,
}

/// The most bits of hashed features (`--hash-bits`): 2^28 weights, 1 GiB of f32 a window.
pub const MAX_HASH_BITS: u32 = 28;

/// Feature `j`'s bucket among `2^bits`: Fibonacci hashing (the top bits of `j` times 2^64 over
/// the golden ratio), which spreads neighbouring and strided ids alike.
#[inline(always)]
pub fn bucket(j: u32, bits: u32) -> u32 {
    (u64::from(j).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as u32
}

thread_local! {
    /// A compute thread's hashed copy of a chunk's feature ids.
    static HASHED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl LogReg {
    /// Trains on the sparse dataset `train` with learning rate `lr`, with an intercept if
    /// `intercept`; evaluates on `eval` (the training set if `None`).
    pub fn new(train: &Path, eval: Option<&Path>, lr: f32, intercept: bool) -> Built<Self> {
        let data = Sets::open(train, eval, Kind::Sparse)?;
        if let Some(e) = data.given_eval() {
            super::same_cols(&data.train, e)?;
        }
        let dim = data.train.header().cols as usize;
        Ok(Self { data, lr, dim, intercept, l2: 0.0, hash_bits: None })
    }

    /// As [`new`](Self::new), with hashed features: `2^bits` weights, feature `j` read and
    /// updated at [`bucket`]`(j, bits)` whatever the dataset's columns (ids up to 2^32 - 1,
    /// LIBSVM's or raw ones), so that the model's size is the user's choice, not the data's;
    /// features that share a bucket share its weight (no sign hashing). `bits` from 1 to
    /// [`MAX_HASH_BITS`]; the evaluation set may have any columns.
    pub fn with_hashing(
        train: &Path,
        eval: Option<&Path>,
        lr: f32,
        intercept: bool,
        bits: u32,
    ) -> Built<Self> {
        if !(1..=MAX_HASH_BITS).contains(&bits) {
            return Err(ModelError::Unfit(format!(
                "hash bits must be from 1 to {MAX_HASH_BITS}, got {bits}"
            )));
        }
        let data = Sets::open(train, eval, Kind::Sparse)?;
        Ok(Self { data, lr, dim: 1 << bits, intercept, l2: 0.0, hash_bits: Some(bits) })
    }

    /// Reading its training and evaluation sets standardized by `scaling` (`peregrine train
    /// --standardize`, and `predict` with such a model): copies of them in memory, the size of
    /// the sets.
    pub fn standardized(mut self, scaling: &peregrine_kernels::data::standardize::Scaling) -> Built<Self> {
        self.data.standardize(scaling)?;
        Ok(self)
    }

    /// With L2 regularization of the feature weights (not of the intercept), in the sparse-SGD
    /// form: each row adds `l2 w_j` to the gradient of every feature `j` it touches, so the
    /// iteration's mean gradient gets `l2 w_j` times the share of rows touching `j` (a rare
    /// feature is held back less; untouched weights are left alone).
    #[must_use]
    pub fn with_l2(self, l2: f32) -> Self {
        Self { l2, ..self }
    }

    /// Runs `f` with `x`'s rows whose feature ids are their buckets, if hashed (a copy of the
    /// ids in this thread's buffer), else as they are.
    fn hashed<R>(&self, x: &SparseRows<'_>, f: impl FnOnce(Csr<'_>) -> R) -> R {
        let Some(bits) = self.hash_bits else { return f(csr(x)) };
        HASHED.with_borrow_mut(|h| {
            h.clear();
            h.extend(x.indices.iter().map(|&j| bucket(j, bits)));
            f(Csr { row_ptr: x.row_ptr, indices: h, values: x.values })
        })
    }

    /// With `features` feature weights (at least the dataset's columns): a model trained on more
    /// features than a file to predict holds.
    pub fn with_features(self, features: usize) -> Built<Self> {
        if features < self.dim {
            return Err(ModelError::Unfit(format!(
                "{} has {} features, the model {features} (convert it with --features {features})",
                self.data.eval().path().display(),
                self.dim
            )));
        }
        Ok(Self { dim: features, ..self })
    }

    /// Parameters: the feature weights, then the intercept if there is one.
    fn params(&self) -> usize {
        self.dim + usize::from(self.intercept)
    }

    fn rows_of(d: &Dataset) -> SparseRows<'_> {
        d.sparse().expect("the kind is checked when the model is built")
    }
}

fn csr<'a>(x: &SparseRows<'a>) -> Csr<'a> {
    Csr { row_ptr: x.row_ptr, indices: x.indices, values: x.values }
}

/// A thread's gradient: dense for models up to [`DENSE_GRAD_MAX`] weights (no bookkeeping of
/// touched features; Adult's 122 weights), sparse above.
#[derive(Debug)]
pub enum Grad {
    /// Every weight.
    Dense(Vec<f32>),
    /// Touched weights only.
    Sparse(SparseGrad),
}

/// Largest model whose per-thread gradient is dense.
pub const DENSE_GRAD_MAX: usize = 1 << 16;

impl Model for LogReg {
    type Work = Grad;

    fn name(&self) -> &'static str {
        "lr"
    }

    fn layout(&self) -> Layout {
        Layout { params: self.params(), width: 1 }
    }

    fn rows(&self) -> usize {
        self.data.train.rows()
    }

    fn eval_rows(&self) -> usize {
        self.data.eval().rows()
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    fn init(&self, _seed: u64, _range: Range<usize>, out: &mut [f32]) {
        out.fill(0.0);
    }

    fn sparse(&self) -> bool {
        true
    }

    fn keys(&self, rows: Range<usize>, set: &mut KeySet) {
        let x = Self::rows_of(&self.data.train).rows(rows);
        match self.hash_bits {
            Some(bits) => x.indices.iter().for_each(|&j| set.insert(bucket(j, bits))),
            None => set.extend(x.indices),
        }
        if self.intercept {
            set.insert(self.dim as u32);
        }
    }

    fn work(&self, _chunk: usize) -> Grad {
        if self.params() <= DENSE_GRAD_MAX {
            Grad::Dense(vec![0.0; self.params()])
        } else {
            Grad::Sparse(SparseGrad::new(self.params()))
        }
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Grad) -> f64 {
        let x = Self::rows_of(&self.data.train).rows(rows);
        // The L2 of the rows' features, once per occurrence (lazy: untouched features are not
        // penalized), in the kernel's scatter.
        self.hashed(&x, |c| match work {
            Grad::Dense(g) => lr::loss_grad_dense_penalized(c, x.labels, params, g, self.intercept, self.l2),
            Grad::Sparse(g) => {
                lr::loss_grad_sparse_penalized(c, x.labels, params, g, self.intercept, self.l2)
            }
        })
    }

    fn drain(&self, work: &mut Grad, scale: f32, delta: &mut Delta) {
        match work {
            Grad::Dense(g) => {
                for (j, v) in g.iter_mut().enumerate() {
                    if *v != 0.0 {
                        delta.add(j as u32, scale, &[*v]);
                        *v = 0.0;
                    }
                }
            }
            Grad::Sparse(g) => delta.take_sparse(scale, g),
        }
    }

    fn scale(&self, rows: usize) -> f32 {
        -self.lr / rows.max(1) as f32
    }

    fn lr(&self) -> Option<f32> {
        Some(self.lr)
    }

    fn unpenalized(&self) -> Range<usize> {
        if self.intercept {
            self.dim..self.dim + 1
        } else {
            0..0
        }
    }

    fn baseline(&self) -> Baseline {
        let y = Self::rows_of(self.data.eval()).labels;
        let ones = y.iter().filter(|&&y| y > 0.5).count() as f64 / y.len().max(1) as f64;
        Baseline { blind_loss: std::f64::consts::LN_2, constant_metric: ones.max(1.0 - ones) }
    }

    /// The log-loss from each row's margin in the stable form the training kernels use (no
    /// clamped probabilities: a confidently wrong row costs its full margin, so runs that differ
    /// report different losses).
    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        // The evaluation set may have fewer columns; it never has more (checked), unless hashed.
        let (w, b) = if self.intercept { (&params[..self.dim], params[self.dim]) } else { (params, 0.0) };
        self.hashed(&x, |c| {
            let (mut loss, mut right) = (0.0f64, 0.0f64);
            for (r, &y) in x.labels.iter().enumerate() {
                let (idx, val) = c.row(r);
                let z = lr::margin(idx, val, w) + b;
                loss += lr::scalar::logistic(z, y).0;
                right += f64::from(u8::from((z > 0.0) == (y > 0.5)));
            }
            [loss, right, x.len() as f64]
        })
    }
}

impl Export for LogReg {
    fn blocks(&self) -> Vec<Block> {
        let mut b = vec![Block::new("weight", &[self.dim], 0)];
        if self.intercept {
            b.push(Block::new("bias", &[1], self.dim));
        }
        b
    }

    fn outputs(&self) -> Vec<String> {
        vec!["probability".into()]
    }

    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>) {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let at = out.len();
        out.resize(at + x.len(), 0.0);
        self.hashed(&x, |c| {
            if self.intercept {
                lr::predict_intercept(c, params, &mut out[at..]);
            } else {
                lr::predict(c, params, &mut out[at..]);
            }
        });
    }

    fn label(&self, row: usize) -> String {
        let y = Self::rows_of(self.data.eval()).labels[row];
        format!("{y}")
    }
}
