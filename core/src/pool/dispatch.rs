//! The pool itself: [`RankPool`]'s threads, each waiting on its own go word, a run dispatched to
//! the active workers (or to the caller standing in for a single one), and the spin-then-park
//! waits of workers and caller. See the [`pool`](super) module docs for the design.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use super::affinity::{sched, Binder, Binding};
use super::{unpinned_reason, Pinning, Placement, PoolError, Slot, DEFAULT_SPIN, PIN_ENV};

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
    /// worker's CPU: see the pool's module docs).
    static STANDING_IN: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The worker of a pool that the calling thread is running a job for in its stead (a one-worker
/// run on the caller's own CPU, see the [`pool`](super) module docs), if it is: for messages that
/// name the thread a panic happened on.
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
    /// when that thread is bound to the worker's CPU alone, see the [`pool`](super) module docs)
    /// and returns when all have returned. The other threads are not woken.
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
            // The caller is worker 0 for this run (see the pool's module docs); a run from inside
            // `f` panics as on a worker.
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

#[cfg(test)]
mod tests {
    use super::*;
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
