//! Both fast GEMMs versus the scalar one over awkward shapes, all transpose combinations and
//! block-boundary sizes; the layers' gradients versus finite differences of a tiny MLP's loss;
//! ReLU and softmax cross-entropy SIMD versus scalar.
//!
//! GEMM tolerance: `|c - c_ref| <= 1e-5 (|alpha| sum_p |a_ip b_pj| + |beta c_ij|) + 1e-6`, the
//! usual bound of a dot product's rounding error whatever the summation order.

use super::{
    dense_backward, dense_backward_as, dense_forward, scalar, simd, transpose, Backend, Matmul, Op, Weights,
};
use crate::dense::testing::{assert_close, Rng, SIZES};

#[allow(clippy::too_many_arguments)]
fn check_gemm(
    mm: &mut Matmul,
    rng: &mut Rng,
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
) {
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * n, -1.0, 1.0);
    let c0 = if beta == 0.0 { vec![f32::NAN; m * n] } else { rng.vec(m * n, -1.0, 1.0) };
    let mut want = c0.clone();
    scalar::gemm(op_a, op_b, m, n, k, alpha, &a, &b, beta, &mut want);
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let mut bound = vec![0.0; m * n];
    scalar::gemm(op_a, op_b, m, n, k, alpha.abs(), &abs(&a), &abs(&b), 0.0, &mut bound);
    let mut got = c0.clone();
    mm.matmul(op_a, op_b, m, n, k, alpha, &a, &b, beta, &mut got);
    for i in 0..m * n {
        let scale = f64::from(bound[i]) + if beta == 0.0 { 0.0 } else { f64::from((beta * c0[i]).abs()) };
        let what = format!(
            "{:?} ({:?}) {op_a:?}{op_b:?} m={m} n={n} k={k} alpha={alpha} beta={beta} at {i}",
            mm.backend(),
            mm.isa()
        );
        assert_close(f64::from(got[i]), f64::from(want[i]), scale, 1e-5, 1e-6, &what);
    }
}

#[test]
fn fast_gemms_match_scalar() {
    let mut rng = Rng::new(12);
    // Our kernel with each micro-kernel this CPU runs (the AVX-512 one only where it has
    // AVX-512F), and matrixmultiply.
    let wide = simd::Isa::runnable();
    let runners = wide.map(|isa| Matmul::with_isa(Backend::Wide, isa));
    for mut mm in runners.chain([Matmul::new(Backend::MatrixMultiply)]) {
        for op_a in [Op::N, Op::T] {
            for op_b in [Op::N, Op::T] {
                for m in [0, 1, 5, 6, 7, 13, 150] {
                    for n in [0, 1, 15, 16, 17, 31, 32, 33, 65] {
                        for k in [0, 1, 7, 8, 9, 300] {
                            let (alpha, beta) = [(1.0, 0.0), (0.7, 1.0), (-1.0, -0.5)][(m + n + k) % 3];
                            check_gemm(&mut mm, &mut rng, op_a, op_b, m, n, k, alpha, beta);
                        }
                    }
                }
                // More columns than one NC block (1024), a longer inner dimension than one KC
                // block (1024) with tiles along rows and down columns (a block of B of 4 MiB,
                // over half of any L2 seen, and smaller ones; 100 rows: over one MC block of
                // 96), and the MLP's own shapes.
                check_gemm(&mut mm, &mut rng, op_a, op_b, 7, 4100, 5, 1.0, 1.0);
                check_gemm(&mut mm, &mut rng, op_a, op_b, 13, 40, 1030, 0.7, 1.0);
                check_gemm(&mut mm, &mut rng, op_a, op_b, 100, 200, 1100, 1.0, 0.0);
                check_gemm(&mut mm, &mut rng, op_a, op_b, 16, 1100, 1100, 0.7, 1.0);
                check_gemm(&mut mm, &mut rng, op_a, op_b, 32, 128, 784, 1.0, 0.0);
                check_gemm(&mut mm, &mut rng, op_a, op_b, 10, 128, 32, 1.0, 1.0);
            }
        }
    }
}

#[test]
fn products_asking_for_rows_ahead_give_the_same_results_and_ask_for_every_line() {
    let mut rng = Rng::new(19);
    // Rows that are not on a cache line's start: the stream covers the lines they touch.
    let rows = vec![0.5f32; 64 * 100 + 3];
    let whole = 64 * 100 * 4 / crate::cpu::CACHE_LINE;
    for isa in simd::Isa::runnable() {
        let mut mm = Matmul::with_isa(Backend::Wide, isa);
        mm.warm(&rows[3..]);
        let lines = mm.warm_left();
        // One more where the slice does not start on a line.
        assert!((whole..=whole + 1).contains(&lines), "{lines} lines for 64 x 100 floats");
        // The MLP's weight gradient (no panel of its own to ask for ahead) and its forward (its
        // last row panel has none).
        check_gemm(&mut mm, &mut rng, Op::T, Op::N, 784, 32, 128, 1.0, 1.0);
        check_gemm(&mut mm, &mut rng, Op::N, Op::N, 128, 32, 784, 1.0, 0.0);
        assert_eq!(mm.warm_left(), 0, "{}: every line asked for", isa.name());
        // A stream longer than the products' turns keeps the rest for the next ones.
        let long = vec![0.0f32; 1 << 20];
        mm.warm(&long);
        // At most a quarter of L2: under the 4 MiB of `long` on any CPU seen.
        let before = mm.warm_left();
        assert!(before < (1 << 20) / 16, "{}: the stream is not capped", isa.name());
        check_gemm(&mut mm, &mut rng, Op::N, Op::T, 13, 17, 9, 0.7, -0.5);
        let left = mm.warm_left();
        assert!(left > 0 && left < before, "{}: {left} of {before} lines left", isa.name());
    }
    // The slice outliving the stream is fine: a prefetch reads nothing.
    let mut mm = Matmul::default();
    mm.warm(&vec![1.0f32; 4096]);
    check_gemm(&mut mm, &mut rng, Op::T, Op::N, 64, 32, 64, 1.0, 0.0);
}

#[test]
fn gemm_known_values() {
    // [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50]; A^T B = [26 30; 38 44]; A B^T = [17 23; 39 53].
    let (a, b) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
    for backend in [Backend::Scalar, Backend::Wide, Backend::MatrixMultiply] {
        let mut mm = Matmul::new(backend);
        for (op_a, op_b, want) in [
            (Op::N, Op::N, [19.0, 22.0, 43.0, 50.0]),
            (Op::T, Op::N, [26.0, 30.0, 38.0, 44.0]),
            (Op::N, Op::T, [17.0, 23.0, 39.0, 53.0]),
        ] {
            let mut c = [f32::NAN; 4];
            mm.matmul(op_a, op_b, 2, 2, 2, 1.0, &a, &b, 0.0, &mut c);
            assert_eq!(c, want, "{backend:?} {op_a:?}{op_b:?}");
        }
    }
}

/// The tiny MLP of the gradient check: `in -> hidden (ReLU) -> out`, softmax cross-entropy.
#[derive(Clone)]
struct Net {
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

const N: usize = 3;
const IN: usize = 5;
const HID: usize = 9;
const OUT: usize = 4;

fn loss(mm: &mut Matmul, net: &Net, order: Weights, x: &[f32], labels: &[u32]) -> f64 {
    let mut h = vec![0.0; N * HID];
    dense_forward(mm, x, &net.w1, order, &net.b1, &mut h);
    simd::relu(&mut h);
    let mut z = vec![0.0; N * OUT];
    dense_forward(mm, &h, &net.w2, order, &net.b2, &mut z);
    let mut g = vec![0.0; N * OUT];
    simd::softmax_cross_entropy(&z, labels, &mut g)
}

/// Central differences over every parameter and input of the tiny MLP (its weights in either
/// order, with the same values: each order is a different network), `h = 1e-3`, tolerance
/// `5e-3` absolute + relative (the loss is `f32` inside, so its rounding divided by `2h` is
/// about `1e-4`). The pre-activations are kept at least `0.1` away from the ReLU's kink, so no
/// perturbation crosses it.
#[test]
fn layer_gradients_match_finite_difference() {
    let mut rng = Rng::new(13);
    let x = rng.vec(N * IN, -1.0, 1.0);
    let labels = [1, 3, 0];
    let net = Net {
        w1: rng.vec(HID * IN, -0.3, 0.3),
        b1: (0..HID).map(|j| if j % 3 == 0 { -1.0 } else { 0.8 }).collect(),
        w2: rng.vec(OUT * HID, -1.0, 1.0),
        b2: rng.vec(OUT, -0.5, 0.5),
    };
    let every = [Backend::Scalar, Backend::Wide, Backend::MatrixMultiply];
    for (backend, order) in every.into_iter().flat_map(|b| [(b, Weights::OutIn), (b, Weights::InOut)]) {
        let mm = &mut Matmul::new(backend);
        let mut h = vec![0.0; N * HID];
        dense_forward(mm, &x, &net.w1, order, &net.b1, &mut h);
        assert!(h.iter().all(|v| v.abs() > 0.1), "test setup: a pre-activation is near the kink");
        simd::relu(&mut h);
        let mut z = vec![0.0; N * OUT];
        dense_forward(mm, &h, &net.w2, order, &net.b2, &mut z);
        let mut dz = vec![0.0; N * OUT];
        simd::softmax_cross_entropy(&z, &labels, &mut dz);
        let (mut gw2, mut gb2, mut dh) = (vec![0.0; OUT * HID], vec![0.0; OUT], vec![f32::NAN; N * HID]);
        dense_backward(mm, &h, &net.w2, order, &dz, &mut gw2, &mut gb2, Some(&mut dh));
        simd::relu_backward(&h, &mut dh);
        let (mut gw1, mut gb1, mut dx) = (vec![0.0; HID * IN], vec![0.0; HID], vec![0.0; N * IN]);
        dense_backward(mm, &x, &net.w1, order, &dh, &mut gw1, &mut gb1, Some(&mut dx));

        let eps = 1e-3f32;
        let checks: [(&str, &[f32], usize); 5] =
            [("w1", &gw1, 0), ("b1", &gb1, 1), ("w2", &gw2, 2), ("b2", &gb2, 3), ("x", &dx, 4)];
        for (name, grad, which) in checks {
            for (j, &g) in grad.iter().enumerate() {
                let mut at = |delta: f32| {
                    let mut np = net.clone();
                    let mut xp = x.clone();
                    let v = match which {
                        0 => &mut np.w1[j],
                        1 => &mut np.b1[j],
                        2 => &mut np.w2[j],
                        3 => &mut np.b2[j],
                        _ => &mut xp[j],
                    };
                    *v += delta;
                    loss(mm, &np, order, &xp, &labels)
                };
                let d = (at(eps) - at(-eps)) / f64::from(2.0 * eps);
                assert_close(
                    f64::from(g),
                    d,
                    d.abs(),
                    5e-3,
                    5e-3,
                    &format!("{backend:?} {order:?} {name}[{j}]"),
                );
            }
        }
    }
}

/// The forward pass with our kernel (each micro-kernel this CPU runs) and with the weights in
/// either order, against the scalar reference in PyTorch's: fewer rows than outputs (taken as
/// `W X^T`, transposed, in that order) and as many or more (`X W^T`); `Y` is written whole (it
/// starts as NaN) and the `Y^T` buffer kept between calls of different shapes leaves nothing
/// behind.
#[test]
fn dense_forward_every_way_matches_scalar() {
    let mut rng = Rng::new(15);
    let wide = simd::Isa::runnable();
    for isa in wide {
        let mm = &mut Matmul::with_isa(Backend::Wide, isa);
        for (n, n_in, n_out) in
            [(64, 784, 128), (1, 3, 2), (7, 9, 33), (33, 9, 7), (10, 20, 10), (256, 784, 128), (5, 130, 64)]
        {
            let (x, w, b) =
                (rng.vec(n * n_in, -1.0, 1.0), rng.vec(n_out * n_in, -1.0, 1.0), rng.vec(n_out, -1.0, 1.0));
            let mut wt = vec![0.0; w.len()];
            transpose(&w, n_out, n_in, &mut wt);
            let mut want = vec![0.0; n * n_out];
            dense_forward(&mut Matmul::new(Backend::Scalar), &x, &w, Weights::OutIn, &b, &mut want);
            for (order, w) in [(Weights::OutIn, &w), (Weights::InOut, &wt)] {
                let mut got = vec![f32::NAN; n * n_out];
                dense_forward(mm, &x, w, order, &b, &mut got);
                for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                    let what = format!("{isa:?} {order:?} n={n} n_in={n_in} n_out={n_out} at {i}");
                    assert_close(f64::from(*g), f64::from(*r), n_in as f64, 1e-5, 1e-6, &what);
                }
            }
        }
    }
}

/// The backward pass with the weights `n_in x n_out` is the other order's on the transposed
/// weights, its weight gradient transposed, with every backend (the layer's shapes: a
/// 64-row chunk of 784 -> 128, the 128 -> 10 layer; and ragged ones).
#[test]
fn dense_backward_in_either_order_is_the_same_layer() {
    let mut rng = Rng::new(16);
    for backend in [Backend::Scalar, Backend::Wide, Backend::MatrixMultiply] {
        let mm = &mut Matmul::new(backend);
        for (n, n_in, n_out) in [(64, 784, 128), (64, 128, 10), (7, 9, 33), (33, 17, 7)] {
            let (x, w, dy) = (
                rng.vec(n * n_in, -1.0, 1.0),
                rng.vec(n_out * n_in, -1.0, 1.0),
                rng.vec(n * n_out, -1.0, 1.0),
            );
            let (g0, gb0) = (rng.vec(w.len(), -1.0, 1.0), rng.vec(n_out, -1.0, 1.0));
            let (mut wt, mut g0t) = (vec![0.0; w.len()], vec![0.0; w.len()]);
            transpose(&w, n_out, n_in, &mut wt);
            transpose(&g0, n_out, n_in, &mut g0t);
            let (mut gw, mut gb, mut gx) = (g0.clone(), gb0.clone(), vec![f32::NAN; n * n_in]);
            dense_backward(mm, &x, &w, Weights::OutIn, &dy, &mut gw, &mut gb, Some(&mut gx));
            let (mut gwt, mut gbt, mut gxt) = (g0t, gb0, vec![f32::NAN; n * n_in]);
            dense_backward(mm, &x, &wt, Weights::InOut, &dy, &mut gwt, &mut gbt, Some(&mut gxt));
            let mut back = vec![0.0; w.len()];
            transpose(&gwt, n_in, n_out, &mut back);
            let what = format!("{backend:?} n={n} n_in={n_in} n_out={n_out}");
            for (name, got, want, k) in
                [("grad_w", &back, &gw, n), ("grad_b", &gbt, &gb, n), ("grad_x", &gxt, &gx, n_out)]
            {
                for (i, (g, r)) in got.iter().zip(want.iter()).enumerate() {
                    assert_close(
                        f64::from(*g),
                        f64::from(*r),
                        k as f64,
                        1e-5,
                        1e-6,
                        &format!("{what} {name}[{i}]"),
                    );
                }
            }
        }
    }
}

#[test]
fn dense_backward_accumulates_parameters_and_overwrites_grad_x() {
    let mut mm = Matmul::default();
    let (x, w, dy) = ([1.0, 2.0], [3.0, 4.0], [0.5]);
    let (mut gw, mut gb, mut gx) = ([1.0, 1.0], [1.0], [f32::NAN, f32::NAN]);
    dense_backward(&mut mm, &x, &w, Weights::OutIn, &dy, &mut gw, &mut gb, Some(&mut gx));
    assert_eq!((gw, gb, gx), ([1.5, 2.0], [1.5], [1.5, 2.0]));
    let mut y = [f32::NAN];
    dense_forward(&mut mm, &x, &w, Weights::OutIn, &[0.25], &mut y);
    assert_eq!(y, [11.25]);
    // Two inputs, two outputs: W = [3 4; 5 6] (a row per output) is V = [3 5; 4 6].
    let (v, dy) = ([3.0, 5.0, 4.0, 6.0], [0.5, -1.0]);
    let mut y = [f32::NAN; 2];
    dense_forward(&mut mm, &x, &v, Weights::InOut, &[0.25, 0.0], &mut y);
    assert_eq!(y, [11.25, 17.0]);
    let (mut gv, mut gb, mut gx) = ([0.0; 4], [0.0; 2], [f32::NAN; 2]);
    dense_backward(&mut mm, &x, &v, Weights::InOut, &dy, &mut gv, &mut gb, Some(&mut gx));
    // dY^T X = [0.5 1; -1 -2], in V's order [0.5 -1; 1 -2]; dY W = [1.5 - 5, 2 - 6].
    assert_eq!((gv, gb, gx), ([0.5, -1.0, 1.0, -2.0], [0.5, -1.0], [-3.5, -4.0]));
}

#[test]
fn a_fresh_backward_writes_what_one_into_zeros_adds_and_never_reads_the_old_values() {
    let mut rng = Rng::new(17);
    for backend in [Backend::Scalar, Backend::Wide, Backend::MatrixMultiply] {
        let mm = &mut Matmul::new(backend);
        // The MLP's shapes, ragged ones, and a chunk of no rows (its gradient: zeros).
        for (n, n_in, n_out) in [(64, 784, 128), (64, 128, 10), (7, 9, 33), (0, 5, 3)] {
            for order in [Weights::OutIn, Weights::InOut] {
                let (x, w, dy) = (
                    rng.vec(n * n_in, -1.0, 1.0),
                    rng.vec(n_out * n_in, -1.0, 1.0),
                    rng.vec(n * n_out, -1.0, 1.0),
                );
                let (mut gw, mut gb, mut gx) = (vec![0.0; w.len()], vec![0.0; n_out], vec![0.0; n * n_in]);
                dense_backward(mm, &x, &w, order, &dy, &mut gw, &mut gb, Some(&mut gx));
                let (mut fw, mut fb, mut fx) =
                    (vec![f32::NAN; w.len()], vec![f32::NAN; n_out], vec![0.0; n * n_in]);
                dense_backward_as(mm, &x, &w, order, &dy, &mut fw, &mut fb, Some(&mut fx), false);
                let what = format!("{backend:?} {order:?} n={n} n_in={n_in} n_out={n_out}");
                assert_eq!(fw, gw, "{what}: grad_w");
                assert_eq!(fb, gb, "{what}: grad_b");
                assert_eq!(fx, gx, "{what}: grad_x");
            }
        }
    }
}

#[test]
fn relu_and_xent_simd_match_scalar() {
    let mut rng = Rng::new(14);
    for n in SIZES {
        for off in 0..8 {
            let v = rng.vec(n + off, -1.0, 1.0);
            let (mut a, mut b) = (v[off..].to_vec(), v[off..].to_vec());
            simd::relu(&mut a);
            scalar::relu(&mut b);
            assert_eq!(a, b, "relu n={n} off={off}");
            let g = rng.vec(n + off, -1.0, 1.0);
            let (mut g1, mut g2) = (g[off..].to_vec(), g[off..].to_vec());
            simd::relu_backward(&a, &mut g1);
            scalar::relu_backward(&b, &mut g2);
            assert_eq!(g1, g2, "relu_backward n={n} off={off}");
        }
    }
    for (k, n) in [1, 2, 7, 8, 9, 10, 16, 17].into_iter().flat_map(|k| [(k, 5), (k, 8), (k, 29)]) {
        let logits = rng.vec(n * k, -5.0, 5.0);
        let labels: Vec<u32> = (0..n).map(|_| rng.below(k) as u32).collect();
        let (mut g1, mut g2) = (vec![0.0; n * k], vec![0.0; n * k]);
        let l1 = simd::softmax_cross_entropy(&logits, &labels, &mut g1);
        let l2 = scalar::softmax_cross_entropy(&logits, &labels, &mut g2);
        assert_close(l1, l2, l2, 1e-5, 1e-6, &format!("xent k={k} n={n}"));
        for (a, b) in g1.iter().zip(&g2) {
            assert_close(f64::from(*a), f64::from(*b), 1.0, 1e-6, 0.0, &format!("xent grad k={k} n={n}"));
        }
    }
}
