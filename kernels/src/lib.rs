//! Peregrine's compute and data layer.
//!
//! - Gradient kernels, each a plain scalar reference (always compiled, the definition of correct)
//!   and a `wide` SIMD version checked against it: [`dense`], [`lr`], [`softmax`], [`mf`], [`mlp`].
//! - [`alloc`]: an allocator that starts large blocks on a cache line, for the binary.
//! - [`cpu`]: the instruction set this build was compiled for, checked against the CPU's.
//! - [`data`]: the binary dataset format, read zero-copy from a memory mapping, its converters
//!   (LIBSVM, MNIST IDX, ratings text) and seeded generators.
#![warn(missing_docs)]

pub mod alloc;
pub mod cpu;
pub mod data;
pub mod dense;
pub mod lr;
pub mod mf;
pub mod mlp;
pub mod roofline;
pub mod softmax;
