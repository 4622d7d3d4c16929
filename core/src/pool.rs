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

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use serde::Serialize;

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

/// A rank's compute threads, pinned to its cores, with an adjustable active count. Dropping it
/// stops and joins the threads.
pub struct RankPool {
    // Invariants: `threads` and `handles` hold the `max` workers, worker `i` being `threads[i]`,
    // which waits on `shared.workers[i]`; `placement.cpus` is empty or has `max` entries.
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    handles: Vec<JoinHandle<()>>,
    max: usize,
    active: AtomicUsize,
    /// The epoch of the last run; held for the whole of a run, so runs never overlap.
    epoch: Mutex<u64>,
    placement: Placement,
    binder: Binder,
}

/// What the caller and the workers share.
struct Shared {
    workers: Box<[GoWord]>,
    /// The job of the current run (the caller's `Job`, on its stack). Valid for worker `i` from
    /// the moment it reads a new epoch in its go word until it counts itself out of `remaining`.
    job: AtomicPtr<Job<'static>>,
    shutdown: AtomicBool,
    spin_ns: AtomicU64,
}

/// Worker `i`'s go word: the epoch of the last run it was asked to take part in. One cache line
/// each (two on CPUs that fetch lines in pairs), so signalling one worker does not disturb another.
#[repr(align(128))]
struct GoWord(AtomicU64);

/// One run, as the workers see it.
struct Job<'f> {
    f: &'f (dyn Fn(usize) + Sync),
    /// Active workers that have not finished `f` yet.
    remaining: AtomicUsize,
    /// The thread waiting in `run`.
    caller: Thread,
    /// The first panic of a worker, resumed in the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

thread_local! {
    /// The `Shared` of the pool whose worker the current thread is (null on other threads).
    static WORKER_OF: Cell<*const Shared> = const { Cell::new(ptr::null()) };
    /// The worker the current thread stands in for while it runs a job itself (a caller on its
    /// worker's CPU: see the module docs).
    static STANDING_IN: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The worker of a pool that the calling thread is running a job for in its stead (a one-worker
/// run on the caller's own CPU, see the module docs), if it is: for messages that name the
/// thread a panic happened on.
pub fn standing_in_for() -> Option<usize> {
    STANDING_IN.with(Cell::get)
}

impl fmt::Debug for RankPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RankPool")
            .field("max_threads", &self.max)
            .field("active", &self.active())
            .field("spin", &self.spin())
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

impl RankPool {
    /// Starts a pool of `max_threads` threads for `slot` of the process's CPUs, all of them
    /// active, and pins them unless `pinning` is [`Pinning::Off`] or `PEREGRINE_PIN=0` is set.
    pub fn new(max_threads: usize, slot: Slot, pinning: Pinning) -> Result<Self, PoolError> {
        if max_threads == 0 {
            return Err(PoolError::ZeroThreads);
        }
        if slot.of == 0 || slot.index >= slot.of {
            return Err(PoolError::InvalidSlot { index: slot.index, of: slot.of });
        }
        let env = std::env::var(PIN_ENV).ok();
        let target = match unpinned_reason(pinning, env.as_deref()) {
            Some(reason) => Err(reason),
            None => Binding::discover(max_threads, slot),
        };

        let shared = Arc::new(Shared {
            workers: (0..max_threads).map(|_| GoWord(AtomicU64::new(0))).collect(),
            job: AtomicPtr::new(ptr::null_mut()),
            shutdown: AtomicBool::new(false),
            spin_ns: AtomicU64::new(nanos(DEFAULT_SPIN)),
        });
        let (report, pinned) = mpsc::channel::<Option<String>>();
        let mut pool = Self {
            shared: Arc::clone(&shared),
            threads: Vec::with_capacity(max_threads),
            handles: Vec::with_capacity(max_threads),
            max: max_threads,
            active: AtomicUsize::new(max_threads),
            epoch: Mutex::new(0),
            placement: Placement::unpinned(String::new()),
            binder: Binder::Sched,
        };
        for i in 0..max_threads {
            let (shared, report) = (Arc::clone(&shared), report.clone());
            let pin = target.as_ref().ok().map(|t| (t.binder.clone(), t.plan.cpus[i]));
            let spawned = thread::Builder::new().name(format!("pgr-s{}w{i}", slot.index)).spawn(move || {
                let failure = pin.and_then(|(binder, cpu)| {
                    binder.bind_current_thread(&[cpu]).err().map(|e| format!("worker {i} on cpu {cpu}: {e}"))
                });
                // The receiver lives until every worker has reported (or `new` failed).
                let _ = report.send(failure);
                drop(report);
                worker_loop(&shared, i);
            });
            match spawned {
                Ok(handle) => {
                    pool.threads.push(handle.thread().clone());
                    pool.handles.push(handle);
                }
                // Dropping `pool` stops the threads started so far.
                Err(source) => return Err(PoolError::Spawn { worker: i, threads: max_threads, source }),
            }
        }
        drop(report);
        let failures: Vec<String> = pinned.iter().flatten().collect();

        (pool.placement, pool.binder) = match target {
            Err(reason) => (Placement::unpinned(reason), Binder::Sched),
            Ok(t) if !failures.is_empty() => {
                // Undo the bindings that worked: a half-pinned pool would be the worst of both.
                let all = &t.process_cpus;
                pool.dispatch(max_threads, &|_| {
                    let _ = t.binder.bind_current_thread(all);
                });
                let reason = format!("unpinned: {} failed for {}", t.mechanism, failures.join("; "));
                (Placement::unpinned(reason), t.binder)
            }
            Ok(t) => {
                let how = t.plan.describe(&t.mechanism, t.unit_name, slot);
                let placement = Placement { cpus: t.plan.cpus, numa_node: t.numa_node, pinned: true, how };
                (placement, t.binder)
            }
        };
        Ok(pool)
    }

    /// Number of threads in the pool: the most [`run`](Self::run) can use.
    pub fn max_threads(&self) -> usize {
        self.max
    }

    /// Number of workers the next [`run`](Self::run) will use.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Sets the number of workers of the next runs, clamped to `1..=max_threads()`. Takes effect at
    /// the next [`run`](Self::run) (one in progress keeps its count).
    pub fn set_active(&self, n: usize) {
        self.active.store(n.clamp(1, self.max), Ordering::Relaxed);
    }

    /// How long a worker spins (yielding) for its next job, and the caller for the end of a run,
    /// before sleeping in the kernel. Longer keeps dispatch at a few us across longer pauses
    /// between runs, at the price of CPU time burnt while idle (yielded to any other runnable
    /// thread); zero makes every wait a sleep (the choice for heavily oversubscribed runs).
    /// Default [`DEFAULT_SPIN`]; takes effect at a thread's next wait.
    pub fn set_spin(&self, spin: Duration) {
        self.shared.spin_ns.store(nanos(spin), Ordering::Relaxed);
    }

    /// The spin time, see [`set_spin`](Self::set_spin).
    pub fn spin(&self) -> Duration {
        Duration::from_nanos(self.shared.spin_ns.load(Ordering::Relaxed))
    }

    /// Runs `f(worker)` for worker in `0..active()` concurrently on the pool's threads (worker `i`
    /// on the thread pinned to `placement().cpus[i]`; a single worker on the calling thread itself
    /// when that thread is bound to the worker's CPU alone, see the module docs) and returns when
    /// all have returned. The other threads are not woken.
    ///
    /// Call it from a thread outside the pool (the rank's training thread): calling it from
    /// inside `f` panics. Runs from several threads at once are serialized. If `f` panics on a
    /// worker, the (first) panic is resumed here after all workers have returned.
    pub fn run<F: Fn(usize) + Sync>(&self, f: F) {
        self.dispatch(self.active(), &f);
    }

    fn dispatch(&self, active: usize, f: &(dyn Fn(usize) + Sync)) {
        assert!(
            WORKER_OF.with(Cell::get) != Arc::as_ptr(&self.shared),
            "RankPool::run called from one of the pool's own threads"
        );
        let mut epoch = self.epoch.lock().unwrap_or_else(PoisonError::into_inner);
        if active == 1 && self.placement.pinned && sched::bound_to_only(self.placement.cpus[0]) {
            // The caller is worker 0 for this run (see the module docs); a run from inside `f`
            // panics as on a worker.
            struct Restore(*const Shared, Option<usize>);
            impl Drop for Restore {
                fn drop(&mut self) {
                    WORKER_OF.with(|w| w.set(self.0));
                    STANDING_IN.with(|s| s.set(self.1));
                }
            }
            let _restore = Restore(
                WORKER_OF.with(|w| w.replace(Arc::as_ptr(&self.shared))),
                STANDING_IN.with(|s| s.replace(Some(0))),
            );
            f(0);
            return;
        }
        *epoch += 1;
        let job = Job {
            f,
            remaining: AtomicUsize::new(active),
            caller: thread::current(),
            panic: Mutex::new(None),
        };
        // The lifetime is erased for storage only: the workers dereference the pointer between
        // reading this run's epoch and counting themselves out of `remaining`, and we do not
        // return (nothing below panics) before `remaining` is 0.
        self.shared.job.store(ptr::from_ref(&job).cast::<Job<'static>>().cast_mut(), Ordering::Relaxed);
        for (go, thread) in self.shared.workers.iter().zip(&self.threads).take(active) {
            // Release: the job (and everything the caller did before) is visible to the worker
            // that sees the new epoch.
            go.0.store(*epoch, Ordering::Release);
            thread.unpark();
        }
        // Acquire: pairs with the workers' release decrements, so their writes are visible here.
        self.shared.wait(|| job.remaining.load(Ordering::Acquire) == 0);
        self.shared.job.store(ptr::null_mut(), Ordering::Relaxed);
        drop(epoch);
        if let Some(p) = job.panic.into_inner().unwrap_or_else(PoisonError::into_inner) {
            panic::resume_unwind(p);
        }
    }

    /// Where the threads are, for the run's metadata.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Binds the memory of `buf` to the pool's NUMA node where hwloc allows (feature `hwloc`);
    /// returns whether it did. Pages already touched are migrated when the system supports it;
    /// binding works on whole pages, so the pages `buf` shares with its neighbours are bound too.
    /// A no-op returning false without the feature, when the pool is not pinned to a single NUMA
    /// node, for an empty buffer, or when the system does not support it. Never fails the run.
    pub fn bind_memory<T>(&self, buf: &mut [T]) -> bool {
        match self.placement.numa_node {
            Some(node) if self.placement.pinned => self.binder.bind_memory(node, &*buf),
            _ => false,
        }
    }
}

impl Drop for RankPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for t in &self.threads {
            t.unpark();
        }
        for h in self.handles.drain(..) {
            // Workers catch the panics of `f`; there is nothing to report from a join error.
            let _ = h.join();
        }
    }
}

/// Busy-wait rounds (`spin_loop`, about 0.2-0.5 us in all) before a waiting thread starts
/// yielding the CPU. Longer made runs slower whenever the caller shares a core with a worker (two
/// waits of a few us each before either yields to the other).
const PURE_SPINS: u32 = 10;

impl Shared {
    /// Waits until `done()`: spins briefly, then yields the CPU until the spin time is over, then
    /// parks (whoever makes `done()` true unparks this thread; park tolerates early unparks).
    fn wait(&self, done: impl Fn() -> bool) {
        let mut start: Option<Instant> = None;
        let mut spins = 0u32;
        while !done() {
            if spins < PURE_SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let since = *start.get_or_insert_with(Instant::now);
            if since.elapsed().as_nanos() < u128::from(self.spin_ns.load(Ordering::Relaxed)) {
                thread::yield_now();
            } else {
                thread::park();
            }
        }
    }
}

/// Worker `i`'s life: wait for a new epoch in its go word, run the job, count itself out.
fn worker_loop(shared: &Shared, i: usize) {
    WORKER_OF.with(|w| w.set(ptr::from_ref(shared)));
    let go = &shared.workers[i].0;
    let mut seen = 0;
    loop {
        shared.wait(|| go.load(Ordering::Acquire) != seen || shared.shutdown.load(Ordering::Acquire));
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = go.load(Ordering::Acquire);
        // SAFETY: the caller stored a pointer to its live `Job` before releasing this epoch into
        // our go word (we acquired it), and keeps the `Job` alive until `remaining` reaches 0,
        // which cannot happen before our own decrement below; we do not touch `job` after it.
        let job = unsafe { &*shared.job.load(Ordering::Relaxed) };
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| (job.f)(i))) {
            job.panic.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(p);
        }
        let caller = job.caller.clone();
        // Release: our work in `f` is visible to the caller once it sees 0.
        if job.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            caller.unpark();
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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

// ---------------------------------------------------------------------------------------------
// Planning: which cpu each worker gets. Pure, so it is tested on made-up machines.

/// A core as the pool sees it: the OS ids of its PUs (hyperthreads) the process may run on.
type Core = Vec<usize>;

/// The cpus of one slot's workers.
#[derive(Debug, PartialEq, Eq)]
struct CpuPlan {
    /// One cpu per worker.
    cpus: Vec<usize>,
    /// Distinct cores the workers are on.
    cores_used: usize,
    /// Some workers share a core (hyperthreads of one core).
    smt: bool,
    /// More workers than cpus in the group: some cpus run several workers.
    oversubscribed: bool,
    /// Fewer units than ranks: this slot's cpus are also another slot's (units, ranks).
    shared: Option<(usize, usize)>,
    /// Whether hyperthreads, not cores, were split among the ranks (fewer cores than ranks).
    split_pus: bool,
}

impl CpuPlan {
    /// The cpus of `max_threads` workers of `slot`, from the process's `cores` in locality order.
    fn new(cores: &[Core], slot: Slot, max_threads: usize) -> Option<Self> {
        // What is split among the ranks: cores, or single PUs if there are fewer cores than ranks
        // (distinct hyperthreads before sharing anything). Each unit is tagged with its core.
        let split_pus = cores.len() < slot.of && cores.iter().map(Vec::len).sum::<usize>() > cores.len();
        let units: Vec<(usize, &[usize])> = if split_pus {
            cores
                .iter()
                .enumerate()
                .flat_map(|(c, pus)| pus.iter().map(move |pu| (c, std::slice::from_ref(pu))))
                .collect()
        } else {
            cores.iter().enumerate().map(|(c, pus)| (c, &pus[..])).collect()
        };
        let (picked, shared) = split(units.len(), slot);
        // This slot's cores, each with its PUs in this slot.
        let mut group: Vec<(usize, Vec<usize>)> = Vec::new();
        for &u in &picked {
            let (c, pus) = units[u];
            match group.last_mut() {
                Some((last, v)) if *last == c => v.extend_from_slice(pus),
                _ => group.push((c, pus.to_vec())),
            }
        }
        // One PU of every core first, then the second hyperthread of every core, ...
        let depth = group.iter().map(|(_, pus)| pus.len()).max().unwrap_or(0);
        let order: Vec<(usize, usize)> = (0..depth)
            .flat_map(|k| group.iter().filter_map(move |(c, pus)| pus.get(k).map(|&pu| (*c, pu))))
            .collect();
        if order.is_empty() {
            return None;
        }
        let used = &order[..max_threads.min(order.len())];
        let mut cores_used: Vec<usize> = used.iter().map(|&(c, _)| c).collect();
        cores_used.sort_unstable();
        cores_used.dedup();
        Some(Self {
            cpus: (0..max_threads).map(|i| order[i % order.len()].1).collect(),
            cores_used: cores_used.len(),
            smt: used.len() > cores_used.len(),
            oversubscribed: max_threads > order.len(),
            shared: shared.then_some((units.len(), slot.of)),
            split_pus,
        })
    }

    /// The text of [`Placement::how`] for a pinned pool.
    fn describe(&self, mechanism: &str, unit: &str, slot: Slot) -> String {
        let threads = self.cpus.len();
        let mut how = format!(
            "{mechanism}: 1 cpu per thread, {threads} thread{} on {} {unit}{}",
            plural(threads),
            self.cores_used,
            plural(self.cores_used)
        );
        if slot.of > 1 {
            how += &format!(" (slot {} of {})", slot.index, slot.of);
        }
        if self.split_pus {
            how += &format!("; fewer {unit}s than ranks: hyperthreads split among ranks");
        }
        if self.smt {
            how += "; threads share cores (hyperthreads)";
        }
        if self.oversubscribed {
            let mut distinct = self.cpus.clone();
            distinct.sort_unstable();
            distinct.dedup();
            how += &format!("; oversubscribed: {threads} threads on {} cpus", distinct.len());
        }
        if let Some((units, ranks)) = self.shared {
            let what = if self.split_pus { "cpus".to_string() } else { format!("{unit}s") };
            how += &format!("; shared with other ranks: {units} {what} for {ranks} ranks, round-robin");
        }
        how
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The units (indices into `0..units`) of `slot`, and whether they are shared with other slots.
/// With `units >= slot.of`: `slot.of` contiguous, disjoint groups covering everything, sizes
/// differing by at most one. With fewer units: unit `slot.index % units`, shared.
fn split(units: usize, slot: Slot) -> (Vec<usize>, bool) {
    if units == 0 {
        (Vec::new(), false)
    } else if units >= slot.of {
        ((slot.index * units / slot.of..(slot.index + 1) * units / slot.of).collect(), false)
    } else {
        (vec![slot.index % units], true)
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery and binding: hwloc or sched_*affinity.

/// What pinning will be attempted.
struct Binding {
    binder: Binder,
    plan: CpuPlan,
    /// All cpus the process may use: where threads go back to if pinning fails.
    process_cpus: Vec<usize>,
    numa_node: Option<usize>,
    mechanism: String,
    /// What `CpuPlan`'s units are: "core" (hwloc) or "cpu" (no topology).
    unit_name: &'static str,
}

impl Binding {
    /// The pinning plan for `slot`, or why the pool cannot be pinned.
    fn discover(max_threads: usize, slot: Slot) -> Result<Self, String> {
        #[cfg(feature = "hwloc")]
        let fallback_note = match hwloc::Topo::new().and_then(|topo| topo.target(max_threads, slot)) {
            Ok(target) => return Ok(target),
            Err(e) => format!("hwloc failed ({e}), "),
        };
        #[cfg(not(feature = "hwloc"))]
        let fallback_note = String::new();

        let process_cpus = sched::allowed_cpus().map_err(|e| format!("unpinned: {fallback_note}{e}"))?;
        let cores: Vec<Core> = process_cpus.iter().map(|&c| vec![c]).collect();
        let plan = CpuPlan::new(&cores, slot, max_threads)
            .ok_or_else(|| format!("unpinned: {fallback_note}no cpus in the affinity mask"))?;
        Ok(Self {
            binder: Binder::Sched,
            plan,
            process_cpus,
            numa_node: None,
            mechanism: format!("{fallback_note}sched_setaffinity"),
            unit_name: "cpu",
        })
    }
}

/// How threads get bound, and memory.
#[derive(Clone)]
enum Binder {
    Sched,
    #[cfg(feature = "hwloc")]
    Hwloc(Arc<hwloc::Topo>),
}

impl Binder {
    /// Restricts the calling thread to `cpus`.
    fn bind_current_thread(&self, cpus: &[usize]) -> Result<(), String> {
        match self {
            Binder::Sched => sched::bind_current_thread(cpus),
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(topo) => topo.bind_current_thread(cpus),
        }
    }

    /// Binds the pages of `buf` to NUMA node `node`; whether it did.
    fn bind_memory<T>(&self, node: usize, buf: &[T]) -> bool {
        match self {
            Binder::Sched => {
                let _ = (node, buf);
                false
            }
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(topo) => topo.bind_memory(node, buf),
        }
    }
}

/// The CPUs the calling thread may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> Result<Vec<usize>, String> {
    sched::allowed_cpus()
}

/// Pins the calling thread to `cpu` (best effort: a failure leaves it where it is). Used for
/// threads outside a pool that must share a rank's cores, like straggler-injection disruptors.
pub fn pin_current_thread(cpu: usize) -> bool {
    sched::bind_current_thread(&[cpu]).is_ok()
}

mod sched {
    //! Thread affinity through the Linux system calls (the calling thread is pid 0).

    use std::io;
    use std::mem;

    /// Bits in a `cpu_set_t`: cpu ids at or above it cannot be named here.
    const SETSIZE: usize = libc::CPU_SETSIZE as usize;

    /// The calling thread's affinity mask.
    fn mask() -> io::Result<libc::cpu_set_t> {
        // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; `set` is a valid, writable cpu_set_t of the size
        // passed.
        let rc = unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }

    /// The cpu ids in the calling thread's affinity mask, ascending.
    pub(super) fn allowed_cpus() -> Result<Vec<usize>, String> {
        let set = mask().map_err(|e| format!("sched_getaffinity failed: {e}"))?;
        // SAFETY: every index is below CPU_SETSIZE, the bit length of `set`.
        Ok((0..SETSIZE).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
    }

    /// Whether the calling thread may run on `cpu` and on no other (false if the mask cannot be
    /// read). No allocation: it is asked at every one-worker run.
    pub(super) fn bound_to_only(cpu: usize) -> bool {
        mask().is_ok_and(|set| {
            cpu < SETSIZE
                // SAFETY: `set` is a valid cpu_set_t, and `cpu` is below its bit length (checked).
                && unsafe { libc::CPU_COUNT(&set) == 1 && libc::CPU_ISSET(cpu, &set) }
        })
    }

    /// Restricts the calling thread to `cpus`.
    pub(super) fn bind_current_thread(cpus: &[usize]) -> Result<(), String> {
        // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        for &c in cpus {
            if c >= SETSIZE {
                return Err(format!("cpu {c} is beyond CPU_SETSIZE ({SETSIZE})"));
            }
            // SAFETY: c < CPU_SETSIZE, the bit length of `set`.
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(format!("sched_setaffinity({cpus:?}) failed: {}", io::Error::last_os_error()));
        }
        Ok(())
    }
}

#[cfg(feature = "hwloc")]
mod hwloc {
    //! Topology-aware placement through hwlocality.

    use std::fmt;

    use hwlocality::cpu::binding::CpuBindingFlags;
    use hwlocality::cpu::cpuset::CpuSet;
    use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
    use hwlocality::memory::nodeset::NodeSet;
    use hwlocality::object::types::ObjectType;
    use hwlocality::object::TopologyObject;
    use hwlocality::Topology;

    use super::{Binder, Binding, Core, CpuPlan, Slot};

    /// The machine's topology, shared by the pool's threads (hwlocality's `Topology` is
    /// `Send + Sync`).
    pub(super) struct Topo(Topology);

    impl Topo {
        pub(super) fn new() -> Result<Self, String> {
            Topology::new().map(Self).map_err(|e| e.to_string())
        }

        /// The process's cores in logical (locality) order, each with the PUs the process may
        /// use.
        fn cores(&self) -> Result<(Vec<Core>, Vec<usize>), String> {
            let topo = &self.0;
            let bound = topo
                .cpu_binding(CpuBindingFlags::PROCESS)
                .map_err(|e| format!("hwloc_get_cpubind(PROCESS) failed: {e}"))?;
            let allowed = bound & topo.cpuset();
            let mut cores: Vec<Core> = Vec::new();
            let mut all = Vec::new();
            let mut last: Option<&TopologyObject> = None;
            // PUs in logical order: the PUs of one core are consecutive.
            for pu in topo.objects_with_type(ObjectType::PU) {
                let Some(os) = pu.os_index() else { continue };
                if !allowed.is_set(os) {
                    continue;
                }
                all.push(os);
                let core = pu.first_ancestor_with_type(ObjectType::Core);
                match (core, last, cores.last_mut()) {
                    (Some(c), Some(l), Some(unit)) if std::ptr::eq(c, l) => unit.push(os),
                    _ => cores.push(vec![os]),
                }
                last = core;
            }
            all.sort_unstable();
            Ok((cores, all))
        }

        pub(super) fn target(self, max_threads: usize, slot: Slot) -> Result<Binding, String> {
            let (cores, process_cpus) = self.cores()?;
            let plan = CpuPlan::new(&cores, slot, max_threads).ok_or("it found no allowed PUs")?;
            let numa_node = self.numa_node(&plan.cpus);
            Ok(Binding {
                binder: Binder::Hwloc(std::sync::Arc::new(self)),
                plan,
                process_cpus,
                numa_node,
                mechanism: "hwloc".to_string(),
                unit_name: "core",
            })
        }

        /// The NUMA node of all of `cpus`, if they have exactly one.
        fn numa_node(&self, cpus: &[usize]) -> Option<usize> {
            let nodes = NodeSet::from_cpuset(&self.0, &cpuset(cpus));
            match nodes.weight() {
                Some(1) => nodes.first_set().map(usize::from),
                _ => None,
            }
        }

        pub(super) fn bind_current_thread(&self, cpus: &[usize]) -> Result<(), String> {
            self.0
                .bind_cpu(&cpuset(cpus), CpuBindingFlags::THREAD)
                .map_err(|e| format!("hwloc_set_cpubind(THREAD, {cpus:?}) failed: {e}"))
        }

        pub(super) fn bind_memory<T>(&self, node: usize, buf: &[T]) -> bool {
            let Some(support) = self.0.feature_support().memory_binding() else { return false };
            if !(support.set_area() && support.bind_policy()) || std::mem::size_of_val(buf) == 0 {
                return false;
            }
            let mut nodes = NodeSet::new();
            nodes.set(node);
            let bind = |flags| {
                self.0.bind_memory_area::<[T], _>(buf, &nodes, MemoryBindingPolicy::Bind, flags).is_ok()
            };
            // Move pages already touched if possible; otherwise bind only the pages to come.
            (support.migrate_flag() && bind(MemoryBindingFlags::MIGRATE)) || bind(MemoryBindingFlags::empty())
        }

        #[cfg(test)]
        pub(super) fn topology(&self) -> &Topology {
            &self.0
        }
    }

    impl fmt::Debug for Topo {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Topo")
        }
    }

    fn cpuset(cpus: &[usize]) -> CpuSet {
        let mut set = CpuSet::new();
        for &c in cpus {
            // The ids come from hwloc's own topology or the OS's, far below hwloc's index limit.
            set.set(c);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    fn env_disables_pinning() -> bool {
        unpinned_reason(Pinning::Auto, std::env::var(PIN_ENV).ok().as_deref()).is_some()
    }

    fn this_cpu() -> usize {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).expect("sched_getcpu failed")
    }

    /// Runs `pool` once and returns how often each worker index was called.
    fn counts(pool: &RankPool) -> Vec<usize> {
        let hits: Vec<AtomicUsize> = (0..pool.max_threads() + 1).map(|_| AtomicUsize::new(0)).collect();
        pool.run(|w| {
            hits[w.min(pool.max_threads())].fetch_add(1, Ordering::Relaxed);
        });
        hits.into_iter().map(AtomicUsize::into_inner).collect()
    }

    #[test]
    fn pool_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<RankPool>();
    }

    #[test]
    fn run_runs_exactly_the_active_workers_once_each() {
        let pool = RankPool::new(3, Slot::WHOLE, Pinning::Auto).expect("pool");
        assert_eq!(pool.active(), 3, "all threads active at first");
        for active in [3, 1, 2, 3, 1] {
            pool.set_active(active);
            let c = counts(&pool);
            let want: Vec<usize> = (0..4).map(|w| usize::from(w < active)).collect();
            assert_eq!(c, want, "active = {active}");
        }
    }

    #[test]
    fn workers_run_concurrently() {
        // Each worker waits until all active workers have arrived: deadlocks (the test hangs) if
        // the workers ran one after another.
        let pool = RankPool::new(2, Slot::WHOLE, Pinning::Off).expect("pool");
        let arrived = AtomicUsize::new(0);
        pool.run(|_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let start = Instant::now();
            while arrived.load(Ordering::SeqCst) < 2 {
                assert!(start.elapsed().as_secs() < 20, "workers did not run concurrently");
                std::hint::spin_loop();
            }
        });
    }

    #[test]
    fn set_active_clamps_and_changes_the_next_run() {
        let pool = RankPool::new(2, Slot::WHOLE, Pinning::Auto).expect("pool");
        pool.set_active(0);
        assert_eq!(pool.active(), 1);
        assert_eq!(counts(&pool), [1, 0, 0]);
        pool.set_active(100);
        assert_eq!(pool.active(), 2);
        assert_eq!(counts(&pool), [1, 1, 0]);
    }

    #[test]
    fn sleeping_workers_lose_no_wake_up() {
        // With no spinning every wait parks: a lost wake-up would hang this test.
        let pool = RankPool::new(3, Slot::WHOLE, Pinning::Auto).expect("pool");
        pool.set_spin(Duration::ZERO);
        assert_eq!(pool.spin(), Duration::ZERO);
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        let mut want = [0; 3];
        for k in 0..3000 {
            let active = [3, 1, 2, 2, 3][k % 5];
            pool.set_active(active);
            pool.run(|w| {
                hits[w].fetch_add(1, Ordering::Relaxed);
            });
            want.iter_mut().take(active).for_each(|n| *n += 1);
            if k % 500 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let hits: Vec<usize> = hits.into_iter().map(AtomicUsize::into_inner).collect();
        assert_eq!(hits, want);
    }

    #[test]
    fn runs_from_two_threads_are_serialized() {
        // Each caller's workers count into the caller's own counter: overlapping runs would mix
        // jobs up (wrong counts) or lose a worker's count-out (hang).
        let pool = RankPool::new(2, Slot::WHOLE, Pinning::Off).expect("pool");
        let counts: [AtomicUsize; 2] = Default::default();
        std::thread::scope(|s| {
            for (caller, count) in counts.iter().enumerate() {
                let pool = &pool;
                s.spawn(move || {
                    for k in 0..500 {
                        pool.run(|_| {
                            count.fetch_add(1, Ordering::Relaxed);
                        });
                        assert_eq!(count.load(Ordering::Relaxed), 2 * (k + 1), "caller {caller}");
                    }
                });
            }
        });
    }

    #[test]
    fn run_propagates_a_workers_panic_and_the_pool_survives() {
        let pool = RankPool::new(2, Slot::WHOLE, Pinning::Off).expect("pool");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|w| assert!(w != 1, "worker 1 fails"));
        }));
        assert!(r.is_err());
        assert_eq!(counts(&pool), [1, 1, 0]);
    }

    #[test]
    fn run_from_inside_the_pool_panics() {
        let pool = RankPool::new(1, Slot::WHOLE, Pinning::Off).expect("pool");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.run(|_| pool.run(|_| ()))));
        assert!(r.is_err());
    }

    #[test]
    #[cfg_attr(miri, ignore = "sched_getcpu is a foreign function Miri cannot run")]
    fn pinned_threads_run_on_their_cpu() {
        let cpus = sched::allowed_cpus().expect("affinity").len();
        let pool = RankPool::new(cpus, Slot::WHOLE, Pinning::Auto).expect("pool");
        let p = pool.placement();
        if env_disables_pinning() {
            assert!(!p.pinned);
            return;
        }
        assert!(p.pinned, "pinning failed here: {}", p.how);
        assert_eq!(p.cpus.len(), cpus);
        assert_eq!(p.cpus.iter().collect::<BTreeSet<_>>().len(), cpus, "one cpu per thread: {p:?}");
        let seen: Vec<AtomicUsize> = (0..cpus).map(|_| AtomicUsize::new(usize::MAX)).collect();
        for _ in 0..50 {
            pool.run(|w| {
                let cpu = this_cpu();
                assert_eq!(cpu, p.cpus[w], "worker {w} ran on cpu {cpu}, placement {p:?}");
                seen[w].store(cpu, Ordering::Relaxed);
            });
        }
        let seen: Vec<usize> = seen.into_iter().map(AtomicUsize::into_inner).collect();
        assert_eq!(seen, p.cpus);
        // The calling thread is left alone.
        assert_eq!(sched::allowed_cpus().expect("affinity").len(), cpus);
    }

    #[test]
    fn one_worker_on_the_callers_only_cpu_runs_on_the_caller() {
        let pool = RankPool::new(1, Slot::WHOLE, Pinning::Auto).expect("pool");
        let p = pool.placement().clone();
        let caller = thread::current().id();
        let ran_on = Mutex::new(Vec::new());
        let run = || {
            pool.run(|w| ran_on.lock().expect("lock").push((w, thread::current().id())));
            ran_on.lock().expect("lock").pop().expect("one run")
        };
        let allowed = sched::allowed_cpus().expect("affinity");
        if allowed.len() > 1 || !p.pinned {
            // The caller may run elsewhere (or nothing is pinned): the worker's thread runs it.
            let (w, on) = run();
            assert_eq!(w, 0);
            assert_ne!(on, caller, "{p:?}");
        }
        if !p.pinned {
            return;
        }
        sched::bind_current_thread(&p.cpus[..1]).expect("bind the caller");
        assert_eq!(run(), (0, caller), "the caller bound to the worker's cpu runs it: {p:?}");
        pool.run(|w| assert_eq!(standing_in_for(), Some(w)));
        assert_eq!(standing_in_for(), None);
        // A run from inside it panics as on a worker, and leaves the caller usable.
        let nested = panic::catch_unwind(AssertUnwindSafe(|| pool.run(|_| pool.run(|_| {}))));
        assert!(nested.is_err(), "a nested run must panic");
        assert_eq!(run(), (0, caller));
        sched::bind_current_thread(&allowed).expect("restore the caller's cpus");
    }

    #[test]
    fn slots_split_the_cpus_disjointly() {
        let all = sched::allowed_cpus().expect("affinity");
        let a = RankPool::new(1, Slot { index: 0, of: 2 }, Pinning::Auto).expect("pool");
        let b = RankPool::new(1, Slot { index: 1, of: 2 }, Pinning::Auto).expect("pool");
        if env_disables_pinning() {
            return;
        }
        let (pa, pb) = (a.placement(), b.placement());
        assert!(pa.pinned && pb.pinned, "{pa:?} {pb:?}");
        assert!(pa.cpus.iter().chain(&pb.cpus).all(|c| all.contains(c)));
        if all.len() >= 2 {
            assert!(pa.cpus.iter().all(|c| !pb.cpus.contains(c)), "{pa:?} {pb:?}");
            assert!(!pa.how.contains("shared") && !pb.how.contains("shared"));
        } else {
            assert!(pa.how.contains("shared"), "{}", pa.how);
        }
        // Where the workers run (sched_getcpu: not under Miri, which cannot call it).
        #[cfg(not(miri))]
        for (pool, p) in [(&a, pa), (&b, pb)] {
            pool.run(|w| assert_eq!(this_cpu(), p.cpus[w]));
        }
    }

    #[test]
    fn pinning_off_leaves_threads_unpinned() {
        let pool = RankPool::new(2, Slot::WHOLE, Pinning::Off).expect("pool");
        let p = pool.placement();
        assert!(!p.pinned && p.cpus.is_empty() && p.numa_node.is_none());
        assert!(p.how.starts_with("unpinned"), "{}", p.how);
        assert!(!pool.bind_memory(&mut [0u8; 4096]));
        assert_eq!(counts(&pool), [1, 1, 0]);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(matches!(RankPool::new(0, Slot::WHOLE, Pinning::Off), Err(PoolError::ZeroThreads)));
        assert!(matches!(
            RankPool::new(1, Slot { index: 2, of: 2 }, Pinning::Off),
            Err(PoolError::InvalidSlot { index: 2, of: 2 })
        ));
        assert!(matches!(
            RankPool::new(1, Slot { index: 0, of: 0 }, Pinning::Off),
            Err(PoolError::InvalidSlot { .. })
        ));
    }

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

    #[test]
    fn plan_prefers_distinct_cores_then_hyperthreads() {
        // 2 cores with 2 hyperthreads each, Linux-style numbering (siblings n apart).
        let cores = vec![vec![0, 2], vec![1, 3]];
        let p = CpuPlan::new(&cores, Slot::WHOLE, 2).expect("plan");
        assert_eq!(p.cpus, [0, 1]);
        assert!(!p.smt && !p.oversubscribed && p.shared.is_none());
        let p = CpuPlan::new(&cores, Slot::WHOLE, 4).expect("plan");
        assert_eq!(p.cpus, [0, 1, 2, 3]);
        assert!(p.smt && !p.oversubscribed);
        assert!(p.describe("hwloc", "core", Slot::WHOLE).contains("hyperthreads"));
        let p = CpuPlan::new(&cores, Slot::WHOLE, 6).expect("plan");
        assert_eq!(p.cpus, [0, 1, 2, 3, 0, 1]);
        assert!(p.oversubscribed);
        let how = p.describe("hwloc", "core", Slot::WHOLE);
        assert!(how.contains("oversubscribed: 6 threads on 4 cpus"), "{how}");
    }

    #[test]
    fn plan_splits_cores_then_hyperthreads_then_shares() {
        let cores = vec![vec![0, 2], vec![1, 3]];
        // 2 ranks: one core each, both its hyperthreads.
        let p = CpuPlan::new(&cores, Slot { index: 1, of: 2 }, 2).expect("plan");
        assert_eq!(p.cpus, [1, 3]);
        assert!(p.smt && p.shared.is_none());
        // 4 ranks on 2 cores: one hyperthread each, not shared.
        let cpus: Vec<Vec<usize>> =
            (0..4).map(|r| CpuPlan::new(&cores, Slot { index: r, of: 4 }, 1).expect("plan").cpus).collect();
        assert_eq!(cpus, [[0], [2], [1], [3]]);
        let p = CpuPlan::new(&cores, Slot { index: 3, of: 4 }, 1).expect("plan");
        assert!(p.split_pus && p.shared.is_none());
        // 6 ranks on 4 PUs: round-robin, shared.
        let p = CpuPlan::new(&cores, Slot { index: 5, of: 6 }, 1).expect("plan");
        assert_eq!(p.cpus, [2]);
        assert_eq!(p.shared, Some((4, 6)));
        let how = p.describe("hwloc", "core", Slot { index: 5, of: 6 });
        assert!(how.contains("shared with other ranks: 4 cpus for 6 ranks"), "{how}");
        // No cores: nothing to pin to.
        assert_eq!(CpuPlan::new(&[], Slot::WHOLE, 1), None);
    }

    proptest! {
        #[test]
        fn split_is_contiguous_disjoint_and_covering(units in 0usize..200, of in 1usize..40) {
            let groups: Vec<(Vec<usize>, bool)> = (0..of).map(|index| split(units, Slot { index, of })).collect();
            if units >= of {
                let flat: Vec<usize> = groups.iter().flat_map(|(g, _)| g.clone()).collect();
                prop_assert_eq!(flat, (0..units).collect::<Vec<_>>());
                for (g, shared) in &groups {
                    prop_assert!(!shared);
                    prop_assert!(g.len() == units / of || g.len() == units / of + 1);
                }
            } else {
                for (index, (g, shared)) in groups.iter().enumerate() {
                    prop_assert!(*shared || units == 0);
                    if units > 0 {
                        prop_assert_eq!(g.clone(), vec![index % units]);
                    }
                }
            }
        }

        #[test]
        fn plan_gives_each_worker_a_cpu_of_its_group(
            n_cores in 1usize..12, smt in 1usize..4, of in 1usize..6, threads in 1usize..20,
        ) {
            let cores: Vec<Core> = (0..n_cores).map(|c| (0..smt).map(|t| t * n_cores + c).collect()).collect();
            let plans: Vec<CpuPlan> =
                (0..of).map(|index| CpuPlan::new(&cores, Slot { index, of }, threads).expect("plan")).collect();
            for p in &plans {
                prop_assert_eq!(p.cpus.len(), threads);
                // Distinct cores first: the first workers, one per core used, are on distinct cores.
                let k = threads.min(p.cores_used);
                let first: BTreeSet<usize> = p.cpus[..k].iter().map(|c| c % n_cores).collect();
                prop_assert_eq!(first.len(), k);
                let all: BTreeSet<usize> = p.cpus.iter().map(|c| c % n_cores).collect();
                prop_assert_eq!(all.len(), p.cores_used);
            }
            if n_cores * smt >= of {
                // No cpu is in two slots.
                for (i, a) in plans.iter().enumerate() {
                    for b in &plans[i + 1..] {
                        prop_assert!(a.cpus.iter().all(|c| !b.cpus.contains(c)));
                    }
                }
            }
        }
    }

    #[test]
    fn bind_memory_without_numa_node_is_a_no_op() {
        let pool = RankPool::new(1, Slot::WHOLE, Pinning::Auto).expect("pool");
        let mut empty: [f32; 0] = [];
        assert!(!pool.bind_memory(&mut empty));
        if cfg!(not(feature = "hwloc")) {
            assert_eq!(pool.placement().numa_node, None);
            assert!(!pool.bind_memory(&mut vec![0f32; 1 << 16]));
        }
    }

    #[cfg(feature = "hwloc")]
    #[test]
    fn hwloc_finds_the_numa_node_and_binds_memory_to_it() {
        use hwlocality::memory::binding::MemoryBindingFlags;
        use hwlocality::memory::nodeset::NodeSet;

        let pool = RankPool::new(1, Slot::WHOLE, Pinning::Auto).expect("pool");
        if env_disables_pinning() {
            return;
        }
        let p = pool.placement();
        assert!(p.pinned && p.how.starts_with("hwloc: "), "{p:?}");
        let node = p.numa_node.expect("one NUMA node for a one-thread pool");
        let mut buf = vec![1f64; 1 << 20];
        assert!(pool.bind_memory(&mut buf), "binding 8 MiB to node {node} failed");
        let Binder::Hwloc(topo) = &pool.binder else { panic!("hwloc pool without hwloc binder") };
        let (nodes, _policy) = topo
            .topology()
            .area_memory_binding::<[f64], NodeSet>(&buf, MemoryBindingFlags::empty())
            .expect("area binding");
        assert!(nodes.is_set(node), "buffer bound to {nodes:?}, not node {node}");
    }
}
