//! Peregrine's training runtime: models over sharded parameters, the iteration loop, synchronization
//! schemes, chunk queues and stealing, straggler control and injection, metrics. Built on
//! `peregrine-kernels` and `peregrine-transport`; nothing here yet.
