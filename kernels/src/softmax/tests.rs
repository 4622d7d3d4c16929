//! SIMD versus scalar on awkward `d`, `k`, `n` and unaligned starts; gradients versus a finite
//! difference of the loss; known values.
//!
//! Tolerances: loss sums `1e-5` relative (the SIMD version works in `f32`, the reference in
//! `f64`); each gradient entry `1e-5 * sum_i |x_ij|` (+`1e-6`), since `|p - e_y| <= 1`.

use super::{scalar, simd};
use crate::dense::testing::{assert_close, Rng};

type LossGrad = fn(&[f32], &[u32], &[f32], &[f32], &mut [f32], &mut [f32], &mut [f32]) -> f64;
const VERSIONS: [(&str, LossGrad); 2] = [("simd", simd::loss_grad), ("scalar", scalar::loss_grad)];

#[test]
fn simd_matches_scalar() {
    let mut rng = Rng::new(7);
    for d in [0, 1, 7, 8, 9, 15, 16, 17, 33, 784] {
        // k = 4, 9, 10: tiles of 4 classes, of 5 and 4, of 5 and 5.
        for k in [1, 2, 3, 4, 5, 9, 10] {
            // Rows one at a time, in blocks of 3 (a scratch of 3k + 1), and in whole blocks.
            let blocks = [1, 3, simd::BLOCK_ROWS];
            for ((n, off), rows) in [(0, 0), (1, 3), (3, 1), (9, 7), (20, 0), (70, 2)]
                .into_iter()
                .flat_map(|c| blocks.map(|b| (c, b)))
            {
                let what = format!("d={d} k={k} n={n} off={off} rows={rows}");
                let xs = rng.vec(n * d + off, -1.0, 1.0);
                let x = &xs[off..];
                let labels: Vec<u32> = (0..n).map(|_| rng.below(k) as u32).collect();
                let ws = rng.vec(k * d + off, -0.3, 0.3);
                let w = &ws[off..];
                let b = rng.vec(k, -1.0, 1.0);
                let mut gw1 = vec![0.5; k * d];
                let mut gb1 = vec![0.5; k];
                let (mut gw2, mut gb2) = (gw1.clone(), gb1.clone());
                let mut scratch = vec![0.0; rows * k + usize::from(rows == 3)];
                let l1 = simd::loss_grad(x, &labels, w, &b, &mut gw1, &mut gb1, &mut scratch);
                let l2 = scalar::loss_grad(x, &labels, w, &b, &mut gw2, &mut gb2, &mut scratch);
                assert_close(l1, l2, l2.abs(), 1e-5, 1e-6, &format!("loss {what}"));
                for j in 0..d {
                    let scale: f64 = (0..n).map(|i| f64::from(x[i * d + j].abs())).sum();
                    for c in 0..k {
                        let (a, b) = (f64::from(gw1[c * d + j]), f64::from(gw2[c * d + j]));
                        assert_close(a, b, scale, 1e-5, 1e-6, &format!("grad_w {what} c={c} j={j}"));
                    }
                }
                for c in 0..k {
                    let (a, b) = (f64::from(gb1[c]), f64::from(gb2[c]));
                    assert_close(a, b, n as f64, 1e-5, 1e-6, &format!("grad_b {what} c={c}"));
                }
                for i in 0..n {
                    let row = &x[i * d..(i + 1) * d];
                    let p1 = simd::predict(row, w, &b, &mut scratch);
                    let p2 = scalar::predict(row, w, &b, &mut scratch);
                    assert_eq!(p1, p2, "predict {what} i={i}");
                }
            }
        }
    }
}

/// Central differences, `h = 1e-2`; the tolerance covers the `O(h^2)` truncation and the `f32`
/// rounding of the SIMD version's loss divided by `2h`.
#[test]
fn gradient_matches_finite_difference() {
    let mut rng = Rng::new(8);
    let (n, d, k) = (6, 11, 4);
    let x = rng.vec(n * d, -1.0, 1.0);
    let labels: Vec<u32> = (0..n).map(|_| rng.below(k) as u32).collect();
    let w = rng.vec(k * d, -0.5, 0.5);
    let b = rng.vec(k, -0.5, 0.5);
    let mut scratch = vec![0.0; k];
    for (name, f) in VERSIONS {
        let (mut gw, mut gb) = (vec![0.0; k * d], vec![0.0; k]);
        f(&x, &labels, &w, &b, &mut gw, &mut gb, &mut scratch);
        let (mut sw, mut sb) = (gw.clone(), gb.clone());
        let h = 1e-2f32;
        let mut loss_at = |w: &[f32], b: &[f32]| f(&x, &labels, w, b, &mut sw, &mut sb, &mut scratch);
        for j in 0..k * d {
            let mut wp = w.clone();
            wp[j] += h;
            let lp = loss_at(&wp, &b);
            wp[j] -= 2.0 * h;
            let fd = (lp - loss_at(&wp, &b)) / f64::from(2.0 * h);
            assert_close(f64::from(gw[j]), fd, fd.abs(), 2e-3, 2e-3, &format!("{name} w[{j}]"));
        }
        for c in 0..k {
            let mut bp = b.clone();
            bp[c] += h;
            let lp = loss_at(&w, &bp);
            bp[c] -= 2.0 * h;
            let fd = (lp - loss_at(&w, &bp)) / f64::from(2.0 * h);
            assert_close(f64::from(gb[c]), fd, fd.abs(), 2e-3, 2e-3, &format!("{name} b[{c}]"));
        }
    }
}

#[test]
fn known_values() {
    // W = 0, b = 0: p = 1/k for every row, loss = n ln k, grad_b = n/k - count(label).
    let (n, d, k) = (4, 3, 5);
    let x = vec![1.0; n * d];
    let labels = [0, 2, 2, 4];
    for (name, f) in VERSIONS {
        let (mut gw, mut gb, mut s) = (vec![0.0; k * d], vec![0.0; k], vec![0.0; k]);
        let l = f(&x, &labels, &vec![0.0; k * d], &[0.0; 5], &mut gw, &mut gb, &mut s);
        assert_close(l, n as f64 * (k as f64).ln(), 1.0, 1e-6, 0.0, name);
        let want = [-0.2, 0.8, -1.2, 0.8, -0.2];
        for c in 0..k {
            assert_close(f64::from(gb[c]), want[c], 1.0, 1e-6, 0.0, &format!("{name} gb[{c}]"));
            assert_close(f64::from(gw[c * d]), want[c], 1.0, 1e-6, 0.0, &format!("{name} gw[{c}]"));
        }
    }
    // Huge logits stay finite: z = [1000, 0], label 1 -> loss 1000, p - e_y = [1, -1].
    for xent in [simd::xent_row as fn(&mut [f32], usize) -> f64, scalar::xent_row] {
        let mut z = [1000.0, 0.0];
        assert_close(xent(&mut z, 1), 1000.0, 1000.0, 1e-6, 0.0, "huge logit");
        assert_eq!(z, [1.0, -1.0]);
    }
    let w = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0];
    assert_eq!(simd::predict(&[2.0, 3.0], &w, &[0.0, 0.0, 0.0], &mut [0.0; 3]), 2);
    assert_eq!(simd::predict(&[3.0, 3.0], &w, &[0.0, 0.0, 0.0], &mut [0.0; 3]), 1, "first max on ties");
}
