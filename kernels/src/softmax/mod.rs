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
//! - [`simd`]: the public functions. [`loss_grad`] takes the rows in blocks (up to
//!   [`simd::BLOCK_ROWS`], as its scratch allows): the block's logits in register tiles of 2 rows
//!   x 5 classes, `f32x8` `exp`, then the block's weight gradient in tiles of 5 classes x 16
//!   columns held in registers over all its rows, so that the gradient is read and written once
//!   a block rather than once a row; the first tiles ask for the lines of the rows 4 further on
//!   (into L2), since in training the rows come from memory. On a Zen 4 (AVX2 build), a 64-row
//!   chunk of Fashion-MNIST's shape (d = 784, k = 10; `softmax/simd_chunk64*` in the kernels
//!   bench), row by row before (4 classes per load of `x`, the gradient updated a row at a time)
//!   against blocks: rows in cache 47-55 -> 23.5-25 us (~70 % of one core's FMA peak), rows
//!   from memory 61 -> 32-34 us (47 without the prefetch).
//!
//! Shapes: `n = labels.len()`, `k = b.len()`, `d = w.len() / k`; `x.len() == n * d`,
//! `grad_w.len() == w.len()`, `grad_b.len() == k`, `scratch.len() >= k` (`BLOCK_ROWS * k` for
//! blocks of rows), labels `< k`.
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
