//! Our own `wide` GEMM: BLIS-style blocks and a 6x16 register-tiled micro-kernel, its operands
//! packed only where their layout asks for it; `f32x8` ReLU and softmax cross-entropy.
//!
//! Loops, outermost first (BLIS): `jc` over `NC` columns of `C`; `pc` over `KC` of the inner
//! dimension, that `KC x NC` block of `op(B)` in column panels of 16; `ic` over `MC` rows, that
//! `MC x KC` block of `op(A)` in row panels of 6; then every (6-row panel, 16-column panel) pair
//! runs the micro-kernel (along the rows of `C` or down its columns: see `ROW_ORDER_B_BYTES`),
//! which keeps its 6x16 tile of `C` in 12 `f32x8` registers for the whole `KC` loop: per step,
//! two loads of `B`, six broadcasts of `A` and 12 FMAs.
//!
//! What the micro-kernel reads per step is 16 consecutive values of a row of `op(B)` and one
//! value of each of 6 rows of `op(A)`. A transposed operand has neither in one place, and is
//! packed (8x8 `f32x8` transposes into panels). An untransposed one already has them: a row of
//! `op(B) = B` holds its 16 values side by side, one row length from the next step's, and the 6
//! rows of `op(A) = A` are 6 streams the prefetcher follows; both are read in place, but for a
//! ragged last panel, packed with zeros past the edge so that the micro-kernel never branches.
//! (BLIS packs every panel, for contiguous streams and fewer TLB misses on large matrices; at
//! an MLP's sizes the copy cost more than it saved.) Measured in one process on a Zen 4, the
//! packed and in-place versions alternated, 12 rounds of 200 calls, operands in cache: the
//! first layer's forward `X W1^T` of a 64-row chunk 137.3 -> 131.7 us, of 256 rows 494 -> 472
//! us, its weight gradient `dH^T X` 134.4 -> 131.4 us, the 10-output layer 3.9 -> 3.0 us;
//! reading `op(A) = A^T` in place too (each step's 6 values a row length from the next's) took
//! the weight gradient to 140 us, and is not done. MLP training, 2 MPI ranks, 8 runs of each
//! binary alternated: 279.9k -> 292.8k samples/s at batch 128, 354.7k -> 362.2k at 512
//! (medians), the same model.

use std::array;

use wide::f32x8;

use super::{check_gemm, Op};
use crate::dense::simd::{load, store, LANES};

/// Rows of the micro-tile.
const MR: usize = 6;
/// Columns of the micro-tile (two `f32x8`).
const NR: usize = 16;
/// Inner-dimension block: a `MR x KC` panel of `A` (24 KiB) stays in L1, a `KC x NR` panel of
/// `B` (64 KiB) streams from L2. BLIS keeps the panel of `B` in L1 (`KC` = 256 here before), but
/// an MLP's inner dimension is its input width (784 for MNIST-sized images): in one block, each
/// tile of `C` is written once rather than once per block, and nothing is packed twice.
/// Measured on the forward `X W1^T` of a 64-row chunk and of 256 rows (both orders of tiles
/// alternated in one process, 1000 calls each, two runs): `KC` = 512, 784 and 1024 took 2, 4
/// and 5 % less time than 256.
const KC: usize = 1024;
/// Row block: the packed `MC x KC` block of `A` (384 KiB) stays in L2.
const MC: usize = 96;
/// Column block: the packed `KC x NC` block of `B` (up to 4 MiB) lives in L3.
const NC: usize = 1024;

/// Packed blocks of `B` up to this size are walked once per row panel of `A` (tiles along the
/// rows of `C`), larger ones once in all (BLIS's order, tiles down the columns of `C`). A
/// short inner dimension makes `C` the bulk of the traffic: the weight gradient `dH^T X` of a
/// 64-row chunk (`k = 64`) updates a 128 x 784 `C` (400 KiB, out of L2) in tiles of 6 x 16, and
/// going along its rows, which the prefetcher follows, took 5-8 % less time than going down
/// its columns (both orders alternated in one process, `C` evicted between calls, 1000 calls
/// each, three runs); the MLP's other products took the same time either way.
const ROW_ORDER_B_BYTES: usize = 256 * 1024;

/// Packing buffers for [`gemm`], grown on first use and then reused (no allocation in steady
/// state).
#[derive(Debug, Clone, Default)]
pub struct Pack {
    a: Vec<f32>,
    b: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// Packs rows `i0..i0 + mc`, columns `p0..p0 + kc` of `op(A)` (strides `rs`, `cs`, one of them
/// 1) into panels of `MR` rows: `out[panel][kk * MR + i]`, zero rows past `mc`.
///
/// `op(A) = A` (`cs == 1`, rows contiguous): 8x8 `f32x8` transposes of `MR` rows (plus zero
/// rows) by 8 columns, then the first `MR` lanes of each column; `op(A) = A^T` (`rs == 1`): each
/// column of the panel is `MR` contiguous floats, a copy.
#[allow(clippy::too_many_arguments)]
fn pack_a(a: &[f32], rs: usize, cs: usize, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [f32]) {
    for (p, panel) in out.chunks_exact_mut(kc * MR).enumerate() {
        let rows = (mc - p * MR).min(MR);
        let r0 = i0 + p * MR;
        if rows < MR {
            panel.fill(0.0);
        }
        if cs == 1 {
            let kc8 = kc - kc % LANES;
            for kk in (0..kc8).step_by(LANES) {
                let t = f32x8::transpose(array::from_fn(|i| {
                    if i < rows {
                        let s = (r0 + i) * rs + p0 + kk;
                        load(&a[s..s + LANES])
                    } else {
                        f32x8::ZERO
                    }
                }));
                for (q, col) in panel[kk * MR..(kk + LANES) * MR].chunks_exact_mut(MR).enumerate() {
                    col.copy_from_slice(&t[q].as_array()[..MR]);
                }
            }
            for i in 0..rows {
                let s = (r0 + i) * rs + p0;
                for kk in kc8..kc {
                    panel[kk * MR + i] = a[s + kk];
                }
            }
        } else {
            for (kk, col) in panel.chunks_exact_mut(MR).enumerate() {
                let s = (p0 + kk) * cs + r0;
                if rows == MR {
                    // Fixed length: an inline copy, not a `memcpy` call per column.
                    col.copy_from_slice(&a[s..s + MR]);
                } else {
                    col[..rows].copy_from_slice(&a[s..s + rows]);
                }
            }
        }
    }
}

/// Packs rows `p0..p0 + kc`, columns `j0..j0 + nc` of `op(B)` (strides `rs`, `cs`, one of them
/// 1) into panels of `NR` columns: `out[panel][kk * NR + j]`, zero columns past `nc`.
///
/// `op(B) = B` (`cs == 1`): each row of the panel is a contiguous copy; `op(B) = B^T`
/// (`rs == 1`, columns contiguous): 8x8 `f32x8` transposes, two per 8 rows of the panel.
#[allow(clippy::too_many_arguments)]
fn pack_b(b: &[f32], rs: usize, cs: usize, p0: usize, kc: usize, j0: usize, nc: usize, out: &mut [f32]) {
    for (q, panel) in out.chunks_exact_mut(kc * NR).enumerate() {
        let cols = (nc - q * NR).min(NR);
        let jq = j0 + q * NR;
        if cols < NR {
            panel.fill(0.0);
        }
        if cs == 1 {
            for (kk, dst) in panel.chunks_exact_mut(NR).enumerate() {
                let s = (p0 + kk) * rs + jq;
                if cols == NR {
                    // Fixed length: two `f32x8` moves, not a `memcpy` call per row.
                    store(&mut dst[..LANES], load(&b[s..s + LANES]));
                    store(&mut dst[LANES..], load(&b[s + LANES..s + NR]));
                } else {
                    dst[..cols].copy_from_slice(&b[s..s + cols]);
                }
            }
        } else {
            let kc8 = kc - kc % LANES;
            for h in 0..NR / LANES {
                let hcols = cols.saturating_sub(h * LANES).min(LANES);
                if hcols == 0 {
                    break;
                }
                for kk in (0..kc8).step_by(LANES) {
                    let t = f32x8::transpose(array::from_fn(|j| {
                        if j < hcols {
                            let s = (jq + h * LANES + j) * cs + p0 + kk;
                            load(&b[s..s + LANES])
                        } else {
                            f32x8::ZERO
                        }
                    }));
                    for (r, t) in t.iter().enumerate() {
                        let d = (kk + r) * NR + h * LANES;
                        store(&mut panel[d..d + LANES], *t);
                    }
                }
                for j in 0..hcols {
                    let s = (jq + h * LANES + j) * cs + p0;
                    for kk in kc8..kc {
                        panel[kk * NR + h * LANES + j] = b[s + kk];
                    }
                }
            }
        }
    }
}

/// Where the micro-kernel reads a panel of `MR` rows of `op(A)` over `kc` steps of the inner
/// dimension.
#[derive(Clone, Copy)]
enum APanel<'a> {
    /// `op(A) = A` read in place: row `i`'s values `rows[i][..kc]`, each row a stream the
    /// prefetcher follows.
    Rows([&'a [f32]; MR]),
    /// Packed: the `MR` values of each step side by side.
    Packed(&'a [f32]),
}

/// The 6x16 micro-kernel: `sum_kk a[kk] (6) x b[kk] (16)` over `kc` steps, `b`'s rows of 16
/// `rsb` apart (a packed panel: `NR`; `op(B) = B` read in place: `B`'s row length).
#[inline(always)]
fn kernel(a: APanel<'_>, b: &[f32], rsb: usize, kc: usize) -> [[f32x8; 2]; MR] {
    let mut acc = [[f32x8::ZERO; 2]; MR];
    let mut step = |ak: [f32; MR], bk: &[f32]| {
        let (b0, b1) = (load(&bk[..LANES]), load(&bk[LANES..NR]));
        for i in 0..MR {
            let ai = f32x8::splat(ak[i]);
            acc[i][0] = ai.mul_add(b0, acc[i][0]);
            acc[i][1] = ai.mul_add(b1, acc[i][1]);
        }
    };
    match a {
        APanel::Packed(ap) if rsb == NR => {
            // Both packed: fixed strides, no bounds test per step.
            for (ak, bk) in ap[..kc * MR].chunks_exact(MR).zip(b[..kc * NR].chunks_exact(NR)) {
                step(array::from_fn(|i| ak[i]), bk);
            }
        }
        APanel::Packed(ap) => {
            for (kk, ak) in ap[..kc * MR].chunks_exact(MR).enumerate() {
                step(array::from_fn(|i| ak[i]), &b[kk * rsb..kk * rsb + NR]);
            }
        }
        APanel::Rows(rows) => {
            let rows: [&[f32]; MR] = array::from_fn(|i| &rows[i][..kc]);
            for kk in 0..kc {
                step(array::from_fn(|i| rows[i][kk]), &b[kk * rsb..kk * rsb + NR]);
            }
        }
    }
    acc
}

/// `C[tile] <- alpha acc + beta C[tile]` for the valid `mr x nr` corner (`C` not read if
/// `beta == 0`).
fn write_tile(
    acc: &[[f32x8; 2]; MR],
    c: &mut [f32],
    ldc: usize,
    mr: usize,
    nr: usize,
    alpha: f32,
    beta: f32,
) {
    let (va, vb) = (f32x8::splat(alpha), f32x8::splat(beta));
    for (i, acc) in acc.iter().enumerate().take(mr) {
        let row = &mut c[i * ldc..i * ldc + nr];
        if nr == NR {
            for (h, cs) in row.chunks_exact_mut(LANES).enumerate() {
                let v = acc[h] * va;
                store(cs, if beta == 0.0 { v } else { vb.mul_add(load(cs), v) });
            }
        } else {
            let mut t = [0.0f32; NR];
            t[..LANES].copy_from_slice(acc[0].as_array());
            t[LANES..].copy_from_slice(acc[1].as_array());
            for (cij, &tj) in row.iter_mut().zip(&t) {
                *cij = if beta == 0.0 { alpha * tj } else { alpha * tj + beta * *cij };
            }
        }
    }
}

/// `C <- alpha op(A) op(B) + beta C` (row-major; `op(A)` is `m x k`, `op(B)` is `k x n`). With
/// `beta == 0`, `C` is only written.
///
/// # Panics
/// If `a.len() != m k`, `b.len() != k n` or `c.len() != m n`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
    pack: &mut Pack,
) {
    check_gemm(m, n, k, a, b, c);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 || alpha == 0.0 {
        super::scale_c(beta, c);
        return;
    }
    let (ars, acs) = op_a.strides(m, k);
    let (brs, bcs) = op_b.strides(k, n);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            // `op(B) = B`: its rows are the panels' rows, read in place but for a ragged last
            // panel (packed, zero-padded); `op(B) = B^T`: every panel packed (transposed).
            let (panels_b, full_b) = (nc.div_ceil(NR), if bcs == 1 { nc / NR } else { 0 });
            let pb = grow(&mut pack.b, (panels_b - full_b) * NR * kc);
            pack_b(b, brs, bcs, pc, kc, jc + full_b * NR, nc - full_b * NR, pb);
            let pb = &pack.b[..(panels_b - full_b) * NR * kc];
            let beta = if pc == 0 { beta } else { 1.0 };
            // Tiles along the rows of C for a small block of B (see `ROW_ORDER_B_BYTES`).
            let row_order = kc * panels_b * NR * std::mem::size_of::<f32>() <= ROW_ORDER_B_BYTES;
            let b_panel = |q: usize| -> (&[f32], usize) {
                if q < full_b {
                    (&b[pc * brs + jc + q * NR..], brs)
                } else {
                    (&pb[(q - full_b) * kc * NR..(q - full_b + 1) * kc * NR], NR)
                }
            };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                // `op(A) = A`: full panels read in place, a ragged last one packed (zero rows
                // added); `op(A) = A^T`: every panel packed (read in place, each step's 6
                // values a row length apart, it took 4 % more time on the weight gradient).
                let (panels_a, full_a) = (mc.div_ceil(MR), if acs == 1 { mc / MR } else { 0 });
                let pa = grow(&mut pack.a, (panels_a - full_a) * MR * kc);
                pack_a(a, ars, acs, ic + full_a * MR, mc - full_a * MR, pc, kc, pa);
                let pa = &pack.a[..(panels_a - full_a) * MR * kc];
                let a_panel = |p: usize| -> APanel<'_> {
                    if p < full_a {
                        APanel::Rows(array::from_fn(|i| &a[(ic + p * MR + i) * ars + pc..]))
                    } else {
                        APanel::Packed(&pa[(p - full_a) * kc * MR..(p - full_a + 1) * kc * MR])
                    }
                };
                let mut tile = |p: usize, q: usize| {
                    let (i, mr) = (ic + p * MR, (mc - p * MR).min(MR));
                    let (j, nr) = (jc + q * NR, (nc - q * NR).min(NR));
                    let (bp, rsb) = b_panel(q);
                    let acc = kernel(a_panel(p), bp, rsb, kc);
                    write_tile(&acc, &mut c[i * n + j..], n, mr, nr, alpha, beta);
                };
                if row_order {
                    // Tiles along rows of C: C streams row by row, the block of B from L2.
                    for p in 0..panels_a {
                        for q in 0..panels_b {
                            tile(p, q);
                        }
                    }
                } else {
                    // Tiles down columns of C: each panel of B is fetched once for all of A's.
                    for q in 0..panels_b {
                        for p in 0..panels_a {
                            tile(p, q);
                        }
                    }
                }
            }
        }
    }
}

/// `x <- max(x, 0)`.
pub fn relu(x: &mut [f32]) {
    let mut x8 = x.chunks_exact_mut(LANES);
    for c in &mut x8 {
        store(c, load(c).max(f32x8::ZERO));
    }
    for v in x8.into_remainder() {
        *v = v.max(0.0);
    }
}

/// `dy <- dy * [y > 0]`, with `y` the ReLU's output (positive exactly where its input was).
///
/// # Panics
/// If `y.len() != dy.len()`.
pub fn relu_backward(y: &[f32], dy: &mut [f32]) {
    assert_eq!(y.len(), dy.len(), "relu_backward: length mismatch");
    let mut g8 = dy.chunks_exact_mut(LANES);
    let y8 = y.chunks_exact(LANES);
    let y_tail = y8.remainder();
    for (g, yc) in (&mut g8).zip(y8) {
        let keep = load(yc).simd_gt(f32x8::ZERO);
        store(g, keep.select(load(g), f32x8::ZERO));
    }
    for (g, &v) in g8.into_remainder().iter_mut().zip(y_tail) {
        if v <= 0.0 {
            *g = 0.0;
        }
    }
}

/// Summed cross-entropy of the rows of `logits` (`n x k`, `n = labels.len()`) against `labels`;
/// writes `grad_logits <- softmax(logits) - onehot(labels)`, the gradient of the *sum* (divide by
/// `n` for the mean).
///
/// # Panics
/// On inconsistent lengths or a label `>= k`.
pub fn softmax_cross_entropy(logits: &[f32], labels: &[u32], grad_logits: &mut [f32]) -> f64 {
    super::softmax_cross_entropy_with(crate::softmax::simd::xent_row, logits, labels, grad_logits)
}
