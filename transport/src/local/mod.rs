//! The `local` backend: ranks are threads of one process, shards are shared memory.
//!
//! It keeps the visibility rules of MPI passive-target RMA, so that a program which forgets a
//! flush fails here, under plain `cargo test`, and not only later on a cluster:
//! - `put` and `accumulate` are queued at the origin and reach the target's memory only at
//!   `flush(target)`, `flush_all`, `free`, or, for accumulates only, before a later atomic
//!   operation on the same target (MPI orders accumulate-family operations from one origin to one
//!   target, but not puts: a `put` then a `compare_and_swap` that releases a lock, with no flush
//!   between, loses the put here as it may under MPI);
//! - a barrier does not complete anything;
//! - `get`, `fetch_add` and `compare_and_swap` read the target's memory at once (they return data,
//!   so they are complete when they return, as after `MPI_Win_flush_local`).
//!
//! Elements are stored in atomics of their size, so concurrent operations from many ranks are data
//! race free; each element update is atomic, as MPI guarantees for accumulates of one basic type.
//!
//! Collectives go through one mutex and condition variable per world. A rank whose [`LocalRank`]
//! is dropped (it returned, failed or panicked) has left the world: peers waiting in, or later
//! entering, a collective get [`ErrorKind::PeerExited`] instead of hanging.
//!
//! A **serial** world ([`serial_world`]) is driven by one thread that acts for every rank in turn
//! (a simulator stepping thousands of ranks in virtual time): nothing in it may block, so a
//! barrier returns at once (the driver orders the ranks' steps itself), a rank's `k`-th window
//! allocation attaches to the world's `k`-th window (made by the first rank to ask for it), and
//! the collectives that exchange data (`allreduce`, `broadcast`) are errors.

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::{Elem, ErrorKind, ReduceOp, Result, ShardMap};

mod window;
pub use window::LocalWindow;

/// A node's block of memory in the local backend, shared by the node's threads
/// ([`crate::NodeShared`]).
pub struct LocalNode<T: Elem> {
    block: Arc<Block<T>>,
    world: Arc<World>,
    rank: usize,
}

impl<T: Elem> std::fmt::Debug for LocalNode<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNode").field("len", &self.len()).field("rank", &self.rank).finish()
    }
}

impl<T: Elem> LocalNode<T> {
    pub(crate) fn len(&self) -> usize {
        self.block.cells.len()
    }

    pub(crate) fn as_ptr(&self) -> *mut T {
        // `UnsafeCell<T>` has the layout of `T`: the cells are a `[T]`.
        UnsafeCell::raw_get(self.block.cells.as_ptr())
    }

    pub(crate) fn counter(&self) -> &std::sync::atomic::AtomicU64 {
        &self.block.count
    }

    /// An error if a rank of this node left the world (the node barrier would wait for it for
    /// good).
    pub(crate) fn check_peers(&self) -> Result<()> {
        let layout = crate::NodeLayout::blocks(self.world.size, self.world.per_node, self.rank);
        let s = lock(&self.world.sync);
        match layout.ranks(layout.node()).find(|&r| s.left[r]) {
            Some(peer) => Err(ErrorKind::PeerExited { rank: self.rank, peer, op: "node barrier" }.into()),
            None => Ok(()),
        }
    }
}

/// A node's cells and barrier count.
struct Block<T> {
    cells: Box<[UnsafeCell<T>]>,
    count: std::sync::atomic::AtomicU64,
}

// SAFETY: the cells are only reached through `NodeShared::as_ptr`, whose users order their
// accesses by the node barrier (the type's contract); the block never moves or resizes.
unsafe impl<T: Send> Sync for Block<T> {}
// SAFETY: as above; the cells are plain `T`s (`Elem`: `Send`).
unsafe impl<T: Send> Send for Block<T> {}

impl<T: Elem> Block<T> {
    fn new(len: usize) -> Self {
        Self { cells: (0..len).map(|_| UnsafeCell::new(T::default())).collect(), count: Default::default() }
    }
}

/// State shared by all ranks of one in-process world.
#[derive(Debug)]
struct World {
    size: usize,
    /// Ranks per node ([`crate::NodeLayout::blocks`]).
    per_node: usize,
    sync: Mutex<SyncState>,
    wake: Condvar,
    /// The collectives' mailboxes ([`World::combine`]).
    mail: Mutex<Mail>,
    /// A serial world's windows, if this is one.
    serial: Option<Mutex<Serial>>,
    /// A serial world's window operations per rank (a simulator charges them): round trips,
    /// and operations pipelined behind one.
    ops: Option<Vec<[std::sync::atomic::AtomicU64; 2]>>,
}

/// One mailbox per rank for collectives, filled, then a barrier, then read, then a barrier; and
/// what the first rank to read made of them all, shared by every rank.
#[derive(Debug, Default)]
struct Mail {
    each: Vec<Option<Box<dyn Any + Send>>>,
    /// The combination of every rank's contribution to the current collective (an `Arc`), and
    /// how many ranks have taken their share of it.
    combined: Option<Box<dyn Any + Send>>,
    taken: usize,
}

/// The windows of a serial world, in allocation order, and how many each rank has allocated.
#[derive(Debug, Default)]
struct Serial {
    windows: Vec<Box<dyn Any + Send>>,
    allocated: Vec<usize>,
}

impl World {
    /// Counts one window operation (a get, a write, an atomic) by `rank`, in a serial world.
    #[inline]
    pub(super) fn count(&self, rank: usize) {
        self.count_batch(rank, 1);
    }

    /// Counts `n` operations by `rank` issued back to back before one completion: one round
    /// trip, `n - 1` pipelined behind it.
    #[inline]
    pub(super) fn count_batch(&self, rank: usize, n: usize) {
        if let Some(ops) = &self.ops {
            let b = crate::Ops::batch(n);
            ops[rank][0].fetch_add(b.trips, std::sync::atomic::Ordering::Relaxed);
            ops[rank][1].fetch_add(b.pipelined, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// What a rank that called another collective than its peers gets.
const DIFFERENT: &str = "ranks called different collectives or used different element types";

/// What every rank's view of one window shares: its layout, element type, shards and locks.
type Shared<T> =
    (Arc<ShardMap>, crate::ElemKind, Arc<[Arc<[<T as Elem>::Atomic]>]>, Arc<[Arc<std::sync::Mutex<()>>]>);

#[derive(Debug)]
struct SyncState {
    arrived: usize,
    generation: u64,
    /// Every rank that left the world.
    left: Vec<bool>,
    /// The first rank that left the world, if any.
    exited: Option<usize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking rank never leaves world state half-updated (every critical section is a few
    // plain assignments), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl World {
    fn barrier(&self, rank: usize, op: &'static str) -> Result<()> {
        if self.serial.is_some() {
            return Ok(());
        }
        let mut s = lock(&self.sync);
        if let Some(peer) = s.exited {
            return Err(ErrorKind::PeerExited { rank, peer, op }.into());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.size {
            s.arrived = 0;
            s.generation += 1;
            self.wake.notify_all();
            return Ok(());
        }
        loop {
            s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
            if s.generation != generation {
                return Ok(());
            }
            if let Some(peer) = s.exited {
                return Err(ErrorKind::PeerExited { rank, peer, op }.into());
            }
        }
    }

    /// Every rank contributes `value`; once all have, `combine` runs once, on the first rank to
    /// get there, over every rank's contribution in rank order (each taken out of its mailbox:
    /// `None` if a rank's is not a `V`, a rank that called another collective), and every rank
    /// gets a share of its result. No rank copies the others' contributions: a collective of
    /// `world` ranks over `len` elements each holds `world * len` elements in all, where a copy
    /// of every contribution on every rank held that much per rank (`world^2 * len`: 19 GB for
    /// an allreduce of a few words per rank at 512 ranks).
    fn combine<V: Send + 'static, C: Send + Sync + 'static>(
        &self,
        rank: usize,
        op: &'static str,
        value: V,
        combine: impl FnOnce(Vec<Option<V>>) -> C,
    ) -> Result<Arc<C>> {
        if self.serial.is_some() {
            return Err(ErrorKind::CollectiveMismatch {
                rank,
                op,
                detail:
                    "a serial world (one thread acting for every rank) cannot exchange data in a collective"
                        .into(),
            }
            .into());
        }
        {
            // Every rank has taken its share of the previous collective's result (they all
            // passed its last barrier): nothing of it may linger, even after a failure.
            let mut m = lock(&self.mail);
            m.each[rank] = Some(Box::new(value));
            (m.combined, m.taken) = (None, 0);
        }
        self.barrier(rank, op)?;
        let mine = {
            let mut m = lock(&self.mail);
            if m.combined.is_none() {
                let all =
                    m.each.iter_mut().map(|s| s.take().and_then(|b| b.downcast::<V>().ok()).map(|b| *b));
                let c: Arc<C> = Arc::new(combine(all.collect()));
                m.combined = Some(Box::new(c));
            }
            let mine = m.combined.as_ref().and_then(|b| b.downcast_ref::<Arc<C>>()).cloned();
            // The last rank to take its share empties the mailbox (a window's shards are not
            // kept alive by it once freed).
            m.taken += 1;
            if m.taken == self.size {
                m.combined = None;
                m.taken = 0;
            }
            mine
        };
        self.barrier(rank, op)?;
        mine.ok_or_else(|| {
            ErrorKind::CollectiveMismatch {
                rank,
                op,
                detail: "ranks called different collectives or used different element types".into(),
            }
            .into()
        })
    }
}

/// One rank of an in-process world. Dropping it means the rank has left the world.
#[derive(Debug)]
pub struct LocalRank {
    world: Arc<World>,
    rank: usize,
}

impl Drop for LocalRank {
    fn drop(&mut self) {
        let mut s = lock(&self.world.sync);
        s.exited.get_or_insert(self.rank);
        s.left[self.rank] = true;
        self.world.wake.notify_all();
    }
}

/// Creates an in-process world of `world_size` ranks; element `r` is rank `r`.
///
/// Each rank is meant to run on its own thread (see [`crate::run_local`]).
pub fn world(world_size: usize) -> Result<Vec<LocalRank>> {
    make(world_size, world_size, false)
}

/// [`world`], its ranks in nodes of `per_node` consecutive ranks ([`crate::NodeLayout::blocks`]):
/// what [`crate::Transport::node_layout`] reports and [`crate::Transport::alloc_node_shared`]
/// shares, to run what several nodes do in one process.
pub fn world_in_nodes(world_size: usize, per_node: usize) -> Result<Vec<LocalRank>> {
    make(world_size, per_node.clamp(1, world_size.max(1)), false)
}

/// Creates a serial world of `world_size` ranks, all driven by the calling thread (see the module
/// docs): barriers return at once, windows are allocated by the first rank to ask, and
/// `allreduce` and `broadcast` are errors.
pub fn serial_world(world_size: usize) -> Result<Vec<LocalRank>> {
    make(world_size, world_size, true)
}

fn make(world_size: usize, per_node: usize, serial: bool) -> Result<Vec<LocalRank>> {
    if world_size == 0 {
        return Err(ErrorKind::EmptyWorld(world_size).into());
    }
    let world = Arc::new(World {
        size: world_size,
        per_node,
        sync: Mutex::new(SyncState {
            arrived: 0,
            generation: 0,
            left: vec![false; world_size],
            exited: None,
        }),
        wake: Condvar::new(),
        mail: Mutex::new(Mail {
            each: if serial { Vec::new() } else { (0..world_size).map(|_| None).collect() },
            ..Mail::default()
        }),
        serial: serial.then(|| Mutex::new(Serial { windows: Vec::new(), allocated: vec![0; world_size] })),
        ops: serial.then(|| (0..world_size).map(|_| Default::default()).collect()),
    });
    Ok((0..world_size).map(|rank| LocalRank { world: world.clone(), rank }).collect())
}

impl LocalRank {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world.size
    }

    /// In a serial world, the window operations (gets, writes, atomics) this rank issued since
    /// the last call; 0 elsewhere.
    pub fn take_ops(&self) -> crate::Ops {
        // A load first: most calls find nothing counted, and a swap is a locked instruction.
        let take = |i: usize| {
            self.world.ops.as_ref().map_or(0, |o| {
                let c = &o[self.rank][i];
                if c.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    0
                } else {
                    c.swap(0, std::sync::atomic::Ordering::Relaxed)
                }
            })
        };
        crate::Ops { trips: take(0), pipelined: take(1) }
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        self.world.barrier(self.rank, "barrier")
    }

    /// The world's nodes as this rank sees them.
    pub(crate) fn node_layout(&self) -> crate::NodeLayout {
        crate::NodeLayout::blocks(self.world.size, self.world.per_node, self.rank)
    }

    /// Collective: one zeroed block of `len` elements per node, this rank's node's returned.
    pub(crate) fn alloc_node_shared<T: Elem>(&self, len: usize) -> Result<LocalNode<T>> {
        let per_node = self.world.per_node;
        // Each node's block as long as its ranks ask (the same on every rank of a node).
        let blocks = self.world.combine(self.rank, "node block", len, |lens| {
            let lens: Option<Vec<usize>> = lens.into_iter().collect();
            let lens = lens?;
            let each: Vec<&[usize]> = lens.chunks(per_node).collect();
            each.iter()
                .all(|node| node.iter().all(|l| *l == node[0]))
                .then(|| each.iter().map(|node| Arc::new(Block::<T>::new(node[0]))).collect::<Vec<_>>())
        })?;
        let Some(blocks) = blocks.as_ref() else {
            return Err(
                self.mismatch("node block", "ranks of a node asked for node blocks of different lengths")
            );
        };
        Ok(LocalNode {
            block: blocks[self.rank / per_node].clone(),
            world: self.world.clone(),
            rank: self.rank,
        })
    }

    /// Nothing to do: a thread's window operations complete inside the call.
    pub(crate) fn progress(&self) -> Result<()> {
        Ok(())
    }

    pub(crate) fn allreduce<T: Elem>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        // Reduced once, in rank order: the same result on every rank, bit for bit.
        let reduced = self.world.combine(self.rank, "allreduce", data.to_vec(), |all| {
            let all: Vec<Vec<T>> = all.into_iter().collect::<Option<_>>().ok_or(DIFFERENT)?;
            let len = all[0].len();
            if let Some((r, v)) = all.iter().enumerate().find(|(_, v)| v.len() != len) {
                return Err(format!("rank 0 passed {len} elements, rank {r} passed {}", v.len()).into());
            }
            let mut all = all.into_iter();
            let mut acc = all.next().unwrap_or_default();
            for v in all {
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = op.apply(*a, x);
                }
            }
            Ok::<_, std::borrow::Cow<'static, str>>(acc)
        })?;
        match &*reduced {
            Ok(v) => {
                data.copy_from_slice(v);
                Ok(())
            }
            Err(detail) => Err(self.mismatch("allreduce", detail)),
        }
    }

    pub(crate) fn broadcast<T: Elem>(&self, data: &mut [T], root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let mine = (self.rank == root).then(|| data.to_vec());
        // Every rank's contribution must be a broadcast's, as for the other collectives.
        let sent = self.world.combine(self.rank, "broadcast", mine, |mut all| {
            if all.iter().any(Option::is_none) {
                None
            } else {
                all.swap_remove(root)
            }
        })?;
        match &*sent {
            Some(Some(v)) if v.len() == data.len() => {
                data.copy_from_slice(v);
                Ok(())
            }
            Some(Some(v)) => Err(self.mismatch(
                "broadcast",
                &format!("root {root} sent {} elements, rank {} expects {}", v.len(), self.rank, data.len()),
            )),
            Some(None) => Err(self.mismatch("broadcast", &format!("rank {root} did not act as root"))),
            None => Err(self.mismatch("broadcast", DIFFERENT)),
        }
    }

    fn mismatch(&self, op: &'static str, detail: &str) -> crate::Error {
        ErrorKind::CollectiveMismatch { rank: self.rank, op, detail: detail.to_owned() }.into()
    }

    pub(crate) fn alloc_window<T: Elem>(&self, name: &str, map: &ShardMap) -> Result<LocalWindow<T>> {
        self.check_map(map)?;
        if let Some(serial) = &self.world.serial {
            return self.attach(serial, name, map);
        }
        // Each rank allocates (and so first-touches) its own shard; the first rank to read them
        // all checks that every rank asked for the same window (a mismatch is then reported on
        // every rank) and makes the one list of shards every rank's view shares.
        let shard: Arc<[T::Atomic]> =
            (0..map.len_of(self.rank)).map(|_| T::atomic_new(T::default())).collect();
        let lock = Arc::new(std::sync::Mutex::new(()));
        let made = self.world.combine(self.rank, "window allocation", (map.clone(), T::KIND, shard, lock), |all| {
            let Some(all) = all.into_iter().collect::<Option<Vec<_>>>() else {
                return Err(DIFFERENT.to_owned());
            };
            let (first, kind) = (&all[0].0, all[0].1);
            if let Some((r, (other, other_kind, _, _))) =
                all.iter().enumerate().find(|(_, (m, k, _, _))| m != first || *k != kind)
            {
                let lens = |m: &ShardMap| (0..m.parts()).map(|p| m.len_of(p)).collect::<Vec<_>>();
                return Err(format!(
                    "rank 0 asked for {} x {kind:?} in shards {:?}, rank {r} for {} x {other_kind:?} in shards {:?}",
                    first.total(),
                    lens(first),
                    other.total(),
                    lens(other),
                ));
            }
            let mut all = all.into_iter();
            let (map, _, shard, lock) = all.next().expect("a world has at least one rank");
            let (shards, locks): (Vec<_>, Vec<_>) =
                std::iter::once((shard, lock)).chain(all.map(|(_, _, s, l)| (s, l))).unzip();
            Ok::<Shared<T>, String>((Arc::new(map), kind, shards.into(), locks.into()))
        })?;
        match &*made {
            Ok((map, _, shards, locks)) => Ok(LocalWindow::new(
                self.world.clone(),
                self.rank,
                name,
                map.clone(),
                shards.clone(),
                locks.clone(),
            )),
            Err(detail) => Err(ErrorKind::WindowMismatch {
                rank: self.rank,
                window: name.to_owned(),
                detail: detail.clone(),
            }
            .into()),
        }
    }

    /// A serial world's allocation: this rank's next window, made now if no rank has asked for
    /// it yet.
    fn attach<T: Elem>(&self, serial: &Mutex<Serial>, name: &str, map: &ShardMap) -> Result<LocalWindow<T>> {
        let mut s = lock(serial);
        let k = s.allocated[self.rank];
        s.allocated[self.rank] += 1;
        if k == s.windows.len() {
            let shards: Arc<[Arc<[T::Atomic]>]> = (0..map.parts())
                .map(|r| (0..map.len_of(r)).map(|_| T::atomic_new(T::default())).collect())
                .collect();
            let locks: Arc<[_]> = (0..map.parts()).map(|_| Arc::new(std::sync::Mutex::new(()))).collect();
            s.windows.push(Box::new((Arc::new(map.clone()), T::KIND, shards, locks)));
        }
        let Some((m, _, shards, locks)) = s.windows[k]
            .downcast_ref::<Shared<T>>()
            .filter(|(m, kind, _, _)| **m == *map && *kind == T::KIND)
        else {
            return Err(ErrorKind::WindowMismatch {
                rank: self.rank,
                window: name.to_owned(),
                detail: format!(
                    "its allocation number {k} differs from the first rank's ({} x {})",
                    map.total(),
                    T::NAME
                ),
            }
            .into());
        };
        Ok(LocalWindow::new(self.world.clone(), self.rank, name, m.clone(), shards.clone(), locks.clone()))
    }

    fn check_rank(&self, what: &'static str, target: usize) -> Result<()> {
        if target >= self.world.size {
            return Err(
                ErrorKind::NoSuchRank { rank: self.rank, what, target, world_size: self.world.size }.into()
            );
        }
        Ok(())
    }

    fn check_map(&self, map: &ShardMap) -> Result<()> {
        if map.parts() != self.world.size {
            return Err(ErrorKind::ShardCount {
                rank: self.rank,
                parts: map.parts(),
                world_size: self.world.size,
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{run_local, Error, ErrorKind, ShardMap, Window};

    /// A rank's stores in place (between barriers) are what the others read after the next
    /// barrier, and the others' flushed accumulates are what it loads in place: the protocol
    /// `with_own_shard` asks of its caller, here for Miri's data-race and aliasing checks too.
    #[test]
    fn stores_in_place_between_barriers_reach_the_other_ranks() {
        let out = run_local(3, |t| -> crate::Result<(Vec<f32>, Vec<f32>)> {
            let n = t.world_size();
            let w: Window<f32> = t.alloc_window("w", &ShardMap::from_lens([2, 0, 3]))?;
            w.accumulate(0, &[1.0; 5])?;
            w.flush_all()?;
            t.barrier()?;
            let rank = t.rank() as f32;
            // SAFETY: every accumulate was flushed before the barrier above; nobody touches the
            // window again before the barrier below.
            let seen = unsafe {
                w.with_own_shard(|own| {
                    let seen = own.to_vec();
                    own.iter_mut().for_each(|x| *x += 10.0 * rank);
                    seen
                })
            }?;
            t.barrier()?;
            let mut all = vec![0.0; 5];
            w.get(0, &mut all)?;
            assert_eq!(n, 3);
            t.barrier()?;
            w.free()?;
            Ok((seen, all))
        })
        .expect("world");
        for (r, o) in out.into_iter().enumerate() {
            let (seen, all) = o.expect("rank");
            assert_eq!(seen, vec![3.0; [2, 0, 3][r]], "rank {r} loads the sums in place");
            assert_eq!(all, [3.0, 3.0, 23.0, 23.0, 23.0], "rank {r} reads the stores in place");
        }
    }

    /// The visibility rule that makes a forgotten flush fail under `cargo test`.
    #[test]
    fn writes_reach_the_target_only_at_flush() {
        let seen = run_local(2, |t| -> crate::Result<Vec<f64>> {
            let w: Window<f64> = t.alloc_window("w", &ShardMap::from_lens([1, 1]))?;
            let mut seen = Vec::new();
            let mut x = [0.0];
            if t.rank() == 0 {
                w.put(1, &[3.0])?;
                w.accumulate(1, &[4.0])?;
            }
            t.barrier()?; // does not complete rank 0's writes
            if t.rank() == 1 {
                w.get(1, &mut x)?;
                seen.push(x[0]);
            }
            t.barrier()?;
            if t.rank() == 0 {
                w.flush(0)?; // not the target: completes nothing for rank 1
            }
            t.barrier()?;
            if t.rank() == 1 {
                w.get(1, &mut x)?;
                seen.push(x[0]);
            }
            t.barrier()?;
            if t.rank() == 0 {
                w.flush(1)?;
            }
            t.barrier()?;
            if t.rank() == 1 {
                w.get(1, &mut x)?;
                seen.push(x[0]);
            }
            w.free()?;
            Ok(seen)
        })
        .expect("world of 2");
        assert_eq!(seen[1].as_ref().expect("rank 1 ran"), &[0.0, 0.0, 7.0]);
    }

    #[test]
    fn atomics_see_earlier_writes_to_the_same_target() {
        let r = run_local(1, |t| -> crate::Result<u64> {
            let w: Window<u64> = t.alloc_window("w", &ShardMap::from_lens([1]))?;
            w.accumulate(0, &[5])?;
            w.fetch_add(0, 1) // ordered after the accumulate, as MPI orders them
        })
        .expect("world of 1");
        assert_eq!(r[0].as_ref().expect("rank 0 ran"), &5);
    }

    #[test]
    fn puts_are_not_completed_by_atomics() {
        let r = run_local(1, |t| -> crate::Result<[u64; 2]> {
            let w: Window<u64> = t.alloc_window("w", &ShardMap::from_lens([2]))?;
            w.put(1, &[9])?;
            w.compare_and_swap(0, 0, 1)?; // e.g. releasing a lock without flushing first
            let mut before = [0];
            w.get(1, &mut before)?;
            w.flush(0)?;
            let mut after = [0];
            w.get(1, &mut after)?;
            Ok([before[0], after[0]])
        })
        .expect("world of 1");
        assert_eq!(r[0].as_ref().expect("rank 0 ran"), &[0, 9]);
    }

    #[test]
    fn a_rank_that_leaves_does_not_hang_its_peers() {
        let r = run_local(3, |t| if t.rank() == 1 { Ok(()) } else { t.barrier() }).expect("world of 3");
        assert!(r[1].is_ok());
        for rank in [0, 2] {
            let kind = r[rank].as_ref().err().map(|e| e.kind());
            assert!(
                matches!(kind, Some(ErrorKind::PeerExited { peer: 1, .. })),
                "rank {rank}: {:?}",
                r[rank]
            );
        }
    }

    #[test]
    fn a_panicking_rank_is_reported_and_peers_return() {
        let caught = std::panic::catch_unwind(|| {
            run_local(2, |t| {
                if t.rank() == 0 {
                    panic!("rank 0 fails");
                }
                t.barrier()
            })
        });
        assert!(caught.is_err(), "the panic of rank 0 is resumed by run_local");
    }

    #[test]
    fn a_serial_world_is_driven_by_one_thread() {
        let ranks: Vec<crate::Transport> =
            super::serial_world(3).expect("world").into_iter().map(crate::Transport::Local).collect();
        let map = ShardMap::from_lens([1, 1, 1]);
        // Each rank's first allocation is one window; a barrier does not block.
        let w: Vec<Window<u64>> =
            ranks.iter().map(|t| t.alloc_window("w", &map)).collect::<Result<_, _>>().expect("alloc");
        ranks[0].barrier().expect("barrier returns at once");
        assert_eq!(w[0].fetch_add(2, 5).expect("add"), 0);
        assert_eq!(w[2].load(2).expect("load"), 5, "rank 2 sees rank 0's atomic on its shard");
        w[1].put(0, &[7]).expect("put");
        assert_eq!(w[0].load(0).expect("load"), 0, "a put is not visible before its flush");
        w[1].flush(0).expect("flush");
        assert_eq!(w[0].load(0).expect("load"), 7);
        // The second allocation differs between ranks: an error naming the window.
        let a: Window<u64> = ranks[0].alloc_window("v", &ShardMap::from_lens([2, 0, 0])).expect("first");
        let e = ranks[1].alloc_window::<u64>("v", &ShardMap::from_lens([1, 1, 0])).expect_err("mismatch");
        assert!(matches!(e.kind(), ErrorKind::WindowMismatch { rank: 1, .. }), "{e}");
        let e = ranks[0].allreduce(&mut [1u64], crate::ReduceOp::Sum).expect_err("no exchange");
        assert!(e.to_string().contains("serial world"), "{e}");
        a.free().expect("free");
        for w in w {
            w.free().expect("free");
        }
    }

    #[test]
    fn empty_world_is_an_error() {
        let r = run_local(0, |_| ());
        assert!(matches!(r.map_err(Error::into_kind), Err(ErrorKind::EmptyWorld(0))));
    }
}
