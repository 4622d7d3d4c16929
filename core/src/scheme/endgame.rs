//! The end game of an iteration that ends with its last chunk (BSP with taking over, enforced
//! Falcon): a slow rank's thread does not start one of its own queued chunks when the other
//! ranks' threads, about to run out of their own, would finish it sooner.
//!
//! Without it, a rank at half speed starts a chunk just as the others run dry: with 4 chunks a
//! thread, its threads have done 2 when the others are done with 4, start a third, and the whole
//! world waits for it (1.5x an iteration), while the free threads would have taken that chunk
//! and finished it in a third of the time. The rule compares the two finish times at each take
//! of an own chunk: the thread's own (`now` plus its chunk time) and the free threads' (when a
//! typical rank runs out of its own chunks, plus rounds of a typical chunk time over the chunks
//! left, plus a margin for the take and the rates' noise). A thread that leaves its chunk waits
//! until its rank's queue is empty or until the free threads should have finished it, then
//! takes what is left: a rule fed wrong rates costs at most that wait, never a chunk.
//!
//! A typical rank is the median of the chunk rates of a random block of ranks ([`typical_rate`]:
//! one batched read of at most [`crate::tree::FAN`] words, once an iteration), so the rule costs
//! O(1) reads a rank at any scale. It assumes that every rank has a part of the same size and
//! the same threads (true of BSP and of Falcon's enforced mode, not of LB-BSP).

use super::{Result, View};

/// The free threads' margin, in chunk times of a typical rank: a take over (an atomic on the
/// victim's queue) and the spread of the rates read.
pub(crate) const MARGIN: f64 = 0.25;

/// What a thread knows when it is about to take one of its rank's own chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Turn {
    /// Seconds since the rank's compute of the iteration began.
    pub now: f64,
    /// This rank's seconds a chunk on one thread, so far in the iteration (0: none done yet).
    pub mine: f64,
    /// Chunks left in the rank's queue, the one about to be taken among them.
    pub left: u32,
    /// The rank's part of the batch in chunks (every rank's, under parts of one size).
    pub part: u32,
    /// Threads a rank.
    pub threads: usize,
    /// The other ranks.
    pub others: usize,
    /// A typical rank's chunk rate in the iteration (chunks per second over its threads; 0:
    /// unknown).
    pub rate: f64,
}

impl Turn {
    /// When the free threads of the other ranks would have finished the chunks left, in seconds
    /// since this rank's compute began; `None` when it cannot be told (no rate, no chunk of this
    /// rank timed yet, no other rank).
    pub(crate) fn theirs(&self) -> Option<f64> {
        if self.rate <= 0.0 || self.mine <= 0.0 || self.others == 0 || self.threads == 0 {
            return None;
        }
        let chunk = self.threads as f64 / self.rate;
        // A typical rank runs out of its own chunks then, and takes over from then on.
        let free = (f64::from(self.part) / self.rate).max(self.now);
        let hunters = (self.others * self.threads) as f64;
        let rounds = (f64::from(self.left) / hunters).ceil().max(1.0);
        Some(free + chunk * (rounds + MARGIN))
    }

    /// Whether the thread leaves the chunk to the free threads: until when it waits for them to
    /// take what is left (seconds since the compute began), or `None` to take it now.
    pub(crate) fn leave(&self) -> Option<f64> {
        let theirs = self.theirs()?;
        (theirs < self.now + self.mine).then_some(theirs)
    }
}

/// The median of the chunk rates published by a random block of other ranks (at most
/// [`crate::tree::FAN`], read in one batch; the block drawn from `look`); 0 when none of them
/// has published one.
pub(crate) fn typical_rate(view: &dyn View, it: u64, look: u64) -> Result<f64> {
    let (me, block) = (view.rank(), crate::queue::sampled(view.world(), view.rank(), it, look));
    let rates = view.rates_in(block.clone())?;
    let mut known: Vec<f64> =
        block.zip(rates).filter(|&(r, v)| r != me && v > 0.0 && v.is_finite()).map(|(_, v)| v).collect();
    if known.is_empty() {
        return Ok(0.0);
    }
    known.sort_by(f64::total_cmp);
    Ok(known[known.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;

    /// 64 ranks of 16 threads, 64 chunks each (4 a thread), 200 us a chunk: a typical rank runs
    /// at 80,000 chunks a second and runs dry 800 us into the iteration.
    fn half_speed(now: f64, left: u32) -> Turn {
        Turn { now, mine: 400e-6, left, part: 64, threads: 16, others: 63, rate: 80_000.0 }
    }

    #[test]
    fn a_half_speed_rank_leaves_its_third_round_to_the_free_threads() {
        // 400 us in, its first round done: its second round ends at 800 us, the free threads
        // would end at 800 + 200 x 1.25 = 1,050 us: it takes the chunk.
        let t = half_speed(400e-6, 48);
        assert!((t.theirs().expect("known") - 1050e-6).abs() < 1e-12);
        assert_eq!(t.leave(), None);
        // 800 us in, two rounds done, 32 chunks left for 1,008 free threads: its own would end at
        // 1,200 us, theirs at 1,050 us: it leaves it and waits until then at most.
        let t = half_speed(800e-6, 32);
        let until = t.leave().expect("left to the free threads");
        assert!((until - 1050e-6).abs() < 1e-12);
    }

    #[test]
    fn too_few_free_threads_do_not_take_a_slow_ranks_chunks_sooner() {
        // 2 ranks of 16 threads: 32 chunks left for 16 free threads take two rounds, to 800 +
        // 200 x 2.25 = 1,250 us, later than the slow rank's own 1,200 us.
        let t = Turn { others: 1, ..half_speed(800e-6, 32) };
        assert!((t.theirs().expect("known") - 1250e-6).abs() < 1e-12);
        assert_eq!(t.leave(), None);
        // With 2 chunks left one round does: 1,050 us.
        assert!(Turn { others: 1, ..half_speed(800e-6, 2) }.leave().is_some());
    }

    #[test]
    fn a_rank_at_the_typical_speed_takes_every_own_chunk() {
        // 200 us a chunk like the others: after k rounds its next one ends at (k + 1) x 200 us,
        // never later than the free threads' 1,050 us.
        for k in 1..4 {
            let t = Turn { mine: 200e-6, ..half_speed(k as f64 * 200e-6, 64 - 16 * k) };
            assert_eq!(t.leave(), None, "round {k}");
        }
        // A rank whose chunk came late (its compute began after the others') still takes its
        // chunks: the free threads are not free before they run dry.
        assert_eq!(Turn { mine: 200e-6, ..half_speed(0.5e-6, 64) }.leave(), None);
    }

    #[test]
    fn nothing_is_left_without_what_the_rule_needs() {
        assert_eq!(Turn { rate: 0.0, ..half_speed(800e-6, 32) }.leave(), None, "no rate read");
        assert_eq!(Turn { mine: 0.0, ..half_speed(800e-6, 32) }.leave(), None, "no chunk timed");
        assert_eq!(Turn { others: 0, ..half_speed(800e-6, 32) }.leave(), None, "alone");
    }

    #[test]
    fn the_typical_rate_is_the_median_of_the_others_published_ones() {
        // Rank 1 of 5: its own rate and unpublished ones (0) are not counted.
        let mut v = Snapshot::new(1, 5);
        v.rates = vec![80.0, 10.0, 0.0, 100.0, 90.0];
        assert_eq!(typical_rate(&v, 3, 0).expect("view"), 90.0);
        v.rates = vec![0.0, 10.0, 0.0, 0.0, 0.0];
        assert_eq!(typical_rate(&v, 3, 0).expect("view"), 0.0);
        // Past 16 ranks a block of 16 is read, not every rank.
        let mut v = Snapshot::new(0, 64);
        v.rates = (0..64).map(|r| 1000.0 + r as f64).collect();
        let block = crate::queue::sampled(64, 0, 3, 0);
        assert_eq!(block.len(), 16);
        let rate = typical_rate(&v, 3, 0).expect("view");
        assert!(
            block.clone().any(|r| (1000.0 + r as f64) == rate) && rate >= 1000.0 + block.start as f64 + 7.0
        );
    }
}
