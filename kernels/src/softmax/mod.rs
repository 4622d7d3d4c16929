//! Multinomial logistic regression (softmax) over dense rows.
//!
//! For a row `x` (length `d`) with label `y`, weights `W` (`k x d`, row-major) and bias `b` (`k`):
//! logits `z = W x + b`, probabilities `p = softmax(z)`, loss `logsumexp(z) - z_y` (computed as
//! `m + log(sum_c exp(z_c - m))` with `m = max_c z_c`), and gradients
//! `grad_W <- grad_W + (p - e_y) x^T`, `grad_b <- grad_b + (p - e_y)`.
//! [`loss_grad`] sums the loss over the rows and *accumulates* into `grad_w`/`grad_b` (does not
//! zero them): `grad_W <- grad_W + sum_i (p_i - e_{y_i}) x_i^T`; the caller divides by `n`.
//!
//! - [`scalar`]: the reference: sequential dots, `f64` `exp`/`ln`.
//! - [`simd`]: the public functions: logits 4 classes at a time so each `f32x8` of `x` is loaded
//!   once for 4 classes (two accumulators per class), `f32x8` `exp`, and the rank-1 gradient
//!   update again 4 classes per load of `x`.
//!
//! Shapes: `n = labels.len()`, `k = b.len()`, `d = w.len() / k`; `x.len() == n * d`,
//! `grad_w.len() == w.len()`, `grad_b.len() == k`, `scratch.len() >= k`, labels `< k`.
//! Mismatches are programming errors and panic with a message.

pub mod scalar;
pub mod simd;

pub use simd::{loss_grad, predict, xent_row};

/// Checks the shapes shared by both versions; returns `(n, k, d)`.
fn shapes(
    x: &[f32],
    labels: &[u32],
    w: &[f32],
    b: &[f32],
    grad_w: &[f32],
    grad_b: &[f32],
    scratch: &[f32],
) -> (usize, usize, usize) {
    let (n, k) = (labels.len(), b.len());
    assert!(k > 0, "softmax: no classes (b is empty)");
    assert_eq!(w.len() % k, 0, "softmax: w.len() is not a multiple of k = b.len()");
    let d = w.len() / k;
    assert_eq!(x.len(), n * d, "softmax: x.len() != labels.len() * d");
    assert_eq!(grad_w.len(), w.len(), "softmax: grad_w and w differ in length");
    assert_eq!(grad_b.len(), k, "softmax: grad_b and b differ in length");
    assert!(scratch.len() >= k, "softmax: scratch shorter than k");
    (n, k, d)
}

/// Index of the first maximum of `z` (0 for an empty `z`; a comparison with NaN keeps the earlier
/// index).
pub(crate) fn argmax(z: &[f32]) -> u32 {
    let mut best = 0;
    for (c, &v) in z.iter().enumerate() {
        if v > z[best] {
            best = c;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests;
