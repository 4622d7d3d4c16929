//! Ranks and one-sided windows: the layer everything in Peregrine stands on.
//!
//! A [`Transport`] is one rank of a world of `world_size` ranks. Ranks allocate [`Window`]s
//! collectively: a window's global index space is split into one contiguous shard per rank (a
//! [`ShardMap`]; shards may differ in size) and any rank reads and updates any shard one-sidedly,
//! with no action by the owner:
//!
//! | operation | completes | MPI |
//! |---|---|---|
//! | [`Window::get`], [`Window::get_batch`] | on return (data in the buffer) | `MPI_Get` + `MPI_Win_flush_local` |
//! | [`Window::put`], [`Window::accumulate`] and batches | at the target after [`Window::flush`] / [`Window::flush_all`] | `MPI_Put` / `MPI_Accumulate(MPI_SUM)` |
//! | [`Window::fetch_add`], [`Window::compare_and_swap`] | on return, atomically | `MPI_Fetch_and_op` / `MPI_Compare_and_swap` |
//! | [`Window::with_own_shard`] (`unsafe`: the caller excludes other access) | in place | `MPI_Win_sync`, loads and stores, `MPI_Win_sync` |
//!
//! A global range that spans shards is split into per-shard pieces. Small collectives for control
//! data ([`Transport::barrier`], [`Transport::allreduce`], [`Transport::broadcast`]) complete the
//! picture; a barrier does **not** complete outstanding writes (flush first).
//!
//! Backends:
//! - `local` (always built): ranks are threads of one process ([`run_local`]); it enforces the same
//!   visibility rules as MPI passive-target RMA (see [`local`]).
//! - `mpi` (cargo feature `mpi`): MPI-3 RMA on `MPI_Win_allocate` windows in a `lock_all` epoch; see
//!   the `mpi` module.
//!
//! Freeing a window is collective and consumes it, so using a freed window does not compile:
//!
//! ```compile_fail,E0382
//! # use peregrine_transport::*;
//! run_local(1, |t| {
//!     let w = t.alloc_window::<u64>("w", &ShardMap::balanced(4, 1))?;
//!     w.free()?;
//!     w.fetch_add(0, 1) // error[E0382]: use of moved value: `w`
//! });
//! ```

#![warn(missing_docs)]

pub mod conformance;
mod elem;
mod error;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
mod node;
mod shard;

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::str::FromStr;

pub use elem::{Elem, ElemKind, ReduceOp};
pub use error::{Error, ErrorKind, Result};
pub use node::{NodeLayout, NodeShared};
pub use shard::{Piece, Pieces, ShardMap, SHARD_LINE};

/// Which implementation of ranks and windows to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Ranks as threads of one process.
    Local,
    /// MPI processes, MPI-3 RMA windows.
    Mpi,
}

impl Backend {
    /// Whether this binary was built with the backend.
    pub fn compiled(self) -> bool {
        match self {
            Self::Local => true,
            Self::Mpi => cfg!(feature = "mpi"),
        }
    }

    /// `Mpi` when the environment shows an MPI launcher (mpirun/mpiexec of OpenMPI or MPICH, or
    /// `srun --mpi=pmix|pmi2`), else `Local`.
    pub fn detect() -> Self {
        const MARKERS: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"];
        if MARKERS.iter().any(|v| std::env::var_os(v).is_some()) {
            Self::Mpi
        } else {
            Self::Local
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Local => "local",
            Self::Mpi => "mpi",
        })
    }
}

/// Error of [`Backend::from_str`].
#[derive(Debug, thiserror::Error)]
#[error("unknown backend `{0}` (expected `local` or `mpi`)")]
pub struct UnknownBackend(pub String);

impl FromStr for Backend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> std::result::Result<Self, UnknownBackend> {
        match s {
            "local" => Ok(Self::Local),
            "mpi" => Ok(Self::Mpi),
            _ => Err(UnknownBackend(s.to_owned())),
        }
    }
}

/// One rank of a world. Methods that say "collective" must be called by every rank, in the same
/// order.
#[derive(Debug)]
#[non_exhaustive]
pub enum Transport {
    /// A thread of an in-process world.
    Local(local::LocalRank),
    /// An MPI process.
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiRank),
}

/// Delegates a call to the backend behind a [`Transport`] or a [`Window`].
macro_rules! dispatch {
    ($on:expr, $inner:ident => $call:expr) => {
        match $on {
            Inner::Local($inner) => $call,
            #[cfg(feature = "mpi")]
            Inner::Mpi($inner) => $call,
        }
    };
}

impl Transport {
    /// Initialises MPI (`MPI_THREAD_MULTIPLE`) and returns this process's rank of
    /// `MPI_COMM_WORLD`. Errors if MPI support was not compiled in, or MPI was initialised before.
    pub fn mpi() -> Result<Self> {
        #[cfg(feature = "mpi")]
        {
            mpi::MpiRank::init().map(Self::Mpi)
        }
        #[cfg(not(feature = "mpi"))]
        {
            Err(ErrorKind::NotCompiled { backend: "mpi", feature: "mpi" }.into())
        }
    }

    /// The backend of this rank.
    pub fn backend(&self) -> Backend {
        match self {
            Self::Local(_) => Backend::Local,
            #[cfg(feature = "mpi")]
            Self::Mpi(_) => Backend::Mpi,
        }
    }

    /// This rank's number, `0..world_size`.
    pub fn rank(&self) -> usize {
        use Transport as Inner;
        dispatch!(self, t => t.rank())
    }

    /// Number of ranks in the world.
    pub fn world_size(&self) -> usize {
        use Transport as Inner;
        dispatch!(self, t => t.world_size())
    }

    /// Collective: returns when every rank has entered. Does not complete RMA writes.
    pub fn barrier(&self) -> Result<()> {
        use Transport as Inner;
        dispatch!(self, t => t.barrier())
    }

    /// Lets the library serve other ranks' window operations on this rank's memory, outside any
    /// window call of this rank's own. Called by a rank that waits: where one-sided operations
    /// need the target's progress (OpenMPI's `osc/ucx` emulating atomics over TCP, `osc/pt2pt`),
    /// a rank that only polls its own window serves the others' requests inside its own calls,
    /// holding its accumulate lock, and starves them. A no-op for the local backend.
    pub fn progress(&self) -> Result<()> {
        use Transport as Inner;
        dispatch!(self, t => t.progress())
    }

    /// Collective: elementwise reduction of `data` over all ranks; every rank gets the result.
    /// All ranks must pass the same length. Meant for short control arrays.
    pub fn allreduce<T: Elem>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        use Transport as Inner;
        dispatch!(self, t => t.allreduce(data, op))
    }

    /// Collective: copies `root`'s `data` into every rank's `data` (same length everywhere).
    pub fn broadcast<T: Elem>(&self, data: &mut [T], root: usize) -> Result<()> {
        use Transport as Inner;
        dispatch!(self, t => t.broadcast(data, root))
    }

    /// How the world's ranks fill nodes ([`NodeLayout`]); `None` where a node's ranks are not
    /// consecutive world ranks (a round-robin placement).
    pub fn node_layout(&self) -> Option<NodeLayout> {
        match self {
            Self::Local(t) => Some(t.node_layout()),
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => t.node_layout(),
        }
    }

    /// Collective over the world: `len` zeroed elements that every rank of a node maps, one
    /// block per node ([`NodeShared`]). `None` on every rank where some node cannot have one
    /// (no node layout; under MPI, no shared memory file could be made and mapped on some node:
    /// the reason is on that rank's stderr); `name` appears in messages.
    pub fn alloc_node_shared<T: Elem>(&self, name: &str, len: usize) -> Result<Option<NodeShared<T>>> {
        match self {
            Self::Local(t) => {
                let _ = name;
                let ranks = t.node_layout().local_size();
                Ok(Some(NodeShared::new(node::NodeInner::Local(t.alloc_node_shared(len)?), ranks)))
            }
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => {
                let ranks = t.node_layout().map_or(1, |l| l.local_size());
                Ok(t.alloc_node_shared(name, len)?.map(|n| NodeShared::new(node::NodeInner::Mpi(n), ranks)))
            }
        }
    }

    /// Collective: allocates a window laid out by `map` (one shard per rank, zero-initialised).
    /// Every rank must pass the same map and element type; a mismatch is an error on every rank.
    /// `name` appears in error messages.
    pub fn alloc_window<T: Elem>(&self, name: &str, map: &ShardMap) -> Result<Window<T>> {
        self.alloc(name, map, Sharing::None)
    }

    /// Collective: [`alloc_window`](Self::alloc_window), and where the ranks can share its
    /// memory, a window every rank maps whole ([`Window::whole_in_place`]): MPI processes all on
    /// one node (`MPI_Comm_split_type`) get it from `MPI_Win_allocate_shared`, readable in place
    /// when its shards then lie back to back: every shard but the last a whole number of
    /// [`SHARD_LINE`]s ([`ShardMap::balanced_in_lines`]), none of them empty before the last
    /// non-empty one.
    /// Elsewhere (several nodes, a one-sided component without shared windows, the local
    /// backend) it is the same as [`alloc_window`](Self::alloc_window).
    pub fn alloc_shared_window<T: Elem>(&self, name: &str, map: &ShardMap) -> Result<Window<T>> {
        self.alloc(name, map, Sharing::Shared)
    }

    /// Collective: [`alloc_shared_window`](Self::alloc_shared_window), whose operations, where
    /// every rank maps it whole (MPI processes all on one node), are plain loads and stores and
    /// atomic adds on the mapping, as the local backend's are, instead of calls into the MPI
    /// library: a batch of many small ranges (a sparse model's keys) costs what copying them
    /// costs. Floats' accumulates are then compare-and-swap loops per element, dearer than the
    /// library's locked add over a long range: for windows written in short ranges. Elsewhere
    /// the same as [`alloc_window`](Self::alloc_window) (between nodes a batch's ranges to one
    /// target travel as one operation of an indexed datatype).
    pub fn alloc_direct_window<T: Elem>(&self, name: &str, map: &ShardMap) -> Result<Window<T>> {
        self.alloc(name, map, Sharing::Direct)
    }

    /// Every allocation: the local backend's windows are never shared between processes, and
    /// always direct.
    fn alloc<T: Elem>(&self, name: &str, map: &ShardMap, sharing: Sharing) -> Result<Window<T>> {
        let inner = match self {
            Self::Local(t) => {
                let _ = sharing;
                WindowInner::Local(t.alloc_window(name, map)?)
            }
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => WindowInner::Mpi(t.alloc_window(
                name,
                map,
                sharing != Sharing::None,
                sharing == Sharing::Direct,
            )?),
        };
        Ok(Window { inner })
    }

    /// Window operations (gets, writes, atomics) this rank issued since the last call, counted
    /// only in a serial world of the local backend ([`local::serial_world`], where a simulator
    /// charges them); none everywhere else.
    pub fn take_ops(&self) -> Ops {
        match self {
            Self::Local(t) => t.take_ops(),
            #[cfg(feature = "mpi")]
            Self::Mpi(_) => Ops::default(),
        }
    }

    /// Ends the whole job after a fatal error on this rank: `MPI_Abort` under MPI (so that peers
    /// waiting for this rank do not hang), process exit for the local backend.
    pub fn abort(&self, code: i32) -> ! {
        match self {
            Self::Local(_) => std::process::exit(code),
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => t.abort(code),
        }
    }
}

/// This process's MPI rank in `MPI_COMM_WORLD`, once an MPI transport was created ([`Transport::mpi`]);
/// `None` before, and always for the local backend (whose ranks are threads: see their names).
pub fn process_rank() -> Option<usize> {
    #[cfg(feature = "mpi")]
    {
        mpi::process_rank()
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}

/// The MPI library's version string (`MPI_Get_library_version`: "Open MPI v4.1.4, ...",
/// "MPICH Version: 4.0.2 ..."), first line only; `None` without the `mpi` feature.
pub fn mpi_library_version() -> Option<String> {
    #[cfg(feature = "mpi")]
    {
        ::mpi::environment::library_version()
            .ok()
            .map(|v| v.lines().next().unwrap_or_default().trim().to_owned())
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}

/// Ends the whole MPI job from any thread (`MPI_Abort` on `MPI_COMM_WORLD`) if MPI is
/// initialized and not yet finalized, and does not return then; returns otherwise (no MPI, or not
/// live), leaving the caller to end the process. For fatal faults outside the normal error path
/// (a panic hook, a signal handler's last resort): the peers of a dead rank would otherwise wait
/// for it.
pub fn abort_world(code: i32) {
    #[cfg(feature = "mpi")]
    mpi::abort_world(code);
    #[cfg(not(feature = "mpi"))]
    let _ = code;
}

/// Runs `f` on every rank of a fresh in-process world of `world_size` ranks, one thread per rank
/// (named `rank-<r>`), and returns the ranks' results in rank order.
///
/// A rank that returns or panics leaves the world: peers then get [`ErrorKind::PeerExited`] from
/// collectives instead of hanging. If a rank panicked, the panic is resumed here once every rank
/// has finished.
pub fn run_local<R, F>(world_size: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(Transport) -> R + Sync,
{
    run_ranks(local::world(world_size)?, f)
}

/// [`run_local`] with the ranks in nodes of `per_node` consecutive ranks
/// ([`local::world_in_nodes`]).
pub fn run_local_in_nodes<R, F>(world_size: usize, per_node: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(Transport) -> R + Sync,
{
    run_ranks(local::world_in_nodes(world_size, per_node)?, f)
}

fn run_ranks<R, F>(ranks: Vec<local::LocalRank>, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(Transport) -> R + Sync,
{
    let f = &f;
    let outcomes: Vec<std::thread::Result<R>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                std::thread::Builder::new()
                    .name(format!("rank-{}", r.rank()))
                    .spawn_scoped(s, move || f(Transport::Local(r)))
                    .expect("spawning a rank thread (out of threads?)")
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    Ok(outcomes.into_iter().map(|o| o.unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect())
}

/// A window distributed over all ranks; see the crate docs for the operations and when they
/// complete. Shared between a rank's threads by reference (`Window: Sync`).
#[derive(Debug)]
pub struct Window<T: Elem> {
    inner: WindowInner<T>,
}

#[derive(Debug)]
enum WindowInner<T: Elem> {
    Local(local::LocalWindow<T>),
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiWindow<T>),
}

impl<T: Elem> Window<T> {
    /// The window's layout.
    pub fn map(&self) -> &ShardMap {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.map())
    }

    /// The window's name.
    pub fn name(&self) -> &str {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.name())
    }

    /// Total number of elements over all shards.
    pub fn len(&self) -> usize {
        self.map().total()
    }

    /// Whether the window has no elements at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads global elements `start..start + out.len()` into `out`. Complete on return.
    pub fn get(&self, start: usize, out: &mut [T]) -> Result<()> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.get(start, out))
    }

    /// Reads several global ranges, back to back, into `out` (whose length must be the sum of the
    /// ranges' lengths). All reads are issued before one completion: cheaper than many `get`s.
    pub fn get_batch(&self, ranges: &[Range<usize>], out: &mut [T]) -> Result<()> {
        let batch = self.check_batch("get_batch", ranges, out.len())?;
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.get_batch(batch, out))
    }

    /// Whether every operation on this window is a load, store or atomic on memory this process
    /// maps: the local backend's windows, and [`Transport::alloc_direct_window`]'s where every
    /// rank maps it whole. A batch of many short ranges then costs what copying them costs, in
    /// any order (elsewhere, a batch sorted by position travels in fewer operations).
    pub fn is_direct(&self) -> bool {
        match &self.inner {
            WindowInner::Local(_) => true,
            #[cfg(feature = "mpi")]
            WindowInner::Mpi(w) => w.is_direct(),
        }
    }

    /// Reads every range of `ranges` into the same positions of `out` (`out[r]` for each `r`),
    /// which is as long as the window; the rest of `out` is left as it was. Issued as
    /// [`get_batch`](Self::get_batch) is, with no copy through a buffer: under MPI, one
    /// `MPI_Get` of an indexed datatype per target where a target has many ranges (a pull of a
    /// sparse model's keys). Complete on return.
    pub fn get_at(&self, ranges: &[Range<usize>], out: &mut [T]) -> Result<()> {
        let batch = self.check_positioned("get_at", ranges, out.len())?;
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.get_batch(batch, out))
    }

    /// Writes `data` at global `start`. Visible at the target after [`flush`](Self::flush) of the
    /// target (or [`flush_all`](Self::flush_all)); `data` may be reused at once.
    pub fn put(&self, start: usize, data: &[T]) -> Result<()> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.write(start, data, false))
    }

    /// Adds `data` elementwise at global `start` (atomically per element against other
    /// accumulates and atomics). Visible after a flush, like [`put`](Self::put).
    pub fn accumulate(&self, start: usize, data: &[T]) -> Result<()> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.write(start, data, true))
    }

    /// [`put`](Self::put) of `data` split over several global ranges, back to back.
    pub fn put_batch(&self, ranges: &[Range<usize>], data: &[T]) -> Result<()> {
        let batch = self.check_batch("put_batch", ranges, data.len())?;
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.write_batch(batch, data, false))
    }

    /// [`accumulate`](Self::accumulate) of `data` split over several global ranges, back to back.
    pub fn accumulate_batch(&self, ranges: &[Range<usize>], data: &[T]) -> Result<()> {
        let batch = self.check_batch("accumulate_batch", ranges, data.len())?;
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.write_batch(batch, data, true))
    }

    /// Steps the keys `keys` (key `j`: elements `j * width ..` up to `width` of them, the last
    /// key's cut at the window's end; ascending, no key twice) of this window and of `state` (a
    /// window of `k` elements per element of this one's, shard for shard: an optimizer's state,
    /// `k` slots a parameter, interleaved) in one pass, where both are direct MPI windows
    /// ([`is_direct`](Self::is_direct): every process of the node maps them whole). In blocks of
    /// keys: `values` (as long as this window, read at the keys' own positions and left zero
    /// there: an update taken whole, with no pass of the caller's to clear it) and the state of
    /// the same elements are gathered, `f(c, st, ds)` turns the gathered values `c` into
    /// this window's change in place and writes the state's change into `ds` (`k` per element),
    /// and both changes are added, under the accumulate locks of the block's shard in both
    /// windows: what [`get_batch`](Self::get_batch) of the state, then
    /// [`accumulate_batch`](Self::accumulate_batch) of both would do, with each key passed once
    /// instead of three times, no ranges built and no buffer as long as the batch. The state is
    /// read without a lock (as `get_batch` reads it), so a block meets the changes that landed
    /// before its read. Complete on return.
    ///
    /// An error, with nothing done, unless [`steps_with`](Self::steps_with) `state`.
    pub fn step_with_state(
        &self,
        state: &Window<T>,
        width: usize,
        keys: &[u32],
        values: &mut [T],
        mut f: impl FnMut(&mut [T], &[T], &mut [T]),
    ) -> Result<()> {
        let len = self.len();
        if values.len() != len {
            let window = self.name().to_owned();
            let (rank, got) = (self.rank(), values.len());
            return Err(ErrorKind::LengthMismatch {
                rank,
                op: "step_with_state",
                window,
                expected: len,
                got,
            }
            .into());
        }
        // Ascending, each key's first element inside the window.
        let (op, mut prev) = ("step_with_state", None);
        for &key in keys {
            if (key as usize).checked_mul(width).is_none_or(|at| at >= len) {
                let start = (key as usize).saturating_mul(width);
                return Err(self.outside(&(start..start.saturating_add(width.max(1)))));
            }
            if let Some(after) = prev.filter(|&p| p >= key) {
                let (rank, window) = (self.rank(), self.name().to_owned());
                return Err(ErrorKind::Unordered { rank, op, window, key, after }.into());
            }
            prev = Some(key);
        }
        match (&self.inner, &state.inner) {
            #[cfg(feature = "mpi")]
            (WindowInner::Mpi(w), WindowInner::Mpi(s)) => w.step_with_state(s, width, keys, values, &mut f),
            _ => {
                let _ = &mut f;
                let (rank, window, other) = (self.rank(), self.name().to_owned(), state.name().to_owned());
                Err(ErrorKind::NotDirect { rank, op, window, other }.into())
            }
        }
    }

    /// Whether [`step_with_state`](Self::step_with_state) steps this window with `state`: both
    /// direct MPI windows (the local backend's are not), `state`'s shards the same whole
    /// multiple of this one's.
    pub fn steps_with(&self, state: &Window<T>) -> bool {
        match (&self.inner, &state.inner) {
            #[cfg(feature = "mpi")]
            (WindowInner::Mpi(w), WindowInner::Mpi(s)) => w.pairs_with(s).is_some(),
            _ => false,
        }
    }

    /// Atomically adds `value` to global element `index` and returns its previous value.
    pub fn fetch_add(&self, index: usize, value: T) -> Result<T> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.fetch_add(index, value))
    }

    /// Completes, at `target`, every write this rank issued to it.
    pub fn flush(&self, target: usize) -> Result<()> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.flush(target))
    }

    /// Completes, at every target, every write this rank issued.
    pub fn flush_all(&self) -> Result<()> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.flush_all())
    }

    /// Runs `f` on this rank's own shard in place (global elements `map().range(rank)`): the
    /// window's memory itself, with no copy in or out (under MPI between two `MPI_Win_sync`s,
    /// which make what other ranks wrote visible to the loads in `f` and what `f` stored visible
    /// to their later reads). For work on a rank's own elements between two synchronizations of
    /// all ranks, where a `get`, a computation and an `accumulate` or `put` back would move the
    /// shard through memory several times (the owner-side optimizer step).
    ///
    /// # Safety
    /// Nothing else may access this rank's shard while `f` runs: every operation any rank issued
    /// on it (this one's included) has completed at it and the caller knows so (flushed by its
    /// issuer before a synchronization that this rank has passed, such as a barrier or a flag
    /// read after the flush), and no rank issues one before `f` returns and the ranks
    /// synchronize again. Elsewhere, a read racing with `f`'s stores would see torn values, a
    /// write racing with them would be lost, and in the local backend either is a data race.
    pub unsafe fn with_own_shard<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        use WindowInner as Inner;
        // SAFETY: the caller's contract, passed on.
        dispatch!(&self.inner, w => unsafe { w.with_own_shard(f) })
    }

    /// Every element of the window as one slice read in place, with no copy, where this rank
    /// maps the whole window ([`Transport::alloc_shared_window`]); `None` elsewhere (read it with
    /// [`get`](Self::get)). Under MPI after an `MPI_Win_sync`, which makes what other ranks wrote
    /// (and completed before a synchronization this rank has passed) visible to the slice's
    /// loads.
    ///
    /// # Safety
    /// No rank may write any element of the window while the slice lives: every write any rank
    /// issued has completed and the caller knows so (as for
    /// [`with_own_shard`](Self::with_own_shard)), and no rank issues one, or steps its shard in
    /// place, before the slice is dropped and the ranks synchronize. A write racing with the
    /// slice's reads would be seen torn or not at all, and would change memory behind a shared
    /// reference.
    pub unsafe fn whole_in_place(&self) -> Result<Option<&[T]>> {
        match &self.inner {
            WindowInner::Local(_) => Ok(None),
            // SAFETY: the caller's contract, passed on.
            #[cfg(feature = "mpi")]
            WindowInner::Mpi(w) => unsafe { w.whole_in_place() },
        }
    }

    /// Runs `f` with a [`WriteScope`]: writes issued through it borrow their data until the scope
    /// ends and are then completed at their targets (one flush per target touched). This is the
    /// cheapest way to update remote memory, as it skips the local completion that
    /// [`put`](Self::put) and [`accumulate`](Self::accumulate) need to hand the buffer back at once.
    ///
    /// The writes are completed even if `f` fails or panics.
    ///
    /// ```
    /// # use peregrine_transport::*;
    /// run_local(2, |t| -> Result<()> {
    ///     let w = t.alloc_window::<f32>("grad", &ShardMap::balanced(8, 2))?;
    ///     let g = vec![0.5f32; 8];
    ///     w.write_scope(|s| s.accumulate(0, &g))?; // complete at every target on return
    ///     t.barrier()?;
    ///     let mut x = [0.0f32; 8];
    ///     w.get(0, &mut x)?;
    ///     assert_eq!(x, [1.0; 8]);
    ///     t.barrier()?;
    ///     w.free()
    /// })?;
    /// # Ok::<(), Error>(())
    /// ```
    #[inline]
    pub fn write_scope<'d, R>(&self, f: impl FnOnce(&WriteScope<'_, 'd, T>) -> Result<R>) -> Result<R> {
        let scope = WriteScope { window: self, touched: Cell::new(Touched::NONE), _data: PhantomData };
        let r = f(&scope);
        // By reference: moving the scope here would cost a store-forwarding stall per call.
        let done = scope.complete();
        let r = r?;
        done.map(|()| r)
    }

    /// Collective: completes this rank's writes, waits for every rank, and releases the window.
    pub fn free(self) -> Result<()> {
        match self.inner {
            WindowInner::Local(w) => w.free(),
            #[cfg(feature = "mpi")]
            WindowInner::Mpi(w) => w.free(),
        }
    }

    /// Checks a batch before any of it is issued: every range inside the window, their lengths
    /// summing to `got`. One pass of four operations a range, with no early exit, that also
    /// finds the batch's bounds: a backend issues a batch inside one shard with no test per
    /// range. (Tested range by range, with the lengths' sum checked for overflow, the check cost
    /// 2 ns a range: 7 % of an 8-byte `get` in a batch on shared memory.)
    #[inline]
    fn check_batch<'r>(&self, op: &'static str, ranges: &'r [Range<usize>], got: usize) -> Result<Batch<'r>> {
        let len = self.len();
        let (mut start, mut end, mut inverted, mut sum) = (usize::MAX, 0usize, false, 0usize);
        for r in ranges {
            (start, end) = (start.min(r.start), end.max(r.end));
            inverted |= r.start > r.end;
            sum = sum.wrapping_add(r.end.wrapping_sub(r.start));
        }
        if inverted || end > len {
            let r = ranges.iter().find(|r| r.start > r.end || r.end > len).unwrap_or(&(0..0));
            return Err(self.outside(r));
        }
        // Every range lies in `0..len`, so the sum wraps only if `ranges.len() * len` does.
        let expected = if ranges.len().checked_mul(len).is_some() {
            Some(sum)
        } else {
            ranges.iter().try_fold(0usize, |n, r| n.checked_add(r.end - r.start))
        };
        if expected != Some(got) {
            return Err(ErrorKind::LengthMismatch {
                rank: self.rank(),
                op,
                window: self.name().to_owned(),
                expected: expected.unwrap_or(usize::MAX),
                got,
            }
            .into());
        }
        Ok(Batch { ranges, positioned: false, start: start.min(end), end })
    }

    /// Checks a positioned batch ([`Window::get_at`]): every range inside the window, whose
    /// length the buffer's must equal.
    fn check_positioned<'r>(
        &self,
        op: &'static str,
        ranges: &'r [Range<usize>],
        got: usize,
    ) -> Result<Batch<'r>> {
        let len = self.len();
        if got != len {
            return Err(ErrorKind::LengthMismatch {
                rank: self.rank(),
                op,
                window: self.name().to_owned(),
                expected: len,
                got,
            }
            .into());
        }
        let (mut start, mut end) = (usize::MAX, 0usize);
        for r in ranges {
            if r.start > r.end || r.end > len {
                return Err(self.outside(r));
            }
            (start, end) = (start.min(r.start), end.max(r.end));
        }
        Ok(Batch { ranges, positioned: true, start: start.min(end), end })
    }

    /// The error of a range `r` not inside the window.
    fn outside(&self, r: &Range<usize>) -> Error {
        ErrorKind::OutOfRange {
            rank: self.rank(),
            window: self.name().to_owned(),
            start: r.start,
            end: r.end,
            len: self.len(),
        }
        .into()
    }

    fn rank(&self) -> usize {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.rank())
    }
}

/// How a window's memory is shared between the processes of a node ([`Transport::alloc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sharing {
    None,
    Shared,
    Direct,
}

/// A batch of ranges that [`Window::check_batch`] found valid: every range inside the window,
/// their lengths summing to the length of the batch's buffer, and all of them inside
/// `start..end` (an empty `start..end` for a batch of no elements).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Batch<'r> {
    pub(crate) ranges: &'r [Range<usize>],
    /// Each range's data lies at the range's own position in the buffer (`buffer[r]`, the buffer
    /// as long as the window), not back to back.
    pub(crate) positioned: bool,
    // The bounds serve the MPI backend (a batch inside one shard is issued with no test per
    // range); the local backend goes range by range.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) start: usize,
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) end: usize,
}

/// Targets that operations went to since the last completion: none, one, or several. One word
/// (`usize::MAX` = none, `usize::MAX - 1` = several, else the one rank), so that it travels in a
/// register along the hot paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Touched(usize);

/// [`Touched`], unpacked for matching.
pub(crate) enum Targets {
    None,
    One(usize),
    Many,
}

impl Touched {
    pub(crate) const NONE: Self = Self(usize::MAX);
    pub(crate) const MANY: Self = Self(usize::MAX - 1);

    /// A single rank (ranks are far below `usize::MAX - 1`).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn one(rank: usize) -> Self {
        Self(rank)
    }

    #[inline]
    pub(crate) fn add(self, rank: usize) -> Self {
        if self == Self::NONE || self.0 == rank {
            Self(rank)
        } else {
            Self::MANY
        }
    }

    #[inline]
    pub(crate) fn targets(self) -> Targets {
        match self {
            Self::NONE => Targets::None,
            Self::MANY => Targets::Many,
            Self(rank) => Targets::One(rank),
        }
    }
}

/// Writes to a [`Window`] whose data (lifetime `'d`) stays borrowed until the scope completes them;
/// made by [`Window::write_scope`]. Not `Sync`: one scope per thread.
#[derive(Debug)]
pub struct WriteScope<'w, 'd, T: Elem> {
    window: &'w Window<T>,
    touched: Cell<Touched>,
    _data: PhantomData<&'d [T]>,
}

impl<'d, T: Elem> WriteScope<'_, 'd, T> {
    /// [`Window::put`], completed when the scope ends.
    #[inline]
    pub fn put(&self, start: usize, data: &'d [T]) -> Result<()> {
        self.issue(start, data, false)
    }

    /// [`Window::accumulate`], completed when the scope ends.
    #[inline]
    pub fn accumulate(&self, start: usize, data: &'d [T]) -> Result<()> {
        self.issue(start, data, true)
    }

    /// [`Window::put_batch`], completed when the scope ends.
    pub fn put_batch(&self, ranges: &[Range<usize>], data: &'d [T]) -> Result<()> {
        self.issue_batch("put_batch", ranges, data, false)
    }

    /// [`Window::accumulate_batch`], completed when the scope ends.
    pub fn accumulate_batch(&self, ranges: &[Range<usize>], data: &'d [T]) -> Result<()> {
        self.issue_batch("accumulate_batch", ranges, data, true)
    }

    /// Puts `data[r]` at `r` for every range `r` of `ranges` (`data` as long as the window:
    /// [`Window::get_at`]'s layout), completed when the scope ends.
    pub fn put_at(&self, ranges: &[Range<usize>], data: &'d [T]) -> Result<()> {
        let batch = self.window.check_positioned("put_at", ranges, data.len())?;
        self.issue_checked(batch, data, false)
    }

    /// Adds `data[r]` at `r` for every range `r` of `ranges` (`data` as long as the window),
    /// completed when the scope ends: a sparse update's touched keys straight from its dense
    /// vector, one `MPI_Accumulate` of an indexed datatype per target under MPI.
    pub fn accumulate_at(&self, ranges: &[Range<usize>], data: &'d [T]) -> Result<()> {
        let batch = self.window.check_positioned("accumulate_at", ranges, data.len())?;
        self.issue_checked(batch, data, true)
    }

    fn issue_batch(&self, op: &'static str, ranges: &[Range<usize>], data: &'d [T], acc: bool) -> Result<()> {
        let batch = self.window.check_batch(op, ranges, data.len())?;
        self.issue_checked(batch, data, acc)
    }

    fn issue_checked(&self, batch: Batch<'_>, data: &'d [T], acc: bool) -> Result<()> {
        use WindowInner as Inner;
        let touched = self.touched.get();
        self.track(dispatch!(&self.window.inner, w => w.issue_write_batch(batch, data, acc, touched)))
    }

    #[inline(always)]
    fn issue(&self, start: usize, data: &'d [T], accumulate: bool) -> Result<()> {
        use WindowInner as Inner;
        let touched = self.touched.get();
        self.track(dispatch!(&self.window.inner, w => w.issue_write(start, data, accumulate, touched)))
    }

    /// Records the targets of writes just issued, or on an error (part of the writes may have
    /// been issued) marks every target for completion.
    #[inline(always)]
    fn track(&self, issued: Result<Touched>) -> Result<()> {
        match issued {
            Ok(t) => {
                self.touched.set(t);
                Ok(())
            }
            Err(e) => {
                // Part of the range may have been issued: complete everything.
                self.touched.set(Touched::MANY);
                Err(e)
            }
        }
    }

    #[inline(always)]
    fn complete(&self) -> Result<()> {
        use WindowInner as Inner;
        let touched = self.touched.replace(Touched::NONE);
        dispatch!(&self.window.inner, w => w.complete_remote(touched))
    }
}

impl<T: Elem> Drop for WriteScope<'_, '_, T> {
    fn drop(&mut self) {
        // Only reached with writes outstanding when `f` panicked: the data they read must not be
        // released before they complete. The error, if any, cannot be reported from here.
        if self.touched.get() != Touched::NONE {
            let _ = self.complete();
        }
    }
}

/// Window operations counted by a serial world ([`Transport::take_ops`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ops {
    /// Operations that each waited for their own completion: a round trip each.
    pub trips: u64,
    /// Operations issued back to back behind another before one completion (the rest of a
    /// [`Window::get_batch`] or [`Window::load_batch`]): no round trip of their own.
    pub pipelined: u64,
}

impl Ops {
    /// `n` operations issued back to back before one completion: one round trip, the rest
    /// pipelined behind it (none for `n = 0`).
    pub fn batch(n: usize) -> Self {
        let n = n as u64;
        Self { trips: u64::from(n > 0), pipelined: n.saturating_sub(1) }
    }
}

impl std::ops::AddAssign for Ops {
    fn add_assign(&mut self, o: Ops) {
        self.trips += o.trips;
        self.pipelined += o.pipelined;
    }
}

impl Window<u64> {
    /// Atomically reads global element `index` (MPI: `MPI_Fetch_and_op` with `MPI_NO_OP`): the
    /// read of a word that other ranks update atomically (a plain `get` racing with atomics is
    /// undefined in MPI).
    pub fn load(&self, index: usize) -> Result<u64> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.load(index))
    }

    /// Atomically reads elements `start..start + out.len()` into `out`, as
    /// [`load_batch`](Self::load_batch) does (one batch).
    pub fn load_range(&self, start: usize, out: &mut [u64]) -> Result<()> {
        let end = start.checked_add(out.len()).ok_or_else(|| {
            Error::from(ErrorKind::OutOfRange {
                rank: self.rank(),
                window: self.name().to_owned(),
                start,
                end: usize::MAX,
                len: self.len(),
            })
        })?;
        self.load_batch(std::slice::from_ref(&(start..end)), out)
    }

    /// Atomically reads every element of `ranges`, back to back, into `out` (whose length must
    /// be the sum of the ranges' lengths): each element as [`load`](Self::load) reads it, all
    /// issued before one completion, so reading a word of every rank costs one round trip and
    /// not one per rank. Each element is read atomically; the batch is not one snapshot.
    pub fn load_batch(&self, ranges: &[Range<usize>], out: &mut [u64]) -> Result<()> {
        self.check_batch("load_batch", ranges, out.len())?;
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.load_batch(ranges, out))
    }

    /// Counts a batch of `n` loads as [`load_batch`](Self::load_batch) counts them, without
    /// issuing them, in a serial world ([`local::serial_world`], whose operations a simulator
    /// charges): for a simulated rank that already holds what they would read (the same words,
    /// in the same state, that another rank of the world read). Does nothing in any other world.
    pub fn count_loads(&self, n: usize) {
        match &self.inner {
            WindowInner::Local(w) => w.count_loads(n),
            #[cfg(feature = "mpi")]
            WindowInner::Mpi(_) => {}
        }
    }

    /// Atomically stores `value` into global element `index` and returns the previous value
    /// (MPI: `MPI_Fetch_and_op` with `MPI_REPLACE`).
    pub fn swap(&self, index: usize, value: u64) -> Result<u64> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.swap(index, value))
    }

    /// Atomically replaces global element `index` by `new` if it equals `current`; returns the
    /// previous value (the swap happened iff it equals `current`).
    pub fn compare_and_swap(&self, index: usize, current: u64, new: u64) -> Result<u64> {
        use WindowInner as Inner;
        dispatch!(&self.inner, w => w.compare_and_swap(index, current, new))
    }
}
