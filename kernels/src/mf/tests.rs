//! SIMD versus scalar on awkward `k` and unaligned factor matrices; the gradient versus a finite
//! difference; the SGD step versus the gradient; known values.
//!
//! Tolerance: factors and sums agree to `1e-5` relative (scale `1 + |value|`): the SIMD update
//! `(1 - lr l2) u + (lr e) v` is the reference's `u + lr (e v - l2 u)` rearranged, so they differ
//! by a few roundings per step, over 300 steps that revisit the same rows.

use super::{scalar, simd};
use crate::dense::testing::{assert_close, Rng};

#[test]
fn simd_matches_scalar() {
    let mut rng = Rng::new(9);
    let (n_users, n_items, n) = (13, 7, 300);
    for k in [1, 7, 8, 9, 15, 16, 17, 40] {
        for off in [0, 1, 5] {
            let what = format!("k={k} off={off}");
            let users: Vec<u32> = (0..n).map(|_| rng.below(n_users) as u32).collect();
            let items: Vec<u32> = (0..n).map(|_| rng.below(n_items) as u32).collect();
            let ratings = rng.vec(n, 1.0, 5.0);
            let u0 = rng.vec(n_users * k + off, 0.0, 0.5);
            let v0 = rng.vec(n_items * k + off, 0.0, 0.5);
            let (mut u1, mut v1, mut u2, mut v2) = (u0.clone(), v0.clone(), u0.clone(), v0.clone());
            let (lr, l2) = (0.02, 0.05);
            let s1 = simd::sgd_chunk(&users, &items, &ratings, &mut u1[off..], &mut v1[off..], k, lr, l2);
            let s2 = scalar::sgd_chunk(&users, &items, &ratings, &mut u2[off..], &mut v2[off..], k, lr, l2);
            assert_close(s1, s2, s2, 1e-5, 0.0, &format!("sse {what}"));
            for (a, b) in u1.iter().zip(&u2).chain(v1.iter().zip(&v2)) {
                let scale = 1.0 + f64::from(b.abs());
                assert_close(f64::from(*a), f64::from(*b), scale, 1e-5, 0.0, &format!("factor {what}"));
            }
            let r1 = simd::rmse(&users, &items, &ratings, &u1[off..], &v1[off..], k);
            let r2 = scalar::rmse(&users, &items, &ratings, &u1[off..], &v1[off..], k);
            assert_close(r1, r2, r2, 1e-5, 0.0, &format!("rmse {what}"));

            let (ur, vr) = (&u0[off..off + k], &v0[off + k..off + 2 * k]);
            let (mut gu1, mut gv1) = (vec![0.5; k], vec![-0.5; k]);
            let (mut gu2, mut gv2) = (gu1.clone(), gv1.clone());
            let e1 = simd::loss_grad_row(3.0, ur, vr, l2, &mut gu1, &mut gv1);
            let e2 = scalar::loss_grad_row(3.0, ur, vr, l2, &mut gu2, &mut gv2);
            assert_close(f64::from(e1), f64::from(e2), f64::from(e2), 1e-5, 0.0, &format!("e^2 {what}"));
            for (a, b) in gu1.iter().zip(&gu2).chain(gv1.iter().zip(&gv2)) {
                let scale = 1.0 + f64::from(b.abs());
                assert_close(f64::from(*a), f64::from(*b), scale, 1e-5, 0.0, &format!("grad {what}"));
            }
        }
    }
}

/// Central differences of `0.5 e^2 + 0.5 l2 (|u|^2 + |v|^2)`, `h = 1e-2`, tolerance `1e-3`.
#[test]
fn gradient_matches_finite_difference() {
    let mut rng = Rng::new(10);
    let k = 11;
    let (u, v) = (rng.vec(k, -1.0, 1.0), rng.vec(k, -1.0, 1.0));
    let (r, l2) = (2.5, 0.1);
    type Lgr = fn(f32, &[f32], &[f32], f32, &mut [f32], &mut [f32]) -> f32;
    for (name, f) in [("simd", simd::loss_grad_row as Lgr), ("scalar", scalar::loss_grad_row)] {
        let objective = |u: &[f32], v: &[f32]| {
            let e2 = f(r, u, v, l2, &mut vec![0.0; k], &mut vec![0.0; k]);
            0.5 * f64::from(e2) + 0.5 * f64::from(l2) * f64::from(scalar_sq(u) + scalar_sq(v))
        };
        let (mut gu, mut gv) = (vec![0.0; k], vec![0.0; k]);
        f(r, &u, &v, l2, &mut gu, &mut gv);
        let h = 1e-2;
        for j in 0..2 * k {
            let (mut up, mut vp) = (u.clone(), v.clone());
            let x = if j < k { &mut up[j] } else { &mut vp[j - k] };
            *x += h;
            let lp = objective(&up, &vp);
            let x = if j < k { &mut up[j] } else { &mut vp[j - k] };
            *x -= 2.0 * h;
            let fd = (lp - objective(&up, &vp)) / f64::from(2.0 * h);
            let g = if j < k { gu[j] } else { gv[j - k] };
            assert_close(f64::from(g), fd, fd.abs(), 1e-3, 1e-3, &format!("{name} j={j}"));
        }
    }
}

fn scalar_sq(x: &[f32]) -> f32 {
    crate::dense::scalar::sq_norm(x)
}

#[test]
fn sgd_step_is_minus_lr_times_gradient() {
    let mut rng = Rng::new(11);
    let k = 9;
    let (u, v) = (rng.vec(k, -1.0, 1.0), rng.vec(k, -1.0, 1.0));
    let (lr, l2, r) = (0.1, 0.2, 4.0);
    let (mut gu, mut gv) = (vec![0.0; k], vec![0.0; k]);
    let e2 = simd::loss_grad_row(r, &u, &v, l2, &mut gu, &mut gv);
    let (mut u1, mut v1) = (u.clone(), v.clone());
    let sse = simd::sgd_chunk(&[0], &[0], &[r], &mut u1, &mut v1, k, lr, l2);
    assert_close(sse, f64::from(e2), f64::from(e2), 1e-6, 0.0, "sse");
    for j in 0..k {
        assert_close(f64::from(u1[j]), f64::from(u[j] - lr * gu[j]), 1.0, 1e-6, 0.0, "u");
        assert_close(f64::from(v1[j]), f64::from(v[j] - lr * gv[j]), 1.0, 1e-6, 0.0, "v");
    }
}

#[test]
fn known_values() {
    type Sgd = fn(&[u32], &[u32], &[f32], &mut [f32], &mut [f32], usize, f32, f32) -> f64;
    for f in [simd::sgd_chunk as Sgd, scalar::sgd_chunk] {
        // k = 1: e = 5 - 1 * 2 = 3; u = 1 + 0.1 * 3 * 2 = 1.6; v = 2 + 0.1 * 3 * 1 = 2.3.
        let (mut u, mut v) = ([0.0, 1.0], [2.0]);
        let sse = f(&[1], &[0], &[5.0], &mut u, &mut v, 1, 0.1, 0.0);
        assert_eq!(sse, 9.0);
        assert_close(f64::from(u[1]), 1.6, 1.0, 1e-6, 0.0, "u");
        assert_close(f64::from(v[0]), 2.3, 1.0, 1e-6, 0.0, "v");
        assert_eq!(u[0], 0.0, "other users untouched");
    }
    assert_eq!(simd::rmse(&[], &[], &[], &[0.0], &[0.0], 1), 0.0);
    assert_eq!(simd::rmse(&[0, 0], &[0, 0], &[3.0, 5.0], &[1.0], &[1.0], 1), 10f64.sqrt());
}

#[test]
fn biased_rows_step_factors_and_biases_and_match_the_scalar_reference() {
    type Biased = fn(&[u32], &[u32], &[f32], &mut [f32], &mut [f32], usize, f32, f32, f32) -> f64;
    for f in [simd::sgd_chunk_biased as Biased, scalar::sgd_chunk_biased] {
        // k = 1, mean 3, b_u 0.5, b_i -0.25, u . v = 1 * 2: e = 5 - (3 + 0.5 - 0.25 + 2) = -0.25.
        let (mut u, mut v) = ([9.0, 9.0, 1.0, 0.5], [2.0, -0.25]);
        let (lr, l2) = (0.1, 0.2);
        let sse = f(&[1], &[0], &[5.0], &mut u, &mut v, 1, lr, l2, 3.0);
        assert_close(sse, 0.0625, 1.0, 1e-6, 0.0, "sse");
        let e = -0.25f32;
        for (got, want, what) in [
            (u[2], 1.0 + lr * (e * 2.0 - l2 * 1.0), "u"),
            (v[0], 2.0 + lr * (e * 1.0 - l2 * 2.0), "v"),
            (u[3], 0.5 + lr * (e - l2 * 0.5), "b_u"),
            (v[1], -0.25 + lr * (e - l2 * -0.25), "b_i"),
        ] {
            assert_close(f64::from(got), f64::from(want), 1.0, 1e-6, 0.0, what);
        }
        assert_eq!(u[..2], [9.0, 9.0], "other users untouched");
    }
    let mut rng = Rng::new(12);
    let (n_users, n_items, n) = (11, 6, 200);
    for k in [1, 8, 9, 17] {
        let users: Vec<u32> = (0..n).map(|_| rng.below(n_users) as u32).collect();
        let items: Vec<u32> = (0..n).map(|_| rng.below(n_items) as u32).collect();
        let ratings = rng.vec(n, 1.0, 5.0);
        let u0 = rng.vec(n_users * (k + 1), 0.0, 0.5);
        let v0 = rng.vec(n_items * (k + 1), 0.0, 0.5);
        let (mut u1, mut v1, mut u2, mut v2) = (u0.clone(), v0.clone(), u0.clone(), v0.clone());
        let s1 = simd::sgd_chunk_biased(&users, &items, &ratings, &mut u1, &mut v1, k, 0.02, 0.05, 3.5);
        let s2 = scalar::sgd_chunk_biased(&users, &items, &ratings, &mut u2, &mut v2, k, 0.02, 0.05, 3.5);
        assert_close(s1, s2, s2, 1e-5, 0.0, &format!("sse k={k}"));
        for (a, b) in u1.iter().zip(&u2).chain(v1.iter().zip(&v2)) {
            assert_close(
                f64::from(*a),
                f64::from(*b),
                1.0 + f64::from(b.abs()),
                1e-5,
                0.0,
                &format!("k={k}"),
            );
        }
        // The evaluation's prediction is the one the step used.
        let want: f64 = (0..n)
            .map(|i| {
                let (ur, vr) = (
                    &u1[users[i] as usize * (k + 1)..][..k + 1],
                    &v1[items[i] as usize * (k + 1)..][..k + 1],
                );
                let p = 3.5 + ur[k] + vr[k] + (0..k).map(|j| ur[j] * vr[j]).sum::<f32>();
                f64::from(ratings[i] - p).powi(2)
            })
            .sum();
        assert_close(
            simd::sse_biased(&users, &items, &ratings, &u1, &v1, k, 3.5),
            want,
            want,
            1e-5,
            0.0,
            "sse_biased",
        );
    }
}

#[test]
fn adaptive_rows_step_at_their_own_rates_and_match_the_scalar_reference() {
    type Adaptive =
        fn(&[u32], &[u32], &[f32], &mut [f32], &mut [f32], usize, f32, f32, Option<f32>, bool) -> f64;
    for f in [simd::sgd_chunk_adaptive as Adaptive, scalar::sgd_chunk_adaptive] {
        // k = 1, no biases, rows [factor, G, G of the rest]: u = 1 (G 4), v = 2 (G 1), r = 5:
        // e = 3. With one factor there is no rest: its G stays.
        let (mut u, mut v) = ([1.0, 4.0, 7.0], [2.0, 1.0, 7.0]);
        let (lr, l2) = (0.1, 0.2);
        let sse = f(&[0], &[0], &[5.0], &mut u, &mut v, 1, lr, l2, None, false);
        assert_close(sse, 9.0, 1.0, 1e-6, 0.0, "sse");
        let (gu, gv) = (l2 * 1.0 - 3.0 * 2.0, l2 * 2.0 - 3.0 * 1.0);
        for (got, want, what) in [
            (u[0], 1.0 - lr / 2.0 * gu, "u at lr / sqrt(4)"),
            (v[0], 2.0 - lr * gv, "v at lr / sqrt(1)"),
            (u[1], 4.0 + gu * gu, "G_u"),
            (v[1], 1.0 + gv * gv, "G_v"),
            (u[2], 7.0, "the rest's G_u"),
        ] {
            assert_close(f64::from(got), f64::from(want), 1.0, 1e-6, 0.0, what);
        }
        // With a bias: rows [factor, bias, G, G]; the bias steps at the row's first rate.
        let (mut u, mut v) = ([1.0, 0.5, 4.0, 1.0], [2.0, -0.25, 1.0, 1.0]);
        f(&[0], &[0], &[5.0], &mut u, &mut v, 1, lr, l2, Some(3.0), false);
        let e = 5.0f32 - (3.0 + 0.5 - 0.25 + 2.0);
        assert_close(f64::from(u[1]), f64::from(0.5 + lr / 2.0 * (e - l2 * 0.5)), 1.0, 1e-6, 0.0, "b_u");
        assert_close(f64::from(v[1]), f64::from(-0.25 + lr * (e - l2 * -0.25)), 1.0, 1e-6, 0.0, "b_i");
        // k = 10: the first 8 factors step at the first G's rate, the last 2 at the second's,
        // and each G adds the mean squared gradient of its own group. In the first pass the last
        // 2 and their G stay.
        let k = 10;
        let u0: Vec<f32> = (0..k).map(|d| 0.1 * d as f32).chain([4.0, 16.0]).collect();
        let v0: Vec<f32> = (0..k).map(|d| 0.2 - 0.05 * d as f32).chain([1.0, 9.0]).collect();
        let e = 2.0 - (0..k).map(|d| u0[d] * v0[d]).sum::<f32>();
        for first_pass in [false, true] {
            let (mut u, mut v) = (u0.clone(), v0.clone());
            f(&[0], &[0], &[2.0], &mut u, &mut v, k, lr, l2, None, first_pass);
            let (mut s, mut t) = ([0.0f32; 2], [0.0f32; 2]);
            for d in 0..k {
                let group = usize::from(d >= 8);
                let (gu, gv) = (l2 * u0[d] - e * v0[d], l2 * v0[d] - e * u0[d]);
                let (wu, wv) = if first_pass && group == 1 {
                    (u0[d], v0[d])
                } else {
                    s[group] += gu * gu;
                    t[group] += gv * gv;
                    (u0[d] - lr / u0[k + group].sqrt() * gu, v0[d] - lr / v0[k + group].sqrt() * gv)
                };
                for (row, got, want) in [("u", u[d], wu), ("v", v[d], wv)] {
                    let what = format!("{row}[{d}], first pass {first_pass}");
                    assert_close(f64::from(got), f64::from(want), 1.0, 1e-6, 0.0, &what);
                }
            }
            for (group, n) in [(0, 8.0), (1, 2.0)] {
                let (wu, wv) = (u0[k + group] + s[group] / n, v0[k + group] + t[group] / n);
                assert_close(f64::from(u[k + group]), f64::from(wu), 1.0, 1e-6, 0.0, &format!("G_u {group}"));
                assert_close(f64::from(v[k + group]), f64::from(wv), 1.0, 1e-6, 0.0, &format!("G_v {group}"));
            }
        }
    }
    let mut rng = Rng::new(13);
    let (n_users, n_items, n) = (11, 6, 300);
    for (k, mean, first_pass) in [
        (1, None, false),
        (8, None, true),
        (8, Some(3.5), false),
        (9, Some(3.5), false),
        (16, Some(3.5), true),
        (17, None, true),
        (40, Some(3.5), false),
        (40, None, false),
        (48, None, true),
    ] {
        let w = k + usize::from(mean.is_some()) + 2;
        let users: Vec<u32> = (0..n).map(|_| rng.below(n_users) as u32).collect();
        let items: Vec<u32> = (0..n).map(|_| rng.below(n_items) as u32).collect();
        let ratings = rng.vec(n, 1.0, 5.0);
        let mut u0 = rng.vec(n_users * w, 0.0, 0.5);
        let mut v0 = rng.vec(n_items * w, 0.0, 0.5);
        for g in u0.chunks_exact_mut(w).chain(v0.chunks_exact_mut(w)) {
            g[w - 2..].fill(1.0);
        }
        let (mut u1, mut v1, mut u2, mut v2) = (u0.clone(), v0.clone(), u0.clone(), v0.clone());
        let s1 = simd::sgd_chunk_adaptive(
            &users, &items, &ratings, &mut u1, &mut v1, k, 0.1, 0.05, mean, first_pass,
        );
        let s2 = scalar::sgd_chunk_adaptive(
            &users, &items, &ratings, &mut u2, &mut v2, k, 0.1, 0.05, mean, first_pass,
        );
        assert_close(s1, s2, s2, 1e-4, 0.0, &format!("sse k={k}"));
        for (a, b) in u1.iter().zip(&u2).chain(v1.iter().zip(&v2)) {
            assert_close(
                f64::from(*a),
                f64::from(*b),
                1.0 + f64::from(b.abs()),
                1e-4,
                0.0,
                &format!("k={k}"),
            );
        }
        // Every G grew from 1 where its row was rated, and the error went down.
        assert!(u1.chunks_exact(w).zip(u0.chunks_exact(w)).all(|(a, b)| a[w - 2] >= b[w - 2]));
        let after = simd::sse_rows(&users, &items, &ratings, &u1, &v1, k, w, mean);
        assert!(after < s1, "k={k}: sse {s1} before the pass, {after} after");
    }
}

#[test]
fn users_take_turns_within_a_piece() {
    // Ratings 0..6 sorted by user: user 4 has three, user 7 two, user 9 one.
    let users = [4, 4, 4, 7, 7, 9];
    let mut piece: Vec<usize> = (0..6).collect();
    super::take_turns(&mut piece, &users);
    assert_eq!(piece, [0, 3, 5, 1, 4, 2], "first ratings by user, then second ones, then the third");
    let mut one: Vec<usize> = vec![2, 0, 1];
    super::take_turns(&mut one, &[5, 5, 5]);
    assert_eq!(one, [2, 0, 1], "one user: the order stays");
}
