//! Scalar reference: one row at a time, sequential margin, `f64` libm per row.

use super::{split_intercept, Csr, GradSink, SparseGrad};

/// `z = x . w = sum_k values[k] * w[indices[k]]`, summed strictly left to right.
///
/// # Panics
/// If `indices.len() != values.len()` or an index is `>= w.len()`.
pub fn margin(indices: &[u32], values: &[f32], w: &[f32]) -> f32 {
    assert_eq!(indices.len(), values.len(), "margin: indices and values differ in length");
    let mut z = 0.0f32;
    for (&j, &v) in indices.iter().zip(values) {
        z += v * w[j as usize];
    }
    z
}

/// Loss and gradient coefficient of one row: `(log(1 + exp(z)) - y z, sigmoid(z) - y)`.
///
/// Stable for any `z`: `log(1 + exp(z)) = max(z, 0) + log1p(exp(-|z|))`, and `sigmoid` uses
/// `e = exp(-|z|)` as `1 / (1 + e)` for `z >= 0`, `e / (1 + e)` otherwise.
pub fn logistic(z: f32, y: f32) -> (f64, f32) {
    let (z, y) = (f64::from(z), f64::from(y));
    let e = (-z.abs()).exp();
    let p = if z >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) };
    (z.max(0.0) + e.ln_1p() - y * z, (p - y) as f32)
}

fn loss_grad<G: GradSink + ?Sized>(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut G, intercept: bool) -> f64 {
    assert_eq!(y.len(), x.n_rows(), "loss_grad: one label per row");
    let (wf, b) = split_intercept(w, intercept);
    let mut loss = 0.0f64;
    let mut gb = 0.0f32;
    for (r, &yr) in y.iter().enumerate() {
        let (idx, val) = x.row(r);
        let (l, g) = logistic(margin(idx, val, wf) + b, yr);
        loss += l;
        grad.scatter(idx, val, g);
        gb += g;
    }
    if intercept && !y.is_empty() {
        grad.scatter(&[wf.len() as u32], &[1.0], gb);
    }
    loss
}

/// `grad <- grad + X^T (sigmoid(Xw) - y)`; returns `sum_i log(1 + exp(z_i)) - y_i z_i`.
///
/// # Panics
/// If `y.len() != x.n_rows()`, `grad.len() != w.len()`, or an index is `>= w.len()`.
pub fn loss_grad_dense(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut [f32]) -> f64 {
    assert_eq!(grad.len(), w.len(), "loss_grad_dense: grad and w differ in length");
    loss_grad(x, y, w, grad, false)
}

/// As [`loss_grad_dense`] with an intercept, the last element of `w` (its gradient: the last
/// element of `grad`).
///
/// # Panics
/// As [`loss_grad_dense`], and if `w` is empty or an index is `>= w.len() - 1`.
pub fn loss_grad_dense_intercept(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut [f32]) -> f64 {
    assert_eq!(grad.len(), w.len(), "loss_grad_dense_intercept: grad and w differ in length");
    loss_grad(x, y, w, grad, true)
}

/// As [`loss_grad_dense`], accumulating into the touched features of `grad`.
///
/// # Panics
/// If `y.len() != x.n_rows()`, `grad.dim() != w.len()`, or an index is `>= w.len()`.
pub fn loss_grad_sparse(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut SparseGrad) -> f64 {
    assert_eq!(grad.dim(), w.len(), "loss_grad_sparse: grad and w differ in dimension");
    loss_grad(x, y, w, grad, false)
}

/// As [`loss_grad_sparse`] with an intercept, the last element of `w`.
///
/// # Panics
/// As [`loss_grad_sparse`], and if `w` is empty or an index is `>= w.len() - 1`.
pub fn loss_grad_sparse_intercept(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut SparseGrad) -> f64 {
    assert_eq!(grad.dim(), w.len(), "loss_grad_sparse_intercept: grad and w differ in dimension");
    loss_grad(x, y, w, grad, true)
}

/// `out[i] <- sigmoid(x_i . w)`, the predicted probability of label 1.
///
/// # Panics
/// If `out.len() != x.n_rows()` or an index is `>= w.len()`.
pub fn predict(x: Csr<'_>, w: &[f32], out: &mut [f32]) {
    predict_with(x, w, out, false);
}

/// As [`predict`] with an intercept, the last element of `w`.
///
/// # Panics
/// As [`predict`], and if `w` is empty or an index is `>= w.len() - 1`.
pub fn predict_intercept(x: Csr<'_>, w: &[f32], out: &mut [f32]) {
    predict_with(x, w, out, true);
}

fn predict_with(x: Csr<'_>, w: &[f32], out: &mut [f32], intercept: bool) {
    assert_eq!(out.len(), x.n_rows(), "predict: one output per row");
    let (w, b) = split_intercept(w, intercept);
    for (r, o) in out.iter_mut().enumerate() {
        let (idx, val) = x.row(r);
        let (_, g) = logistic(margin(idx, val, w) + b, 0.0);
        *o = g;
    }
}
