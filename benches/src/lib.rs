//! Peregrine's benchmarks.
//!
//! - [`rma`]: OSU-style one-sided latency and bandwidth of the transports, against raw MPI on
//!   the same machine in the same run (`peregrine bench rma`).

pub mod rma;
