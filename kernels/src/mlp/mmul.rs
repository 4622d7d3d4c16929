//! The `matrixmultiply` crate's `sgemm` (its own packing and AVX2/FMA kernels, chosen at run
//! time), behind the same safe signature as the other two.

use super::{check_gemm, Op};

/// `C <- alpha op(A) op(B) + beta C` through `matrixmultiply::sgemm` (row-major; `op(A)` is
/// `m x k`, `op(B)` is `k x n`). With `beta == 0`, `C` is only written. Note that `sgemm`
/// allocates its packing buffer on every call.
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
) {
    check_gemm(m, n, k, a, b, c);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        super::scale_c(beta, c);
        return;
    }
    let (ars, acs) = op_a.strides(m, k);
    let (brs, bcs) = op_b.strides(k, n);
    // `Op::strides` of a row-major `rows x cols` buffer are (cols, 1) or (1, rows); as isize:
    // the lengths of live slices are below isize::MAX, so the casts are lossless.
    let s = |x: usize| x as isize;
    // SAFETY: `sgemm` reads A at `i * ars + p * acs` for i < m, p < k: with the strides of
    // `Op::strides` that is at most `m * k - 1` (either `(m-1) k + (k-1)` or `(m-1) + (k-1) m`),
    // and `check_gemm` asserted `a.len() == m * k`; likewise B (`k * n`). It reads and writes C
    // at `i * n + j < m * n == c.len()`, and the strides (n, 1) do not alias. `c` is a unique
    // borrow, so it overlaps neither `a` nor `b`, and nothing else accesses them during the call.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            s(ars),
            s(acs),
            b.as_ptr(),
            s(brs),
            s(bcs),
            beta,
            c.as_mut_ptr(),
            s(n),
            1,
        );
    }
}
