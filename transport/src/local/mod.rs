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
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::{Elem, ErrorKind, ReduceOp, Result, ShardMap};

mod window;
pub use window::LocalWindow;

/// State shared by all ranks of one in-process world.
#[derive(Debug)]
struct World {
    size: usize,
    sync: Mutex<SyncState>,
    wake: Condvar,
    /// One mailbox per rank for collectives: filled, then a barrier, then read, then a barrier.
    slots: Mutex<Vec<Option<Box<dyn Any + Send>>>>,
    /// A serial world's windows, if this is one.
    serial: Option<Mutex<Serial>>,
    /// A serial world's window operations per rank (a simulator charges them): round trips,
    /// and operations pipelined behind one.
    ops: Option<Vec<[std::sync::atomic::AtomicU64; 2]>>,
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

/// What every rank's view of one window shares: its layout, element type, shards and locks.
type Shared<T> =
    (ShardMap, crate::ElemKind, Arc<[Arc<[<T as Elem>::Atomic]>]>, Arc<[Arc<std::sync::Mutex<()>>]>);

#[derive(Debug)]
struct SyncState {
    arrived: usize,
    generation: u64,
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

    /// Every rank contributes `value`; every rank gets all contributions, in rank order.
    fn allgather<V: Clone + Send + 'static>(
        &self,
        rank: usize,
        op: &'static str,
        value: V,
    ) -> Result<Vec<V>> {
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
        lock(&self.slots)[rank] = Some(Box::new(value));
        self.barrier(rank, op)?;
        let all: Option<Vec<V>> = lock(&self.slots)
            .iter()
            .map(|s| s.as_ref().and_then(|b| b.downcast_ref::<V>()).cloned())
            .collect();
        self.barrier(rank, op)?;
        all.ok_or_else(|| {
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
        self.world.wake.notify_all();
    }
}

/// Creates an in-process world of `world_size` ranks; element `r` is rank `r`.
///
/// Each rank is meant to run on its own thread (see [`crate::run_local`]).
pub fn world(world_size: usize) -> Result<Vec<LocalRank>> {
    make(world_size, false)
}

/// Creates a serial world of `world_size` ranks, all driven by the calling thread (see the module
/// docs): barriers return at once, windows are allocated by the first rank to ask, and
/// `allreduce` and `broadcast` are errors.
pub fn serial_world(world_size: usize) -> Result<Vec<LocalRank>> {
    make(world_size, true)
}

fn make(world_size: usize, serial: bool) -> Result<Vec<LocalRank>> {
    if world_size == 0 {
        return Err(ErrorKind::EmptyWorld(world_size).into());
    }
    let world = Arc::new(World {
        size: world_size,
        sync: Mutex::new(SyncState { arrived: 0, generation: 0, exited: None }),
        wake: Condvar::new(),
        slots: Mutex::new(if serial { Vec::new() } else { (0..world_size).map(|_| None).collect() }),
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
        let take = |i: usize| {
            self.world
                .ops
                .as_ref()
                .map_or(0, |o| o[self.rank][i].swap(0, std::sync::atomic::Ordering::Relaxed))
        };
        crate::Ops { trips: take(0), pipelined: take(1) }
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        self.world.barrier(self.rank, "barrier")
    }

    /// Nothing to do: a thread's window operations complete inside the call.
    pub(crate) fn progress(&self) -> Result<()> {
        Ok(())
    }

    pub(crate) fn allreduce<T: Elem>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let all = self.world.allgather(self.rank, "allreduce", data.to_vec())?;
        if let Some((r, v)) = all.iter().enumerate().find(|(_, v)| v.len() != data.len()) {
            return Err(ErrorKind::CollectiveMismatch {
                rank: self.rank,
                op: "allreduce",
                detail: format!(
                    "rank {} passed {} elements, rank {} passed {}",
                    self.rank,
                    data.len(),
                    r,
                    v.len()
                ),
            }
            .into());
        }
        // Reduce in rank order on every rank: the same result everywhere, bit for bit.
        for (i, x) in data.iter_mut().enumerate() {
            *x = all[1..].iter().fold(all[0][i], |acc, v| op.apply(acc, v[i]));
        }
        Ok(())
    }

    pub(crate) fn broadcast<T: Elem>(&self, data: &mut [T], root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let mine = (self.rank == root).then(|| data.to_vec());
        let all = self.world.allgather(self.rank, "broadcast", mine)?;
        match &all[root] {
            Some(v) if v.len() == data.len() => {
                data.copy_from_slice(v);
                Ok(())
            }
            Some(v) => Err(ErrorKind::CollectiveMismatch {
                rank: self.rank,
                op: "broadcast",
                detail: format!(
                    "root {root} sent {} elements, rank {} expects {}",
                    v.len(),
                    self.rank,
                    data.len()
                ),
            }
            .into()),
            None => Err(ErrorKind::CollectiveMismatch {
                rank: self.rank,
                op: "broadcast",
                detail: format!("rank {root} did not act as root"),
            }
            .into()),
        }
    }

    pub(crate) fn alloc_window<T: Elem>(&self, name: &str, map: &ShardMap) -> Result<LocalWindow<T>> {
        self.check_map(map)?;
        if let Some(serial) = &self.world.serial {
            return self.attach(serial, name, map);
        }
        // Each rank allocates (and so first-touches) its own shard, then all exchange them along
        // with what they asked for, so that a mismatch is reported on every rank.
        let shard: Arc<[T::Atomic]> =
            (0..map.len_of(self.rank)).map(|_| T::atomic_new(T::default())).collect();
        let lock = Arc::new(std::sync::Mutex::new(()));
        let all =
            self.world.allgather(self.rank, "window allocation", (map.clone(), T::KIND, shard, lock))?;
        if let Some((r, (other, kind, _, _))) =
            all.iter().enumerate().find(|(_, (m, k, _, _))| m != map || *k != T::KIND)
        {
            return Err(ErrorKind::WindowMismatch {
                rank: self.rank,
                window: name.to_owned(),
                detail: format!(
                    "rank {} asked for {} x {} in shards {:?}, rank {} for {} x {:?} in shards {:?}",
                    self.rank,
                    map.total(),
                    T::NAME,
                    (0..map.parts()).map(|p| map.len_of(p)).collect::<Vec<_>>(),
                    r,
                    other.total(),
                    kind,
                    (0..other.parts()).map(|p| other.len_of(p)).collect::<Vec<_>>(),
                ),
            }
            .into());
        }
        let (shards, locks): (Vec<_>, Vec<_>) = all.into_iter().map(|(_, _, s, l)| (s, l)).unzip();
        Ok(LocalWindow::new(self.world.clone(), self.rank, name, map.clone(), shards.into(), locks.into()))
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
            s.windows.push(Box::new((map.clone(), T::KIND, shards, locks)));
        }
        let Some((m, _, shards, locks)) =
            s.windows[k].downcast_ref::<Shared<T>>().filter(|(m, kind, _, _)| m == map && *kind == T::KIND)
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
