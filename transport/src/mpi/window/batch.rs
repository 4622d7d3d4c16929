//! The pieces a window's operations are issued in, and batches of them: the handles every piece
//! passes, one MPI call a piece (`MPI_Get`, `MPI_Put`/`MPI_Accumulate`, under MPICH `MPI_Rget`
//! with a request each), a batch's ranges cut into pieces, and where a target has many, the
//! pieces gathered into one operation of an indexed datatype on each side ([`Blocks`]).

use std::ffi::c_int;
use std::sync::atomic::{fence, Ordering};

use mpi::ffi;

use super::locks::Held;
use super::MpiWindow;
use crate::mpi::{count, MAX_COUNT};
use crate::{Batch, Elem, Result, Touched};

/// How many ranges ahead a direct window's batch asks for the line its operations will touch.
/// Scattered keys of a large model (sparse LR hashed into 2^24 features: ~40k single keys a push,
/// over 64 MB) miss the caches and the TLB one by one; asked ahead, the misses overlap.
pub(super) const AHEAD: usize = 48;

/// Asks the CPU to bring the first element of `ranges[i + AHEAD]` (if there is one) of `a` into
/// the cache: to write where `to_write` says the processor has `prefetchw`, else to read
/// ([`prefetch_to_write`]).
#[inline(always)]
fn prefetch_ahead<A>(a: &[A], ranges: &[std::ops::Range<usize>], i: usize, to_write: bool) {
    if let Some(r) = ranges.get(i + AHEAD) {
        prefetch_to_write(a, r.start, to_write);
    }
}

/// Asks the CPU to bring element `at` of `a` into the cache: a hint, nothing where the target has
/// no such instruction; an element past the end of `a` is never asked for.
#[inline(always)]
pub(super) fn prefetch<A>(a: &[A], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at < a.len() {
        // SAFETY: a prefetch reads nothing architecturally and cannot fault; the address is
        // inside `a` all the same.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                a.as_ptr().add(at).cast::<i8>(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (a, at);
}

/// Whether this processor has `prefetchw` ([`prefetch_to_write`]).
pub(super) fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            // CPUID leaf 0x8000_0001, ECX bit 8 (PRFCHW), where the extended leaves go that far.
            let top = std::arch::x86_64::__cpuid(0x8000_0000).eax;
            top >= 0x8000_0001 && std::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`prefetch`] with the intent to write where the processor has `prefetchw` (`owned`: from
/// [`has_prefetchw`]): the line comes in owned, so that the store after a load costs no second
/// request for ownership when another core read or wrote it last (the other rank's chunks read
/// the weights in place; its pushes add to the same lines).
#[inline(always)]
pub(super) fn prefetch_to_write<A>(a: &[A], at: usize, owned: bool) {
    #[cfg(target_arch = "x86_64")]
    if owned && at < a.len() {
        // SAFETY: a prefetch reads nothing architecturally, writes nothing and cannot fault;
        // the address is inside `a` all the same; the processor has the instruction (`owned`).
        unsafe {
            std::arch::asm!(
                "prefetchw byte ptr [{0}]",
                in(reg) a.as_ptr().add(at),
                options(nostack, preserves_flags, readonly)
            )
        };
        return;
    }
    let _ = owned;
    prefetch(a, at);
}

/// The handles of a window's operations ([`MpiWindow::handles`]).
#[derive(Clone, Copy)]
pub(super) struct Handles {
    dt: ffi::MPI_Datatype,
    win: ffi::MPI_Win,
    sum: ffi::MPI_Op,
}

impl<T: Elem> MpiWindow<T> {
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

    /// One `MPI_Get` of `n` elements from `target` at `disp` into `origin`.
    ///
    /// # Safety
    /// `origin .. origin + n` must be writable and stay borrowed, unread, until a local completion
    /// of `target`; `disp .. disp + n` must lie inside `target`'s shard.
    #[inline(always)]
    pub(super) unsafe fn get_piece(
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
    pub(super) fn handles(&self) -> Handles {
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
    pub(super) unsafe fn write_piece(
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
    pub(super) unsafe fn rget_all(
        &self,
        base: *mut T,
        pieces: &[(usize, c_int, ffi::MPI_Aint, c_int)],
    ) -> Result<()> {
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
            for (i, r) in batch.ranges.iter().enumerate() {
                prefetch_ahead(a, batch.ranges, i, false);
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
            let (mut held, owned) = (Held::none(), has_prefetchw());
            if batch.positioned && accumulate {
                // Adds in any order: each rank starts at the shard after its own and wraps
                // around, so that ranks pushing at once (as they do after lining up) take the
                // shards' locks in turn instead of queueing for the same one.
                let from = self.map.range((self.rank() + 1) % self.map.parts()).start;
                let split = batch.ranges.partition_point(|r| r.start < from);
                let (low, high) = batch.ranges.split_at(split);
                for part in [high, low] {
                    for (i, r) in part.iter().enumerate() {
                        prefetch_ahead(a, part, i, owned);
                        self.direct_write(a, r.start, &data[r.clone()], true, &mut held);
                    }
                }
            } else {
                let mut run = 0;
                for (i, r) in batch.ranges.iter().enumerate() {
                    prefetch_ahead(a, batch.ranges, i, owned);
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
pub(super) fn library_is_open_mpi() -> bool {
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
