//! SIMD kernels: register tiles of rows x classes, `f32x8` `exp`.

use std::array;

use wide::f32x8;

use super::shapes;
use crate::dense::simd::{load, prefetch, store, vectors, vectors_mut, LANES};

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

/// Rows that [`loss_grad`] takes at once when its `scratch` holds their logits (`BLOCK_ROWS x k`
/// values): each block's rows are read from memory once for both products, and the weight
/// gradient is read and written once per block instead of once per row.
pub const BLOCK_ROWS: usize = 32;

/// Classes per register tile of both products: 2 rows x 5 classes of logits (10 accumulators),
/// 5 classes x 16 columns of the weight gradient (10 accumulators), so that a 10-class model
/// (MNIST's) splits into two tiles with no lane wasted.
const TILE_CLASSES: usize = 5;

/// `z[r][c] = w_c . x_r + b_c` for the `R` rows `xs` and the `C` classes `ws` (`z` rows `k`
/// apart): each `f32x8` of a class's weights serves the `R` rows, each of a row's features the
/// `C` classes, so a step is `R + C` loads for `R x C` fused multiply-adds.
#[inline(always)]
fn logits_tile<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ahead: [&[f32]; R],
    ws: [&[f32]; C],
    b: &[f32],
    z: &mut [f32],
    k: usize,
) {
    let d = ws[0].len();
    let full = d / LANES * LANES;
    let mut acc = [[f32x8::ZERO; C]; R];
    // Whole `f32x8`s only, as arrays: the loads need no bounds checks.
    let xa: [&[[f32; LANES]]; R] = array::from_fn(|r| vectors(&xs[r][..full]));
    let wa: [&[[f32; LANES]]; C] = array::from_fn(|c| vectors(&ws[c][..full]));
    for j in 0..full / LANES {
        if j % 2 == 0 {
            for row in ahead {
                if let Some(v) = row.get(j * LANES) {
                    prefetch(v);
                }
            }
        }
        let xv: [f32x8; R] = array::from_fn(|r| f32x8::new(xa[r][j]));
        for c in 0..C {
            let wv = f32x8::new(wa[c][j]);
            for r in 0..R {
                acc[r][c] = wv.mul_add(xv[r], acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            let mut s = acc[r][c].reduce_add();
            for t in full..d {
                s = xs[r][t].mul_add(ws[c][t], s);
            }
            z[r * k + c] = s + b[c];
        }
    }
}

/// Rows ahead whose lines the logits ask for.
const AHEAD: usize = 4;

/// [`logits_tile`] for the classes `c0..c0 + C` of the first `m` rows of `x` (rows of `d`; the
/// rows after them are only prefetched), rows in pairs.
#[inline(always)]
fn logits_classes<const C: usize>(x: &[f32], m: usize, w: &[f32], b: &[f32], z: &mut [f32], c0: usize) {
    let (k, d) = (b.len(), w.len() / b.len());
    let ws: [&[f32]; C] = array::from_fn(|c| &w[(c0 + c) * d..(c0 + c + 1) * d]);
    let bc = &b[c0..c0 + C];
    let row = |i: usize| x.get(i * d..(i + 1) * d).unwrap_or(&[]);
    // The first class group reads the rows from memory: it asks for the lines of the rows
    // AHEAD further on (past the block too) while it works on this pair's.
    let ahead = |i: usize| if c0 == 0 { row(i + AHEAD) } else { &[] };
    let mut i = 0;
    while i + 2 <= m {
        logits_tile::<2, C>([row(i), row(i + 1)], [ahead(i), ahead(i + 1)], ws, bc, &mut z[i * k + c0..], k);
        i += 2;
    }
    if i < m {
        logits_tile::<1, C>([row(i)], [&[]], ws, bc, &mut z[i * k + c0..], k);
    }
}

/// `gw_c <- gw_c + sum_r g[r][c] x_r` for the `C` classes `c0..` (the rows of `gw`, `d` long)
/// over the rows of `x` (`m x d`, `g` `m x k`): a tile of `C` classes x 16 columns stays in
/// registers over all the rows, so the gradient is read and written once for `m` rows.
#[inline(always)]
fn rank_tile<const C: usize>(g: &[f32], k: usize, c0: usize, x: &[f32], m: usize, gw: &mut [f32]) {
    let d = gw.len() / C;
    let full = d / LANES * LANES;
    let coefs = |r: usize| -> &[f32; C] { g[r * k + c0..r * k + c0 + C].try_into().expect("C coefficients") };
    let mut rows = gw.chunks_exact_mut(d);
    let mut gr: [&mut [f32]; C] = array::from_fn(|_| rows.next().expect("rank_tile: gw holds C rows of d"));
    {
        // Whole `f32x8`s only, as arrays: the loads and stores need no bounds checks.
        let ga: [&mut [[f32; LANES]]; C] = {
            let mut it = gr.iter_mut();
            array::from_fn(|_| vectors_mut(it.next().expect("C rows")))
        };
        let xa = |r: usize| vectors(&x[r * d..r * d + full]);
        let vectors = full / LANES;
        let mut q = 0;
        while q + 2 <= vectors {
            let mut acc: [[f32x8; 2]; C] =
                array::from_fn(|c| [f32x8::new(ga[c][q]), f32x8::new(ga[c][q + 1])]);
            for r in 0..m {
                let (xr, gr) = (xa(r), coefs(r));
                let (x0, x1) = (f32x8::new(xr[q]), f32x8::new(xr[q + 1]));
                for (a, &g) in acc.iter_mut().zip(gr) {
                    let gc = f32x8::splat(g);
                    a[0] = gc.mul_add(x0, a[0]);
                    a[1] = gc.mul_add(x1, a[1]);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                ga[c][q] = *a[0].as_array();
                ga[c][q + 1] = *a[1].as_array();
            }
            q += 2;
        }
        if q < vectors {
            let mut acc: [f32x8; C] = array::from_fn(|c| f32x8::new(ga[c][q]));
            for r in 0..m {
                let xv = f32x8::new(xa(r)[q]);
                for (a, &g) in acc.iter_mut().zip(coefs(r)) {
                    *a = f32x8::splat(g).mul_add(xv, *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                ga[c][q] = *a.as_array();
            }
        }
    }
    for t in full..d {
        for (c, row) in gr.iter_mut().enumerate() {
            let mut s = row[t];
            for r in 0..m {
                s = coefs(r)[c].mul_add(x[r * d + t], s);
            }
            row[t] = s;
        }
    }
}

/// Runs `f::<C>(c0)` over the classes `0..k` in groups of [`TILE_CLASSES`], the last group
/// smaller.
macro_rules! by_class_groups {
    ($k:expr, |$c0:ident, $C:ident| $body:expr) => {
        by_class_groups!(@groups $k, $c0, $C, $body, 1 2 3 4)
    };
    (@groups $k:expr, $c0:ident, $C:ident, $body:expr, $($n:literal)*) => {{
        let k = $k;
        let mut $c0 = 0;
        while $c0 < k {
            $c0 += match k - $c0 {
                $($n => {
                    const $C: usize = $n;
                    $body;
                    $n
                })*
                _ => {
                    const $C: usize = TILE_CLASSES;
                    $body;
                    TILE_CLASSES
                }
            };
        }
    }};
}

/// Sums `logsumexp(z_i) - z_{i,y_i}` over the rows, `z_i = W x_i + b`, and accumulates
/// `grad_w <- grad_w + sum_i (p_i - e_{y_i}) x_i^T`, `grad_b <- grad_b + sum_i (p_i - e_{y_i})`.
/// See the module doc for shapes. The rows go in blocks of up to [`BLOCK_ROWS`], as many as
/// `scratch` holds logits for (`scratch.len() / k`): pass `BLOCK_ROWS * k` for the fastest.
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
    let (n, k, d) = shapes(x, labels, w, b, grad_w, grad_b, scratch);
    let rows = (scratch.len() / k).clamp(1, BLOCK_ROWS);
    let mut loss = 0.0;
    for i0 in (0..n).step_by(rows) {
        let m = rows.min(n - i0);
        let (xb, z) = (&x[i0 * d..(i0 + m) * d], &mut scratch[..m * k]);
        by_class_groups!(k, |c0, C| logits_classes::<C>(&x[i0 * d..], m, w, b, z, c0));
        for (zr, &y) in z.chunks_exact_mut(k).zip(&labels[i0..i0 + m]) {
            loss += xent_row(zr, y as usize);
            crate::dense::simd::axpy(1.0, zr, grad_b);
        }
        if d > 0 {
            by_class_groups!(k, |c0, C| rank_tile::<C>(z, k, c0, xb, m, &mut grad_w[c0 * d..(c0 + C) * d]));
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
    by_class_groups!(b.len(), |c0, C| logits_classes::<C>(x_row, 1, w, b, z, c0));
    super::argmax(z)
}
