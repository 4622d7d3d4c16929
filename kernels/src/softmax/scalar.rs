//! Scalar reference: sequential dots, `f64` `exp`/`ln`.

use super::shapes;

/// Turns logits `z` into `p - e_label` in place, `p = softmax(z)`, and returns the cross-entropy
/// `logsumexp(z) - z_label`.
///
/// # Panics
/// If `label >= z.len()`.
pub fn xent_row(z: &mut [f32], label: usize) -> f64 {
    assert!(label < z.len(), "xent_row: label {label} out of range for {} classes", z.len());
    let m = f64::from(z.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)));
    let mut s = 0.0f64;
    for v in z.iter() {
        s += (f64::from(*v) - m).exp();
    }
    let loss = m + s.ln() - f64::from(z[label]);
    for v in z.iter_mut() {
        *v = ((f64::from(*v) - m).exp() / s) as f32;
    }
    z[label] -= 1.0;
    loss
}

fn logits(x_row: &[f32], w: &[f32], b: &[f32], z: &mut [f32]) {
    let d = x_row.len();
    for (c, (zc, bc)) in z.iter_mut().zip(b).enumerate() {
        *zc = crate::dense::scalar::dot(&w[c * d..(c + 1) * d], x_row) + bc;
    }
}

/// Sums `logsumexp(z_i) - z_{i,y_i}` over the rows, `z_i = W x_i + b`, and accumulates
/// `grad_w <- grad_w + sum_i (p_i - e_{y_i}) x_i^T`, `grad_b <- grad_b + sum_i (p_i - e_{y_i})`.
/// See the module doc for shapes.
///
/// # Panics
/// On inconsistent shapes or a label `>= k`.
pub fn loss_grad(
    x: &[f32],
    labels: &[u32],
    w: &[f32],
    b: &[f32],
    grad_w: &mut [f32],
    grad_b: &mut [f32],
    scratch: &mut [f32],
) -> f64 {
    let (_, k, d) = shapes(x, labels, w, b, grad_w, grad_b, scratch);
    let z = &mut scratch[..k];
    let mut loss = 0.0;
    for (i, &y) in labels.iter().enumerate() {
        let x_row = &x[i * d..(i + 1) * d];
        logits(x_row, w, b, z);
        loss += xent_row(z, y as usize);
        for (c, (gb, &g)) in grad_b.iter_mut().zip(z.iter()).enumerate() {
            crate::dense::scalar::axpy(g, x_row, &mut grad_w[c * d..(c + 1) * d]);
            *gb += g;
        }
    }
    loss
}

/// `argmax_c (W x + b)_c` (the first one on ties); `scratch` (`>= k`) receives the logits.
///
/// # Panics
/// If `w.len() != b.len() * x_row.len()` or `scratch.len() < b.len()`.
pub fn predict(x_row: &[f32], w: &[f32], b: &[f32], scratch: &mut [f32]) -> u32 {
    assert_eq!(w.len(), b.len() * x_row.len(), "predict: w is not k x d");
    let z = &mut scratch[..b.len()];
    logits(x_row, w, b, z);
    super::argmax(z)
}
