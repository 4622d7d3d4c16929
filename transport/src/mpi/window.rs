//! Windows of the MPI backend: their collective allocation, single-range operations,
//! atomics, completion and release. Batches and the pieces every operation is issued in are in
//! `batch.rs`; a direct window's writes and the shard locks they hold in `locks.rs`; a window
//! stepped with its state window in one pass in `pair.rs`.

use std::ffi::c_int;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::Arc;

use mpi::ffi;

use super::{
    check, count, peregrine_mpi_mode_nocheck, peregrine_mpi_no_op, peregrine_mpi_replace, Comm, MpiRank,
    MAX_COUNT,
};
use crate::{Elem, Error, ErrorKind, Result, ShardMap, Targets, Touched, SHARD_LINE};

mod batch;
mod locks;
mod pair;

use batch::library_is_open_mpi;
use locks::Held;

impl MpiRank {
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

    pub(crate) fn write(&self, start: usize, data: &[T], accumulate: bool) -> Result<()> {
        let touched = self.issue_write(start, data, accumulate, Touched::NONE)?;
        self.complete_local(touched)
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
            // see the `mpi` module's docs.
            unsafe { ffi::MPI_Win_unlock_all(self.win) };
        }
    }
}
