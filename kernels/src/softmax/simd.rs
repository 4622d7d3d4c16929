//! SIMD kernels: 4 classes per load of `x`, `f32x8` `exp`.

use std::array;

use wide::f32x8;

use super::shapes;
use crate::dense::simd::{load, store, LANES};

/// Turns logits `z` into `p - e_label` in place, `p = softmax(z)`, and returns the cross-entropy
/// `logsumexp(z) - z_label` (computed in `f32`, returned as `f64`).
///
/// # Panics
/// If `label >= z.len()`.
pub fn xent_row(z: &mut [f32], label: usize) -> f64 {
    assert!(label < z.len(), "xent_row: label {label} out of range for {} classes", z.len());
    let m = z.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let zl = z[label];
    let vm = f32x8::splat(m);
    let mut vs = f32x8::ZERO;
    let mut z8 = z.chunks_exact_mut(LANES);
    for c in &mut z8 {
        let e = (load(c) - vm).exp();
        vs += e;
        store(c, e);
    }
    let tail = z8.into_remainder();
    let mut t = [f32::NEG_INFINITY; LANES];
    t[..tail.len()].copy_from_slice(tail);
    let e = (f32x8::new(t) - vm).exp();
    vs += e;
    tail.copy_from_slice(&e.as_array()[..tail.len()]);
    let s = vs.reduce_add();
    crate::dense::simd::scale(1.0 / s, z);
    z[label] -= 1.0;
    f64::from(m) + f64::from(s.ln()) - f64::from(zl)
}

/// `z_c = w_c . x + b_c` for the `C` classes whose rows are `w` (`C x d`), loading each `f32x8`
/// of `x` once for all of them; two accumulators per class.
#[inline(always)]
fn logits_group<const C: usize>(x: &[f32], w: &[f32], b: &[f32], z: &mut [f32]) {
    let d = x.len();
    let mut rows: [&[f32]; C] = array::from_fn(|c| &w[c * d..(c + 1) * d]);
    let mut acc = [[f32x8::ZERO; 2]; C];
    let x16 = x.chunks_exact(2 * LANES);
    let x_rest = x16.remainder();
    for xc in x16 {
        let (x0, x1) = (load(&xc[..LANES]), load(&xc[LANES..]));
        for c in 0..C {
            let (wc, rest) = rows[c].split_at(2 * LANES);
            rows[c] = rest;
            acc[c][0] = load(&wc[..LANES]).mul_add(x0, acc[c][0]);
            acc[c][1] = load(&wc[LANES..]).mul_add(x1, acc[c][1]);
        }
    }
    for c in 0..C {
        let mut s = (acc[c][0] + acc[c][1]).reduce_add();
        for (xi, wi) in x_rest.iter().zip(rows[c]) {
            s = xi.mul_add(*wi, s);
        }
        z[c] = s + b[c];
    }
}

/// `z = W x + b`, classes in groups of 4, then 2, then 1.
fn logits(x: &[f32], w: &[f32], b: &[f32], z: &mut [f32]) {
    let (d, k) = (x.len(), b.len());
    let mut c = 0;
    while c < k {
        let (wc, bc, zc) = (&w[c * d..], &b[c..], &mut z[c..]);
        c += match k - c {
            1 => {
                logits_group::<1>(x, wc, bc, zc);
                1
            }
            2 | 3 => {
                logits_group::<2>(x, wc, bc, zc);
                2
            }
            _ => {
                logits_group::<4>(x, wc, bc, zc);
                4
            }
        };
    }
}

/// `gw_c <- gw_c + g_c x` for the `C` rows of `gw` (`C x d`), loading each `f32x8` of `x` once.
#[inline(always)]
fn rank1_group<const C: usize>(g: &[f32], x: &[f32], gw: &mut [f32]) {
    let d = x.len();
    let mut rows = gw.chunks_exact_mut(d);
    let mut rows: [&mut [f32]; C] =
        array::from_fn(|_| rows.next().expect("rank1_group: gw holds C rows of d"));
    let coef: [f32x8; C] = array::from_fn(|c| f32x8::splat(g[c]));
    let x8 = x.chunks_exact(LANES);
    let x_rest = x8.remainder();
    let mut off = 0;
    for xc in x8 {
        let xv = load(xc);
        for c in 0..C {
            let r = &mut rows[c][off..off + LANES];
            store(r, coef[c].mul_add(xv, load(r)));
        }
        off += LANES;
    }
    for (c, row) in rows.iter_mut().enumerate() {
        for (ri, xi) in row[off..].iter_mut().zip(x_rest) {
            *ri = g[c].mul_add(*xi, *ri);
        }
    }
}

/// `grad_w <- grad_w + g x^T`, classes in groups of 4, then 2, then 1.
fn rank1(g: &[f32], x: &[f32], grad_w: &mut [f32]) {
    let (d, k) = (x.len(), g.len());
    if d == 0 {
        return;
    }
    let mut c = 0;
    while c < k {
        let (gc, gw) = (&g[c..], &mut grad_w[c * d..]);
        c += match k - c {
            1 => {
                rank1_group::<1>(gc, x, gw);
                1
            }
            2 | 3 => {
                rank1_group::<2>(gc, x, gw);
                2
            }
            _ => {
                rank1_group::<4>(gc, x, gw);
                4
            }
        };
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
        rank1(z, x_row, grad_w);
        crate::dense::simd::axpy(1.0, z, grad_b);
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
