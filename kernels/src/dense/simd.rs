//! `wide::f32x8` kernels (AVX2 + FMA with `-C target-cpu=native`).
//!
//! Slices are loaded through `[f32; 8]` arrays, never cast to `[f32x8]`: a plain `Vec<f32>` is only
//! 4-byte aligned and `f32x8` wants 32.

use wide::{f32x4, f32x8};

/// Lanes of an `f32x8`.
pub const LANES: usize = 8;

/// Loads the 8 floats of `chunk` (which must hold exactly 8) into an `f32x8`.
#[inline(always)]
pub fn load(chunk: &[f32]) -> f32x8 {
    f32x8::new(<[f32; LANES]>::try_from(chunk).expect("load: chunk of exactly 8 floats"))
}

/// The whole `f32x8`s of `x` (its first `len / 8 * 8` floats) as arrays of 8: indexing them
/// needs no bounds check per vector beyond the index's own.
#[inline(always)]
pub fn vectors(x: &[f32]) -> &[[f32; LANES]] {
    bytemuck::cast_slice(&x[..x.len() / LANES * LANES])
}

/// [`vectors`], mutable.
#[inline(always)]
pub fn vectors_mut(x: &mut [f32]) -> &mut [[f32; LANES]] {
    let full = x.len() / LANES * LANES;
    bytemuck::cast_slice_mut(&mut x[..full])
}

/// Asks for the cache line holding `x` in the second-level cache (a hint: nothing happens on
/// targets without one). Into L2 rather than L1: a stream of rows from memory asked for a few
/// rows ahead keeps more lines in flight there, and the first-level prefetcher takes them on.
#[inline(always)]
pub fn prefetch(x: &f32) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    safe_arch::prefetch_t1(x);
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = x;
}

/// Stores `v` into `chunk` (which must hold exactly 8 floats).
#[inline(always)]
pub fn store(chunk: &mut [f32], v: f32x8) {
    chunk.copy_from_slice(v.as_array());
}

/// `[sum a, sum b, sum c, sum d]`: four horizontal sums at once. With AVX that is three
/// `vhaddps` and one add, where four [`f32x8::reduce_add`]s take six instructions each; the
/// lanes are summed in another order than `reduce_add`'s, so the last bits may differ.
#[inline(always)]
pub fn reduce_add4(a: f32x8, b: f32x8, c: f32x8, d: f32x8) -> f32x4 {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
    {
        use safe_arch::{
            add_horizontal_m256 as hadd, add_m128, cast_to_m128_from_m256, extract_m128_from_m256, m256,
        };
        let m = |v: f32x8| -> m256 { bytemuck::cast(v) };
        let h = hadd(hadd(m(a), m(b)), hadd(m(c), m(d)));
        bytemuck::cast(add_m128(cast_to_m128_from_m256(h), extract_m128_from_m256::<1>(h)))
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx")))]
    f32x4::from([a.reduce_add(), b.reduce_add(), c.reduce_add(), d.reduce_add()])
}

/// `sum_i a[i] * b[i]`, four `f32x8` accumulators (32 products in flight), then a scalar tail.
///
/// # Panics
/// If `a.len() != b.len()`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [f32x8::ZERO; 4];
    let (a4, b4) = (a.chunks_exact(4 * LANES), b.chunks_exact(4 * LANES));
    let (a_rest, b_rest) = (a4.remainder(), b4.remainder());
    for (ca, cb) in a4.zip(b4) {
        for (j, acc) in acc.iter_mut().enumerate() {
            let r = j * LANES..(j + 1) * LANES;
            *acc = load(&ca[r.clone()]).mul_add(load(&cb[r]), *acc);
        }
    }
    let (a1, b1) = (a_rest.chunks_exact(LANES), b_rest.chunks_exact(LANES));
    let (a_tail, b_tail) = (a1.remainder(), b1.remainder());
    for (ca, cb) in a1.zip(b1) {
        acc[0] = load(ca).mul_add(load(cb), acc[0]);
    }
    let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])).reduce_add();
    for (x, y) in a_tail.iter().zip(b_tail) {
        s = x.mul_add(*y, s);
    }
    s
}

/// `y <- y + alpha * x`.
///
/// # Panics
/// If `x.len() != y.len()`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    let va = f32x8::splat(alpha);
    let mut x8 = x.chunks_exact(LANES);
    let mut y8 = y.chunks_exact_mut(LANES);
    for (cx, cy) in (&mut x8).zip(&mut y8) {
        store(cy, va.mul_add(load(cx), load(cy)));
    }
    for (xi, yi) in x8.remainder().iter().zip(y8.into_remainder()) {
        *yi = alpha.mul_add(*xi, *yi);
    }
}

/// `x <- alpha * x`.
pub fn scale(alpha: f32, x: &mut [f32]) {
    let va = f32x8::splat(alpha);
    let mut x8 = x.chunks_exact_mut(LANES);
    for cx in &mut x8 {
        store(cx, va * load(cx));
    }
    for xi in x8.into_remainder() {
        *xi *= alpha;
    }
}

/// `|x|^2 = sum_i x[i]^2`, four `f32x8` accumulators, then a scalar tail.
pub fn sq_norm(x: &[f32]) -> f32 {
    let mut acc = [f32x8::ZERO; 4];
    let x4 = x.chunks_exact(4 * LANES);
    let rest = x4.remainder();
    for c in x4 {
        for (j, acc) in acc.iter_mut().enumerate() {
            let v = load(&c[j * LANES..(j + 1) * LANES]);
            *acc = v.mul_add(v, *acc);
        }
    }
    let x1 = rest.chunks_exact(LANES);
    let tail = x1.remainder();
    for c in x1 {
        let v = load(c);
        acc[0] = v.mul_add(v, acc[0]);
    }
    let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])).reduce_add();
    for xi in tail {
        s = xi.mul_add(*xi, s);
    }
    s
}
