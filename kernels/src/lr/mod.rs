//! Binary logistic regression over sparse CSR rows, labels `y_i` in {0, 1}.
//!
//! With margin `z_i = x_i . w` and `sigmoid(z) = 1 / (1 + exp(-z))`, the summed log-loss is
//! `L(w) = sum_i [log(1 + exp(z_i)) - y_i z_i]`, computed in the stable form
//! `max(z, 0) + log1p(exp(-|z|)) - y z`, and its gradient is `X^T (sigmoid(Xw) - y)`. The kernels
//! return `L` and *accumulate* the gradient into the caller's buffer (they do not zero it), so one
//! buffer can sum several chunks; the caller divides by `n` and adds [`add_l2`] as it sees fit:
//! `g <- X^T (sigmoid(Xw) - y) / n + l2 * w`.
//!
//! - [`scalar`]: the reference, one row at a time, strictly sequential margin, `f64` libm
//!   `exp`/`log1p` per row.
//! - [`simd`]: the public functions. The margin is a gather (`w[idx]` at random indices, which
//!   `wide` cannot load as a vector), so it runs as four independent scalar FMA chains; the
//!   per-row transcendental part (`exp`, `log1p`, a division) runs 8 rows at a time in `f32x8`.
//!   The scatter `grad[j] += g v` stays scalar.
//!
//! The `*_penalized` functions also add `l2 * w[j]` at every nonzero of feature `j` in the same
//! scatter (the lazy L2 of a chunk's features, once per occurrence), where a pass of its own over
//! the nonzeros after the kernel cost a second read-modify-write of the gradient per nonzero: LR
//! on Adult (14 nonzeros a row) computed 1.3x as many rows a second with it fused.
//!
//! With an intercept (the `*_intercept` functions) the margin is `z_i = x_i . w + b`, `b` the
//! last element of `w` (a weight no feature index reaches), and its gradient `sum_i (sigmoid(z_i)
//! - y_i)` goes into the last element of the gradient.
//!
//! Feature indices must be `< w.len()` (`< w.len() - 1` with an intercept); a larger one panics
//! (bounds-checked indexing, no unsafe).

pub mod scalar;
pub mod simd;

pub use simd::{
    loss_grad_dense, loss_grad_dense_intercept, loss_grad_dense_penalized, loss_grad_sparse,
    loss_grad_sparse_intercept, loss_grad_sparse_penalized, margin, predict, predict_intercept,
};

/// The feature weights and the intercept of `w`: all of `w` and 0 without one, else all but its
/// last element and that element.
///
/// # Panics
/// If `intercept` and `w` is empty.
#[inline]
pub(crate) fn split_intercept(w: &[f32], intercept: bool) -> (&[f32], f32) {
    if intercept {
        let (b, w) = w.split_last().expect("a model with an intercept has at least one weight");
        (w, *b)
    } else {
        (w, 0.0)
    }
}

/// A view of some consecutive rows of a CSR matrix.
///
/// Row `r` spans `row_ptr[r] - row_ptr[0] .. row_ptr[r + 1] - row_ptr[0]` of `indices` and
/// `values`: `row_ptr` may be a sub-slice of a bigger dataset's row pointers (it has
/// `n_rows + 1` entries), while `indices` and `values` start at the first row's first entry.
#[derive(Debug, Clone, Copy)]
pub struct Csr<'a> {
    /// `n_rows + 1` non-decreasing offsets (absolute offsets in the full dataset).
    pub row_ptr: &'a [u64],
    /// Feature index of each nonzero.
    pub indices: &'a [u32],
    /// Value of each nonzero.
    pub values: &'a [f32],
}

impl<'a> Csr<'a> {
    /// Number of rows (`row_ptr.len() - 1`, 0 for an empty `row_ptr`).
    pub fn n_rows(&self) -> usize {
        self.row_ptr.len().saturating_sub(1)
    }

    /// Number of nonzeros of the view (`row_ptr[n_rows] - row_ptr[0]`).
    pub fn nnz(&self) -> usize {
        match (self.row_ptr.first(), self.row_ptr.last()) {
            (Some(first), Some(last)) => (last - first) as usize,
            _ => 0,
        }
    }

    /// Indices and values of row `r`.
    ///
    /// # Panics
    /// If `r >= n_rows()` or the row pointers reach past `indices`/`values`.
    #[inline]
    pub fn row(&self, r: usize) -> (&'a [u32], &'a [f32]) {
        let base = self.row_ptr[0];
        let (s, e) = ((self.row_ptr[r] - base) as usize, (self.row_ptr[r + 1] - base) as usize);
        (&self.indices[s..e], &self.values[s..e])
    }
}

/// A gradient that holds `(index, value)` pairs for the touched features only.
///
/// Storage: a dense `Vec<f32>` of the model's dimension (zero outside the touched features), a
/// touched bitmap (one bit per feature: 8 KiB per 65,536 features, so it stays in L1), and a
/// touched-index list with room for every feature. [`SparseGrad::scatter`] is branch-free: the
/// value's read-modify-write, an `|=` on the bitmap word, and an unconditional write at the end of
/// the list whose length grows by one on a first touch. [`SparseGrad::clear`] walks the list
/// (`O(touched)`). All buffers (about 8 bytes per feature) are allocated by [`SparseGrad::new`];
/// nothing allocates afterwards.
///
/// It runs at about half the dense gradient's rate (`lr_grad/sparse_simd_mb256` against
/// `lr_grad/dense_simd`): the longer loop keeps fewer of the L2-missing read-modify-writes in
/// flight. Measured and dropped (slower): a `bool` marker per feature with a branch on it;
/// epoch-stamped `(stamp, value)` cells with an `O(1)` clear (twice the cache footprint); a bitmap
/// with a summary level walked on clear; splitting the values and the marks into two passes.
#[derive(Debug, Clone)]
pub struct SparseGrad {
    /// `g[j]`; zero for untouched features.
    dense: Vec<f32>,
    /// Bit `j % 64` of word `j / 64`: feature `j` is touched.
    bits: Vec<u64>,
    /// Touched indices in first-touch order are `touched[..len]`; `touched.len() == dim + 1`
    /// so that the unconditional write after the last touched index stays in bounds.
    touched: Vec<u32>,
    len: usize,
}

impl SparseGrad {
    /// An empty gradient over `dim` features.
    ///
    /// # Panics
    /// If `dim > u32::MAX` (feature indices are `u32`).
    pub fn new(dim: usize) -> Self {
        assert!(u32::try_from(dim).is_ok(), "SparseGrad: dim {dim} does not fit u32 indices");
        SparseGrad {
            dense: vec![0.0; dim],
            bits: vec![0; dim.div_ceil(64)],
            touched: vec![0; dim + 1],
            len: 0,
        }
    }

    /// Number of features (the model's dimension).
    pub fn dim(&self) -> usize {
        self.dense.len()
    }

    /// Number of touched features.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no feature is touched.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `g[j] += v`, marking `j` as touched.
    ///
    /// # Panics
    /// If `j >= dim()`.
    #[inline]
    pub fn add(&mut self, j: u32, v: f32) {
        self.scatter(&[j], &[v], 1.0);
    }

    /// `g[indices[k]] += coef * values[k]` for every `k`: the kernels' scatter of one row.
    ///
    /// # Panics
    /// If an index is `>= dim()`.
    #[inline]
    pub fn scatter(&mut self, indices: &[u32], values: &[f32], coef: f32) {
        self.scatter_with(indices, values, |_, v| coef * v);
    }

    /// `g[indices[k]] += f(indices[k], values[k])` for every `k`, marking the features touched.
    #[inline(always)]
    fn scatter_with(&mut self, indices: &[u32], values: &[f32], f: impl Fn(u32, f32) -> f32) {
        let (dense, bits, touched) = (&mut self.dense[..], &mut self.bits[..], &mut self.touched[..]);
        let mut len = self.len;
        for (&j, &v) in indices.iter().zip(values) {
            let ju = j as usize;
            dense[ju] += f(j, v);
            let (word, bit) = (&mut bits[ju / 64], 1u64 << (ju % 64));
            let fresh = *word & bit == 0;
            *word |= bit;
            // `len <= dim` (a feature enters the list once) and `touched.len() == dim + 1`.
            touched[len] = j;
            len += usize::from(fresh);
        }
        self.len = len;
    }

    /// `g[j]` (0 for an untouched feature).
    ///
    /// # Panics
    /// If `j >= dim()`.
    pub fn get(&self, j: u32) -> f32 {
        self.dense[j as usize]
    }

    /// `g` over every feature (zero where untouched).
    pub fn values(&self) -> &[f32] {
        &self.dense
    }

    /// Indices of the touched features, in first-touch order.
    pub fn indices(&self) -> &[u32] {
        &self.touched[..self.len]
    }

    /// `(index, value)` of the touched features, in first-touch order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.indices().iter().map(|&j| (j, self.dense[j as usize]))
    }

    /// Lazy L2 on the touched features only: `g[j] <- g[j] + l2 * w[j]` for touched `j`.
    ///
    /// # Panics
    /// If `w.len() != dim()`.
    pub fn add_l2_touched(&mut self, w: &[f32], l2: f32) {
        assert_eq!(w.len(), self.dim(), "add_l2_touched: w has the wrong dimension");
        for &j in &self.touched[..self.len] {
            self.dense[j as usize] += l2 * w[j as usize];
        }
    }

    /// Hands `scale * g` over to a caller's empty sparse vector and leaves this gradient empty, in
    /// `O(len())`: the touched values are scaled in place, the value and bitmap buffers trade
    /// places with `dense` and `bits` (all zeros, as an empty vector's are: they become this
    /// gradient's), and the touched indices, in first-touch order, are appended to `list`. What
    /// adding into the empty vector and [`clear`](Self::clear)ing would give, without the second
    /// scattered pass over each buffer.
    ///
    /// # Panics
    /// If `dense` or `bits` are not this gradient's lengths, or `list` is not empty.
    pub fn trade(&mut self, scale: f32, dense: &mut Vec<f32>, bits: &mut Vec<u64>, list: &mut Vec<u32>) {
        assert_eq!(dense.len(), self.dense.len(), "trade: the values are not the gradient's length");
        assert_eq!(bits.len(), self.bits.len(), "trade: the bitmap is not the gradient's length");
        assert!(list.is_empty(), "trade: the receiving vector is not empty");
        debug_assert!(dense.iter().all(|&v| v == 0.0) && bits.iter().all(|&w| w == 0));
        let touched = &self.touched[..self.len];
        if scale != 1.0 {
            for &j in touched {
                self.dense[j as usize] *= scale;
            }
        }
        list.extend_from_slice(touched);
        std::mem::swap(&mut self.dense, dense);
        std::mem::swap(&mut self.bits, bits);
        self.len = 0;
    }

    /// Zeroes and forgets the touched features, in `O(len())`; keeps every buffer.
    pub fn clear(&mut self) {
        for &j in &self.touched[..self.len] {
            self.dense[j as usize] = 0.0;
            self.bits[j as usize / 64] = 0;
        }
        self.len = 0;
    }
}

/// Where a kernel scatters a row's `coef * x_i`: a dense gradient or a [`SparseGrad`].
pub(crate) trait GradSink {
    /// `g[indices[k]] += coef * values[k]` for every `k`.
    fn scatter(&mut self, indices: &[u32], values: &[f32], coef: f32);

    /// `g[j] += coef * values[k] + l2 * w[j]` for every `k`, `j = indices[k]`: the row's scatter
    /// and the lazy L2 of its features in one pass.
    fn scatter_l2(&mut self, indices: &[u32], values: &[f32], coef: f32, w: &[f32], l2: f32);
}

impl GradSink for [f32] {
    #[inline(always)]
    fn scatter(&mut self, indices: &[u32], values: &[f32], coef: f32) {
        for (&j, &v) in indices.iter().zip(values) {
            self[j as usize] += coef * v;
        }
    }

    #[inline(always)]
    fn scatter_l2(&mut self, indices: &[u32], values: &[f32], coef: f32, w: &[f32], l2: f32) {
        for (&j, &v) in indices.iter().zip(values) {
            self[j as usize] += coef.mul_add(v, l2 * w[j as usize]);
        }
    }
}

impl GradSink for SparseGrad {
    #[inline(always)]
    fn scatter(&mut self, indices: &[u32], values: &[f32], coef: f32) {
        SparseGrad::scatter(self, indices, values, coef);
    }

    #[inline(always)]
    fn scatter_l2(&mut self, indices: &[u32], values: &[f32], coef: f32, w: &[f32], l2: f32) {
        SparseGrad::scatter_with(self, indices, values, |j, v| coef.mul_add(v, l2 * w[j as usize]));
    }
}

/// `grad <- grad + l2 * w` (the gradient of `0.5 * l2 * |w|^2`).
///
/// # Panics
/// If `w.len() != grad.len()`.
pub fn add_l2(w: &[f32], grad: &mut [f32], l2: f32) {
    crate::dense::axpy(l2, w, grad);
}

#[cfg(test)]
mod tests;
