//! Peregrine's training runtime: models over sharded parameters, the iteration loop,
//! synchronization schemes, chunk queues and stealing, metrics. Built on `peregrine-kernels` and
//! `peregrine-transport`.
//!
//! - [`engine`]: the training loop ([`engine::train`]), its configuration, metrics and report;
//! - [`model`]: logistic regression, softmax regression, matrix factorization, MLP;
//! - [`plan`]: which rows each rank computes in each iteration;
//! - [`queue`]: the per-rank chunk queues in a window, from which a rank's threads take its own
//!   chunks and other ranks take chunks over;
//! - [`sync`]: BSP, SSP, ASP and DynSGD over one-sided clocks;
//! - [`backup`]: backup workers, static and dynamic (Sync-opt, DBW);
//! - [`lbbsp`]: LB-BSP's speed predictors (ARX, moving average) and weighted batch splits;
//! - [`pool`]: a rank's pinned compute threads with an adjustable active count;
//! - [`inject`]: seeded straggler injection (slow worker, disrupted machine, power law,
//!   persistent, heterogeneous).
#![warn(missing_docs)]

pub mod backup;
pub mod engine;
pub mod inject;
pub mod lbbsp;
pub mod model;
pub mod plan;
pub mod pool;
pub mod queue;
pub mod sync;

pub use engine::{train, Config, Report, TrainError};
pub use sync::Scheme;
