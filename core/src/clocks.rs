//! One-sided clocks and progress words: no coordinator, every rank reads the others' words
//! itself. The schemes ([`crate::scheme`]) decide from them when to wait.
//!
//! - `clocks`: one `u64` per rank, the number of iterations whose update the rank has pushed and
//!   flushed. BSP waits for every clock to reach `t + 1` before reading for `t + 1`; SSP(s) waits
//!   until the slowest is at least `t + 1 - s`; ASP never waits.
//! - `progress`: one [`Progress`] word per rank for its current iteration (tag = iteration mod
//!   2^16): how many of its chunks exist and how many are computed, by it or by whoever took them
//!   over. Lining up (BSP with taking over) pushes only once every rank's chunks of `t` are done:
//!   a rank taking over chunks reads the parameters of `t` after others finished computing, and
//!   nobody may have changed them yet.
//! - `held`: for each rank, one `u64` per other rank: how many of its chunks that rank has taken
//!   over and not finished. A rank waiting for another's chunks learns from it who is computing
//!   them: the owner itself, or a rank that took them over (a straggler may take chunks over
//!   too, when its own were all taken before it started).
//!
//! All reads of these words race with atomic updates, so they are atomic loads too.

use std::time::{Duration, Instant};

use peregrine_transport::{Result, ShardMap, Transport, Window};

use crate::words::Progress;

/// The clock and progress words of every rank.
#[derive(Debug)]
pub struct Clocks {
    clocks: Window<u64>,
    progress: Window<u64>,
    held: Window<u64>,
    rank: usize,
    world: usize,
}

impl Clocks {
    /// Collective: all clocks at 0, every progress word tagged as no iteration that is about to
    /// start (a zero word would read as "iteration 0: all of its 0 chunks done" on a rank that
    /// has not announced iteration 0 yet, letting others push before it pulled).
    pub fn new(t: &Transport) -> Result<Self> {
        let world = t.world_size();
        let map = ShardMap::from_lens(vec![1; world]);
        let c = Self {
            clocks: t.alloc_window("clocks", &map)?,
            progress: t.alloc_window("progress", &map)?,
            held: t.alloc_window("chunks held", &ShardMap::from_lens(vec![world; world]))?,
            rank: t.rank(),
            world,
        };
        c.progress.swap(c.rank, Progress::NONE)?;
        t.barrier()?;
        Ok(c)
    }

    /// Sets this rank's clock to `iterations` done (a run resumed from a checkpoint).
    pub fn resume(&self, iterations: u64) -> Result<()> {
        self.clocks.swap(self.rank, iterations).map(drop)
    }

    /// Records that this rank's update of its current iteration is pushed; returns the new clock.
    pub fn tick(&self) -> Result<u64> {
        Ok(self.clocks.fetch_add(self.rank, 1)? + 1)
    }

    /// The clock of `rank`.
    pub fn clock(&self, rank: usize) -> Result<u64> {
        self.clocks.load(rank)
    }

    /// Every rank's clock, read in one batch (one round trip, not one per rank).
    pub fn clocks(&self) -> Result<Vec<u64>> {
        let mut out = vec![0; self.world];
        self.clocks.load_range(0, &mut out)?;
        Ok(out)
    }

    /// Announces this rank's iteration tagged `tag` with `chunks` chunks, none done.
    pub fn start(&self, tag: u16, chunks: u32) -> Result<()> {
        self.progress.swap(self.rank, Progress { tag, total: chunks, done: 0 }.pack()).map(drop)
    }

    /// Records `n` more of `rank`'s chunks done.
    pub fn done(&self, rank: usize, n: u32) -> Result<()> {
        self.progress.fetch_add(rank, u64::from(n)).map(drop)
    }

    /// Records that this rank takes over `n` of `owner`'s chunks, to compute them now; they are
    /// counted done (and no longer held) by [`done_taken`](Self::done_taken).
    pub fn taking(&self, owner: usize, n: u32) -> Result<()> {
        self.held.fetch_add(owner * self.world + self.rank, u64::from(n)).map(drop)
    }

    /// Records `n` of `owner`'s chunks, taken over by this rank, done.
    pub fn done_taken(&self, owner: usize, n: u32) -> Result<()> {
        self.done(owner, n)?;
        // Minus `n`, wrapping (the word never goes below zero: `taking` added it first).
        self.held.fetch_add(owner * self.world + self.rank, u64::from(n).wrapping_neg()).map(drop)
    }

    /// The first rank other than `owner` computing chunks of `owner`'s that it took over, if any
    /// (one batch: one round trip).
    pub fn holder(&self, owner: usize) -> Result<Option<usize>> {
        let mut words = vec![0; self.world];
        self.held.load_range(owner * self.world, &mut words)?;
        Ok(words.iter().enumerate().position(|(r, &n)| r != owner && n > 0))
    }

    /// `rank`'s current iteration: its tag, chunks and chunks done.
    pub fn progress(&self, rank: usize) -> Result<Progress> {
        Ok(Progress::unpack(self.progress.load(rank)?))
    }

    /// Whether every rank has started the iteration tagged `tag` and all its chunks are done.
    /// Every progress word is read in one batch.
    pub fn all_done(&self, tag: u16) -> Result<bool> {
        Ok(self.first_not_done(tag)?.is_none())
    }

    /// The first rank that has not started the iteration tagged `tag` or whose chunks of it are
    /// not all done (`None`: every rank is done). Every progress word is read in one batch.
    pub fn first_not_done(&self, tag: u16) -> Result<Option<usize>> {
        let mut words = vec![0; self.world];
        self.progress.load_range(0, &mut words)?;
        Ok(words.into_iter().map(Progress::unpack).position(|p| p.tag != tag || p.done < p.total))
    }

    /// Collective: frees the windows.
    pub fn free(self) -> Result<()> {
        self.clocks.free()?;
        self.progress.free()?;
        self.held.free()
    }
}

/// Polls spun before yielding the core.
const SPIN_POLLS: u32 = 64;
/// Polls (spun or yielded) before sleeping between polls.
const YIELD_POLLS: u32 = 4096;
/// The sleep between polls after that.
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// Polls `ready` until it says yes: a short spin, then yielding the core (ranks may share cores),
/// then short sleeps. Returns the time spent.
pub fn wait_until<E>(
    mut ready: impl FnMut() -> std::result::Result<bool, E>,
) -> std::result::Result<Duration, E> {
    let t0 = Instant::now();
    let mut polls = 0u32;
    while !ready()? {
        polls += 1;
        if polls < SPIN_POLLS {
            std::hint::spin_loop();
        } else if polls < YIELD_POLLS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(POLL_SLEEP);
        }
    }
    Ok(t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_chunks_done_by_anyone() {
        peregrine_transport::run_local(3, |t| -> Result<()> {
            let c = Clocks::new(&t)?;
            let mine = 3 + t.rank() as u32;
            c.start(9, mine)?;
            t.barrier()?;
            assert!(!c.all_done(9)?);
            // Every rank marks one chunk of every rank done, then each its own remaining ones.
            for r in 0..3 {
                c.done(r, 1)?;
            }
            t.barrier()?;
            c.done(t.rank(), mine - 3)?;
            t.barrier()?;
            assert_eq!(c.progress(t.rank())?, Progress { tag: 9, total: mine, done: mine });
            assert!(c.all_done(9)?);
            // Rank 2 takes over two of rank 0's chunks: held by it until they are done.
            assert_eq!(c.holder(0)?, None);
            t.barrier()?;
            if t.rank() == 2 {
                c.taking(0, 2)?;
            }
            t.barrier()?;
            assert_eq!(c.holder(0)?, Some(2));
            assert_eq!(c.holder(1)?, None);
            t.barrier()?;
            if t.rank() == 2 {
                c.done_taken(0, 2)?;
            }
            t.barrier()?;
            assert_eq!(c.holder(0)?, None);
            assert_eq!(c.progress(0)?.done, 5);
            assert!(!c.all_done(10)?);
            assert_eq!(c.tick()?, 1);
            t.barrier()?;
            assert_eq!(c.clocks()?, vec![1; 3]);
            t.barrier()?;
            c.free()
        })
        .expect("world")
        .into_iter()
        .for_each(|r| r.expect("rank"));
    }
}
