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

use std::ops::Range;

use peregrine_transport::{Result, ShardMap, Transport, Window};

use crate::words::Queue;
pub use crate::words::{tag, MAX_CHUNKS};

/// The chunk queues of all ranks. Shared by reference between a rank's threads.
#[derive(Debug)]
pub struct ChunkQueues {
    window: Window<u64>,
    rank: usize,
    world: usize,
}

impl ChunkQueues {
    /// Collective: one (empty) queue per rank.
    pub fn new(t: &Transport) -> Result<Self> {
        let window = t.alloc_window("chunk queues", &ShardMap::from_lens(vec![1; t.world_size()]))?;
        Ok(Self { window, rank: t.rank(), world: t.world_size() })
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
        let n = self.window.len();
        let mut words = vec![0; n];
        self.window.load_range(0, &mut words)?;
        Ok(words.into_iter().map(Queue::unpack).collect())
    }

    /// Chunks left in `rank`'s queue.
    pub fn remaining(&self, rank: usize) -> Result<u32> {
        Ok(self.peek(rank)?.left())
    }

    /// Fills this rank's queue with chunks `0..chunks` for a new iteration. Other ranks must not
    /// take from it until they know it is filled (e.g. after a barrier).
    ///
    /// # Panics
    /// If `chunks > MAX_CHUNKS`.
    pub fn fill(&self, tag: u16, chunks: u32) -> Result<()> {
        assert!(chunks <= MAX_CHUNKS, "chunk queue: {chunks} chunks, at most {MAX_CHUNKS}");
        self.window.swap(self.rank, Queue { tag, head: 0, tail: chunks }.pack()).map(drop)
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

    /// Takes over, from the tail of `victim`'s queue, `fraction` of its remaining chunks (at least
    /// one, at most `max`): FlexRR takes half, Falcon enough to equalise projected finish times.
    /// Returns the tag of the iteration the chunks belong to with them.
    pub fn steal(&self, victim: usize, fraction: f64, max: u32) -> Result<Option<(u16, Range<u32>)>> {
        self.update(victim, |head, tail| {
            let left = tail.saturating_sub(head);
            let n = ((f64::from(left) * fraction).ceil() as u32).clamp(1, max.max(1)).min(left);
            (n > 0).then(|| (head, tail - n, tail - n..tail))
        })
    }

    /// Collective: frees the window.
    pub fn free(self) -> Result<()> {
        self.window.free()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                // Half of the 7 left, rounded up; then capped at 1.
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
