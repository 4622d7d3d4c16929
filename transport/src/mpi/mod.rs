//! The `mpi` backend: MPI processes, MPI-3 RMA windows.
//!
//! rsmpi initialises MPI (`MPI_THREAD_MULTIPLE`); everything else goes through its raw `mpi::ffi`,
//! because rsmpi has no safe one-sided API:
//! - our own duplicate of `MPI_COMM_WORLD`, with `MPI_ERRORS_RETURN`, so that a failing call comes
//!   back as [`Error::Mpi`] naming the call instead of aborting the job;
//! - windows from `MPI_Win_allocate` (not `MPI_Win_create`: ~35x slower for small operations on one
//!   node, as the memory cannot be shared), also `MPI_ERRORS_RETURN`, opened once with
//!   `MPI_Win_lock_all(MPI_MODE_NOCHECK)` for their whole life (passive target); windows asked to
//!   be shared ([`crate::Transport::alloc_shared_window`]) from `MPI_Win_allocate_shared` where
//!   every process is on one node and the one-sided component offers it, read whole in place
//!   where `MPI_Win_shared_query` finds the shards back to back;
//! - `get` = `MPI_Get` + `MPI_Win_flush_local` (under MPICH `MPI_Rget` + `MPI_Wait`: a flush
//!   there once returned before a get's data had arrived); `put`/`accumulate` = `MPI_Put`/`MPI_Accumulate`
//!   followed by `MPI_Win_flush_local` (the origin buffer is free on return, the target sees the
//!   data after `flush`), or without it inside a write scope, which completes with one
//!   `MPI_Win_flush` per target at its end; `fetch_add` = `MPI_Fetch_and_op(MPI_SUM)`;
//!   `compare_and_swap` = `MPI_Compare_and_swap`; batches issue every operation before one
//!   completion.
//!
//! Constants that the bindings lack (`MPI_NO_OP`, `MPI_REPLACE`, `MPI_MODE_NOCHECK`,
//! `MPI_IN_PLACE`) come from `shim.c`, compiled with `mpicc` (or `$MPICC`).
//!
//! Dropping a window without [`MpiWindow::free`] completes its operations (`MPI_Win_unlock_all`)
//! but does not free it: `MPI_Win_free` is collective, and a rank unwinding after an error must
//! not block in it while its peers wait elsewhere. MPI releases such windows at `MPI_Finalize`.
//!
//! With OpenMPI 4.1 run with `OMPI_MCA_osc=sm,pt2pt`: its default one-sided component crashes in
//! `MPI_Compare_and_swap` on shared memory.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{fence, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mpi::ffi;
use mpi::Threading;

use crate::{Batch, Elem, Error, ErrorKind, ReduceOp, Result, ShardMap, Targets, Touched, SHARD_LINE};

mod node;
pub use node::MpiNode;

extern "C" {
    fn peregrine_mpi_no_op() -> ffi::MPI_Op;
    fn peregrine_mpi_replace() -> ffi::MPI_Op;
    fn peregrine_mpi_mode_nocheck() -> c_int;
    fn peregrine_mpi_in_place() -> *mut c_void;
}

/// Largest element count passed to one MPI call (counts are C ints).
const MAX_COUNT: usize = 1 << 30;

/// Turns an MPI return code into a result.
#[inline]
fn check(rank: usize, call: &'static str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(mpi_error(rank, call, code))
    }
}

#[cold]
#[inline(never)]
fn mpi_error(rank: usize, call: &'static str, code: c_int) -> Error {
    let mut buf = vec![0u8; 4096];
    let mut len: c_int = 0;
    // SAFETY: `buf` has room for MPI_MAX_ERROR_STRING (256 in OpenMPI, 1024 in MPICH) characters
    // plus the terminator; `len` is a valid out-pointer.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    let message = if rc == ffi::MPI_SUCCESS as c_int {
        String::from_utf8_lossy(&buf[..usize::try_from(len).unwrap_or(0).min(buf.len())]).into_owned()
    } else {
        "unknown error".to_owned()
    };
    ErrorKind::Mpi { rank, call, code, message }.into()
}

/// The tag of the receive [`MpiRank::progress`] tests: no message carries it (the communicator
/// carries collectives, whose internal tags a receive does not match, and no point-to-point
/// messages).
const PROGRESS_TAG: c_int = 0x7e57;

/// The process's MPI world: rsmpi's universe (MPI_Finalize on drop) and our communicator.
struct Comm {
    /// Our duplicate of MPI_COMM_WORLD; live until Drop, which frees it before `universe` finalises.
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// The receive [`MpiRank::progress`] tests: posted on its first call, cancelled in Drop.
    progress: Mutex<Option<ffi::MPI_Request>>,
    /// Whether every process shares this one's memory (`MPI_Comm_split_type` with
    /// `MPI_COMM_TYPE_SHARED` leaves the world whole): one node.
    one_node: bool,
    /// The processes of this one's node (`MPI_Comm_split_type`); live until Drop.
    node: ffi::MPI_Comm,
    /// How the world's processes fill nodes, if each node's are consecutive ranks.
    layout: Option<crate::NodeLayout>,
    _universe: mpi::environment::Universe,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("rank", &self.rank).field("size", &self.size).finish_non_exhaustive()
    }
}

// SAFETY: MPI was initialised with MPI_THREAD_MULTIPLE (checked in `MpiRank::init`), so any thread
// may make MPI calls on the communicator; the handle itself is never changed after creation.
unsafe impl Send for Comm {}
// SAFETY: as for Send: shared use only makes MPI calls, which are thread safe at THREAD_MULTIPLE.
unsafe impl Sync for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Some(mut req) = self.progress.get_mut().ok().and_then(Option::take) {
            // SAFETY: `req` is the live receive `progress` posted, never matched (nothing is sent
            // with its tag): cancelled, it completes, and the wait frees it. Errors are ignored,
            // as below.
            unsafe {
                ffi::MPI_Cancel(&mut req);
                ffi::MPI_Wait(&mut req, ffi::RSMPI_STATUS_IGNORE);
            }
        }
        // SAFETY: `comm` and `node` are live (invariant), and no window or node block of them is
        // left: those hold an `Arc` of this `Comm`. The error codes are ignored: nothing can be
        // done about them in Drop.
        unsafe {
            ffi::MPI_Comm_free(&mut self.node);
            ffi::MPI_Comm_free(&mut self.comm);
        }
    }
}

/// `MPI_COMM_WORLD`'s rank of this process, set once MPI is initialized ([`MpiRank::init`]).
static PROCESS_RANK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

pub(crate) fn process_rank() -> Option<usize> {
    PROCESS_RANK.get().copied()
}

/// `MPI_Abort(MPI_COMM_WORLD, code)` if MPI is live; returns if it is not.
pub(crate) fn abort_world(code: i32) {
    let (mut init, mut fini): (c_int, c_int) = (0, 0);
    // SAFETY: MPI_Initialized and MPI_Finalized may be called at any time, from any thread, with
    // valid out-pointers.
    unsafe {
        ffi::MPI_Initialized(&mut init);
        ffi::MPI_Finalized(&mut fini);
    }
    if init != 0 && fini == 0 {
        // SAFETY: MPI is initialized and not finalized; RSMPI_COMM_WORLD is a constant handle;
        // MPI_Abort does not return.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
    }
}

/// One MPI process of the world.
#[derive(Debug)]
pub struct MpiRank {
    comm: Arc<Comm>,
}

impl MpiRank {
    pub(crate) fn init() -> Result<Self> {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or(Error::from(ErrorKind::AlreadyInitialized))?;
        if provided != Threading::Multiple {
            return Err(ErrorKind::ThreadLevel { provided: format!("{provided:?}") }.into());
        }
        let mut comm = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: MPI is initialised; RSMPI_COMM_WORLD is a constant handle; `comm` is an
        // out-pointer that MPI_Comm_dup writes on success (checked before it is read).
        let rc = unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, comm.as_mut_ptr()) };
        check(0, "MPI_Comm_dup", rc)?;
        // SAFETY: written by the successful MPI_Comm_dup above.
        let comm = unsafe { comm.assume_init() };
        // SAFETY: `comm` is a live communicator; RSMPI_ERRORS_RETURN is a constant handle.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
        check(0, "MPI_Comm_set_errhandler", rc)?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: live communicator, valid out-pointers.
        check(0, "MPI_Comm_rank", unsafe { ffi::MPI_Comm_rank(comm, &mut rank) })?;
        // SAFETY: as above.
        check(0, "MPI_Comm_size", unsafe { ffi::MPI_Comm_size(comm, &mut size) })?;
        let _ = PROCESS_RANK.set(usize::try_from(rank).expect("MPI ranks are non-negative"));
        let mut node = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: collective over the live communicator (every process calls `init`); constant
        // handles; `node` is an out-pointer written on success (checked before it is read).
        let rc = unsafe {
            ffi::MPI_Comm_split_type(
                comm,
                ffi::RSMPI_COMM_TYPE_SHARED,
                rank,
                ffi::RSMPI_INFO_NULL,
                node.as_mut_ptr(),
            )
        };
        check(0, "MPI_Comm_split_type", rc)?;
        // SAFETY: written by the successful MPI_Comm_split_type above.
        let node = unsafe { node.assume_init() };
        let mut node_size: c_int = 0;
        // SAFETY: live communicator (ours, from the split), valid out-pointer.
        check(0, "MPI_Comm_size", unsafe { ffi::MPI_Comm_size(node, &mut node_size) })?;
        let (rank, size) = (
            usize::try_from(rank).expect("MPI ranks are non-negative"),
            usize::try_from(size).expect("MPI sizes are positive"),
        );
        let layout = node::layout(comm, node, rank, size)?;
        let comm = Comm {
            comm,
            rank,
            size,
            progress: Mutex::new(None),
            one_node: usize::try_from(node_size).ok() == Some(size),
            node,
            layout,
            _universe: universe,
        };
        Ok(Self { comm: Arc::new(comm) })
    }

    /// How the world's processes fill nodes.
    pub(crate) fn node_layout(&self) -> Option<crate::NodeLayout> {
        self.comm.layout.clone()
    }

    /// Collective: a node block of `len` elements ([`crate::NodeShared`]), or `None` on every
    /// rank where some node has none.
    pub(crate) fn alloc_node_shared<T: Elem>(&self, name: &str, len: usize) -> Result<Option<MpiNode<T>>> {
        let made = match &self.comm.layout {
            Some(_) => node::MpiNode::alloc(&self.comm, name, len),
            None => Ok(None),
        };
        let ok = u64::from(matches!(made, Ok(Some(_))));
        let mut all = [ok];
        self.allreduce(&mut all, ReduceOp::Min)?;
        match made {
            Err(e) => Err(e),
            Ok(n) if all[0] == 1 => Ok(n),
            Ok(_) => Ok(None),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank
    }

    /// Number of processes.
    pub fn world_size(&self) -> usize {
        self.comm.size
    }

    fn check(&self, call: &'static str, rc: c_int) -> Result<()> {
        check(self.comm.rank, call, rc)
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        // SAFETY: live communicator.
        self.check("MPI_Barrier", unsafe { ffi::MPI_Barrier(self.comm.comm) })
    }

    /// `MPI_Test` of a receive that never completes: the library's progress engine runs once
    /// (OpenMPI's `opal_progress`, which serves `osc/ucx`'s worker and `osc/pt2pt`'s requests;
    /// MPICH's progress engine likewise). Not `MPI_Iprobe`: under `pml/ucx` it runs
    /// `opal_progress` only every 100th call and serves only the point-to-point worker otherwise.
    /// One thread at a time tests the request; another one calling meanwhile returns.
    pub(crate) fn progress(&self) -> Result<()> {
        let Ok(mut held) = self.comm.progress.try_lock() else { return Ok(()) };
        let req = match &mut *held {
            Some(req) => req,
            None => {
                let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
                // SAFETY: live communicator; a receive of zero bytes (its buffer is never
                // written) from this rank to itself with a tag no message carries; `req` is an
                // out-pointer written on success.
                let rc = unsafe {
                    ffi::MPI_Irecv(
                        std::ptr::NonNull::<u8>::dangling().as_ptr().cast(),
                        0,
                        ffi::RSMPI_UINT8_T,
                        self.comm.rank as c_int,
                        PROGRESS_TAG,
                        self.comm.comm,
                        req.as_mut_ptr(),
                    )
                };
                self.check("MPI_Irecv", rc)?;
                // SAFETY: written by the successful MPI_Irecv above.
                held.insert(unsafe { req.assume_init() })
            }
        };
        let mut flag: c_int = 0;
        // SAFETY: `req` is the live receive posted above, tested by this thread alone (the lock).
        let rc = unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        self.check("MPI_Test", rc)?;
        if flag != 0 {
            // Completed (and freed by MPI_Test), which nothing sent should make it: post anew.
            *held = None;
        }
        Ok(())
    }

    /// Checks that every rank passes the same `values`, with one MAX-allreduce of each value and its
    /// complement (max of `!v` is `!min(v)`).
    fn agree(&self, op: &'static str, values: &[u64]) -> Result<bool> {
        let mut both: Vec<u64> = values.iter().flat_map(|&v| [v, !v]).collect();
        let mut out = vec![0u64; both.len()];
        // SAFETY: both buffers hold `both.len()` u64s; live communicator; constant handles.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                both.as_mut_ptr().cast(),
                out.as_mut_ptr().cast(),
                count(both.len()),
                u64::mpi_datatype(),
                ffi::RSMPI_MAX,
                self.comm.comm,
            )
        };
        check(self.comm.rank, op, rc)?;
        Ok(both == out)
    }

    pub(crate) fn allreduce<T: Elem>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        if !self.agree("MPI_Allreduce", &[data.len() as u64, T::KIND as u64])? {
            return Err(ErrorKind::CollectiveMismatch {
                rank: self.rank(),
                op: "allreduce",
                detail: format!(
                    "ranks passed different lengths or types (this rank: {} x {})",
                    data.len(),
                    T::NAME
                ),
            }
            .into());
        }
        // SAFETY: constant handles exported by rsmpi's shim, never written.
        let mpi_op = unsafe {
            match op {
                ReduceOp::Sum => ffi::RSMPI_SUM,
                ReduceOp::Min => ffi::RSMPI_MIN,
                ReduceOp::Max => ffi::RSMPI_MAX,
            }
        };
        // SAFETY: in-place reduction over `data.len()` elements of `T`'s datatype; every rank passes
        // the same count (checked above); MPI_IN_PLACE comes from our shim.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                peregrine_mpi_in_place(),
                data.as_mut_ptr().cast(),
                count(data.len()),
                T::mpi_datatype(),
                mpi_op,
                self.comm.comm,
            )
        };
        self.check("MPI_Allreduce", rc)
    }

    pub(crate) fn broadcast<T: Elem>(&self, data: &mut [T], root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(ErrorKind::NoSuchRank {
                rank: self.rank(),
                what: "root",
                target: root,
                world_size: self.world_size(),
            }
            .into());
        }
        if !self.agree("MPI_Bcast", &[data.len() as u64, T::KIND as u64, root as u64])? {
            return Err(ErrorKind::CollectiveMismatch {
                rank: self.rank(),
                op: "broadcast",
                detail: format!(
                    "ranks passed different lengths, types or roots (this rank: {} x {}, root {root})",
                    data.len(),
                    T::NAME
                ),
            }
            .into());
        }
        // SAFETY: `data` holds `data.len()` elements of `T`'s datatype on every rank (checked).
        let rc = unsafe {
            ffi::MPI_Bcast(
                data.as_mut_ptr().cast(),
                count(data.len()),
                T::mpi_datatype(),
                root as c_int,
                self.comm.comm,
            )
        };
        self.check("MPI_Bcast", rc)
    }

    /// Collective: a window laid out by `map`; if `shared` and every process is on this node,
    /// from `MPI_Win_allocate_shared` (else, or where the one-sided component in use does not
    /// offer it, from `MPI_Win_allocate`), and readable whole in place where its shards then lie
    /// back to back ([`MpiWindow::whole_in_place`]).
    pub(crate) fn alloc_window<T: Elem>(
        &self,
        name: &str,
        map: &ShardMap,
        shared: bool,
        direct: bool,
    ) -> Result<MpiWindow<T>> {
        let rank = self.rank();
        let shared = shared || direct;
        if map.parts() != self.world_size() {
            // Every rank must still take part in the collective check, or its peers would hang.
            self.agree("MPI_Allreduce", &[u64::MAX, 0, 0])?;
            return Err(
                ErrorKind::ShardCount { rank, parts: map.parts(), world_size: self.world_size() }.into()
            );
        }
        if !self.agree("MPI_Allreduce", &[map.fingerprint(), map.total() as u64, T::KIND as u64])? {
            return Err(ErrorKind::WindowMismatch {
                rank,
                window: name.to_owned(),
                detail: format!(
                    "shard maps or element types differ (this rank: {} x {} in shards {:?})",
                    map.total(),
                    T::NAME,
                    (0..map.parts()).map(|p| map.len_of(p)).collect::<Vec<_>>()
                ),
            }
            .into());
        }
        let local_len = map.len_of(rank);
        // Every shard is allocated as a whole number of 64-byte lines, at least one: MPICH 4.0's
        // shared-memory windows misplace the shards that follow one whose size is not a multiple
        // of 16 bytes, or is zero (a put to rank 2's first element lands on rank 0's last one;
        // reproduced in plain C). Whole lines also keep neighbouring shards off each other's cache
        // lines. The padding is never addressed.
        let padded = (local_len * size_of::<T>()).div_ceil(SHARD_LINE).max(1) * SHARD_LINE;
        // A direct window's accumulate locks, a line each, after the last rank's shard (past the
        // mapping's end, so the shards still lie back to back).
        let locks = if direct && rank + 1 == self.world_size() { self.world_size() * SHARD_LINE } else { 0 };
        let padded = padded + locks;
        let mut base: *mut T = std::ptr::null_mut();
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        // SAFETY: collective over our live communicator (every rank reaches this point: the checks
        // above are collective and agree); `base` and `win` are out-pointers, written on success.
        // Rank 0's allocation is `lead` elements longer, for a shared window's first shard to
        // start on a line (see below).
        let allocate = |call: unsafe extern "C" fn(_, _, _, _, _, _) -> c_int,
                        win: *mut ffi::MPI_Win,
                        base: &mut *mut T,
                        lead: usize| {
            // SAFETY: as above.
            unsafe {
                call(
                    (padded + if rank == 0 { lead * size_of::<T>() } else { 0 }) as ffi::MPI_Aint,
                    size_of::<T>() as c_int,
                    ffi::RSMPI_INFO_NULL,
                    self.comm.comm,
                    (base as *mut *mut T).cast(),
                    win,
                )
            }
        };
        // Shared where asked and possible: OpenMPI's `osc/ucx` alone, for one, has no shared
        // windows; the attempt fails alike on every process (the same component selection), before
        // any communication, and the window comes from `MPI_Win_allocate` as elsewhere.
        let shared = shared
            && self.comm.one_node
            && allocate(ffi::MPI_Win_allocate_shared, win.as_mut_ptr(), &mut base, 0)
                == ffi::MPI_SUCCESS as c_int;
        if !shared {
            let rc = allocate(ffi::MPI_Win_allocate, win.as_mut_ptr(), &mut base, 0);
            self.check("MPI_Win_allocate", rc)?;
        }
        // SAFETY: written by the successful MPI_Win_allocate(_shared).
        let mut win = unsafe { win.assume_init() };
        // A shared window's first shard where the library put it: OpenMPI's `osc/sm` 8 bytes past
        // a line, and every shard after it too (they are whole lines). The products that read the
        // weights in place then cross a line with every 64-byte load. Allocated again with
        // `lead` elements before rank 0's shard, every shard starts on a line (the offset within
        // the segment, the same in every process, decides it); RMA to rank 0 adds `lead` to its
        // displacements. The same lead on every rank, or none. (Rank 0's allocation is then no
        // whole number of 16 bytes, which MPICH 4.0 mishandles, above; under MPICH the conformance
        // case finds every shard in place, and on a line, all the same.)
        let mut lead = 0;
        if shared {
            let first = self.shared_query::<T>(win, 0)?.1 as usize;
            let want = (SHARD_LINE - first % SHARD_LINE) % SHARD_LINE;
            let want = if want.is_multiple_of(size_of::<T>()) { want / size_of::<T>() } else { 0 };
            if self.agree("MPI_Allreduce", &[want as u64])? && want > 0 {
                // SAFETY: the live window just allocated, not yet exposed; freed collectively.
                self.check("MPI_Win_free", unsafe { ffi::MPI_Win_free(&mut win) })?;
                let mut again = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
                let rc = allocate(ffi::MPI_Win_allocate_shared, again.as_mut_ptr(), &mut base, want);
                self.check("MPI_Win_allocate_shared", rc)?;
                // SAFETY: written by the successful MPI_Win_allocate_shared.
                win = unsafe { again.assume_init() };
                lead = want;
                if rank == 0 {
                    base = base.wrapping_add(lead);
                }
            }
        }
        let mut window = MpiWindow {
            comm: self.comm.clone(),
            win,
            base,
            lead,
            whole: std::ptr::null(),
            direct: false,
            locks: std::ptr::null(),
            name: name.to_owned(),
            map: map.clone(),
            last_target: AtomicUsize::new(0),
            live: true,
            _elem: PhantomData,
        };
        // SAFETY: live window handle; constant error handler.
        let rc = unsafe { ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN) };
        window.check("MPI_Win_set_errhandler", rc)?;
        if shared {
            window.whole = self.whole_mapping(win, map, lead)?;
        }
        if direct {
            // Direct only if every process maps the whole window: one rank's operations through
            // MPI beside another's plain atomics would not be atomic with each other.
            window.direct = self.agree("MPI_Allreduce", &[u64::from(!window.whole.is_null())])?
                && !window.whole.is_null();
            if window.direct {
                let last = self.world_size() - 1;
                let (size, at) = self.shared_query::<T>(win, last)?;
                // The last rank's allocation ends with the locks (allocated above).
                window.locks = at.cast::<u8>().wrapping_add(size - self.world_size() * SHARD_LINE).cast();
            }
        }
        // SAFETY: `base` points to `padded` bytes (a whole number of elements) owned by this
        // window and not yet exposed to anyone (no epoch is open, the barrier below is ahead).
        // Zero bytes are a valid value of every `Elem` type.
        unsafe { std::ptr::write_bytes(base.cast::<u8>(), 0, padded) };
        // SAFETY: live window; MPI_MODE_NOCHECK is valid as no rank takes exclusive locks.
        let rc = unsafe { ffi::MPI_Win_lock_all(peregrine_mpi_mode_nocheck(), win) };
        window.check("MPI_Win_lock_all", rc)?;
        // SAFETY: live window in a lock_all epoch: makes the zeroes above visible to RMA.
        window.check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(win) })?;
        self.barrier()?;
        Ok(window)
    }

    /// Where `map`'s element 0 lies in this process, if the shared window `win` holds every
    /// shard back to back (each rank's base where the one before it ends: `MPI_Win_shared_query`);
    /// null where it does not (an empty shard, padded to a line, in the middle; a non-contiguous
    /// allocation).
    fn whole_mapping<T: Elem>(&self, win: ffi::MPI_Win, map: &ShardMap, lead: usize) -> Result<*const T> {
        let mut first: *const T = std::ptr::null();
        for r in 0..map.parts() {
            let (mut size, mut at) = self.shared_query::<T>(win, r)?;
            if r == 0 && !at.is_null() {
                // Rank 0's shard starts `lead` elements into its allocation.
                at = at.wrapping_add(lead);
                size = size.saturating_sub(lead * size_of::<T>());
                first = at;
            }
            let want = first.wrapping_add(map.range(r).start);
            if at.is_null() || at != want || size < map.len_of(r) * size_of::<T>() {
                return Ok(std::ptr::null());
            }
        }
        Ok(first)
    }

    /// `MPI_Win_shared_query`: the size in bytes of rank `r`'s allocation in the shared window
    /// `win`, and where it lies in this process.
    fn shared_query<T: Elem>(&self, win: ffi::MPI_Win, r: usize) -> Result<(usize, *const T)> {
        let (mut size, mut disp, mut at): (ffi::MPI_Aint, c_int, *mut T) = (0, 0, std::ptr::null_mut());
        // SAFETY: live shared window (MPI_ERRORS_RETURN); valid rank; out-pointers.
        let rc = unsafe {
            ffi::MPI_Win_shared_query(win, r as c_int, &mut size, &mut disp, (&mut at as *mut *mut T).cast())
        };
        self.check("MPI_Win_shared_query", rc)?;
        Ok((size as usize, at.cast_const()))
    }

    pub(crate) fn abort(&self, code: i32) -> ! {
        // SAFETY: live communicator; MPI_Abort does not return.
        unsafe { ffi::MPI_Abort(self.comm.comm, code) };
        std::process::exit(code)
    }
}

/// Converts an element count that is known to be at most [`MAX_COUNT`] (or a short control array).
fn count(n: usize) -> c_int {
    c_int::try_from(n).expect("MPI counts are split at MAX_COUNT elements")
}

/// The handles of a window's operations ([`MpiWindow::handles`]).
#[derive(Clone, Copy)]
struct Handles {
    dt: ffi::MPI_Datatype,
    win: ffi::MPI_Win,
    sum: ffi::MPI_Op,
}

/// A window of the MPI backend.
///
/// Invariant: while `live`, `win` is a window allocated on `comm` and in a `lock_all` epoch.
#[derive(Debug)]
pub struct MpiWindow<T: Elem> {
    comm: Arc<Comm>,
    win: ffi::MPI_Win,
    /// This rank's shard: `map.len_of(rank)` elements (of an allocation padded to whole cache
    /// lines) that `MPI_Win_allocate` returned (at rank 0, `lead` elements into it), valid while
    /// `live`.
    base: *mut T,
    /// Elements before rank 0's shard in its allocation (a shared window's, to start every shard
    /// on a cache line); added to every displacement at rank 0.
    lead: usize,
    /// Shared windows whose shards lie back to back in this process: element 0 of all of them
    /// (`map.total()` elements, valid while `live`); else null.
    whole: *const T,
    /// Every operation is a load, store or atomic on the mapping at `whole` ([`Self::direct`]).
    direct: bool,
    /// A direct window's accumulate locks: rank `r`'s shard's at `locks + r` lines (in the last
    /// rank's allocation, after its shard), held by float adds ([`Elem::LOCKED_ADD`]); null
    /// unless direct.
    locks: *const u8,
    name: String,
    map: ShardMap,
    /// The shard of the last single-shard operation: checked first, as consecutive operations
    /// mostly go to the same target (a binary search over the shard offsets costs more than the
    /// MPI call itself on shared memory).
    last_target: AtomicUsize,
    live: bool,
    _elem: PhantomData<T>,
}

// SAFETY: MPI_THREAD_MULTIPLE (checked at init); the window memory is touched through MPI calls
// after allocation, and directly only by `with_own_shard`, whose caller guarantees exclusive
// access; the handle and `base` do not change while the window is live.
unsafe impl<T: Elem> Send for MpiWindow<T> {}
// SAFETY: as for Send; concurrent RMA calls on one window are allowed at MPI_THREAD_MULTIPLE.
unsafe impl<T: Elem> Sync for MpiWindow<T> {}

impl<T: Elem> MpiWindow<T> {
    /// The window's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The window's layout.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank
    }

    fn check(&self, call: &'static str, rc: c_int) -> Result<()> {
        check(self.comm.rank, call, rc)
    }

    fn out_of_range(&self, start: usize, len: usize) -> Error {
        ErrorKind::OutOfRange {
            rank: self.rank(),
            window: self.name.clone(),
            start,
            end: start.saturating_add(len),
            len: self.map.total(),
        }
        .into()
    }

    /// Elements before `rank`'s shard in its allocation: [`MpiWindow::lead`] at rank 0.
    #[inline(always)]
    fn lead_at(&self, rank: usize) -> usize {
        if rank == 0 {
            self.lead
        } else {
            0
        }
    }

    /// See [`crate::Window::is_direct`].
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// The whole window as atomics, where its operations are direct: a window allocated with
    /// [`crate::Transport::alloc_direct_window`] that every process maps whole (MPI processes on
    /// one node). Each operation is then a relaxed load or store, or an atomic add or swap, on
    /// the mapping, complete when it returns: no call into the library per range (a pull of 20k
    /// scattered keys through `osc/sm` pays the library's overhead 20k times, or builds an
    /// indexed datatype about as dear). Every process then accesses the window this way, so its
    /// accumulates are atomic with each other (compare-and-swap loops for floats).
    #[inline(always)]
    fn direct(&self) -> Option<&[T::Atomic]> {
        const { assert!(size_of::<T::Atomic>() == size_of::<T>() && align_of::<T::Atomic>() >= align_of::<T>()) };
        if !self.direct {
            return None;
        }
        // SAFETY: `whole` is where every shard lies back to back in this process
        // (`whole_mapping`): `map.total()` elements, aligned for `T` (and so for its atomic, of
        // the same size and alignment: asserted above), initialised, valid while the window is
        // live (the slice borrows `self`). Atomics are `UnsafeCell`s: other processes' atomic
        // accesses to the same memory are what they are made for.
        Some(unsafe { std::slice::from_raw_parts(self.whole.cast::<T::Atomic>(), self.map.total()) })
    }

    /// Applies a put or accumulate of `data` at global `start` of a direct window (`a`: its
    /// atomics). Float adds hold the lock of each shard they add to (`held`: the shard whose
    /// lock the caller holds, kept across the ranges of a batch) and add with a plain load and
    /// store, as the library's shared-memory component does: a compare-and-swap per element
    /// made a whole-vector accumulate ten times dearer and contended on the model's hot keys.
    #[inline(always)]
    fn direct_write<'w>(
        &'w self,
        a: &[T::Atomic],
        start: usize,
        data: &[T],
        accumulate: bool,
        held: &mut Held<'w>,
    ) {
        let dst = &a[start..start + data.len()];
        if !accumulate {
            for (d, &v) in dst.iter().zip(data) {
                T::atomic_store(d, v);
            }
        } else if !T::LOCKED_ADD {
            for (d, &v) in dst.iter().zip(data) {
                T::atomic_fetch_add(d, v);
            }
        } else {
            let (mut at, end) = (start, start + data.len());
            while at < end {
                let shard = held.shard(self, at);
                let to = end.min(self.map.range(shard).end);
                for (d, &v) in a[at..to].iter().zip(&data[at - start..to - start]) {
                    T::atomic_store(d, T::atomic_load(d).add(v));
                }
                at = to;
            }
        }
    }

    /// The accumulate lock of `shard` of a direct window.
    fn lock_word(&self, shard: usize) -> &AtomicU32 {
        // SAFETY: `locks` (non-null in a direct window, the only caller) is the start of
        // `world_size` lines of the last rank's shared allocation, zeroed before the barrier
        // that ended the allocation, valid while the window is live (the reference borrows
        // `self`); a line is aligned for a u32, and every process accesses the word atomically.
        unsafe { &*self.locks.add(shard * SHARD_LINE).cast::<AtomicU32>() }
    }

    /// The displacement of element `offset` of `rank`'s shard.
    #[inline(always)]
    fn disp(&self, rank: usize, offset: usize) -> ffi::MPI_Aint {
        (offset + self.lead_at(rank)) as ffi::MPI_Aint
    }

    /// The shard and offset of `start..start + len` if it lies inside one shard (and fits one MPI
    /// call).
    ///
    /// Always inlined, as are `for_pieces`, `issue_get` and `issue_write`: with `#[inline]` they
    /// stayed calls, which cost a fifth of an 8-byte operation in a batch (`bench rma`, windows of
    /// 8 B to 1 KiB against raw MPI: 1.3-1.4x before, 1.1-1.2x after).
    #[inline(always)]
    fn locate(&self, start: usize, len: usize) -> Option<(usize, usize)> {
        let hint = self.last_target.load(Ordering::Relaxed);
        let shard = self.map.range(hint);
        if shard.contains(&start) && len <= MAX_COUNT && len <= shard.end - start {
            return Some((hint, start - shard.start));
        }
        let (rank, offset) = self.map.locate(start, len).filter(|_| len <= MAX_COUNT)?;
        self.last_target.store(rank, Ordering::Relaxed);
        Some((rank, offset))
    }

    /// Calls `f(target, displacement, position, count)` for every piece of `start..start + len`,
    /// pieces split at [`MAX_COUNT`], from the shard after this rank's
    /// ([`ShardMap::pieces_after`]).
    #[inline(always)]
    fn for_pieces(
        &self,
        start: usize,
        len: usize,
        mut touched: Touched,
        mut f: impl FnMut(c_int, ffi::MPI_Aint, usize, c_int) -> Result<()>,
    ) -> Result<Touched> {
        // No elements: no operation, only the bounds check.
        if len == 0 {
            return if start <= self.map.total() { Ok(touched) } else { Err(self.out_of_range(start, len)) };
        }
        // Fast path: the range lies inside one shard (the common case, and every atomic).
        if let Some((rank, offset)) = self.locate(start, len) {
            f(rank as c_int, self.disp(rank, offset), 0, len as c_int)?;
            return Ok(touched.add(rank));
        }
        let me = self.comm.rank;
        let pieces = self.map.pieces_after(start, len, me).ok_or_else(|| self.out_of_range(start, len))?;
        for p in pieces {
            let mut done = 0;
            while done < p.len {
                let n = (p.len - done).min(MAX_COUNT);
                f(p.rank as c_int, self.disp(p.rank, p.offset + done), p.pos + done, count(n))?;
                done += n;
            }
            touched = touched.add(p.rank);
        }
        Ok(touched)
    }

    /// Calls `f(position, target, displacement, count)` for every piece of every range of a
    /// batch, `position` counting from the batch's first element; returns `touched` with the
    /// targets added.
    ///
    /// A batch inside one shard (the common case: a pull of one owner's keys, every window of
    /// `bench rma`) is issued with nothing per range but its displacement: its bounds came with
    /// the check. Otherwise the bounds of the last shard a range fitted stay in registers, so
    /// such a range costs two comparisons, not a lookup and a bookkeeping of its target.
    #[inline(always)]
    fn for_batch(
        &self,
        batch: Batch<'_>,
        mut touched: Touched,
        mut f: impl FnMut(usize, c_int, ffi::MPI_Aint, c_int) -> Result<()>,
    ) -> Result<Touched> {
        if batch.start == batch.end {
            return Ok(touched); // no elements: nothing to issue
        }
        let mut at = 0;
        // Inside one shard and spanning at most MAX_COUNT elements, so is every range.
        if batch.end - batch.start <= MAX_COUNT {
            if let Some((owner, offset)) = self.map.locate(batch.start, batch.end - batch.start) {
                let (lo, lead) = (batch.start - offset, self.lead_at(owner));
                // Empty ranges are not issued (see below).
                for r in batch.ranges.iter().filter(|r| r.start < r.end) {
                    let len = r.end - r.start;
                    let pos = if batch.positioned { r.start } else { at };
                    f(pos, owner as c_int, (r.start - lo + lead) as ffi::MPI_Aint, len as c_int)?;
                    at += len;
                }
                return Ok(touched.add(owner));
            }
        }
        // The shard of the last range that fitted in one: rank, global bounds and lead. Empty at
        // first (`lo > hi`: no range passes the test below).
        let (mut rank, mut lo, mut hi, mut lead) = (0, 1, 0, 0);
        // An empty range is no operation.
        for r in batch.ranges.iter().filter(|r| r.start < r.end) {
            let len = r.end - r.start;
            let pos = if batch.positioned { r.start } else { at };
            if lo <= r.start && r.end <= hi && len <= MAX_COUNT {
                f(pos, rank as c_int, (r.start - lo + lead) as ffi::MPI_Aint, len as c_int)?;
            } else if let Some((owner, offset)) = self.map.locate(r.start, len).filter(|_| len <= MAX_COUNT) {
                let shard = self.map.range(owner);
                (rank, lo, hi, lead) = (owner, shard.start, shard.end, self.lead_at(owner));
                f(pos, owner as c_int, self.disp(owner, offset), len as c_int)?;
                touched = touched.add(owner);
            } else {
                touched = self.for_pieces(r.start, len, touched, |t, d, p, n| f(pos + p, t, d, n))?;
            }
            at += len;
        }
        Ok(touched)
    }

    /// Completes this rank's operations locally (origin buffers reusable, results present).
    fn complete_local(&self, touched: Touched) -> Result<()> {
        match touched.targets() {
            Targets::None => Ok(()),
            Targets::One(t) => {
                // SAFETY: live window in a lock_all epoch; `t` is a valid rank.
                let rc = unsafe { ffi::MPI_Win_flush_local(t as c_int, self.win) };
                self.check("MPI_Win_flush_local", rc)
            }
            Targets::Many => {
                // SAFETY: live window in a lock_all epoch.
                let rc = unsafe { ffi::MPI_Win_flush_local_all(self.win) };
                self.check("MPI_Win_flush_local_all", rc)
            }
        }
    }

    /// One `MPI_Get` of `n` elements from `target` at `disp` into `origin`.
    ///
    /// # Safety
    /// `origin .. origin + n` must be writable and stay borrowed, unread, until a local completion
    /// of `target`; `disp .. disp + n` must lie inside `target`'s shard.
    #[inline(always)]
    unsafe fn get_piece(
        &self,
        h: Handles,
        origin: *mut T,
        target: c_int,
        disp: ffi::MPI_Aint,
        n: c_int,
    ) -> Result<()> {
        // SAFETY: the caller's contract; a live window in its lock_all epoch.
        let rc = unsafe { ffi::MPI_Get(origin.cast(), n, h.dt, target, disp, n, h.dt, h.win) };
        self.check("MPI_Get", rc)
    }

    /// The handles every operation of a batch passes, read once for the batch: as values in
    /// registers, rather than loaded again after each MPI call (which the compiler must assume
    /// could have changed the window and the library's handles).
    #[inline(always)]
    fn handles(&self) -> Handles {
        // SAFETY: a constant handle exported by rsmpi's shim, never written.
        Handles { dt: T::mpi_datatype(), win: self.win, sum: unsafe { ffi::RSMPI_SUM } }
    }

    /// One `MPI_Put` (or `MPI_Accumulate` with `MPI_SUM`) of `n` elements from `origin` to
    /// `target` at `disp`.
    ///
    /// # Safety
    /// `origin .. origin + n` must be readable and stay borrowed until a local completion of
    /// `target`; `disp .. disp + n` must lie inside `target`'s shard.
    #[inline(always)]
    unsafe fn write_piece(
        &self,
        h: Handles,
        origin: *const T,
        target: c_int,
        disp: ffi::MPI_Aint,
        n: c_int,
        accumulate: bool,
    ) -> Result<()> {
        // SAFETY: the caller's contract; a live window in its lock_all epoch; MPI only reads
        // the origin buffer.
        let rc = unsafe {
            if accumulate {
                ffi::MPI_Accumulate(origin.cast(), n, h.dt, target, disp, n, h.dt, h.sum, h.win)
            } else {
                ffi::MPI_Put(origin.cast(), n, h.dt, target, disp, n, h.dt, h.win)
            }
        };
        self.check(if accumulate { "MPI_Accumulate" } else { "MPI_Put" }, rc)
    }

    /// Completes locally what a batch issued: the targets it returned, or every target when an
    /// issue failed part way (the caller's buffer must not be handed back with operations in
    /// flight). The issue's error comes first.
    fn complete_batch(&self, issued: Result<Touched>) -> Result<()> {
        let completed = self.complete_local(*issued.as_ref().unwrap_or(&Touched::MANY));
        issued.and(completed)
    }

    #[inline(always)]
    fn issue_get(&self, start: usize, out: &mut [T], touched: Touched) -> Result<Touched> {
        let (base, h) = (out.as_mut_ptr(), self.handles());
        self.for_pieces(start, out.len(), touched, |target, disp, pos, n| {
            // SAFETY: `base + pos .. + n` lies inside `out` (pieces tile `0..out.len()`), which stays
            // borrowed until the completion that follows in the caller; target/disp/n lie inside the
            // target's shard (from the shard map every rank agreed on).
            unsafe { self.get_piece(h, base.add(pos), target, disp, n) }
        })
    }

    /// Issues a put or accumulate without completing it (the caller keeps `data` borrowed until
    /// a completion of `touched`).
    #[inline(always)]
    pub(crate) fn issue_write(
        &self,
        start: usize,
        data: &[T],
        accumulate: bool,
        touched: Touched,
    ) -> Result<Touched> {
        if let Some(a) = self.direct() {
            if start.checked_add(data.len()).is_none_or(|end| end > a.len()) {
                return Err(self.out_of_range(start, data.len()));
            }
            let mut held = Held::none();
            // An add over several shards starts at the one after this rank's (as a batch does).
            let from =
                self.map.range((self.rank() + 1) % self.map.parts()).start.clamp(start, start + data.len());
            if accumulate && from > start {
                let (low, high) = data.split_at(from - start);
                self.direct_write(a, from, high, true, &mut held);
                self.direct_write(a, start, low, true, &mut held);
            } else {
                self.direct_write(a, start, data, accumulate, &mut held);
            }
            drop(held);
            fence(Ordering::Release);
            return Ok(touched);
        }
        let (base, h) = (data.as_ptr(), self.handles());
        self.for_pieces(start, data.len(), touched, |target, disp, pos, n| {
            // SAFETY: as in `issue_get`; the caller keeps `data` borrowed until the completion.
            unsafe { self.write_piece(h, base.add(pos), target, disp, n, accumulate) }
        })
    }

    pub(crate) fn get(&self, start: usize, out: &mut [T]) -> Result<()> {
        if let Some(a) = self.direct() {
            let src = start.checked_add(out.len()).and_then(|end| a.get(start..end));
            let src = src.ok_or_else(|| self.out_of_range(start, out.len()))?;
            fence(Ordering::Acquire);
            for (o, x) in out.iter_mut().zip(src) {
                *o = T::atomic_load(x);
            }
            return Ok(());
        }
        if !library_is_open_mpi() {
            let mut pieces = Vec::new();
            self.for_pieces(start, out.len(), Touched::NONE, |target, disp, pos, n| {
                pieces.push((pos, target, disp, n));
                Ok(())
            })?;
            // SAFETY: the pieces tile `0..out.len()`, `out` borrowed mutably for the whole call.
            return unsafe { self.rget_all(out.as_mut_ptr(), &pieces) };
        }
        let touched = self.issue_get(start, out, Touched::NONE)?;
        self.complete_local(touched)
    }

    /// MPICH: every piece `(position, target, displacement, count)` read into `base + position`
    /// by `MPI_Rget`, then every request waited for. Under MPICH 4.0 (ch4, srun across two nodes
    /// over TCP) gets completed by a flush came back without their data about 1 run in 7 of the
    /// conformance case `positioned-batches-of-many-ranges` (`MPI_Win_flush_local_all` and
    /// `MPI_Win_flush_all` alike, gets to a rank on the same node as well as across, with the
    /// one-sided operations of libfabric or MPICH's active messages); with a request per get, 0
    /// in 60. A get's own request completes when its data is in place.
    ///
    /// # Safety
    /// Each piece's `base + position .. + count` must be writable and borrowed for the call; its
    /// displacement and count must lie inside the target's shard.
    unsafe fn rget_all(&self, base: *mut T, pieces: &[(usize, c_int, ffi::MPI_Aint, c_int)]) -> Result<()> {
        let h = self.handles();
        // SAFETY: a constant handle exported by rsmpi's shim, never written.
        let mut reqs = vec![unsafe { ffi::RSMPI_REQUEST_NULL }; pieces.len()];
        let mut issued = Ok(());
        for (&(pos, target, disp, n), req) in pieces.iter().zip(&mut reqs) {
            // SAFETY: the caller's contract; a live window in its lock_all epoch; `req` is an
            // out-pointer into `reqs`, which outlives the waits below.
            let rc =
                unsafe { ffi::MPI_Rget(base.add(pos).cast(), n, h.dt, target, disp, n, h.dt, h.win, req) };
            issued = self.check("MPI_Rget", rc);
            if issued.is_err() {
                break;
            }
        }
        // Every request issued is waited for, even after a failed issue (the buffer is then
        // handed back); unissued ones are null, which MPI_Wait returns at once.
        let mut waited = Ok(());
        for req in &mut reqs {
            // SAFETY: a request from MPI_Rget above, or the null request.
            let rc = unsafe { ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE) };
            if waited.is_ok() {
                waited = self.check("MPI_Wait", rc);
            }
        }
        issued.and(waited)
    }

    pub(crate) fn get_batch(&self, batch: Batch<'_>, out: &mut [T]) -> Result<()> {
        if let Some(a) = self.direct() {
            fence(Ordering::Acquire);
            let mut run = 0;
            for r in batch.ranges {
                let at = if batch.positioned { r.start } else { run };
                run += r.len();
                // In bounds: the batch was checked (ranges inside the window, the buffer long
                // enough for them).
                for (o, x) in out[at..at + r.len()].iter_mut().zip(&a[r.clone()]) {
                    *o = T::atomic_load(x);
                }
            }
            return Ok(());
        }
        if !library_is_open_mpi() {
            let mut pieces = Vec::with_capacity(batch.ranges.len());
            self.for_batch(batch, Touched::NONE, |pos, target, disp, n| {
                pieces.push((pos, target, disp, n));
                Ok(())
            })?;
            // SAFETY: every piece lies inside `out` (the batch was checked against it), which is
            // borrowed mutably for the call.
            return unsafe { self.rget_all(out.as_mut_ptr(), &pieces) };
        }
        let (base, len, h) = (out.as_mut_ptr(), out.len(), self.handles());
        if !Blocks::worth(batch) {
            // A get each, as they come.
            let issued = self.for_batch(batch, Touched::NONE, |pos, target, disp, n| {
                debug_assert!(pos + n as usize <= len, "a piece past the batch's buffer");
                // SAFETY: `pos + n <= out.len()` (the batch was checked against `out`), which
                // stays borrowed until the completion below; target/disp/n lie inside the
                // target's shard (from the shard map every rank agreed on).
                unsafe { self.get_piece(h, base.add(pos), target, disp, n) }
            });
            return self.complete_batch(issued);
        }
        let mut blocks = Blocks::new(batch.ranges.len());
        let issue = |b: &Blocks| {
            // SAFETY: every block's `pos + n <= out.len()` (checked as it was added), `out`
            // stays borrowed until the completion below; the blocks' displacements lie inside
            // the target's shard (from the shard map every rank agreed on).
            unsafe { self.issue_blocks(h, b, base, false) }
        };
        let issued = self
            .for_batch(batch, Touched::NONE, |pos, target, disp, n| {
                debug_assert!(pos + n as usize <= len, "a piece past the batch's buffer");
                blocks.push(target, pos, disp, n, issue)
            })
            .and_then(|t| issue(&blocks).map(|()| t));
        self.complete_batch(issued)
    }

    /// Issues the gets (or, with `put`, the puts) of `b`'s blocks, between `origin + pos` and
    /// the target's displacements: one operation per block when they are few, else one of an
    /// indexed datatype on each side ([`Blocks`]).
    ///
    /// # Safety
    /// Every block's origin elements lie inside one allocation starting at `origin`, which
    /// stays borrowed (unread after a get) until a local completion of the target; its target
    /// displacements lie inside the target's shard.
    unsafe fn issue_blocks(&self, h: Handles, b: &Blocks, origin: *mut T, put: bool) -> Result<()> {
        if b.lens.len() < Blocks::TYPED {
            for i in 0..b.lens.len() {
                let (pos, disp, n) = (b.pos[i] as usize, b.disp[i], b.lens[i]);
                // SAFETY: the caller's contract, block by block.
                unsafe {
                    if put {
                        self.write_piece(h, origin.add(pos), b.target, disp, n, false)?;
                    } else {
                        self.get_piece(h, origin.add(pos), b.target, disp, n)?;
                    }
                }
            }
            return Ok(());
        }
        let size = std::mem::size_of::<T>() as ffi::MPI_Aint;
        let odisp: Vec<ffi::MPI_Aint> = b.pos.iter().map(|&p| p * size).collect();
        let tdisp: Vec<ffi::MPI_Aint> = b.disp.iter().map(|&d| d * size).collect();
        let ot = self.indexed(h, &b.lens, &odisp)?;
        let tt = match self.indexed(h, &b.lens, &tdisp) {
            Ok(t) => t,
            Err(e) => {
                free_type(ot);
                return Err(e);
            }
        };
        // SAFETY: the caller's contract; both datatypes are committed, built from the window's
        // element type; a live window in its lock_all epoch. A datatype may be freed once the
        // operation using it is issued (MPI 4.1, 5.1.9: freeing does not affect pending
        // operations).
        let rc = unsafe {
            if put {
                ffi::MPI_Put(origin.cast(), 1, ot, b.target, 0, 1, tt, h.win)
            } else {
                ffi::MPI_Get(origin.cast(), 1, ot, b.target, 0, 1, tt, h.win)
            }
        };
        free_type(ot);
        free_type(tt);
        self.check(if put { "MPI_Put" } else { "MPI_Get" }, rc)
    }

    /// A committed `MPI_Type_create_hindexed` of the window's element type.
    fn indexed(&self, h: Handles, lens: &[c_int], disp: &[ffi::MPI_Aint]) -> Result<ffi::MPI_Datatype> {
        let mut t = std::mem::MaybeUninit::<ffi::MPI_Datatype>::uninit();
        // SAFETY: `lens` and `disp` are as long as the count passed (which fits, as the blocks
        // came from a batch counted in c_int pieces); `t` is an out-pointer.
        let rc = unsafe {
            ffi::MPI_Type_create_hindexed(
                count(lens.len()),
                lens.as_ptr(),
                disp.as_ptr(),
                h.dt,
                t.as_mut_ptr(),
            )
        };
        self.check("MPI_Type_create_hindexed", rc)?;
        // SAFETY: written by the successful call above.
        let mut t = unsafe { t.assume_init() };
        // SAFETY: a datatype just created.
        let rc = unsafe { ffi::MPI_Type_commit(&mut t) };
        if let Err(e) = self.check("MPI_Type_commit", rc) {
            free_type(t);
            return Err(e);
        }
        Ok(t)
    }

    pub(crate) fn write(&self, start: usize, data: &[T], accumulate: bool) -> Result<()> {
        let touched = self.issue_write(start, data, accumulate, Touched::NONE)?;
        self.complete_local(touched)
    }

    pub(crate) fn write_batch(&self, batch: Batch<'_>, data: &[T], accumulate: bool) -> Result<()> {
        self.complete_batch(self.issue_write_batch(batch, data, accumulate, Touched::NONE))
    }

    /// Issues puts or accumulates of `data` split over `ranges` (the caller checked that their
    /// lengths sum to `data.len()`) without completing them: the caller keeps `data` borrowed
    /// until a completion of the returned targets (of every target on an error).
    #[inline]
    pub(crate) fn issue_write_batch(
        &self,
        batch: Batch<'_>,
        data: &[T],
        accumulate: bool,
        touched: Touched,
    ) -> Result<Touched> {
        if let Some(a) = self.direct() {
            let mut held = Held::none();
            if batch.positioned && accumulate {
                // Adds in any order: each rank starts at the shard after its own and wraps
                // around, so that ranks pushing at once (as they do after lining up) take the
                // shards' locks in turn instead of queueing for the same one.
                let from = self.map.range((self.rank() + 1) % self.map.parts()).start;
                let split = batch.ranges.partition_point(|r| r.start < from);
                let (low, high) = batch.ranges.split_at(split);
                for r in high.iter().chain(low) {
                    self.direct_write(a, r.start, &data[r.clone()], true, &mut held);
                }
            } else {
                let mut run = 0;
                for r in batch.ranges {
                    let at = if batch.positioned { r.start } else { run };
                    run += r.len();
                    self.direct_write(a, r.start, &data[at..at + r.len()], accumulate, &mut held);
                }
            }
            drop(held);
            fence(Ordering::Release);
            return Ok(touched);
        }
        let (base, len, h) = (data.as_ptr().cast_mut(), data.len(), self.handles());
        // Accumulates go a call a range: OpenMPI 4.1's `osc/ucx` loses adds of an indexed
        // datatype that race with other ranks' adds to the same elements (the conformance case
        // `direct-window-accumulates-and-atomics` on a plain window over UCX: 600 where 1,050
        // was due), although MPI makes them atomic element by element.
        if accumulate || !Blocks::worth(batch) {
            return self.for_batch(batch, touched, |pos, target, disp, n| {
                debug_assert!(pos + n as usize <= len, "a piece past the batch's data");
                // SAFETY: `pos + n <= data.len()`, as in `get_batch`; the caller keeps `data`
                // borrowed until the completion.
                unsafe { self.write_piece(h, base.add(pos), target, disp, n, accumulate) }
            });
        }
        let mut blocks = Blocks::new(batch.ranges.len());
        let issue = |b: &Blocks| {
            // SAFETY: as in `get_batch`; MPI only reads the origin of a put, and the caller
            // keeps `data` borrowed until the completion.
            unsafe { self.issue_blocks(h, b, base, true) }
        };
        let touched = self.for_batch(batch, touched, |pos, target, disp, n| {
            debug_assert!(pos + n as usize <= len, "a piece past the batch's data");
            blocks.push(target, pos, disp, n, issue)
        })?;
        issue(&blocks)?;
        Ok(touched)
    }

    pub(crate) fn fetch_add(&self, index: usize, value: T) -> Result<T> {
        if let Some(a) = self.direct() {
            let x = a.get(index).ok_or_else(|| self.out_of_range(index, 1))?;
            if !T::LOCKED_ADD {
                return Ok(T::atomic_fetch_add(x, value));
            }
            let mut held = Held::none();
            held.shard(self, index);
            let old = T::atomic_load(x);
            T::atomic_store(x, old.add(value));
            return Ok(old);
        }
        // SAFETY: a constant handle exported by rsmpi's shim, never written.
        let op = unsafe { ffi::RSMPI_SUM };
        self.fetch_op(index, value, op, "MPI_Fetch_and_op")
    }

    /// `MPI_Fetch_and_op` of `value` with `op` on element `index`: the previous value.
    fn fetch_op(&self, index: usize, value: T, op: ffi::MPI_Op, call: &'static str) -> Result<T> {
        let mut result = T::default();
        // SAFETY: `value` and `result` outlive the local completion that follows.
        let target = unsafe { self.issue_fetch_op(index, &value, &mut result, op, call)? };
        self.complete_local(Touched::one(target))?;
        Ok(result)
    }

    /// Issues `MPI_Fetch_and_op` of `*value` with `op` on element `index` into `*result`, without
    /// completing it; returns the target rank.
    ///
    /// # Safety
    /// `value` and `result` must stay valid (and `result` unread) until a local completion of
    /// the target returned.
    unsafe fn issue_fetch_op(
        &self,
        index: usize,
        value: *const T,
        result: *mut T,
        op: ffi::MPI_Op,
        call: &'static str,
    ) -> Result<usize> {
        let (target, offset) = self.locate(index, 1).ok_or_else(|| self.out_of_range(index, 1))?;
        // SAFETY: live window; one element at a valid displacement of `target`'s shard; the
        // caller keeps `value` and `result` valid until the completion; `op` is a predefined
        // operation handle.
        let rc = unsafe {
            ffi::MPI_Fetch_and_op(
                value.cast(),
                result.cast(),
                T::mpi_datatype(),
                target as c_int,
                self.disp(target, offset),
                op,
                self.win,
            )
        };
        self.check(call, rc)?;
        Ok(target)
    }

    /// Atomic read of element `index` (`MPI_Fetch_and_op` with `MPI_NO_OP`).
    pub(crate) fn load(&self, index: usize) -> Result<T> {
        if let Some(a) = self.direct() {
            return Ok(T::atomic_load_acquire(a.get(index).ok_or_else(|| self.out_of_range(index, 1))?));
        }
        // SAFETY: a constant handle returned by our shim.
        let op = unsafe { peregrine_mpi_no_op() };
        self.fetch_op(index, T::default(), op, "MPI_Fetch_and_op(MPI_NO_OP)")
    }

    /// Atomic loads (`MPI_Fetch_and_op` with `MPI_NO_OP`) of every element of `ranges` into
    /// `out`, all issued before one local completion.
    pub(crate) fn load_batch(&self, ranges: &[Range<usize>], out: &mut [T]) -> Result<()> {
        if let Some(a) = self.direct() {
            for (o, index) in out.iter_mut().zip(ranges.iter().flat_map(Clone::clone)) {
                *o = T::atomic_load_acquire(a.get(index).ok_or_else(|| self.out_of_range(index, 1))?);
            }
            return Ok(());
        }
        // SAFETY: a constant handle returned by our shim.
        let op = unsafe { peregrine_mpi_no_op() };
        let zero = T::default();
        let mut touched = Touched::NONE;
        let mut issued = Ok(());
        for (o, index) in out.iter_mut().zip(ranges.iter().flat_map(Clone::clone)) {
            // SAFETY: `zero` and `out` outlive the local completion below, which runs even when a
            // later issue fails.
            match unsafe { self.issue_fetch_op(index, &zero, o, op, "MPI_Fetch_and_op(MPI_NO_OP)") } {
                Ok(target) => touched = touched.add(target),
                Err(e) => {
                    issued = Err(e);
                    break;
                }
            }
        }
        let completed = self.complete_local(touched);
        issued.and(completed)
    }

    /// Atomic store of `value` into element `index`, returning the previous value
    /// (`MPI_Fetch_and_op` with `MPI_REPLACE`).
    pub(crate) fn swap(&self, index: usize, value: T) -> Result<T> {
        if let Some(a) = self.direct() {
            let x = a.get(index).ok_or_else(|| self.out_of_range(index, 1))?;
            // A float's swap, as its adds, under the shard's lock (an add's load and store
            // around it would undo it).
            let mut held = Held::none();
            if T::LOCKED_ADD {
                held.shard(self, index);
            }
            let old = T::atomic_swap(x, value);
            drop(held);
            return Ok(old);
        }
        // SAFETY: a constant handle returned by our shim.
        let op = unsafe { peregrine_mpi_replace() };
        self.fetch_op(index, value, op, "MPI_Fetch_and_op(MPI_REPLACE)")
    }

    pub(crate) fn compare_and_swap(&self, index: usize, current: T, new: T) -> Result<T> {
        if let Some(a) = self.direct() {
            let x = a.get(index).ok_or_else(|| self.out_of_range(index, 1))?;
            return Ok(T::atomic_compare_swap(x, current, new));
        }
        let (target, offset) = self.locate(index, 1).ok_or_else(|| self.out_of_range(index, 1))?;
        let mut result = T::default();
        // SAFETY: as in `fetch_add`; only called for u64 (an integer type, as MPI requires).
        let rc = unsafe {
            ffi::MPI_Compare_and_swap(
                (&new as *const T).cast(),
                (&current as *const T).cast(),
                (&mut result as *mut T).cast(),
                T::mpi_datatype(),
                target as c_int,
                self.disp(target, offset),
                self.win,
            )
        };
        self.check("MPI_Compare_and_swap", rc)?;
        self.complete_local(Touched::one(target))?;
        Ok(result)
    }

    /// Completes at their targets the operations issued to `touched`.
    #[inline(always)]
    pub(crate) fn complete_remote(&self, touched: Touched) -> Result<()> {
        match touched.targets() {
            Targets::None => Ok(()),
            Targets::One(t) => {
                // SAFETY: live window in a lock_all epoch; `t` is a valid rank.
                let rc = unsafe { ffi::MPI_Win_flush(t as c_int, self.win) };
                self.check("MPI_Win_flush", rc)
            }
            Targets::Many => self.flush_all(),
        }
    }

    pub(crate) fn flush(&self, target: usize) -> Result<()> {
        if target >= self.map.parts() {
            return Err(ErrorKind::NoSuchRank {
                rank: self.rank(),
                what: "target",
                target,
                world_size: self.map.parts(),
            }
            .into());
        }
        // SAFETY: live window in a lock_all epoch; valid rank.
        self.check("MPI_Win_flush", unsafe { ffi::MPI_Win_flush(target as c_int, self.win) })
    }

    pub(crate) fn flush_all(&self) -> Result<()> {
        // SAFETY: live window in a lock_all epoch.
        self.check("MPI_Win_flush_all", unsafe { ffi::MPI_Win_flush_all(self.win) })
    }

    /// See [`crate::Window::with_own_shard`]. `MPI_Win_sync` before `f` (what others wrote, and
    /// completed, is what `f` loads) and after it (what `f` stored is in the window's public
    /// copy, for the reads that follow the next synchronization); under the unified memory model
    /// (shared memory, UCX) these are memory barriers, under the separate one the copies'
    /// synchronization that MPI asks of local access to a window.
    ///
    /// # Safety
    /// As there: no other access to this rank's shard while `f` runs.
    pub(crate) unsafe fn with_own_shard<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        // SAFETY: live window in a lock_all epoch.
        self.check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(self.win) })?;
        // SAFETY: `base` is this rank's shard of `len_of(rank)` elements, aligned and initialised
        // (zeroed at allocation), owned by the window while it is live; exclusive for the
        // slice's life by the caller's contract.
        let own = unsafe { std::slice::from_raw_parts_mut(self.base, self.map.len_of(self.rank())) };
        let r = f(own);
        // SAFETY: as above.
        self.check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(self.win) })?;
        Ok(r)
    }

    /// See [`crate::Window::whole_in_place`]: the shared window's every shard, as one slice,
    /// after an `MPI_Win_sync` (what other ranks wrote and completed before the caller's last
    /// synchronization is what its loads see); `None` unless the window is one mapping.
    ///
    /// # Safety
    /// As there: no rank writes the window while the slice lives.
    pub(crate) unsafe fn whole_in_place(&self) -> Result<Option<&[T]>> {
        if self.whole.is_null() {
            return Ok(None);
        }
        // SAFETY: live window in a lock_all epoch.
        self.check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(self.win) })?;
        // SAFETY: `whole` is where every shard lies back to back in this process
        // (`whole_mapping`): `map.total()` aligned elements, initialised (each rank zeroed its own
        // at allocation, before the barrier that ended it), owned by the window while it is live
        // (the slice borrows it); unchanged while the slice lives, by the caller's contract.
        Ok(Some(unsafe { std::slice::from_raw_parts(self.whole, self.map.total()) }))
    }

    pub(crate) fn free(mut self) -> Result<()> {
        self.live = false;
        // SAFETY: the window was live (the flag was set until now) and in its lock_all epoch.
        self.check("MPI_Win_unlock_all", unsafe { ffi::MPI_Win_unlock_all(self.win) })?;
        // SAFETY: live window, epoch closed; collective (the caller's contract); sets the handle to
        // MPI_WIN_NULL, and `live == false` keeps Drop away from it.
        let rc = unsafe { ffi::MPI_Win_free(&mut self.win) };
        self.check("MPI_Win_free", rc)
    }
}

impl<T: Elem> Drop for MpiWindow<T> {
    fn drop(&mut self) {
        if self.live {
            // SAFETY: live window in its lock_all epoch; completes what this rank issued. Not freed:
            // see the module docs.
            unsafe { ffi::MPI_Win_unlock_all(self.win) };
        }
    }
}

/// The accumulate lock a direct window's writes hold: of one shard at a time, released when
/// dropped.
struct Held<'w> {
    word: Option<(usize, &'w AtomicU32)>,
}

impl<'w> Held<'w> {
    fn none() -> Self {
        Self { word: None }
    }

    /// The shard of global element `at`, its lock held (the lock held before released first,
    /// if it is another shard's).
    fn shard<T: Elem>(&mut self, w: &'w MpiWindow<T>, at: usize) -> usize {
        if let Some((shard, _)) = self.word {
            if w.map.range(shard).contains(&at) {
                return shard;
            }
        }
        self.release();
        let (shard, _) = w.map.owner(at).expect("in the window: checked by the caller");
        let word = w.lock_word(shard);
        let mut spins = 0u32;
        while word.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // Its holder may be descheduled (ranks outnumbering cores).
                std::thread::yield_now();
            }
        }
        self.word = Some((shard, word));
        shard
    }

    fn release(&mut self) {
        if let Some((_, word)) = self.word.take() {
            word.store(0, Ordering::Release);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The pieces of a batch of gets or puts bound for one target, gathered to be issued together:
/// where a target has [`Blocks::TYPED`] pieces or more, one operation of an indexed datatype on
/// each side (`MPI_Type_create_hindexed`) moves them all, instead of one operation per piece (a
/// pull of 20k scattered keys: 20k `MPI_Get`s, each with the library's per-call overhead).
struct Blocks {
    target: c_int,
    pos: Vec<ffi::MPI_Aint>,
    disp: Vec<ffi::MPI_Aint>,
    lens: Vec<c_int>,
}

/// Whether the MPI library is Open MPI. Gets and puts of indexed datatypes are used under Open MPI
/// only (its conformance passed over `osc/sm` and `osc/ucx`, on one node and between nodes; under
/// MPICH a batch is a call a range), and gets complete by a flush there only (under MPICH by
/// their requests: `rget_all`).
fn library_is_open_mpi() -> bool {
    static OPEN_MPI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OPEN_MPI.get_or_init(|| crate::mpi_library_version().is_some_and(|v| v.starts_with("Open MPI")))
}

impl Blocks {
    /// Pieces from which one target's are issued as one operation of an indexed datatype (the
    /// two datatypes' creation and commit cost about as much as this many small operations).
    const TYPED: usize = 16;

    /// Whether a batch may travel in datatypes: [`TYPED`](Self::TYPED) ranges or more, in
    /// ascending order and apart (a sparse model's sorted runs). MPI forbids overlapping entries
    /// where data is received, and other batches (`bench rma`'s windows of one range repeated)
    /// are issued a call a range as they always were, without gathering them first (which cost
    /// `bench rma` a fifth of its small windows' bandwidth).
    fn worth(batch: Batch<'_>) -> bool {
        batch.ranges.len() >= Self::TYPED
            && batch.ranges.windows(2).all(|w| w[0].end <= w[1].start)
            && library_is_open_mpi()
    }

    fn new(cap: usize) -> Self {
        let cap = cap.min(1 << 16);
        Self {
            target: -1,
            pos: Vec::with_capacity(cap),
            disp: Vec::with_capacity(cap),
            lens: Vec::with_capacity(cap),
        }
    }

    /// Adds a piece; first issues (with `issue`) and forgets the pieces gathered for another
    /// target.
    #[inline]
    fn push(
        &mut self,
        target: c_int,
        pos: usize,
        disp: ffi::MPI_Aint,
        n: c_int,
        issue: impl Fn(&Self) -> Result<()>,
    ) -> Result<()> {
        if target != self.target {
            issue(self)?;
            self.target = target;
            self.pos.clear();
            self.disp.clear();
            self.lens.clear();
        }
        self.pos.push(pos as ffi::MPI_Aint);
        self.disp.push(disp);
        self.lens.push(n);
        Ok(())
    }
}

/// Frees a datatype (an error here leaks a handle, nothing more: nothing to report it to).
fn free_type(mut t: ffi::MPI_Datatype) {
    // SAFETY: a committed datatype this process created and no longer uses.
    let _ = unsafe { ffi::MPI_Type_free(&mut t) };
}
