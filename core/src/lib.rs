//! Peregrine's training runtime: models over sharded parameters, the iteration loop,
//! synchronization schemes, chunk queues and stealing, metrics. Built on `peregrine-kernels` and
//! `peregrine-transport`.
//!
//! - [`engine`]: the training loop ([`engine::train`]), its configuration, metrics and report:
//!   mechanism only (windows, queues, pulls and pushes, waits);
//! - [`scheme`]: the synchronization schemes and straggler mitigations as policies the engine
//!   asks at named hooks, one file each: BSP/SSP/ASP, DynSGD, backup workers (static and dynamic),
//!   LB-BSP with its speed predictors, speculative execution, FlexRR, Falcon's EPSP;
//! - [`model`]: logistic regression, softmax regression, matrix factorization, MLP;
//! - [`optim`]: optimizers whose state is sharded beside the weights, and learning-rate
//!   schedules;
//! - [`plan`]: which rows each rank computes in each iteration;
//! - [`queue`]: the per-rank chunk queues in a window, from which a rank's threads take its own
//!   chunks and other ranks take chunks over;
//! - [`clocks`]: the ranks' one-sided clocks and progress words;
//! - [`tree`]: a combining tree of one-sided counters (every rank arrived, in one load);
//! - [`words`]: the layouts of the packed words ranks update one-sidedly;
//! - [`pool`]: a rank's pinned compute threads with an adjustable active count;
//! - [`inject`]: seeded straggler injection (slow worker, disrupted machine, power law,
//!   persistent, heterogeneous);
//! - [`sim`]: a discrete-event simulator that runs the same policies at thousands of ranks in
//!   virtual time.
#![warn(missing_docs)]

pub mod clocks;
pub mod engine;
pub mod inject;
pub mod model;
pub mod optim;
pub mod plan;
pub mod pool;
pub mod queue;
pub mod scheme;
pub mod sim;
pub mod straggler;
pub mod team;
pub mod tree;
pub mod words;

pub use engine::{train, Config, Report, TrainError};
pub use scheme::{Scheme, SchemeError, SchemeSpec};
