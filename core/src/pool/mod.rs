//! A rank's compute thread pool: threads pinned to the cores the rank was given, and an *active*
//! thread count that can change between iterations (elastic parallelism) without rebuilding the pool.
//!
//! # Design
//!
//! - **Built once, with the maximum.** [`RankPool::new`] starts `max_threads` threads and never
//!   resizes the pool. Creating and pinning threads costs tens of microseconds per thread plus the
//!   first touch of their stacks; an elastic scheme that goes from 6 threads to 4 for one iteration
//!   and back to 6 for the next cannot pay that at every change.
//! - **Elastic active count.** [`RankPool::set_active`] only stores a number; [`RankPool::run`]
//!   runs `f(worker)` for `worker in 0..active()` and signals no other thread. Threads
//!   `active..max` are not woken at all: after their spin time (below) they sleep in the kernel
//!   and take no CPU time until a `run` needs them again, so shrinking the active count really
//!   frees their cores (for another rank sharing them, or the communication thread).
//! - **Worker `i` always runs on thread `i`, pinned to `placement().cpus[i]`** (or worker 0 on a
//!   caller bound to that CPU alone, below). So "worker `i`" means the same core in every iteration, and the data it touched in the last iteration is
//!   still in that core's cache in the next one. A work-stealing `scope`/`spawn` would not give
//!   that guarantee.
//! - **Dispatch: per-worker flags, spin, then sleep.** `run` publishes `f` and sets the "go" word
//!   of each active worker (one cache line per worker); a worker that has finished a job waits for
//!   its next one by spinning for a short while (yielding the CPU to anyone else runnable), then
//!   parks (futex). The caller waits for the workers' countdown the same way. While runs come
//!   closer together than the spin time ([`DEFAULT_SPIN`], see [`RankPool::set_spin`]), dispatch
//!   costs 0.1-1 us when the caller has a core to itself and 3-5 us when it shares one with a
//!   worker (measured on the 2-core development VM, 2 threads, empty jobs); after a longer pause
//!   a run pays the OS wake-up of each parked worker (25-50 us on that VM). This is the policy of
//!   OpenMP runtimes (`KMP_BLOCKTIME`, `GOMP_SPINCOUNT`), with a much shorter default.
//!
//!   Why not rayon's `broadcast` (the first version): rayon's workers fall asleep after ~32 idle
//!   rounds, a caller from outside the pool blocks on a condition variable, and a broadcast wakes
//!   every thread, including the inactive ones. Measured the same way: 15 us per back-to-back
//!   run, 40-55 us with 20 us of caller work between runs, 70-90 us with 0.2-1 ms.
//! - **One worker on the caller's own CPU: no hand-over.** When a run has one active worker, the
//!   pool is pinned, and the calling thread is bound to that worker's CPU alone (a rank of one
//!   thread under `mpirun`'s default binding to a core), the two could only take turns on that
//!   CPU: the caller runs `f(0)` itself. That saves waking the worker and being woken back (9 us
//!   a run of the MLP's chunk on the 2-core VM, traced, 12 -> 3 us between the compute phase and
//!   its chunk), and the worker no longer spins beside the caller's communication after each
//!   run. `f` sees the same worker index and the same CPU, so nothing else changes.
//! - **Pinning.** The CPUs this process may run on are split among the ranks of the process
//!   ([`Slot`]): into `of` contiguous, disjoint groups of cores, in hwloc's logical (locality) order
//!   with the `hwloc` feature and in OS cpu-id order without it. If there are fewer cores than
//!   ranks, hyperthreads are split instead, and if there are still fewer, ranks share CPUs
//!   round-robin; [`Placement::how`] says so. Inside a group, threads get one CPU each: first one
//!   PU of every core, then the second hyperthread of every core, and so on; more threads than CPUs
//!   wrap around (oversubscription, also noted in `how`).
//!   - With the `hwloc` feature: the process's CPU binding (`hwloc_get_cpubind` with
//!     `PROCESS`), cores and hyperthreads from the topology, each thread bound with
//!     `hwloc_set_cpubind(THREAD)`, and the NUMA node of the chosen CPUs recorded so that
//!     [`RankPool::bind_memory`] can bind buffers to it.
//!   - Without it: `sched_getaffinity` of the calling thread (the process's mask unless someone
//!     pinned that thread), every allowed cpu id counted as a core (hyperthread siblings are not
//!     told apart), each thread pinned with `sched_setaffinity(0, ..)`; no NUMA information.
//!   - Pinning that fails is not an error: the pool runs unpinned (every thread's mask reset to the
//!     process's CPUs) and `how` says why.
//!
//! # Environment
//!
//! `PEREGRINE_PIN=0` (also `off`, `false`, `no`) forces [`Pinning::Off`], whatever the caller asked
//! for: for runs next to other jobs on a shared node, or to compare pinned and unpinned runs.
//!
//! # Using it
//!
//! `run` is meant to be called by the rank's own (training) thread, which is not one of the pool's
//! threads; calling it from inside `f` (from one of the pool's own threads) panics. Concurrent
//! `run`s from several threads are serialized. `f` should not use rayon: its parallel iterators
//! would run on rayon's global pool, unpinned, beside this one.
//!
//! # Layout
//!
//! - `dispatch`: [`RankPool`], its workers, [`run`](RankPool::run), the active count, spinning and
//!   parking.
//! - `placement`: which CPUs each rank and each worker get (pure, tested on made-up machines).
//! - `affinity`: discovering the CPUs and binding threads and memory to them, through Linux's
//!   `sched_*affinity` or hwloc.

use std::time::Duration;

use serde::Serialize;

mod affinity;
mod dispatch;
mod placement;

pub use affinity::{allowed_cpus, node_cpus, pin_current_thread};
pub use dispatch::{standing_in_for, RankPool};

/// How long, by default, a worker spins for its next job and the caller for the end of a run
/// before going to sleep. See [`RankPool::set_spin`].
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

/// The environment variable that turns pinning off when set to `0` (or `off`, `false`, `no`).
pub const PIN_ENV: &str = "PEREGRINE_PIN";

/// Which part of the process's allowed CPUs this rank gets. With MPI (one rank per process) it is
/// `Slot { index: 0, of: 1 }`; with ranks as threads in one process (local backend) rank r of n gets
/// `Slot { index: r, of: n }` and the process's allowed cores are split into n contiguous, disjoint
/// groups (if there are fewer cores than ranks, groups share cores round-robin, and the placement
/// says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// This rank's group, `0..of`.
    pub index: usize,
    /// Number of groups (ranks in the process).
    pub of: usize,
}

impl Slot {
    /// All of the process's CPUs: one rank per process.
    pub const WHOLE: Slot = Slot { index: 0, of: 1 };
}

/// What the pool got: serializable for the run's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// OS cpu ids (PUs) the threads are bound to, in worker order (len = max threads); empty if
    /// unpinned.
    pub cpus: Vec<usize>,
    /// The NUMA node of those cpus when known (hwloc) and unique, else `None`.
    pub numa_node: Option<usize>,
    /// Whether the threads are bound to `cpus`.
    pub pinned: bool,
    /// How the threads were placed, or why they are not pinned.
    pub how: String,
}

/// Whether to pin the pool's threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pinning {
    /// Pin if possible; failing to pin is not an error (recorded in [`Placement::how`]).
    #[default]
    Auto,
    /// Leave the threads where the OS puts them (they inherit the creating thread's CPU mask).
    Off,
}

/// Errors of [`RankPool::new`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// `max_threads` was 0.
    #[error("a rank's thread pool needs at least one thread, got max_threads = 0")]
    ZeroThreads,
    /// The slot does not name one of its groups.
    #[error("invalid CPU slot {index} of {of}: need of >= 1 and index < of")]
    InvalidSlot {
        /// The slot's index.
        index: usize,
        /// The slot's group count.
        of: usize,
    },
    /// The OS refused to start a thread.
    #[error("starting thread {worker} of the rank's pool of {threads} threads failed")]
    Spawn {
        /// The worker whose thread could not be started.
        worker: usize,
        /// Threads asked for.
        threads: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Placement {
    fn unpinned(how: String) -> Self {
        Self { cpus: Vec::new(), numa_node: None, pinned: false, how }
    }
}

/// `None` if the pool should be pinned, else why not (for [`Placement::how`]). `env` is the value
/// of `PEREGRINE_PIN`, if set.
fn unpinned_reason(requested: Pinning, env: Option<&str>) -> Option<String> {
    if let Some(v) = env {
        if ["0", "off", "false", "no"].iter().any(|off| v.trim().eq_ignore_ascii_case(off)) {
            return Some(format!("unpinned: {PIN_ENV}={v}"));
        }
    }
    match requested {
        Pinning::Off => Some("unpinned: Pinning::Off".to_string()),
        Pinning::Auto => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_variable_turns_pinning_off() {
        assert_eq!(unpinned_reason(Pinning::Auto, None), None);
        assert_eq!(unpinned_reason(Pinning::Auto, Some("1")), None);
        assert_eq!(unpinned_reason(Pinning::Auto, Some("")), None);
        for off in ["0", "off", "OFF", "false", "no", " 0 "] {
            let r = unpinned_reason(Pinning::Auto, Some(off)).expect("off");
            assert!(r.contains("PEREGRINE_PIN"), "{r}");
        }
        let r = unpinned_reason(Pinning::Off, None).expect("off");
        assert!(r.contains("Pinning::Off"), "{r}");
        assert!(unpinned_reason(Pinning::Off, Some("1")).is_some(), "the variable cannot force pinning on");
    }
}
