//! The end game of an iteration that ends with its last chunk (BSP with taking over, enforced
//! Falcon, speculation with taking over): a slow rank's thread does not start one of its own
//! queued chunks when the other ranks' threads, about to run out of work, would finish it sooner.
//!
//! Without it, a rank at half speed starts a chunk just as the others run dry: with 4 chunks a
//! thread, its threads have done 2 when the others are done with 4, start a third, and the whole
//! world waits for it (1.5x an iteration), while the free threads would have taken that chunk
//! and finished it in half the time. The rule compares two finish times at each take of an own
//! chunk (after the rank's first): the thread's own (now plus the rank's chunk time so far) and
//! the free threads' ([`Turn::theirs`]: once the world's queued chunks are done at the world's
//! rate, as a fluid, and not before a typical rank runs out of its own, one typical chunk time
//! later, plus a margin). The world's queued chunks and rate matter where many ranks are slow at
//! once (half the machines disrupted): there the free threads have other ranks' chunks to take
//! first, and a rule that counted only a typical rank's drain left chunks nobody took in time
//! (2.01x Ideal at 128 ranks against 1.53x without it).
//!
//! A thread that leaves its chunk waits until its rank's queue is empty or until the free
//! threads should have finished it, then takes what is left: a rule fed wrong figures costs at
//! most that wait, never a chunk. The figures come from a random block of ranks ([`survey`]: the
//! queues and rates of at most [`crate::tree::FAN`] ranks, two batched reads, once an iteration
//! after the rank's first chunk), so the rule costs O(1) reads a rank at any scale. It assumes
//! that every rank has a part of the same size and the same threads (true of BSP and of
//! Falcon's enforced mode, not of LB-BSP).

use super::{Result, View};
use crate::words;

/// The free threads' margin, in chunk times of a typical rank: a take over (an atomic on the
/// victim's queue) and the spread of the rates read.
pub(crate) const MARGIN: f64 = 0.25;

/// What a random block of other ranks showed, read once an iteration.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Survey {
    /// The median of their chunk rates (chunks per second over a rank's threads; 0: none known).
    pub rate: f64,
    /// Their mean chunk rate (the unknown ones counted at the median).
    pub mean_rate: f64,
    /// Their mean of chunks queued for the iteration (a rank not yet in it counted with a whole
    /// part).
    pub mean_queued: f64,
}

/// What a thread knows when it is about to take one of its rank's own chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Turn {
    /// Seconds since the rank's compute of the iteration began.
    pub now: f64,
    /// This rank's seconds a chunk on one thread, so far in the iteration (0: none done yet).
    pub mine: f64,
    /// Threads a rank is configured with (a typical rank's: this rank's own may be fewer, given up
    /// by elastic parallelism or an injected pattern).
    pub threads: usize,
    /// The other ranks.
    pub others: usize,
    /// The survey of the other ranks this iteration, with this rank's own figures then.
    pub seen: Seen,
}

/// A [`Survey`] with when it was read (seconds since the rank's compute began), this rank's
/// chunks queued and chunk rate then, and its part of the batch in chunks (every rank's, under
/// parts of one size).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Seen {
    pub survey: Survey,
    pub at: f64,
    pub queued: u32,
    pub rate: f64,
    pub part: u32,
}

impl Turn {
    /// When the free threads of the other ranks would have finished one more chunk of this rank,
    /// in seconds since its compute began: once the world's queued chunks are done at the
    /// world's rate (as of the survey, as if work were a fluid), and not before a typical rank
    /// runs out of its own, a typical chunk time later, plus the margin. `None` when it cannot be
    /// told (no rate, no chunk of this rank timed yet, no other rank).
    pub(crate) fn theirs(&self) -> Option<f64> {
        let (seen, v) = (&self.seen, &self.seen.survey);
        if v.rate <= 0.0 || self.mine <= 0.0 || self.others == 0 || self.threads == 0 {
            return None;
        }
        let chunk = self.threads as f64 / v.rate;
        // A typical rank runs out of its own chunks then, and takes over from then on.
        let free = f64::from(seen.part) / v.rate;
        let others = self.others as f64;
        let queued = v.mean_queued * others + f64::from(seen.queued);
        let rate = v.mean_rate * others + seen.rate;
        let drained = seen.at + queued / rate.max(1e-12);
        Some(free.max(drained).max(self.now) + chunk * (1.0 + MARGIN))
    }

    /// Whether the thread leaves the chunk to the free threads: until when it waits for them to
    /// take what is left (seconds since the compute began), or `None` to take it now.
    pub(crate) fn leave(&self) -> Option<f64> {
        let theirs = self.theirs()?;
        (theirs < self.now + self.mine).then_some(theirs)
    }
}

/// Whether leaving chunks paid lately. A leave nobody answered (the rank's queue still held
/// chunks when the free threads should have been done) means the survey misjudged the world
/// (another scheme's thieves preferring other victims, most ranks slow at once): the rank then
/// leaves none for 1, 2, 4, ... up to [`Backoff::MOST`] iterations. An answered leave halves the
/// pause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The first iteration that may leave chunks again.
    until: u64,
    /// The pause after the next unanswered leave is twice this (at least 1).
    pause: u64,
}

impl Backoff {
    /// The longest pause, in iterations.
    pub(crate) const MOST: u64 = 64;

    /// Whether iteration `it` may leave chunks.
    pub(crate) fn allows(&self, it: u64) -> bool {
        it >= self.until
    }

    /// A leave of iteration `it` went unanswered.
    pub(crate) fn missed(&mut self, it: u64) {
        self.pause = (self.pause * 2).clamp(1, Self::MOST);
        self.until = self.until.max(it + 1 + self.pause);
    }

    /// A leave was answered: the free threads took what was left.
    pub(crate) fn answered(&mut self) {
        self.pause /= 2;
    }
}

/// What a rank's thread about to take an own chunk reads of its rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rank {
    /// Seconds since the rank's compute of the iteration began.
    pub now: f64,
    /// Chunks the rank computed so far in the iteration, and its threads' seconds in them.
    pub chunks: u64,
    pub busy: f64,
    /// Threads a rank is configured with, and the other ranks ([`Turn`]).
    pub threads: usize,
    pub others: usize,
}

/// A rank's end game across its threads: the iteration's survey, read once, and the pause.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct State {
    /// The iteration surveyed last, and what was seen.
    seen: Option<(u64, Seen)>,
    pub backoff: Backoff,
}

impl State {
    /// For a thread of `rank` about to take one of its own chunks of iteration `it`: until when
    /// it leaves them to the free threads of other ranks ([`Turn::leave`]), or `None` to take it
    /// now. `left` reads the rank's chunks queued, `survey` the other ranks and its part (once an
    /// iteration, after the rank's first chunk and while chunks are queued).
    pub(crate) fn leave(
        &mut self,
        it: u64,
        rank: &Rank,
        mut left: impl FnMut() -> Result<u32>,
        survey: impl FnOnce() -> Result<(Survey, u32)>,
    ) -> Result<Option<f64>> {
        if rank.chunks == 0 || !self.backoff.allows(it) {
            return Ok(None);
        }
        let seen = match self.seen {
            Some((at, seen)) if at == it => seen,
            _ => {
                let queued = left()?;
                if queued == 0 {
                    return Ok(None);
                }
                let (survey, part) = survey()?;
                let rate = rank.chunks as f64 / rank.now.max(1e-9);
                let seen = Seen { survey, at: rank.now, queued, rate, part };
                self.seen = Some((it, seen));
                seen
            }
        };
        let mine = rank.busy / rank.chunks as f64;
        let turn = Turn { now: rank.now, mine, threads: rank.threads, others: rank.others, seen };
        match turn.leave() {
            Some(until) if left()? > 0 => Ok(Some(until)),
            _ => Ok(None),
        }
    }
}

/// Surveys a random block of other ranks (at most [`crate::tree::FAN`], their queues and rates
/// each read in one batch; the block drawn from the rank and the iteration) in iteration `it`,
/// parts being `part` chunks.
pub(crate) fn survey(view: &dyn View, it: u64, part: u32) -> Result<Survey> {
    let (me, block) = (view.rank(), crate::queue::sampled(view.world(), view.rank(), it, 0));
    let (rates, queues) = (view.rates_in(block.clone())?, view.queues_in(block.clone())?);
    let others = || block.clone().filter(|&r| r != me).map(|r| r - block.start);
    let known = |i: usize| Some(rates[i]).filter(|v| *v > 0.0 && v.is_finite());
    let mut rates_known: Vec<f64> = others().filter_map(known).collect();
    if rates_known.is_empty() {
        return Ok(Survey::default());
    }
    rates_known.sort_by(f64::total_cmp);
    let rate = rates_known[rates_known.len() / 2];
    let n = others().count() as f64;
    let tag = words::tag(it);
    let mean_rate = others().map(|i| known(i).unwrap_or(rate)).sum::<f64>() / n;
    let mean_queued = others()
        .map(|i| if queues[i].tag == tag { f64::from(queues[i].left()) } else { f64::from(part) })
        .sum::<f64>()
        / n;
    Ok(Survey { rate, mean_rate, mean_queued })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;

    /// 64 ranks of 16 threads, 64 chunks each (4 a thread), 200 us a chunk; this rank at half
    /// speed. Surveyed 400 us in: the others at 80,000 chunks a second (they run dry at 800 us)
    /// with 32 chunks queued each, this rank at 40,000 with 48.
    fn half_speed(now: f64) -> Turn {
        let survey = Survey { rate: 80_000.0, mean_rate: 80_000.0, mean_queued: 32.0 };
        let seen = Seen { survey, at: 400e-6, queued: 48, rate: 40_000.0, part: 64 };
        Turn { now, mine: 400e-6, threads: 16, others: 63, seen }
    }

    #[test]
    fn a_half_speed_rank_leaves_its_third_round_to_the_free_threads() {
        // The world's 2,064 chunks at 5.08 M a second: drained 406 us after the survey, at 806 us;
        // one typical chunk and the margin later, 1,056 us.
        let t = half_speed(400e-6);
        let theirs = 400e-6 + 2064.0 / 5.08e6 + 250e-6;
        assert!((t.theirs().expect("known") - theirs).abs() < 1e-12);
        // 400 us in its second round would end at 800 us: it takes the chunk.
        assert_eq!(t.leave(), None);
        // 800 us in its third would end at 1,200 us: it leaves it and waits until 1,056 us at most.
        let until = half_speed(800e-6).leave().expect("left to the free threads");
        assert!((until - theirs).abs() < 1e-12);
    }

    #[test]
    fn too_few_free_threads_do_not_take_a_slow_ranks_chunks_sooner() {
        // 2 ranks: the world's 80 chunks at 120,000 a second drain 667 us after the survey, at
        // 1,067 us; with the chunk and the margin 1,317 us, later than the slow rank's own 1,200.
        let t = Turn { others: 1, ..half_speed(800e-6) };
        assert!((t.theirs().expect("known") - (400e-6 + 80.0 / 120_000.0 + 250e-6)).abs() < 1e-12);
        assert_eq!(t.leave(), None);
    }

    #[test]
    fn a_rank_among_many_slow_ones_keeps_computing() {
        // Half the others at a third of the speed (a disrupted machine's): the mean rate 53,333,
        // the median still 80,000. Surveyed at 600 us by a rank at a third of the speed (600 us a
        // chunk, 48 chunks queued): the fast ranks have 16 chunks queued, the slow ones 48. The
        // world's 2,064 chunks at 3.39 M a second drain at 1,209 us: the free threads have other
        // slow ranks' chunks to take first, and the rank takes its second round (ending at 1,200).
        let survey =
            Survey { rate: 80_000.0, mean_rate: (80_000.0 + 80_000.0 / 3.0) / 2.0, mean_queued: 32.0 };
        let seen = Seen { survey, at: 600e-6, queued: 48, rate: 80_000.0 / 3.0, part: 64 };
        let t = Turn { now: 600e-6, mine: 600e-6, threads: 16, others: 63, seen };
        let drained = 600e-6 + 2064.0 / (63.0 * survey.mean_rate + seen.rate);
        assert!((t.theirs().expect("known") - (drained + 250e-6)).abs() < 1e-12);
        assert_eq!(t.leave(), None);
        // Had it counted only a typical rank's drain (800 us), it would have left it: 1,050 us.
        let lone = Turn { seen: Seen { survey: Survey { mean_queued: 0.0, ..survey }, ..seen }, ..t };
        assert!(lone.leave().is_some());
    }

    #[test]
    fn a_rank_at_the_typical_speed_takes_every_own_chunk() {
        // 200 us a chunk like the others: after k rounds its next one ends at (k + 1) x 200 us,
        // never later than the free threads' 1,056 us.
        for k in 1..4 {
            let t = Turn { mine: 200e-6, ..half_speed(k as f64 * 200e-6) };
            assert_eq!(t.leave(), None, "round {k}");
        }
    }

    #[test]
    fn nothing_is_left_without_what_the_rule_needs() {
        let t = half_speed(800e-6);
        let unknown = Seen { survey: Survey { rate: 0.0, ..t.seen.survey }, ..t.seen };
        assert_eq!(Turn { seen: unknown, ..t }.leave(), None, "no rate read");
        assert_eq!(Turn { mine: 0.0, ..t }.leave(), None, "no chunk timed");
        assert_eq!(Turn { others: 0, ..t }.leave(), None, "alone");
    }

    #[test]
    fn a_rank_whose_leaves_go_unanswered_pauses_longer_each_time() {
        let mut b = Backoff::default();
        assert!(b.allows(0));
        // Missed in iteration 5: none left in 6, again in 7.
        b.missed(5);
        assert!(!b.allows(6) && b.allows(7));
        // Missed again in 7: a pause of 2 (8 and 9), then 4, up to 64.
        b.missed(7);
        assert!(!b.allows(9) && b.allows(10));
        b.missed(10);
        assert!(!b.allows(14) && b.allows(15));
        for it in 20..40 {
            b.missed(it * 100);
        }
        assert!(!b.allows(3900 + 64) && b.allows(3900 + 65));
        // Answered leaves shorten the next pause: 64 -> 32 -> 16, the next miss pauses 32.
        b.answered();
        b.answered();
        b.missed(5000);
        assert!(!b.allows(5032) && b.allows(5033));
        // Two threads missing in the same iteration pause once more, not from an earlier end.
        let mut b = Backoff::default();
        b.missed(5);
        b.missed(5);
        assert!(!b.allows(7) && b.allows(8));
    }

    #[test]
    fn the_survey_reads_the_others_rates_and_queues() {
        // Rank 1 of 5 in iteration 3, parts of 10 chunks: its own words and unpublished rates (0)
        // are not counted in the median; a rank not yet in iteration 3 counts a whole part.
        let t = words::tag(3);
        let mut v = Snapshot::new(1, 5);
        v.rates = vec![80.0, 10.0, 0.0, 100.0, 90.0];
        v.queues = vec![
            words::Queue { tag: t, head: 2, tail: 6 },
            words::Queue { tag: t, head: 0, tail: 9 },
            words::Queue { tag: words::tag(2), head: 0, tail: 0 },
            words::Queue { tag: t, head: 10, tail: 10 },
            words::Queue { tag: t, head: 7, tail: 8 },
        ];
        let s = survey(&v, 3, 10).expect("view");
        assert_eq!(s.rate, 90.0);
        // Rank 2's unknown rate counts at the median: (80 + 90 + 100 + 90) / 4.
        assert_eq!(s.mean_rate, 90.0);
        // 4 + 10 + 0 + 1 chunks over 4 ranks.
        assert_eq!(s.mean_queued, 3.75);
        v.rates = vec![0.0, 10.0, 0.0, 0.0, 0.0];
        assert_eq!(survey(&v, 3, 10).expect("view"), Survey::default());
        // Past 16 ranks a block of 16 is read, not every rank.
        let mut v = Snapshot::new(0, 64);
        v.rates = (0..64).map(|r| 1000.0 + r as f64).collect();
        v.queues = vec![words::Queue { tag: t, head: 0, tail: 4 }; 64];
        let block = crate::queue::sampled(64, 0, 3, 0);
        assert_eq!(block.len(), 16);
        let s = survey(&v, 3, 10).expect("view");
        assert!(block.clone().any(|r| (1000.0 + r as f64) == s.rate), "{s:?} from {block:?}");
        assert_eq!(s.mean_queued, 4.0);
    }
}
