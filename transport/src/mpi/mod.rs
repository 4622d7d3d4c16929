//! The `mpi` backend: MPI processes, MPI-3 RMA windows.
//!
//! rsmpi initialises MPI (`MPI_THREAD_MULTIPLE`); everything else goes through its raw `mpi::ffi`,
//! because rsmpi has no safe one-sided API:
//! - our own duplicate of `MPI_COMM_WORLD`, with `MPI_ERRORS_RETURN`, so that a failing call comes
//!   back as [`crate::ErrorKind::Mpi`] naming the call instead of aborting the job;
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
//! Dropping a window without `MpiWindow::free` completes its operations (`MPI_Win_unlock_all`)
//! but does not free it: `MPI_Win_free` is collective, and a rank unwinding after an error must
//! not block in it while its peers wait elsewhere. MPI releases such windows at `MPI_Finalize`.
//!
//! The rank, its communicators and collectives are here; windows in `window.rs` (with
//! `window/batch.rs`, batches and indexed datatypes, and `window/locks.rs`, a direct window's
//! shard locks); node blocks in `node.rs`.
//!
//! With OpenMPI 4.1 run with `OMPI_MCA_osc=sm,pt2pt`: its default one-sided component crashes in
//! `MPI_Compare_and_swap` on shared memory.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use mpi::ffi;
use mpi::Threading;

use crate::{Elem, Error, ErrorKind, ReduceOp, Result};

mod node;
mod window;
pub use node::MpiNode;
pub use window::MpiWindow;

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
