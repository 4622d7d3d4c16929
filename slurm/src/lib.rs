//! Slurm support: hostlist expansion and compression as `scontrol show hostnames` does it, the
//! Slurm job environment of one task (job, step, ranks, nodes, CPU binding), checked for
//! consistency, and [`sbatch`] scripts that run Peregrine under `srun`.
//!
//! Nothing here panics on bad input: every malformed value is an [`Error`] that names the
//! variable or list, its value, and where parsing failed.
#![warn(missing_docs)]

mod env;
mod error;
mod hostlist;
pub mod sbatch;

pub use env::{format_tasks_per_node, parse_tasks_per_node, SlurmEnv};
pub use error::{Error, HostlistProblem, MAX_EXPANDED_BYTES, MAX_HOSTS};
pub use hostlist::{compress, expand};
