//! One-sided clocks and progress words: no coordinator, every rank reads the others' words
//! itself. The schemes ([`crate::scheme`]) decide from them when to wait.
//!
//! - `clocks`: one `u64` per rank, the number of iterations whose update the rank has pushed and
//!   flushed. BSP waits for every clock to reach `t + 1` before reading for `t + 1`; SSP(s) waits
//!   until the slowest is at least `t + 1 - s`; ASP never waits.
//! - `progress`: one [`ProgressWord`] word per rank for its current iteration (tag = iteration mod
//!   2^16): how many of its chunks exist and how many are computed, by it or by whoever took them
//!   over. Lining up (BSP with taking over) pushes only once every rank's chunks of `t` are done:
//!   a rank taking over chunks reads the parameters of `t` after others finished computing, and
//!   nobody may have changed them yet.
//! - `held`: for each rank, how many of its chunks other ranks have taken over and not finished,
//!   and the last rank that took some: a rank waiting for another's chunks learns from it who is
//!   computing them (a straggler may take chunks over too, when its own were all taken before
//!   it started). Two words per rank, O(N) in all.
//!
//! ## At scale: questions about every rank in one load
//! The waits ask about every rank: "is every clock at least `c`?", "are every rank's chunks of
//! `t` done?". Reading every rank's word to answer costs O(N) per poll. Where the policy bounds
//! how far clocks drift apart ([`Reads::staleness`]), both are kept in combining trees
//! ([`crate::tree`]) as well: a tick arrives at the clock tree's slot of the clock it leaves,
//! and whoever counts a rank's last chunk of `t` done (its owner, or a rank that took it over:
//! the add that fills the progress word says so, exactly once) arrives for it at the done tree's
//! slot `t`. A wait then polls one word, the root's; an arrival costs one atomic, up to
//! `levels` for the last arriver of each node. Every word is still there to read, when a wait
//! has lasted long enough that the watchdog wants a name (`Clocks::clocks`,
//! [`Clocks::first_not_done`]). A clock word carries [`PASSING`] while its rank passes its
//! arrival up the tree, so that a rank stopped mid-tree is named too.
//!
//! `version` (the sum of clocks: updates pushed so far, DynSGD's staleness measure) is one
//! counter on rank 0 that every tick adds to, kept only if the policy reads it.
//!
//! All reads of these words race with atomic updates, so they are atomic loads too.

use std::ops::Range;
use std::time::{Duration, Instant};

use peregrine_transport::{Result, ShardMap, Transport, Window};

use crate::tree::Tree;
use crate::words::{self, ProgressWord};

/// The bit of a clock word set while its rank passes its tick up the clock tree.
pub const PASSING: u64 = 1 << 63;

/// What the run's policy asks of the clocks: which aggregated words they keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// The most iterations a rank runs ahead of the slowest clock (`Some(0)`: BSP; `None`:
    /// unbounded): with a bound, "is every clock at least `c`" and "every rank's chunks of `t`
    /// done" are answered by combining trees; without one, by reading every word.
    pub staleness: Option<u64>,
    /// Whether ranks line up (wait until every rank's chunks of an iteration are done).
    pub lines_up: bool,
    /// Whether the policy reads the parameters' version (the sum of clocks).
    pub version: bool,
}

/// The clock and progress words of every rank.
#[derive(Debug)]
pub struct Clocks {
    clocks: Window<u64>,
    progress: Window<u64>,
    held: Window<u64>,
    /// "Every clock is past `c`", by the tick that left `c` (with a staleness bound).
    reached: Option<Tree>,
    /// "Every rank's chunks of `t` are done" (lining up, with a staleness bound).
    finished: Option<Tree>,
    /// Rank 0: updates pushed by every rank (when the policy reads the version).
    version: Option<Window<u64>>,
    /// Descents of the done tree so far (drawing their paths).
    looks: std::sync::atomic::AtomicU64,
    rank: usize,
    world: usize,
}

impl Clocks {
    /// Collective: all clocks at 0, every progress word tagged as no iteration that is about to
    /// start (a zero word would read as "iteration 0: all of its 0 chunks done" on a rank that
    /// has not announced iteration 0 yet, letting others push before it pulled). `start` is the
    /// run's first iteration (a resumed run's clocks are set to it by [`Clocks::resume`]).
    pub fn new(t: &Transport, reads: Reads, start: u64) -> Result<Self> {
        let world = t.world_size();
        let map = ShardMap::from_lens(vec![1; world]);
        let slots = crate::tree::slots_for(reads.staleness);
        let c = Self {
            clocks: t.alloc_window("clocks", &map)?,
            progress: t.alloc_window("progress", &map)?,
            held: t.alloc_window("chunks held", &ShardMap::from_lens(vec![2; world]))?,
            reached: slots.map(|n| Tree::new(t, "clock tree", n, start)).transpose()?,
            finished: slots
                .filter(|_| reads.lines_up)
                .map(|n| Tree::new(t, "done tree", n, start))
                .transpose()?,
            version: if reads.version {
                let lens = (0..world).map(|r| usize::from(r == 0));
                Some(t.alloc_window("version", &ShardMap::from_lens(lens))?)
            } else {
                None
            },
            looks: std::sync::atomic::AtomicU64::new(0),
            rank: t.rank(),
            world,
        };
        c.progress.swap(c.rank, ProgressWord::NONE)?;
        if let (Some(v), 0) = (&c.version, c.rank) {
            // The sum of the clocks a resumed run starts from.
            v.swap(0, world as u64 * start)?;
        }
        t.barrier()?;
        Ok(c)
    }

    /// Sets this rank's clock to `iterations` done (a run resumed from a checkpoint, whose
    /// clocks were made with `start = iterations`).
    pub fn resume(&self, iterations: u64) -> Result<()> {
        self.clocks.swap(self.rank, iterations).map(drop)
    }

    /// Records that this rank's update of its current iteration is pushed; returns the new clock.
    /// The version counts it first: whoever sees the clock reached sees the version include it.
    pub fn tick(&self) -> Result<u64> {
        if let Some(v) = &self.version {
            v.fetch_add(0, 1)?;
        }
        let c = match &self.reached {
            Some(tree) => {
                let c = self.clocks.fetch_add(self.rank, 1 + PASSING)? & !PASSING;
                tree.arrive(self.rank, c)?;
                self.clocks.fetch_add(self.rank, PASSING.wrapping_neg())?;
                c
            }
            None => self.clocks.fetch_add(self.rank, 1)?,
        };
        Ok(c + 1)
    }

    /// The clock of `rank`.
    pub fn clock(&self, rank: usize) -> Result<u64> {
        Ok(self.clocks.load(rank)? & !PASSING)
    }

    /// Every rank's clock word, read in one batch (one round trip, not one per rank); a word
    /// with [`PASSING`] set is its rank's, passing its last tick up the clock tree.
    pub fn clock_words(&self) -> Result<Vec<u64>> {
        let mut out = vec![0; self.world];
        self.clocks.load_range(0, &mut out)?;
        Ok(out)
    }

    /// Whether every rank's clock is at least `clock`: one load of the clock tree's root, or
    /// every clock read in one batch without a staleness bound.
    pub fn reached(&self, clock: u64) -> Result<bool> {
        match (&self.reached, clock) {
            (_, 0) => Ok(true),
            (Some(tree), c) => tree.complete(c - 1),
            (None, c) => Ok(self.clock_words()?.into_iter().all(|w| w & !PASSING >= c)),
        }
    }

    /// Whether [`reached`](Self::reached) is answered by the clock tree (else by reading every
    /// clock).
    pub fn tree(&self) -> bool {
        self.reached.is_some()
    }

    /// The rank whose tick completed "every clock at least `clock`", once it is (the one a
    /// rank waiting for it waited for longest): one load, with the clock tree.
    pub fn last_to_reach(&self, clock: u64) -> Result<Option<usize>> {
        match (&self.reached, clock) {
            (Some(tree), c) if c > 0 => tree.last(c - 1),
            _ => Ok(None),
        }
    }

    /// The rank whose chunks of `it` were the last to be done, once every rank's are: one load,
    /// with the done tree.
    pub fn last_done(&self, it: u64) -> Result<Option<usize>> {
        match &self.finished {
            Some(tree) => tree.last(it),
            None => Ok(None),
        }
    }

    /// Updates pushed by every rank so far: the sum of clocks (one load, when kept; else every
    /// clock read).
    pub fn version(&self) -> Result<u64> {
        match &self.version {
            Some(v) => v.load(0),
            None => Ok(self.clock_words()?.into_iter().map(|w| w & !PASSING).sum()),
        }
    }

    /// Announces this rank's iteration `it` with `chunks` chunks, none done (with none at all,
    /// they are all done at once).
    pub fn start(&self, it: u64, chunks: u32) -> Result<()> {
        let tag = words::tag(it);
        self.progress.swap(self.rank, ProgressWord { tag, total: chunks, done: 0 }.pack())?;
        match &self.finished {
            Some(tree) if chunks == 0 => tree.arrive(self.rank, it).map(drop),
            _ => Ok(()),
        }
    }

    /// Records `n` more of `rank`'s chunks done, of its iteration within 2^15 of `near`; the add
    /// that counts the last of them arrives for `rank` at the done tree.
    pub fn done(&self, rank: usize, n: u32, near: u64) -> Result<()> {
        let was = ProgressWord::unpack(self.progress.fetch_add(rank, u64::from(n))?);
        match &self.finished {
            Some(tree) if was.done < was.total && was.done + n >= was.total => {
                tree.arrive(rank, words::untag(was.tag, near)).map(drop)
            }
            _ => Ok(()),
        }
    }

    /// Records that this rank takes over `n` of `owner`'s chunks, to compute them now; they are
    /// counted done (and no longer held) by [`done_taken`](Self::done_taken).
    pub fn taking(&self, owner: usize, n: u32) -> Result<()> {
        self.held.fetch_add(2 * owner, u64::from(n))?;
        self.held.swap(2 * owner + 1, self.rank as u64 + 1).map(drop)
    }

    /// Records `n` of `owner`'s chunks of its iteration near `near`, taken over by this rank,
    /// done.
    pub fn done_taken(&self, owner: usize, n: u32, near: u64) -> Result<()> {
        self.done(owner, n, near)?;
        // Minus `n`, wrapping (the word never goes below zero: `taking` added it first).
        self.held.fetch_add(2 * owner, u64::from(n).wrapping_neg()).map(drop)
    }

    /// A rank other than `owner` computing chunks of `owner`'s that it took over, if any: the
    /// last one that took some while any are held (one batch of two words).
    pub fn holder(&self, owner: usize) -> Result<Option<usize>> {
        let mut words = [0; 2];
        self.held.load_range(2 * owner, &mut words)?;
        Ok(match words {
            [0, _] | [_, 0] => None,
            [_, taker] => Some(taker as usize - 1).filter(|&r| r != owner),
        })
    }

    /// `rank`'s current iteration: its tag, chunks and chunks done.
    pub fn progress(&self, rank: usize) -> Result<ProgressWord> {
        Ok(ProgressWord::unpack(self.progress.load(rank)?))
    }

    /// The progress words of `ranks`, read in one batch.
    pub fn progress_in(&self, ranks: Range<usize>) -> Result<Vec<ProgressWord>> {
        let mut words = vec![0; ranks.len()];
        self.progress.load_range(ranks.start, &mut words)?;
        Ok(words.into_iter().map(ProgressWord::unpack).collect())
    }

    /// Whether every rank has started iteration `it` and all its chunks are done: one load of
    /// the done tree's root, or every progress word read in one batch.
    pub fn all_done(&self, it: u64) -> Result<bool> {
        match &self.finished {
            Some(tree) => tree.complete(it),
            None => Ok(self.first_not_done(it)?.is_none()),
        }
    }

    /// The ranks to look at for chunks of `it` not yet done (copies to compute): past
    /// [`crate::queue::READ_ALL_UP_TO`] ranks with the done tree, those of a leaf node some of
    /// whose ranks are not done, found from the root down on a random path
    /// ([`Tree::missing`]; empty: all are done); else every rank.
    pub fn undone(&self, it: u64) -> Result<Range<usize>> {
        match &self.finished {
            Some(tree) if self.world > crate::queue::READ_ALL_UP_TO => {
                let look = self.looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(tree.missing(it, crate::queue::draw(self.rank, it, look))?.unwrap_or(0..0))
            }
            _ => Ok(0..self.world),
        }
    }

    /// The first rank that has not started iteration `it` or whose chunks of it are not all done
    /// (`None`: every rank is done). Every progress word is read in one batch.
    pub fn first_not_done(&self, it: u64) -> Result<Option<usize>> {
        let tag = words::tag(it);
        let mut words = vec![0; self.world];
        self.progress.load_range(0, &mut words)?;
        Ok(words.into_iter().map(ProgressWord::unpack).position(|p| p.tag != tag || p.done < p.total))
    }

    /// Collective: frees the windows.
    pub fn free(self) -> Result<()> {
        self.clocks.free()?;
        self.progress.free()?;
        self.held.free()?;
        for tree in [self.reached, self.finished].into_iter().flatten() {
            tree.free()?;
        }
        match self.version {
            Some(v) => v.free(),
            None => Ok(()),
        }
    }
}

/// Polls spun before yielding the core.
const SPIN_POLLS: u32 = 64;
/// Polls (spun or yielded) before sleeping between polls.
const YIELD_POLLS: u32 = 4096;
/// The same where this node's ranks outnumber its cores ([`set_oversubscribed`]).
const YIELD_POLLS_OVERSUBSCRIBED: u32 = 16;
/// The sleep between polls after that.
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// Whether the node's ranks outnumber its cores.
static OVERSUBSCRIBED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says whether the node's ranks outnumber its cores: waits then sleep between polls after a
/// few, instead of yielding the core thousands of times (with 8-32 ranks on two cores, yielding
/// waiters kept the cores from the ranks they waited for).
pub fn set_oversubscribed(yes: bool) {
    OVERSUBSCRIBED.store(yes, std::sync::atomic::Ordering::Relaxed);
}

/// Polls `ready` until it says yes: a short spin, then yielding the core (ranks may share cores),
/// then short sleeps (soon, where the node is oversubscribed). Returns the time spent.
pub fn wait_until<E>(
    mut ready: impl FnMut() -> std::result::Result<bool, E>,
) -> std::result::Result<Duration, E> {
    let t0 = Instant::now();
    let mut polls = 0u32;
    let yields = if OVERSUBSCRIBED.load(std::sync::atomic::Ordering::Relaxed) {
        YIELD_POLLS_OVERSUBSCRIBED
    } else {
        YIELD_POLLS
    };
    while !ready()? {
        polls += 1;
        if polls < SPIN_POLLS.min(yields) {
            std::hint::spin_loop();
        } else if polls < yields {
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

    /// Runs `f` on every rank of a local world of `world`; any rank's error fails the test.
    fn on_ranks(world: usize, f: impl Fn(Transport) -> Result<()> + Sync) {
        for r in peregrine_transport::run_local(world, f).expect("world") {
            r.expect("rank");
        }
    }

    /// Every way the clocks can be kept: by scans alone, with the trees (BSP, SSP(2)), with the
    /// version counter.
    const KEPT: [Reads; 3] = [
        Reads { staleness: None, lines_up: false, version: false },
        Reads { staleness: Some(0), lines_up: true, version: true },
        Reads { staleness: Some(2), lines_up: true, version: false },
    ];

    #[test]
    fn progress_counts_chunks_done_by_anyone() {
        for reads in KEPT {
            on_ranks(3, |t| {
                // A run resumed at iteration 9: the trees count from there.
                let c = Clocks::new(&t, reads, 9)?;
                c.resume(9)?;
                let mine = 3 + t.rank() as u32;
                c.start(9, mine)?;
                t.barrier()?;
                assert!(!c.all_done(9)?);
                // Every rank marks one chunk of every rank done, then each its own remaining ones.
                for r in 0..3 {
                    c.done(r, 1, 9)?;
                }
                t.barrier()?;
                assert!(!c.all_done(9)?);
                assert_eq!(c.first_not_done(9)?, Some(1), "rank 0's 3 chunks are done");
                t.barrier()?;
                c.done(t.rank(), mine - 3, 9)?;
                t.barrier()?;
                assert_eq!(c.progress(t.rank())?, ProgressWord { tag: 9, total: mine, done: mine });
                assert!(c.all_done(9)?);
                assert_eq!(c.first_not_done(9)?, None);
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
                    c.done_taken(0, 2, 9)?;
                }
                t.barrier()?;
                assert_eq!(c.holder(0)?, None);
                assert_eq!(c.progress(0)?.done, 5);
                assert!(!c.all_done(10)?);
                assert!(!c.reached(10)? && c.reached(9)?);
                assert_eq!(c.version()?, 27);
                t.barrier()?;
                assert_eq!(c.tick()?, 10);
                t.barrier()?;
                assert_eq!(c.clock_words()?, vec![10; 3]);
                assert!(c.reached(10)? && !c.reached(11)?);
                assert_eq!(c.version()?, 30);
                t.barrier()?;
                c.free()
            });
        }
    }

    #[test]
    fn the_clock_tree_answers_as_a_scan_of_every_clock_would() {
        // 1 to 32 ranks tick 30 times under SSP(2) (the trees') and check against the clocks
        // themselves, read one by one, that "every clock at least c" is never said too early, and
        // is said once it holds: a rank may go on after pushing `it` when every clock is at
        // least `it + 1 - 2`.
        for world in [1, 2, 5, 17, 32] {
            let s = 2;
            on_ranks(world, |t| {
                let c = Clocks::new(&t, Reads { staleness: Some(s), ..Reads::default() }, 4)?;
                c.resume(4)?;
                t.barrier()?;
                for it in 4..34u64 {
                    c.tick()?;
                    let need = (it + 1).saturating_sub(s);
                    wait_until(|| -> Result<bool> {
                        let said = c.reached(need)?;
                        if said {
                            for r in 0..world {
                                assert!(c.clock(r)? >= need, "{world} ranks: rank {r} below {need}");
                            }
                        }
                        Ok(said)
                    })?;
                    // Slow some ranks down, so that they are not in lockstep.
                    if (t.rank() + it as usize).is_multiple_of(3) {
                        std::thread::yield_now();
                    }
                }
                // Everyone's last tick, seen by everyone.
                wait_until(|| c.reached(34))?;
                assert!(!c.reached(35)?);
                t.barrier()?;
                c.free()
            });
        }
    }

    #[test]
    fn every_ranks_chunks_arrive_at_the_done_tree_exactly_once() {
        // 1 to 32 ranks of one chunk queue each, BSP lining up: each rank announces 0 to 3
        // chunks; every rank counts chunks of every other rank done one at a time, racing for
        // the last one. The done tree says "all done" exactly when every progress word does, and
        // never before, iteration after iteration (a second arrival for a rank would complete a
        // later lap early; a missing one would never complete).
        for world in [1, 2, 7, 32] {
            on_ranks(world, |t| {
                let reads = Reads { staleness: Some(0), lines_up: true, version: false };
                let c = Clocks::new(&t, reads, 0)?;
                for it in 0..12u64 {
                    let chunks = ((t.rank() as u64 + it) % 4) as u32;
                    c.start(it, chunks)?;
                    t.barrier()?;
                    let total = |r: usize| ((r as u64 + it) % 4) as u32;
                    // Rank r counts chunk k of rank o done when k % world == r (o's chunks spread
                    // over everyone), in an order that differs per rank.
                    for o in (0..world).map(|o| (o + t.rank()) % world) {
                        for k in 0..total(o) {
                            if k as usize % world == t.rank() {
                                assert!(!c.all_done(it)?, "iteration {it} done before rank {o}'s chunk {k}");
                                c.done(o, 1, it)?;
                            }
                        }
                    }
                    wait_until(|| c.all_done(it))?;
                    assert_eq!(c.first_not_done(it)?, None);
                    c.tick()?;
                    wait_until(|| c.reached(it + 1))?;
                }
                t.barrier()?;
                c.free()
            });
        }
    }

    #[test]
    fn a_tick_passing_up_the_tree_marks_its_clock_word() {
        on_ranks(2, |t| {
            let c = Clocks::new(&t, Reads { staleness: Some(0), ..Reads::default() }, 0)?;
            assert_eq!(c.tick()?, 1);
            t.barrier()?;
            // Passed: no mark. The mark is what a rank stopped inside `tick` leaves behind.
            assert_eq!(c.clock_words()?, vec![1, 1]);
            t.barrier()?;
            c.clocks.fetch_add(t.rank(), PASSING)?;
            t.barrier()?;
            assert!(c.clock_words()?.iter().all(|w| w & PASSING != 0));
            assert_eq!((c.clock(0)?, c.clock(1)?), (1, 1));
            t.barrier()?;
            c.free()
        });
    }
}
