//! Scalar reference: textbook triple loop, sequential sums.

use super::{check_gemm, Op};

/// `C <- alpha op(A) op(B) + beta C` (row-major; `op(A)` is `m x k`, `op(B)` is `k x n`), each
/// entry summed strictly in order of `p`. With `beta == 0`, `C` is only written (NaNs in it do
/// not propagate).
///
/// # Panics
/// If `a.len() != m k`, `b.len() != k n` or `c.len() != m n`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    check_gemm(m, n, k, a, b, c);
    let (ars, acs) = op_a.strides(m, k);
    let (brs, bcs) = op_b.strides(k, n);
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f32;
            for p in 0..k {
                s += a[i * ars + p * acs] * b[p * brs + j * bcs];
            }
            let cij = &mut c[i * n + j];
            *cij = if beta == 0.0 { alpha * s } else { alpha * s + beta * *cij };
        }
    }
}

/// `x <- max(x, 0)`.
pub fn relu(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

/// `dy <- dy * [y > 0]`, with `y` the ReLU's output (positive exactly where its input was).
///
/// # Panics
/// If `y.len() != dy.len()`.
pub fn relu_backward(y: &[f32], dy: &mut [f32]) {
    assert_eq!(y.len(), dy.len(), "relu_backward: length mismatch");
    for (g, &v) in dy.iter_mut().zip(y) {
        if v <= 0.0 {
            *g = 0.0;
        }
    }
}

/// Summed cross-entropy of the rows of `logits` (`n x k`, `n = labels.len()`) against `labels`;
/// writes `grad_logits <- softmax(logits) - onehot(labels)`, the gradient of the *sum* (divide by
/// `n` for the mean).
///
/// # Panics
/// On inconsistent lengths or a label `>= k`.
pub fn softmax_cross_entropy(logits: &[f32], labels: &[u32], grad_logits: &mut [f32]) -> f64 {
    super::softmax_cross_entropy_with(crate::softmax::scalar::xent_row, logits, labels, grad_logits)
}
