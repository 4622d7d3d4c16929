//! Scalar reference: one row at a time, sequential margin, `f64` libm per row.

use super::{Csr, GradSink, SparseGrad};

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

fn loss_grad<G: GradSink + ?Sized>(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut G) -> f64 {
    assert_eq!(y.len(), x.n_rows(), "loss_grad: one label per row");
    let mut loss = 0.0f64;
    for (r, &yr) in y.iter().enumerate() {
        let (idx, val) = x.row(r);
        let (l, g) = logistic(margin(idx, val, w), yr);
        loss += l;
        grad.scatter(idx, val, g);
    }
    loss
}

/// `grad <- grad + X^T (sigmoid(Xw) - y)`; returns `sum_i log(1 + exp(z_i)) - y_i z_i`.
///
/// # Panics
/// If `y.len() != x.n_rows()`, `grad.len() != w.len()`, or an index is `>= w.len()`.
pub fn loss_grad_dense(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut [f32]) -> f64 {
    assert_eq!(grad.len(), w.len(), "loss_grad_dense: grad and w differ in length");
    loss_grad(x, y, w, grad)
}

/// As [`loss_grad_dense`], accumulating into the touched features of `grad`.
///
/// # Panics
/// If `y.len() != x.n_rows()`, `grad.dim() != w.len()`, or an index is `>= w.len()`.
pub fn loss_grad_sparse(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut SparseGrad) -> f64 {
    assert_eq!(grad.dim(), w.len(), "loss_grad_sparse: grad and w differ in dimension");
    loss_grad(x, y, w, grad)
}

/// `out[i] <- sigmoid(x_i . w)`, the predicted probability of label 1.
///
/// # Panics
/// If `out.len() != x.n_rows()` or an index is `>= w.len()`.
pub fn predict(x: Csr<'_>, w: &[f32], out: &mut [f32]) {
    assert_eq!(out.len(), x.n_rows(), "predict: one output per row");
    for (r, o) in out.iter_mut().enumerate() {
        let (idx, val) = x.row(r);
        let (_, g) = logistic(margin(idx, val, w), 0.0);
        *o = g;
    }
}
