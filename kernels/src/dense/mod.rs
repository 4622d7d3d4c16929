//! Dense BLAS-1 kernels on `f32` slices: `dot`, `axpy`, `scale`, `sq_norm`.
//!
//! [`scalar`] holds the reference versions: strictly sequential left-to-right loops. LLVM may not
//! reorder floating-point additions, so the reductions (`dot`, `sq_norm`) stay genuinely scalar;
//! the element-wise ones (`axpy`, `scale`) have no such dependency and LLVM auto-vectorizes them,
//! so the SIMD versions can only match them (the benchmark shows it). [`simd`] holds the `wide`
//! `f32x8` versions (FMA through `mul_add`, four independent accumulators for the reductions);
//! the plain functions of this module are the SIMD ones.
//!
//! Lengths must match: a mismatch is a programming error and panics with a message.

pub mod scalar;
pub mod simd;

pub use simd::{axpy, dot, scale, sq_norm};

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;
