//! Peregrine's training runtime: models over sharded parameters, the iteration loop,
//! synchronization schemes, chunk queues and stealing, straggler control and injection, metrics.
//! Built on `peregrine-kernels` and `peregrine-transport`.
//!
//! What exists so far: [`queue`], the per-rank chunk queues in a window through which a rank's
//! threads take its own mini-batch chunks and other ranks take chunks over.
#![warn(missing_docs)]

pub mod queue;
