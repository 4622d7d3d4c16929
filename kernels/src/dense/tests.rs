//! SIMD versus scalar on awkward lengths and unaligned starts.
//!
//! Tolerance for the reductions: `|simd - scalar| <= rel * sum_i |a_i b_i|` (relative to the sum of
//! absolute terms, which bounds the rounding error of any summation order) with
//! `rel = max(1e-5, 2 sqrt(n) u)`, `u = 2^-24`: the sequential reference's own rounding error grows
//! like `sqrt(n) u` (it reaches 1.6e-5 for `sq_norm` at n = 100_003), so at large n the loose part
//! is the reference. That no element is dropped or repeated is checked exactly, at every size, by
//! `dyadic_data_gives_exact_sums`. The element-wise kernels differ only by FMA rounding: `1e-6`
//! relative per element.

use super::testing::{assert_close, Rng, SIZES};
use super::{scalar, simd};
use proptest::prelude::*;

/// Relative tolerance of a sum of `n` terms, see the module doc.
fn sum_tolerance(n: usize) -> f64 {
    f64::max(1e-5, 2.0 * (n as f64).sqrt() * f64::from(f32::EPSILON) / 2.0)
}

fn check_all(n: usize, off: usize, rng: &mut Rng) {
    let a = rng.vec(n + off, -1.0, 1.0);
    let b = rng.vec(n + off, -1.0, 1.0);
    let (a, b) = (&a[off..], &b[off..]);
    let what = format!("n={n} off={off}");
    let rel = sum_tolerance(n);

    let abs_dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from((x * y).abs())).sum();
    let got = f64::from(simd::dot(a, b));
    assert_close(got, f64::from(scalar::dot(a, b)), abs_dot, rel, 0.0, &format!("dot {what}"));

    let sq: f64 = a.iter().map(|x| f64::from(x * x)).sum();
    assert_close(f64::from(simd::sq_norm(a)), f64::from(scalar::sq_norm(a)), sq, rel, 0.0, &what);

    let mut y1 = b.to_vec();
    let mut y2 = b.to_vec();
    simd::axpy(-0.7, a, &mut y1);
    scalar::axpy(-0.7, a, &mut y2);
    for (i, (p, q)) in y1.iter().zip(&y2).enumerate() {
        let scale = f64::from(b[i].abs() + 0.7 * a[i].abs());
        assert_close(f64::from(*p), f64::from(*q), scale, 1e-6, 0.0, &format!("axpy {what} i={i}"));
    }

    let mut x1 = a.to_vec();
    let mut x2 = a.to_vec();
    simd::scale(1.3, &mut x1);
    scalar::scale(1.3, &mut x2);
    assert_eq!(x1, x2, "scale {what}");
}

#[test]
fn simd_matches_scalar_on_awkward_sizes_and_offsets() {
    let mut rng = Rng::new(1);
    for n in SIZES {
        for off in 0..8 {
            check_all(n, off, &mut rng);
        }
    }
}

/// Multiples of 1/8 in [-1, 1]: every product is a multiple of 1/64 and every partial sum of up to
/// 100_003 of them is exact in f32 (needs 24 bits), so any summation order gives the same result
/// and a dropped or repeated element shows.
#[test]
fn dyadic_data_gives_exact_sums() {
    let mut rng = Rng::new(2);
    for n in SIZES {
        let a: Vec<f32> = (0..n).map(|_| (rng.below(17) as f32 - 8.0) / 8.0).collect();
        let b: Vec<f32> = (0..n).map(|_| (rng.below(17) as f32 - 8.0) / 8.0).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
        assert_eq!(f64::from(simd::dot(&a, &b)), exact, "dot n={n}");
        assert_eq!(f64::from(scalar::dot(&a, &b)), exact, "scalar dot n={n}");
        let sq: f64 = a.iter().map(|x| f64::from(x * x)).sum();
        assert_eq!(f64::from(simd::sq_norm(&a)), sq, "sq_norm n={n}");
    }
}

#[test]
fn known_values() {
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
    assert_eq!(simd::dot(&a, &a), 285.0);
    assert_eq!(simd::sq_norm(&a), 285.0);
    let mut y = [1.0; 9];
    simd::axpy(2.0, &a, &mut y);
    assert_eq!(y, [3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0, 17.0, 19.0]);
    simd::scale(0.5, &mut y);
    assert_eq!(y[8], 9.5);
}

/// Each of the four sums is its own vector's, lane for lane: powers of two that no two lanes or
/// vectors share, so a lane summed into the wrong sum or twice shows.
#[test]
fn four_sums_at_once_keep_their_lanes_apart() {
    let v = |j: i32| wide::f32x8::from(std::array::from_fn::<f32, 8, _>(|l| 2f32.powi(8 * j + l as i32)));
    let got = simd::reduce_add4(v(0), v(1), v(2), v(3)).to_array();
    for (j, got) in got.into_iter().enumerate() {
        assert_eq!(got, v(j as i32).reduce_add(), "sum {j}");
        assert_eq!(got, (0..8).map(|l| 2f32.powi(8 * j as i32 + l)).sum::<f32>(), "sum {j}");
    }
}

#[test]
#[should_panic(expected = "dot: length mismatch")]
fn dot_rejects_mismatched_lengths() {
    simd::dot(&[1.0; 3], &[1.0; 4]);
}

proptest! {
    #[test]
    fn simd_matches_scalar_random_lengths(n in 0usize..300, off in 0usize..8, seed in any::<u64>()) {
        check_all(n, off, &mut Rng::new(seed));
    }
}
