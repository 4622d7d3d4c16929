//! SIMD versus scalar on awkward row counts, row lengths and offsets; gradient versus a finite
//! difference of the loss; known values.
//!
//! Tolerances: the loss sums agree to `1e-5` relative (the SIMD version computes each row's loss
//! in `f32`, the reference in `f64`); each gradient entry to `1e-5 * sum |v|` over its nonzeros
//! (`|sigmoid - y| <= 1`, so that sum bounds the entry and its rounding error).

use super::{scalar, simd, Csr, SparseGrad};
use crate::dense::testing::{assert_close, Rng};

/// A random CSR dataset: row lengths `0..=max_nnz` (so empty and odd-length rows occur).
struct Data {
    row_ptr: Vec<u64>,
    indices: Vec<u32>,
    values: Vec<f32>,
    y: Vec<f32>,
}

impl Data {
    fn new(rng: &mut Rng, n_rows: usize, dim: usize, max_nnz: usize) -> Data {
        let mut d = Data { row_ptr: vec![0], indices: Vec::new(), values: Vec::new(), y: Vec::new() };
        for _ in 0..n_rows {
            for _ in 0..rng.below(max_nnz + 1) {
                d.indices.push(rng.below(dim) as u32);
                d.values.push(rng.uniform(-1.0, 1.0));
            }
            d.row_ptr.push(d.indices.len() as u64);
            d.y.push(rng.below(2) as f32);
        }
        d
    }

    /// Rows `r0..r1`, as a dataset shard sees them (absolute row pointers).
    fn view(&self, r0: usize, r1: usize) -> (Csr<'_>, &[f32]) {
        let (s, e) = (self.row_ptr[r0] as usize, self.row_ptr[r1] as usize);
        let x =
            Csr { row_ptr: &self.row_ptr[r0..=r1], indices: &self.indices[s..e], values: &self.values[s..e] };
        (x, &self.y[r0..r1])
    }
}

#[test]
fn csr_view_of_a_shard() {
    let d = Data::new(&mut Rng::new(3), 20, 50, 9);
    let (x, _) = d.view(5, 12);
    assert_eq!(x.n_rows(), 7);
    assert_eq!(x.nnz(), (d.row_ptr[12] - d.row_ptr[5]) as usize);
    let (idx, val) = x.row(2);
    let s = d.row_ptr[7] as usize;
    assert_eq!(idx, &d.indices[s..d.row_ptr[8] as usize]);
    assert_eq!(val, &d.values[s..d.row_ptr[8] as usize]);
    let empty = Csr { row_ptr: &[], indices: &[], values: &[] };
    assert_eq!((empty.n_rows(), empty.nnz()), (0, 0));
}

#[test]
fn simd_matches_scalar() {
    let mut rng = Rng::new(4);
    let dim = 300;
    let d = Data::new(&mut rng, 2100, dim, 40);
    let w = rng.vec(dim, -0.5, 0.5);
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 2000] {
        for r0 in [0, 1, 5, 100] {
            let (x, y) = d.view(r0, r0 + n);
            let what = format!("n={n} r0={r0}");
            let mut g1 = vec![0.25; dim];
            let mut g2 = g1.clone();
            let l1 = simd::loss_grad_dense(x, y, &w, &mut g1);
            let l2 = scalar::loss_grad_dense(x, y, &w, &mut g2);
            assert_close(l1, l2, l2.abs(), 1e-5, 1e-6, &format!("loss {what}"));
            let mut scale = vec![0.0f64; dim];
            for (&j, &v) in x.indices.iter().zip(x.values) {
                scale[j as usize] += f64::from(v.abs());
            }
            for j in 0..dim {
                let what = format!("grad {what} j={j}");
                assert_close(f64::from(g1[j]), f64::from(g2[j]), scale[j], 1e-5, 1e-7, &what);
            }

            let mut sg = SparseGrad::new(dim);
            let l3 = simd::loss_grad_sparse(x, y, &w, &mut sg);
            assert_eq!(l1, l3, "sparse loss {what}");
            let mut g0 = vec![0.0; dim];
            simd::loss_grad_dense(x, y, &w, &mut g0);
            for (j, v) in sg.iter() {
                assert_eq!(v, g0[j as usize], "sparse grad {what} j={j}");
            }
            let mut touched: Vec<u32> = x.indices.to_vec();
            touched.sort_unstable();
            touched.dedup();
            let mut got: Vec<u32> = sg.indices().to_vec();
            got.sort_unstable();
            assert_eq!(got, touched, "touched set {what}");
            assert_eq!(sg.len(), touched.len(), "len {what}");
            for &j in &touched {
                assert_eq!(sg.get(j), g0[j as usize], "get {what} j={j}");
            }

            let mut p1 = vec![0.0; n];
            let mut p2 = vec![0.0; n];
            simd::predict(x, &w, &mut p1);
            scalar::predict(x, &w, &mut p2);
            for (a, b) in p1.iter().zip(&p2) {
                assert_close(f64::from(*a), f64::from(*b), 1.0, 1e-6, 0.0, &format!("predict {what}"));
            }
        }
    }
}

/// With an intercept (the last weight): SIMD against scalar, dense against sparse, and the
/// intercept's gradient is the sum of the rows' `sigmoid(z) - y`.
#[test]
fn intercept_simd_matches_scalar_and_sums_the_residuals() {
    let mut rng = Rng::new(7);
    let dim = 200;
    let d = Data::new(&mut rng, 600, dim, 30);
    let mut w = rng.vec(dim + 1, -0.5, 0.5);
    w[dim] = -1.5;
    for n in [0, 1, 7, 8, 9, 17, 500] {
        let (x, y) = d.view(3, 3 + n);
        let what = format!("n={n}");
        let mut g1 = vec![0.0; dim + 1];
        let mut g2 = g1.clone();
        let l1 = simd::loss_grad_dense_intercept(x, y, &w, &mut g1);
        let l2 = scalar::loss_grad_dense_intercept(x, y, &w, &mut g2);
        assert_close(l1, l2, l2.abs(), 1e-5, 1e-6, &format!("loss {what}"));
        // The intercept's gradient: every row's residual at z = x . w + b.
        let mut p = vec![0.0; n];
        scalar::predict_intercept(x, &w, &mut p);
        let residuals: f64 = p.iter().zip(y).map(|(&p, &y)| f64::from(p) - f64::from(y)).sum();
        for g in [&g1, &g2] {
            assert_close(f64::from(g[dim]), residuals, n as f64, 1e-5, 1e-6, &format!("intercept {what}"));
        }
        for j in 0..dim {
            assert_close(f64::from(g1[j]), f64::from(g2[j]), 1.0 + f64::from(g2[j].abs()), 1e-5, 1e-6, &what);
        }
        let mut sg = SparseGrad::new(dim + 1);
        assert_eq!(simd::loss_grad_sparse_intercept(x, y, &w, &mut sg), l1, "sparse loss {what}");
        for (j, v) in sg.iter() {
            assert_eq!(v, g1[j as usize], "sparse grad {what} j={j}");
        }
        assert_eq!(sg.get(dim as u32), g1[dim], "sparse intercept {what}");
        let mut p1 = vec![0.0; n];
        simd::predict_intercept(x, &w, &mut p1);
        for (a, b) in p1.iter().zip(&p) {
            assert_close(f64::from(*a), f64::from(*b), 1.0, 1e-6, 0.0, &format!("predict {what}"));
        }
        // Without the intercept the same weights give other probabilities: it is used.
        if n > 0 {
            let mut p0 = vec![0.0; n];
            simd::predict(x, &w[..dim], &mut p0);
            assert!(p0.iter().zip(&p1).any(|(a, b)| (a - b).abs() > 1e-3), "{what}");
        }
    }
    // A row with no features: z = b.
    let (row_ptr, idx, val) = ([0u64, 0], [0u32; 0], [0.0f32; 0]);
    let x = Csr { row_ptr: &row_ptr, indices: &idx, values: &val };
    let mut g = [0.0, 0.0];
    let l = scalar::loss_grad_dense_intercept(x, &[1.0], &[5.0, 0.0], &mut g);
    assert_close(l, std::f64::consts::LN_2, 1.0, 1e-6, 0.0, "b=0 loss");
    assert_eq!(g, [0.0, -0.5]);
}

#[test]
fn margin_matches_scalar() {
    let mut rng = Rng::new(5);
    let w = rng.vec(1000, -1.0, 1.0);
    for n in [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33] {
        let idx: Vec<u32> = (0..n).map(|_| rng.below(1000) as u32).collect();
        let val = rng.vec(n, -1.0, 1.0);
        let want = f64::from(scalar::margin(&idx, &val, &w));
        let scale: f64 = idx.iter().zip(&val).map(|(&j, v)| f64::from((v * w[j as usize]).abs())).sum();
        assert_close(f64::from(simd::margin(&idx, &val, &w)), want, scale, 1e-5, 0.0, "margin");
    }
}

/// Central differences of the summed loss, `h = 1e-2`; the tolerance (`2e-3` absolute + relative)
/// covers the `O(h^2)` truncation and the `f32` rounding of the margins divided by `2h`.
#[test]
fn gradient_matches_finite_difference() {
    let mut rng = Rng::new(6);
    let dim = 12;
    let d = Data::new(&mut rng, 25, dim, 6);
    let (x, y) = d.view(0, 25);
    let w = rng.vec(dim, -1.0, 1.0);
    let mut wb = w.clone();
    wb.push(0.7);
    type LossGrad = fn(Csr<'_>, &[f32], &[f32], &mut [f32]) -> f64;
    for (name, f, w) in [
        ("simd", simd::loss_grad_dense as LossGrad, &w),
        ("scalar", scalar::loss_grad_dense, &w),
        ("simd with intercept", simd::loss_grad_dense_intercept, &wb),
        ("scalar with intercept", scalar::loss_grad_dense_intercept, &wb),
    ] {
        let dim = w.len();
        let mut g = vec![0.0; dim];
        f(x, y, w, &mut g);
        let mut scratch = vec![0.0; dim];
        let h = 1e-2;
        for j in 0..dim {
            let mut wp = w.clone();
            wp[j] += h;
            let lp = f(x, y, &wp, &mut scratch);
            wp[j] -= 2.0 * h;
            let lm = f(x, y, &wp, &mut scratch);
            let fd = (lp - lm) / (2.0 * f64::from(h));
            assert_close(f64::from(g[j]), fd, fd.abs(), 2e-3, 2e-3, &format!("{name} j={j}"));
        }
    }
}

#[test]
fn known_values_and_extreme_margins() {
    // One row x = [1] at feature 0: z = w[0].
    let (row_ptr, idx, val) = ([7u64, 8], [0u32], [1.0f32]);
    let x = Csr { row_ptr: &row_ptr, indices: &idx, values: &val };
    type LossGrad = fn(Csr<'_>, &[f32], &[f32], &mut [f32]) -> f64;
    for f in [simd::loss_grad_dense as LossGrad, scalar::loss_grad_dense] {
        let mut g = [0.0];
        let l = f(x, &[1.0], &[0.0], &mut g);
        assert_close(l, std::f64::consts::LN_2, 1.0, 1e-6, 0.0, "z=0 loss");
        assert_close(f64::from(g[0]), -0.5, 1.0, 1e-6, 0.0, "z=0 grad");
        for (z, y, loss, grad) in
            [(100.0, 0.0, 100.0, 1.0), (-100.0, 1.0, 100.0, -1.0), (100.0, 1.0, 0.0, 0.0)]
        {
            let mut g = [0.0];
            let l = f(x, &[y], &[z], &mut g);
            assert_close(l, loss, 100.0, 1e-6, 0.0, &format!("z={z} y={y} loss"));
            assert_close(f64::from(g[0]), grad, 1.0, 1e-6, 0.0, &format!("z={z} y={y} grad"));
        }
    }
}

#[test]
fn sparse_grad_reuse_and_l2() {
    let dim = 300_000;
    let mut g = SparseGrad::new(dim);
    g.add(70_000, 2.0);
    g.add(3, 1.0);
    g.add(299_999, -1.0);
    g.add(3, 0.5);
    g.add(64, 0.25);
    assert_eq!(g.len(), 4);
    assert_eq!(g.iter().collect::<Vec<_>>(), vec![(70_000, 2.0), (3, 1.5), (299_999, -1.0), (64, 0.25)]);
    let w: Vec<f32> = (0..dim).map(|j| (j % 10) as f32).collect();
    g.add_l2_touched(&w, 0.1);
    assert_close(f64::from(g.get(3)), 1.8, 1.0, 1e-6, 0.0, "l2 touched");
    assert_eq!(g.get(5), 0.0, "l2 leaves untouched features alone");
    g.clear();
    assert!(g.is_empty());
    assert_eq!((g.get(3), g.get(70_000), g.iter().count()), (0.0, 0.0, 0));
    g.add(9, -1.0);
    g.add(9, -1.0);
    assert_eq!(g.iter().collect::<Vec<_>>(), vec![(9, -2.0)]);
    // Two features in one bitmap word: clearing one word clears both marks.
    g.add(10, 1.0);
    g.clear();
    g.add(10, 3.0);
    assert_eq!(g.iter().collect::<Vec<_>>(), vec![(10, 3.0)]);
    assert_eq!(g.get(9), 0.0);

    let mut dense = vec![1.0; 10];
    super::add_l2(&w[..10], &mut dense, 0.5);
    assert_eq!(dense[4], 3.0);
}

#[test]
fn a_traded_gradient_is_scaled_and_handed_over_whole() {
    let dim = 200;
    let mut g = SparseGrad::new(dim);
    for (j, v) in [(130u32, 1.0f32), (7, -2.0), (64, 0.5), (7, 1.0), (199, 4.0)] {
        g.add(j, v);
    }
    let (mut dense, mut bits, mut list) = (vec![0.0f32; dim], vec![0u64; dim.div_ceil(64)], Vec::new());
    g.trade(-0.5, &mut dense, &mut bits, &mut list);
    assert_eq!(list, vec![130, 7, 64, 199], "the touched features, in first-touch order");
    let want: Vec<f32> = (0..dim)
        .map(|j| {
            [(130, -0.5), (7, 0.5), (64, -0.25), (199, -2.0)].iter().find(|p| p.0 == j).map_or(0.0, |p| p.1)
        })
        .collect();
    assert_eq!(dense, want);
    let marked: Vec<usize> = (0..dim).filter(|&j| bits[j / 64] & (1 << (j % 64)) != 0).collect();
    assert_eq!(marked, vec![7, 64, 130, 199]);
    // Left empty, with the zeroed buffers it was given: it scatters afresh.
    assert!(g.is_empty() && g.values().iter().all(|&v| v == 0.0));
    g.add(64, 3.0);
    g.add(65, 1.0);
    assert_eq!(g.iter().collect::<Vec<_>>(), vec![(64, 3.0), (65, 1.0)]);
    // Scale 1: handed over as it is.
    let (mut d2, mut b2, mut l2) = (vec![0.0f32; dim], vec![0u64; dim.div_ceil(64)], Vec::new());
    g.trade(1.0, &mut d2, &mut b2, &mut l2);
    assert_eq!((d2[64], d2[65], l2), (3.0, 1.0, vec![64, 65]));
}

#[test]
#[should_panic(expected = "not empty")]
fn a_trade_into_a_vector_that_is_not_empty_panics() {
    let mut g = SparseGrad::new(10);
    g.add(1, 1.0);
    g.trade(1.0, &mut vec![0.0; 10], &mut vec![0; 1], &mut vec![3]);
}

/// The penalized kernels give the plain kernel's loss, and its gradient plus `l2 * w[j]` at every
/// nonzero of feature `j` (the pass the model made after the kernel before, on the scalar
/// reference), dense and sparse, with and without an intercept; `l2 = 0` is the plain kernel,
/// bit for bit.
#[test]
fn penalized_kernels_add_the_lazy_l2_at_every_nonzero() {
    let mut rng = Rng::new(11);
    let dim = 97;
    let d = Data::new(&mut rng, 203, dim, 17);
    let (x, y) = d.view(0, 203);
    let l2 = 0.37f32;
    for intercept in [false, true] {
        let len = dim + usize::from(intercept);
        let w: Vec<f32> = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
        // The reference: the plain kernel, then the model's former pass.
        let mut want = vec![0.0f32; len];
        let plain = if intercept {
            scalar::loss_grad_dense_intercept(x, y, &w, &mut want)
        } else {
            scalar::loss_grad_dense(x, y, &w, &mut want)
        };
        x.indices.iter().for_each(|&j| want[j as usize] += l2 * w[j as usize]);
        // Each entry to 1e-5 of what its nonzeros can add up to.
        let bound = |j: usize| {
            let n = x.indices.iter().zip(x.values).filter(|(&i, _)| i as usize == j);
            n.map(|(_, v)| v.abs() + l2 * w[j].abs()).sum::<f32>().max(1.0)
        };
        let what = format!("intercept {intercept}");
        let mut g = vec![0.0f32; len];
        let loss = simd::loss_grad_dense_penalized(x, y, &w, &mut g, intercept, l2);
        assert_close(loss, plain, 1.0, 1e-5, 0.0, &format!("{what}: loss"));
        let mut s = SparseGrad::new(len);
        let loss_s = simd::loss_grad_sparse_penalized(x, y, &w, &mut s, intercept, l2);
        assert_close(loss_s, plain, 1.0, 1e-5, 0.0, &format!("{what}: sparse loss"));
        for j in 0..len {
            let b = f64::from(bound(j));
            assert_close(f64::from(g[j]), f64::from(want[j]), b, 1e-5, 0.0, &format!("{what}: g[{j}]"));
            assert_close(
                f64::from(s.get(j as u32)),
                f64::from(want[j]),
                b,
                1e-5,
                0.0,
                &format!("{what}: s[{j}]"),
            );
        }
        // The intercept is not penalized, and nothing is added where no row has the feature.
        for j in (0..dim).filter(|&j| !x.indices.contains(&(j as u32))) {
            assert_eq!((g[j], s.get(j as u32)), (0.0, 0.0), "{what}: untouched feature {j}");
        }
        // No penalty: the plain kernels, bit for bit.
        let (mut a, mut b) = (vec![0.0f32; len], vec![0.0f32; len]);
        let la = simd::loss_grad_dense_penalized(x, y, &w, &mut a, intercept, 0.0);
        let lb = if intercept {
            simd::loss_grad_dense_intercept(x, y, &w, &mut b)
        } else {
            simd::loss_grad_dense(x, y, &w, &mut b)
        };
        assert_eq!((la.to_bits(), a), (lb.to_bits(), b), "intercept {intercept}: l2 = 0");
    }
}
