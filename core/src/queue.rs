//! Chunk queues in a window: every rank's mini-batch chunks of an iteration, taken by its own
//! threads from the head and taken over by other ranks ("pioneers" stealing from stragglers) from
//! the tail, each chunk handed out exactly once.
//!
//! Each rank owns one `u64` word in a window: `tag << 48 | head << 24 | tail` over its chunk ids
//! `head..tail` of the iteration tagged `tag` (the iteration number modulo 2^16: a thief learns
//! which iteration the chunks it took belong to in the same atomic step, so it cannot mistake a
//! refilled queue for the one it looked at). Every change is a `compare_and_swap` of the whole word against the value last read, so each
//! hand-out is one atomic step on the word and no chunk can be handed out twice (or lost): the
//! owner advances `head`, a thief lowers `tail`, and whoever loses a race rereads and retries.
//! Reads are atomic loads (`MPI_NO_OP`): atomic with respect to the swaps, as MPI requires of
//! accesses that race with atomics (a plain `get` would not be). The word's layout is
//! [`crate::words::Queue`].
//!
//! ## Finding chunks to take over at scale
//! A rank out of chunks looks for a victim; reading every queue is O(N) per look. With a
//! staleness bound the queues keep a combining tree ([`crate::tree`]) of *drained* queues: the
//! take that empties a rank's queue of iteration `t` (its owner's or a thief's: the swap that
//! leaves nothing says so, exactly once) arrives for that rank at slot `t`, and a rank that
//! announces no chunks arrives when it fills. [`ChunkQueues::candidates`] descends from the root
//! through a node whose ranks have not all drained `t`, drawn at random among such children at
//! each level: `levels` batches of at most [`crate::tree::FAN`] words lead to the (at most 16)
//! ranks of one leaf node, whose queues the policy then reads. One slow rank among 4,096 is
//! found in three batches instead of one of 4,096 words. With many slow ranks the looks spread
//! over their nodes: a descent through the *first* such node made every thief crowd one node
//! while others held queued chunks (slack Falcon under disrupted machines, simulated at 128 ranks
//! of 32 threads: 11.6x Ideal, 4.0x with random paths). What it cannot see: a rank that has not
//! filled `t` yet counts as not drained (its queue is read and holds nothing of `t`).
//!
//! Without a staleness bound (ASP, DynSGD) there is no tree (its ring of slots needs the bound),
//! and past [`SAMPLE_ABOVE`] ranks a look reads the queues of one block of [`crate::tree::FAN`]
//! ranks drawn at random: O(1) words per look instead of N (below it, every queue). A victim is missed
//! by most looks, but not by most ranks: with `N` ranks of `T` threads looking as they run out,
//! each block is read by about `16 T` looks a round whatever `N` is, as in randomized work
//! stealing.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use peregrine_transport::{Result, ShardMap, Transport, Window};

use crate::tree::Tree;
use crate::words::Queue;
pub use crate::words::{tag, MAX_CHUNKS};

/// Worlds up to this many ranks read every queue per look without the tree. Simulated ASP with
/// taking over (16 threads a rank, 40 iterations; time per iteration against Ideal, every queue
/// read against one random block of 16): under a power law of stragglers (`alpha=4`) reading
/// every queue wins up to 2,048 ranks (512: 1.46x against 1.89x; 2,048: 1.88x against 2.03x),
/// the global choice of the victim with most left outweighing the cost of the reads; with one
/// rank at half speed or disrupted machines sampling wins from 1,024 ranks (1,024: 1.18x against
/// 1.03x and 1.77x against 1.58x); at 4,096 it wins in all three (power law 2.54x against
/// 2.06x), where a batch of every word is ~0.3 ms a look. Over the three, sampling is behind at
/// 512 ranks (geometric mean 1.45x against 1.33x), even at 1,024 (1.45x against 1.48x) and ahead
/// from 2,048 (1.50x against 1.74x).
pub const SAMPLE_ABOVE: usize = 1024;

/// Where the fewest ranks are read: the whole world up to this size (a batch of 64 words costs a
/// few round trips, ~5 us over InfiniBand, against chunks of ~200 us). Past it, speculative
/// execution reads the done tree for chunks to copy and a random block's rates for the fastest.
pub const READ_ALL_UP_TO: usize = 64;

/// A block of [`crate::tree::FAN`] ranks drawn at random, all ranks of a world of at most `FAN`:
/// the `b`-th block (`b * FAN ..`, the last block shorter), `b` drawn from `rank`, `it` and the
/// rank's `look` count (each block equally likely).
pub fn sampled(world: usize, rank: usize, it: u64, look: u64) -> Range<usize> {
    let fan = crate::tree::FAN;
    if world <= fan {
        return 0..world;
    }
    let blocks = world.div_ceil(fan) as u64;
    let b = (draw(rank, it, look) % blocks) as usize * fan;
    b..(b + fan).min(world)
}

/// A look's random draw: from the looking `rank`, the iteration `it` and the rank's `look`
/// count (the block of [`sampled`], the path of a tree's descent, [`crate::tree::Tree::missing`]).
pub fn draw(rank: usize, it: u64, look: u64) -> u64 {
    crate::plan::mix(crate::plan::mix(rank as u64 ^ (look << 20)) ^ it)
}

/// How many of `left` queued chunks a thief taking `fraction` of them takes: rounded to the
/// nearest, at least one, at most `max` (0 when none is left). Rounded up, the last thieves of an
/// iteration took two chunks each (a thread's share of 32 chunks left, 1.33) where one each would
/// end it a chunk sooner.
pub fn steal_count(left: u32, fraction: f64, max: u32) -> u32 {
    ((f64::from(left) * fraction).round() as u32).clamp(1, max.max(1)).min(left)
}

/// The chunk queues of all ranks. Shared by reference between a rank's threads.
#[derive(Debug)]
pub struct ChunkQueues {
    window: Window<u64>,
    /// Queues drained, per iteration (with a staleness bound).
    drained: Option<Tree>,
    /// The iteration this rank filled its queue for last (tags are read near it).
    current: AtomicU64,
    /// Looks without the tree so far (drawing their blocks).
    looks: AtomicU64,
    rank: usize,
    world: usize,
}

impl ChunkQueues {
    /// Collective: one (empty) queue per rank.
    pub fn new(t: &Transport) -> Result<Self> {
        Self::with_tree(t, None, 0)
    }

    /// Collective: one (empty) queue per rank, and with `staleness` (the most iterations ranks
    /// run apart, as [`crate::clocks::Reads::staleness`]) a tree of drained queues counting from
    /// iteration `start`.
    pub fn with_tree(t: &Transport, staleness: Option<u64>, start: u64) -> Result<Self> {
        let window = t.alloc_window("chunk queues", &ShardMap::from_lens(vec![1; t.world_size()]))?;
        let slots = crate::tree::slots_for(staleness);
        Ok(Self {
            window,
            drained: slots.map(|n| Tree::new(t, "drained tree", n, start)).transpose()?,
            current: AtomicU64::new(start),
            looks: AtomicU64::new(0),
            rank: t.rank(),
            world: t.world_size(),
        })
    }

    /// The ranks to look at for chunks of iteration `it` to take over: with the tree of drained
    /// queues, those of a leaf node some of whose ranks have not drained `it`, on a random path
    /// (empty if every rank has); else every rank, or past [`SAMPLE_ABOVE`] ranks a block of
    /// [`crate::tree::FAN`] drawn at random ([`sampled`]).
    pub fn candidates(&self, it: u64) -> Result<Range<usize>> {
        let look = || self.looks.fetch_add(1, Ordering::Relaxed);
        match &self.drained {
            Some(tree) => Ok(tree.missing(it, draw(self.rank, it, look()))?.unwrap_or(0..0)),
            None if self.world > SAMPLE_ABOVE => Ok(sampled(self.world, self.rank, it, look())),
            None => Ok(0..self.world),
        }
    }

    /// The queue words of `ranks`, read in one batch.
    pub fn peek_in(&self, ranks: Range<usize>) -> Result<Vec<Queue>> {
        let mut words = vec![0; ranks.len()];
        self.window.load_range(ranks.start, &mut words)?;
        Ok(words.into_iter().map(Queue::unpack).collect())
    }

    /// Number of queues (ranks).
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The current word of `rank`'s queue.
    pub fn peek(&self, rank: usize) -> Result<Queue> {
        Ok(Queue::unpack(self.window.load(rank)?))
    }

    /// The current word of every rank's queue, read in one batch.
    pub fn peek_all(&self) -> Result<Vec<Queue>> {
        self.peek_in(0..self.world)
    }

    /// Chunks left in `rank`'s queue.
    pub fn remaining(&self, rank: usize) -> Result<u32> {
        Ok(self.peek(rank)?.left())
    }

    /// Fills this rank's queue with chunks `0..chunks` of iteration `it` (with a tree of drained
    /// queues: iterations one after another from its start). Other ranks must not take from it
    /// until they know it is filled (e.g. after a barrier).
    ///
    /// # Panics
    /// If `chunks > MAX_CHUNKS`.
    pub fn fill(&self, it: u64, chunks: u32) -> Result<()> {
        assert!(chunks <= MAX_CHUNKS, "chunk queue: {chunks} chunks, at most {MAX_CHUNKS}");
        self.current.store(it, Ordering::Relaxed);
        self.window.swap(self.rank, Queue { tag: tag(it), head: 0, tail: chunks }.pack())?;
        match &self.drained {
            Some(tree) if chunks == 0 => tree.arrive(self.rank, it).map(drop),
            _ => Ok(()),
        }
    }

    /// Atomically updates `rank`'s word with `f(head, tail)` (`None`: nothing to take) and
    /// returns the queue's tag and what `f` decided.
    fn update(
        &self,
        rank: usize,
        f: impl Fn(u32, u32) -> Option<(u32, u32, Range<u32>)>,
    ) -> Result<Option<(u16, Range<u32>)>> {
        let mut cur = self.window.load(rank)?;
        loop {
            let Queue { tag, head, tail } = Queue::unpack(cur);
            let Some((h, t, taken)) = f(head, tail) else { return Ok(None) };
            let prev = self.window.compare_and_swap(rank, cur, Queue { tag, head: h, tail: t }.pack())?;
            if prev == cur {
                if let Some(tree) = self.drained.as_ref().filter(|_| h >= t) {
                    // This take emptied the queue: the one arrival for it.
                    tree.arrive(rank, crate::words::untag(tag, self.current.load(Ordering::Relaxed)))?;
                }
                return Ok(Some((tag, taken)));
            }
            cur = prev;
        }
    }

    /// Takes up to `max` chunks from the head of this rank's own queue.
    pub fn take_own(&self, max: u32) -> Result<Option<Range<u32>>> {
        let taken = self.update(self.rank, |head, tail| {
            let n = tail.saturating_sub(head).min(max);
            (n > 0).then(|| (head + n, tail, head..head + n))
        })?;
        Ok(taken.map(|(_, r)| r))
    }

    /// Takes over, from the tail of `victim`'s queue, [`steal_count`] of its remaining chunks:
    /// FlexRR takes half, Falcon enough to equalise projected finish times. Returns the tag of
    /// the iteration the chunks belong to with them.
    pub fn steal(&self, victim: usize, fraction: f64, max: u32) -> Result<Option<(u16, Range<u32>)>> {
        self.update(victim, |head, tail| {
            let n = steal_count(tail.saturating_sub(head), fraction, max);
            (n > 0).then(|| (head, tail - n, tail - n..tail))
        })
    }

    /// Collective: frees the windows.
    pub fn free(self) -> Result<()> {
        self.window.free()?;
        match self.drained {
            Some(tree) => tree.free(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampled_look_reads_a_random_block_of_16() {
        assert_eq!(sampled(16, 3, 7, 0), 0..16);
        assert_eq!(sampled(1, 0, 0, 9), 0..1);
        // 100 ranks: blocks of 16 from 0, the last of 4; each drawn about as often.
        let mut seen = [0u32; 7];
        for look in 0..7000 {
            let b = sampled(100, 5, 42, look);
            assert_eq!(b.start % crate::tree::FAN, 0, "{b:?}");
            assert_eq!(b.end, (b.start + crate::tree::FAN).min(100), "{b:?}");
            seen[b.start / crate::tree::FAN] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        // Another rank, or the same rank in another iteration, draws another sequence.
        let draws = |rank, it| (0..32).map(|look| sampled(4096, rank, it, look).start).collect::<Vec<_>>();
        assert_ne!(draws(1, 5), draws(2, 5));
        assert_ne!(draws(1, 5), draws(1, 6));
    }

    #[test]
    fn owner_and_thief_split_a_queue() {
        let r = peregrine_transport::run_local(2, |t| -> Result<Vec<Range<u32>>> {
            let q = ChunkQueues::new(&t)?;
            q.fill(7, if t.rank() == 0 { 10 } else { 0 })?;
            t.barrier()?;
            let mut got = Vec::new();
            if t.rank() == 0 {
                got.extend(q.take_own(3)?);
            }
            t.barrier()?;
            if t.rank() == 1 {
                // Half of the 7 left (3.5, to the nearest: 4); then capped at 1.
                for (tag, r) in [q.steal(0, 0.5, 100)?, q.steal(0, 0.5, 1)?].into_iter().flatten() {
                    assert_eq!(tag, 7);
                    got.push(r);
                }
            }
            t.barrier()?;
            if t.rank() == 0 {
                while let Some(r) = q.take_own(2)? {
                    got.push(r);
                }
                assert_eq!(q.remaining(0)?, 0);
                assert_eq!(q.steal(0, 1.0, 5)?, None);
            }
            t.barrier()?;
            q.free()?;
            Ok(got)
        })
        .expect("world");
        let r0 = r[0].as_ref().expect("rank 0");
        let r1 = r[1].as_ref().expect("rank 1");
        assert_eq!(r0, &[0..3, 3..5]);
        assert_eq!(r1, &[6..10, 5..6]);
    }
}
