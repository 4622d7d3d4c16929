//! Windows of the local backend.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{lock, World};
use crate::{Batch, Elem, Error, ErrorKind, Result, ShardMap, Targets, Touched};

/// A window of the local backend, as seen by one rank.
#[derive(Debug)]
pub struct LocalWindow<T: Elem> {
    world: Arc<World>,
    rank: usize,
    name: String,
    /// The layout, shared by every rank's view of the window as the shards are.
    map: Arc<ShardMap>,
    /// Every rank's shard; index = rank. Shared by every rank's view of the window (one list per
    /// window, not one per rank: a world of thousands of ranks would otherwise hold ranks^2
    /// pointers per window).
    shards: Arc<[Arc<[T::Atomic]>]>,
    /// Per shard, the accumulate lock of element types whose atomic add is a compare-and-swap
    /// loop (floats): accumulates and atomics on the shard hold it and add with a plain load and
    /// store, as MPI's shared-memory one-sided component does. Under contention, a CAS per
    /// element made a 100k-element accumulate from two ranks about 10x slower.
    locks: Arc<[Arc<Mutex<()>>]>,
    /// Writes issued by this rank and not yet complete at their target.
    pending: Mutex<Pending<T>>,
    /// How many of them, kept under the lock of `pending`: a load, atomic or flush with none
    /// pending (most of them) does not take that lock. A write issued by another thread of the
    /// rank is seen as surely as through the lock: its count is stored before the lock is
    /// released.
    queued: AtomicUsize,
}

#[derive(Debug)]
struct Pending<T> {
    ops: Vec<PendingOp>,
    /// The origin data of all pending ops, back to back (copied: the caller may reuse its buffer).
    data: Vec<T>,
}

#[derive(Clone, Copy, Debug)]
struct PendingOp {
    target: usize,
    offset: usize,
    len: usize,
    /// Where the op's data starts in `Pending::data`.
    at: usize,
    accumulate: bool,
}

impl<T: Elem> LocalWindow<T> {
    pub(super) fn new(
        world: Arc<World>,
        rank: usize,
        name: &str,
        map: Arc<ShardMap>,
        shards: Arc<[Arc<[T::Atomic]>]>,
        locks: Arc<[Arc<Mutex<()>>]>,
    ) -> Self {
        Self {
            world,
            rank,
            name: name.to_owned(),
            map,
            shards,
            locks,
            pending: Mutex::new(Pending { ops: Vec::new(), data: Vec::new() }),
            queued: AtomicUsize::new(0),
        }
    }

    /// The window's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The window's shard map.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// The rank this view belongs to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn out_of_range(&self, start: usize, len: usize) -> Error {
        ErrorKind::OutOfRange {
            rank: self.rank,
            window: self.name.clone(),
            start,
            end: start.saturating_add(len),
            len: self.map.total(),
        }
        .into()
    }

    fn check_target(&self, target: usize) -> Result<()> {
        if target >= self.map.parts() {
            return Err(ErrorKind::NoSuchRank {
                rank: self.rank,
                what: "target",
                target,
                world_size: self.map.parts(),
            }
            .into());
        }
        Ok(())
    }

    pub(crate) fn get(&self, start: usize, out: &mut [T]) -> Result<()> {
        self.world.count(self.rank);
        self.get_uncounted(start, out)
    }

    fn get_uncounted(&self, start: usize, out: &mut [T]) -> Result<()> {
        if let Some((rank, offset)) = self.map.locate(start, out.len()) {
            let src = &self.shards[rank][offset..offset + out.len()];
            for (o, a) in out.iter_mut().zip(src) {
                *o = T::atomic_load(a);
            }
            return Ok(());
        }
        let pieces = self.map.pieces(start, out.len()).ok_or_else(|| self.out_of_range(start, out.len()))?;
        for p in pieces {
            let src = &self.shards[p.rank][p.offset..p.offset + p.len];
            for (o, a) in out[p.pos..p.pos + p.len].iter_mut().zip(src) {
                *o = T::atomic_load(a);
            }
        }
        Ok(())
    }

    pub(crate) fn get_batch(&self, batch: Batch<'_>, out: &mut [T]) -> Result<()> {
        self.world.count_batch(self.rank, batch.ranges.len());
        let mut run = 0;
        // The shard of the last range that fitted in one, as MPI's batches keep it: a range
        // inside it costs two comparisons, not a lookup (a pull of 20k keys in 20k ranges).
        let (mut shard, mut lo, mut hi) = (0, 1, 0);
        for r in batch.ranges {
            let len = r.end - r.start;
            let at = if batch.positioned { r.start } else { run };
            run += len;
            if !(lo <= r.start && r.end <= hi) {
                match self.map.locate(r.start, len) {
                    Some((rank, offset)) => {
                        (shard, lo, hi) = (rank, r.start - offset, r.start - offset + self.map.len_of(rank))
                    }
                    None => {
                        self.get_uncounted(r.start, &mut out[at..at + len])?;
                        continue;
                    }
                }
            }
            let src = &self.shards[shard][r.start - lo..r.end - lo];
            for (o, a) in out[at..at + len].iter_mut().zip(src) {
                *o = T::atomic_load(a);
            }
        }
        Ok(())
    }

    pub(crate) fn write_batch(&self, batch: Batch<'_>, data: &[T], accumulate: bool) -> Result<()> {
        self.issue_write_batch(batch, data, accumulate, Touched::NONE).map(drop)
    }

    /// Queues puts or accumulates of `data` split over `ranges` (whose lengths sum to
    /// `data.len()`) and adds their targets to `touched`.
    pub(crate) fn issue_write_batch(
        &self,
        batch: Batch<'_>,
        data: &[T],
        accumulate: bool,
        mut touched: Touched,
    ) -> Result<Touched> {
        self.world.count_batch(self.rank, batch.ranges.len());
        let mut pending = lock(&self.pending);
        let (mut run, mut shard, mut lo, mut hi) = (0, 0, 1, 0);
        for r in batch.ranges {
            let len = r.end - r.start;
            let at = if batch.positioned { r.start } else { run };
            run += len;
            if !(lo <= r.start && r.end <= hi) {
                match self.map.locate(r.start, len) {
                    Some((rank, offset)) => {
                        (shard, lo, hi) = (rank, r.start - offset, r.start - offset + self.map.len_of(rank));
                        touched = touched.add(rank);
                    }
                    None => {
                        // Across shards (or empty): piece by piece, as one write.
                        drop(pending);
                        touched = self.issue_uncounted(r.start, &data[at..at + len], accumulate, touched)?;
                        pending = lock(&self.pending);
                        continue;
                    }
                }
            }
            let from = pending.data.len();
            pending.data.extend_from_slice(&data[at..at + len]);
            pending.ops.push(PendingOp { target: shard, offset: r.start - lo, len, at: from, accumulate });
            self.queued.store(pending.ops.len(), Ordering::Release);
        }
        Ok(touched)
    }

    /// Queues a put or accumulate of `data` at global `start`.
    pub(crate) fn write(&self, start: usize, data: &[T], accumulate: bool) -> Result<()> {
        self.issue_write(start, data, accumulate, Touched::NONE).map(drop)
    }

    /// Queues a put or accumulate and adds its targets to `touched`.
    pub(crate) fn issue_write(
        &self,
        start: usize,
        data: &[T],
        accumulate: bool,
        touched: Touched,
    ) -> Result<Touched> {
        self.world.count(self.rank);
        self.issue_uncounted(start, data, accumulate, touched)
    }

    fn issue_uncounted(
        &self,
        start: usize,
        data: &[T],
        accumulate: bool,
        mut touched: Touched,
    ) -> Result<Touched> {
        let pieces = self
            .map
            .pieces_after(start, data.len(), self.rank)
            .ok_or_else(|| self.out_of_range(start, data.len()))?;
        let mut pending = lock(&self.pending);
        for p in pieces {
            let at = pending.data.len();
            pending.data.extend_from_slice(&data[p.pos..p.pos + p.len]);
            pending.ops.push(PendingOp { target: p.rank, offset: p.offset, len: p.len, at, accumulate });
            touched = touched.add(p.rank);
        }
        self.queued.store(pending.ops.len(), Ordering::Release);
        Ok(touched)
    }

    /// Completes at their targets the writes issued to `touched`.
    pub(crate) fn complete_remote(&self, touched: Touched) -> Result<()> {
        match touched.targets() {
            Targets::None => {}
            Targets::One(t) => self.complete(Some(t)),
            Targets::Many => self.complete(None),
        }
        Ok(())
    }

    /// Runs the atomic `op` on global element `index`, ordered after this rank's outstanding
    /// writes to its owner (as MPI orders atomics after earlier operations), under the owner's
    /// lock for elements whose atomics are emulated.
    fn atomic<R>(&self, index: usize, op: impl FnOnce(&T::Atomic) -> R) -> Result<R> {
        self.world.count(self.rank);
        self.atomic_uncounted(index, op)
    }

    fn atomic_uncounted<R>(&self, index: usize, op: impl FnOnce(&T::Atomic) -> R) -> Result<R> {
        let (target, offset) = self.map.owner(index).ok_or_else(|| self.out_of_range(index, 1))?;
        self.apply(Some(target), true);
        let _held = T::LOCKED_ADD.then(|| lock(&self.locks[target]));
        Ok(op(&self.shards[target][offset]))
    }

    pub(crate) fn fetch_add(&self, index: usize, value: T) -> Result<T> {
        self.atomic(index, |a| T::atomic_fetch_add(a, value))
    }

    pub(crate) fn load(&self, index: usize) -> Result<T> {
        self.atomic(index, T::atomic_load_acquire)
    }

    /// Atomic loads of every element of `ranges` into `out`, issued back to back (counted as one
    /// round trip and the rest pipelined behind it).
    pub(crate) fn load_batch(&self, ranges: &[std::ops::Range<usize>], out: &mut [T]) -> Result<()> {
        self.world.count_batch(self.rank, out.len());
        for (o, index) in out.iter_mut().zip(ranges.iter().flat_map(Clone::clone)) {
            *o = self.atomic_uncounted(index, T::atomic_load_acquire)?;
        }
        Ok(())
    }

    /// Counts `n` loads issued back to back, without issuing them (a serial world only).
    pub(crate) fn count_loads(&self, n: usize) {
        self.world.count_batch(self.rank, n);
    }

    pub(crate) fn swap(&self, index: usize, value: T) -> Result<T> {
        self.atomic(index, |a| T::atomic_swap(a, value))
    }

    pub(crate) fn compare_and_swap(&self, index: usize, current: T, new: T) -> Result<T> {
        self.atomic(index, |a| T::atomic_compare_swap(a, current, new))
    }

    pub(crate) fn flush(&self, target: usize) -> Result<()> {
        self.check_target(target)?;
        self.complete(Some(target));
        Ok(())
    }

    pub(crate) fn flush_all(&self) -> Result<()> {
        self.complete(None);
        Ok(())
    }

    /// See [`crate::Window::with_own_shard`]: the shard's atomics seen as plain elements.
    ///
    /// # Safety
    /// As there: no other access to this rank's shard while `f` runs.
    pub(crate) unsafe fn with_own_shard<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        const { assert!(size_of::<T::Atomic>() == size_of::<T>() && align_of::<T::Atomic>() >= align_of::<T>()) };
        let shard = &self.shards[self.rank];
        // SAFETY: the atomics have the size of `T` and at least its alignment (asserted above),
        // and every bit pattern is a valid `T` (`f32`, `f64`, `u64`), so the shard's memory is
        // `shard.len()` valid, aligned `T`s. Writing through a pointer derived from the shared
        // `&[T::Atomic]` is allowed: atomics are `UnsafeCell`s (interior mutability, as a mutex
        // hands out `&mut` to its data). Exclusive for the slice's life by the caller's contract:
        // no other thread touches the shard meanwhile, and the synchronizations before and after
        // (barriers: a mutex and a condition variable) order `f`'s accesses after the writes that
        // completed before it and before the accesses that follow.
        let own =
            unsafe { std::slice::from_raw_parts_mut(shard.as_ptr().cast::<T>().cast_mut(), shard.len()) };
        Ok(f(own))
    }

    /// Applies the pending writes to `target` (all targets if `None`), in issue order.
    fn complete(&self, target: Option<usize>) {
        self.apply(target, false);
    }

    /// Applies the pending writes to `target` (all if `None`; only accumulates if
    /// `accumulates_only`), in issue order.
    fn apply(&self, target: Option<usize>, accumulates_only: bool) {
        if self.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut guard = lock(&self.pending);
        let pending = &mut *guard;
        if pending.ops.is_empty() {
            return;
        }
        let data = &pending.data;
        // The accumulate lock is taken once per run of ops to one target, not once per op (a
        // push of 20k keys issues 20k ops to one or two targets).
        let mut held: Option<(usize, std::sync::MutexGuard<'_, ()>)> = None;
        let mut write = |op: &PendingOp| {
            let dst = &self.shards[op.target][op.offset..op.offset + op.len];
            let src = &data[op.at..op.at + op.len];
            if op.accumulate && T::LOCKED_ADD {
                if held.as_ref().is_none_or(|(t, _)| *t != op.target) {
                    held = None;
                    held = Some((op.target, lock(&self.locks[op.target])));
                }
                for (d, &s) in dst.iter().zip(src) {
                    T::atomic_store(d, T::atomic_load(d).add(s));
                }
            } else {
                for (d, &s) in dst.iter().zip(src) {
                    if op.accumulate {
                        T::atomic_fetch_add(d, s);
                    } else {
                        T::atomic_store(d, s);
                    }
                }
            }
        };
        if target.is_none() && !accumulates_only {
            pending.ops.iter().for_each(&mut write);
            pending.ops.clear();
        } else {
            pending.ops.retain(|op| {
                if target.is_some_and(|t| t != op.target) || (accumulates_only && !op.accumulate) {
                    return true;
                }
                write(op);
                false
            });
        }
        drop(held);
        if pending.ops.is_empty() {
            pending.data.clear();
        }
        self.queued.store(pending.ops.len(), Ordering::Release);
    }

    pub(crate) fn free(self) -> Result<()> {
        self.complete(None);
        // Collective, as MPI_Win_free: nobody's memory goes away while a peer may still use it.
        // (In a serial world the shards live as long as any rank's view of them.)
        self.world.barrier(self.rank, "window free")
    }
}

impl<T: Elem> Drop for LocalWindow<T> {
    fn drop(&mut self) {
        // As MPI_Win_unlock_all: whatever this rank issued completes.
        self.complete(None);
    }
}
