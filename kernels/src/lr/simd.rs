//! SIMD kernels: gathered margins in independent FMA chains, transcendentals 8 rows at a time.

use wide::f32x8;

use super::{split_intercept, Csr, GradSink, SparseGrad};

/// `z = x . w = sum_k values[k] * w[indices[k]]`.
///
/// `wide` has no gather, so the products run as four independent scalar FMA chains (4 nonzeros
/// per step), which hides the FMA latency that limits the sequential reference. (Assembling an
/// `f32x8` from 8 gathered weights measured the same, 0.75 against 0.74 G nonzeros/s on the
/// margins-only benchmark, and was dropped.)
///
/// # Panics
/// If `indices.len() != values.len()` or an index is `>= w.len()`.
#[inline]
pub fn margin(indices: &[u32], values: &[f32], w: &[f32]) -> f32 {
    assert_eq!(indices.len(), values.len(), "margin: indices and values differ in length");
    let mut acc = [0.0f32; 4];
    let (i4, v4) = (indices.chunks_exact(4), values.chunks_exact(4));
    let (i_tail, v_tail) = (i4.remainder(), v4.remainder());
    for (ci, cv) in i4.zip(v4) {
        for t in 0..4 {
            acc[t] = cv[t].mul_add(w[ci[t] as usize], acc[t]);
        }
    }
    for (t, (&j, &v)) in i_tail.iter().zip(v_tail).enumerate() {
        acc[t] = v.mul_add(w[j as usize], acc[t]);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// Per-lane `(log(1 + exp(z)) - y z, sigmoid(z) - y)` in the stable form of
/// [`super::scalar::logistic`].
#[inline]
pub fn logistic(z: f32x8, y: f32x8) -> (f32x8, f32x8) {
    let e = (-z.abs()).exp();
    let inv = f32x8::ONE / (f32x8::ONE + e);
    let p = z.simd_ge(f32x8::ZERO).select(inv, e * inv);
    (z.max(f32x8::ZERO) + e.ln_1p() - y * z, p - y)
}

/// The kernel, with the lazy L2 in the scatter where `l2` is not 0 (one copy of the loop each
/// way: the test stays out of the loop).
fn loss_grad<G: GradSink + ?Sized>(
    x: Csr<'_>,
    y: &[f32],
    w: &[f32],
    grad: &mut G,
    intercept: bool,
    l2: f32,
) -> f64 {
    if l2 == 0.0 {
        rows::<G, false>(x, y, w, grad, (intercept, 0.0))
    } else {
        rows::<G, true>(x, y, w, grad, (intercept, l2))
    }
}

fn rows<G: GradSink + ?Sized, const L2: bool>(
    x: Csr<'_>,
    y: &[f32],
    w: &[f32],
    grad: &mut G,
    (intercept, l2): (bool, f32),
) -> f64 {
    assert_eq!(y.len(), x.n_rows(), "loss_grad: one label per row");
    let (wf, b) = split_intercept(w, intercept);
    let mut loss = 0.0f64;
    let mut gb = 0.0f32;
    for (block, yb) in y.chunks(8).enumerate() {
        let r0 = block * 8;
        let mut z = [0.0f32; 8];
        let mut yl = [0.0f32; 8];
        for (t, &yr) in yb.iter().enumerate() {
            let (idx, val) = x.row(r0 + t);
            z[t] = margin(idx, val, wf) + b;
            yl[t] = yr;
        }
        let (l, g) = logistic(f32x8::new(z), f32x8::new(yl));
        let (l, g) = (l.to_array(), g.to_array());
        for t in 0..yb.len() {
            loss += f64::from(l[t]);
            let (idx, val) = x.row(r0 + t);
            if L2 {
                grad.scatter_l2(idx, val, g[t], wf, l2);
            } else {
                grad.scatter(idx, val, g[t]);
            }
            gb += g[t];
        }
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
    loss_grad(x, y, w, grad, false, 0.0)
}

/// As [`loss_grad_dense`] with an intercept, the last element of `w` (its gradient: the last
/// element of `grad`).
///
/// # Panics
/// As [`loss_grad_dense`], and if `w` is empty or an index is `>= w.len() - 1`.
pub fn loss_grad_dense_intercept(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut [f32]) -> f64 {
    assert_eq!(grad.len(), w.len(), "loss_grad_dense_intercept: grad and w differ in length");
    loss_grad(x, y, w, grad, true, 0.0)
}

/// As [`loss_grad_dense`], accumulating into the touched features of `grad`.
///
/// # Panics
/// If `y.len() != x.n_rows()`, `grad.dim() != w.len()`, or an index is `>= w.len()`.
pub fn loss_grad_sparse(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut SparseGrad) -> f64 {
    assert_eq!(grad.dim(), w.len(), "loss_grad_sparse: grad and w differ in dimension");
    loss_grad(x, y, w, grad, false, 0.0)
}

/// As [`loss_grad_sparse`] with an intercept, the last element of `w`.
///
/// # Panics
/// As [`loss_grad_sparse`], and if `w` is empty or an index is `>= w.len() - 1`.
pub fn loss_grad_sparse_intercept(x: Csr<'_>, y: &[f32], w: &[f32], grad: &mut SparseGrad) -> f64 {
    assert_eq!(grad.dim(), w.len(), "loss_grad_sparse_intercept: grad and w differ in dimension");
    loss_grad(x, y, w, grad, true, 0.0)
}

/// As [`loss_grad_dense`] (with an intercept, the last element of `w`, where `intercept`), plus
/// `l2 * w[j]` at every nonzero of feature `j`: the lazy L2 of the rows' features, once per
/// occurrence, in the scatter's pass (`l2 == 0`: [`loss_grad_dense`] itself).
///
/// # Panics
/// As [`loss_grad_dense`] and [`loss_grad_dense_intercept`].
pub fn loss_grad_dense_penalized(
    x: Csr<'_>,
    y: &[f32],
    w: &[f32],
    grad: &mut [f32],
    intercept: bool,
    l2: f32,
) -> f64 {
    assert_eq!(grad.len(), w.len(), "loss_grad_dense_penalized: grad and w differ in length");
    loss_grad(x, y, w, grad, intercept, l2)
}

/// As [`loss_grad_dense_penalized`], accumulating into the touched features of `grad`.
///
/// # Panics
/// As [`loss_grad_sparse`] and [`loss_grad_sparse_intercept`].
pub fn loss_grad_sparse_penalized(
    x: Csr<'_>,
    y: &[f32],
    w: &[f32],
    grad: &mut SparseGrad,
    intercept: bool,
    l2: f32,
) -> f64 {
    assert_eq!(grad.dim(), w.len(), "loss_grad_sparse_penalized: grad and w differ in dimension");
    loss_grad(x, y, w, grad, intercept, l2)
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
    for (block, ob) in out.chunks_mut(8).enumerate() {
        let mut z = [0.0f32; 8];
        for (t, zt) in z.iter_mut().take(ob.len()).enumerate() {
            let (idx, val) = x.row(block * 8 + t);
            *zt = margin(idx, val, w) + b;
        }
        let (_, p) = logistic(f32x8::new(z), f32x8::ZERO);
        ob.copy_from_slice(&p.as_array()[..ob.len()]);
    }
}
