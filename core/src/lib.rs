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
//! - [`record`]: what a rank records of an iteration and of its run (the engine writes it,
//!   schemes read it);
//! - [`plan`]: which rows each rank computes in each iteration;
//! - [`queue`]: the per-rank chunk queues in a window, from which a rank's threads take its own
//!   chunks and other ranks take chunks over;
//! - [`clocks`]: the ranks' one-sided clocks and progress words;
//! - [`tree`]: a combining tree of one-sided counters (every rank arrived, in one load);
//! - [`words`]: the layouts of the packed words ranks update one-sidedly;
//! - [`pool`]: a rank's pinned compute threads with an adjustable active count;
//! - [`inject`]: seeded straggler injection (slow worker, disrupted machine, power law,
//!   persistent, heterogeneous);
//! - [`speed_traces`]: synthetic per-iteration speed traces (injection, LB-BSP's predictors);
//! - [`sim`]: a discrete-event simulator that runs the same policies at thousands of ranks in
//!   virtual time.
#![warn(missing_docs)]

/// Serialized as their names (configuration files, `config.toml`, results): a name that does not
/// parse is an error at its place in the file.
macro_rules! serde_as_name {
    ($($t:ty),*) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

pub(crate) use serde_as_name;

pub mod clocks;
pub mod engine;
pub mod inject;
pub mod model;
pub mod optim;
pub mod plan;
pub mod pool;
pub mod queue;
pub mod record;
pub mod scheme;
pub mod sim;
pub mod speed_traces;
pub mod straggler;
pub mod sums;
pub mod team;
pub mod tree;
pub mod words;

pub use engine::{train, Config, Report, TrainError};
pub use scheme::{Scheme, SchemeError, SchemeSpec};
