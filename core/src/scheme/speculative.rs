//! Speculative execution (task cloning, as MapReduce's backup tasks and LATE) over BSP: once a
//! rank has done its chunks and waited as long as one of its chunks takes, its idle threads also
//! compute copies of chunks still running on ranks slower than [`SPECULATE_BELOW`] of its chunk
//! rate; whichever copy finishes first claims the chunk in a window bitmap and only its result is
//! applied (the other copy is dropped, an injected delay of the late copy cut short). Ranks that
//! are not slow claim their chunks before computing them, so they pay nothing for copies. With
//! taking over (`speculative+steal`) queued chunks are taken over too; without it only running
//! chunks are copied, as in MapReduce; with it a slow rank also leaves its last chunks to the free
//! threads where they would finish them sooner (the end game of [`super::endgame`]).
//!
//! The claim bitmap: per rank, one bit per chunk of its current iteration, 48 chunks to a word
//! tagged with the iteration ([`crate::words::ClaimWord`]). A chunk's result is applied only by
//! whoever sets its bit (a compare-and-swap), so exactly once however many copies run; a word
//! tagged with another iteration claims nothing (a copy that finishes after its iteration is over
//! is dropped).
//!
//! One copy a chunk, as MapReduce's and LATE's one backup a task: beside each claim word a word of
//! the same shape marks the chunks a copy was started of, set by the copier with a
//! compare-and-swap before it starts; a chunk marked is not copied again. Copies of one chunk all
//! end at about the same time (the copiers are the fast ranks), so more of them win nothing, and
//! every idle thread of thousands of ranks copying the same few running chunks cost each of them
//! a pull and a chunk's compute for nothing (and the simulator an event each).

use std::fmt;
use std::sync::Arc;

use peregrine_transport::{ShardMap, Transport, Window};

use super::staleness::Bound;
use super::{Family, OwnChunks, Parsed, Policy, Result, SchemeKind, Setup, View};
use crate::queue::{sampled, READ_ALL_UP_TO};
use crate::words::{self, ClaimWord, CLAIM_BITS};

pub(crate) const FAMILY: Family =
    Family { forms: "speculative", names: &["speculative"], compared: &[], parse };

fn parse(s: &str) -> Option<Parsed> {
    matches!(s, "speculative" | "clone").then(|| Ok(Arc::new(Speculative) as Arc<dyn SchemeKind>))
}

/// Speculative execution copies chunks only of ranks whose chunk rate is below this fraction of
/// the copying rank's (LATE's "slow task" threshold in spirit: speculate on the slow, not on
/// everyone still running). Chunk rates of on-time ranks with short chunks (MF's take ~75 us
/// here) differ by a quarter from noise alone; 0.6 leaves that out and still copies a rank at
/// half speed.
pub(crate) const SPECULATE_BELOW: f64 = 0.6;

/// Speculative execution (no arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Speculative;

impl fmt::Display for Speculative {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("speculative")
    }
}

impl SchemeKind for Speculative {
    fn pulls_every_update(&self) -> bool {
        true
    }

    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        // A rank owns at most this many chunks of an iteration.
        let most = setup.plan.batch().div_ceil(setup.plan.chunk()).div_ceil(setup.t.world_size());
        Ok(Box::new(Copies { claims: Claims::new(setup.t, most)?, steal: setup.steal, tag: 0, fastest: 0.0 }))
    }
}

/// Whether a rank at chunk rate `theirs` is slow enough, next to a copier at `mine`, for its
/// chunks to be copied (an unknown rate, 0, is never copied).
pub(crate) fn copies_from(mine: f64, theirs: f64) -> bool {
    theirs > 0.0 && theirs < SPECULATE_BELOW * mine
}

/// The policy: the claims and copies bitmaps, and what the iteration opened with.
struct Copies {
    claims: Claims,
    steal: bool,
    /// The current iteration's tag.
    tag: u16,
    /// The fastest other rank's chunk rate as the iteration opened.
    fastest: f64,
}

impl Copies {
    /// [`candidate`] in iteration `it`, skipping chunks settled or copied already (by any
    /// rank, this one's threads included); if `mark`, marked as copied (a copier that marked it
    /// first, here or elsewhere: the next candidate).
    fn pick(&self, view: &dyn View, it: u64, mark: bool) -> Result<Option<(usize, u32)>> {
        let tag = words::tag(it);
        loop {
            let got = candidate(view, it, |v, word| self.claims.closed_bits(v, tag, word))?;
            match got {
                Some((v, c)) if mark && !self.claims.mark_copied(v, tag, c)? => {}
                _ => return Ok(got),
            }
        }
    }
}

/// The chunk to copy next: the first one handed out to a thread (below its queue's head) of
/// iteration `it`, not closed, on the first other rank slow enough to copy
/// ([`copies_from`]) among those not done ([`View::undone`]: every rank, or past 64 ranks one
/// leaf node of the done tree). A copy of an on-time rank's chunk mostly loses, and a copy in
/// real compute cannot be cut short, so it would delay this rank's push. `closed(rank, word)`
/// gives the chunks of the rank's claim word `word` not to copy (settled, or copied already) as
/// bits (chunks `48 * word ..`): one read per 48 chunks, not one per chunk.
pub(crate) fn candidate(
    view: &dyn View,
    it: u64,
    mut closed: impl FnMut(usize, u32) -> Result<u64>,
) -> Result<Option<(usize, u32)>> {
    let (me, tag, ranks) = (view.rank(), words::tag(it), view.undone(it)?);
    // The ranks' queues and rates, each in one batch (this rank's rate on its own if it is not
    // among them).
    let (queues, rates) = (view.queues_in(ranks.clone())?, view.rates_in(ranks.clone())?);
    let mine = if ranks.contains(&me) { rates[me - ranks.start] } else { view.rate(me)? };
    for v in ranks.clone().filter(|&v| v != me) {
        let (q, theirs) = (queues[v - ranks.start], rates[v - ranks.start]);
        if q.tag != tag || !copies_from(mine, theirs) {
            continue;
        }
        for word in 0..q.head.div_ceil(CLAIM_BITS) {
            let first = word * CLAIM_BITS;
            let handed_out = (1u64 << (q.head - first).min(CLAIM_BITS)) - 1;
            let open = !closed(v, word)? & handed_out;
            if open != 0 {
                return Ok(Some((v, first + open.trailing_zeros())));
            }
        }
    }
    Ok(None)
}

/// Whether a rank at chunk rate `mine` may have its chunks copied, the fastest other rank being
/// at `fastest` (the rule copiers apply, [`copies_from`]).
pub(crate) fn copyable(mine: f64, fastest: f64) -> bool {
    mine > 0.0 && copies_from(fastest, mine)
}

impl Policy for Copies {
    fn takes_over(&self) -> bool {
        self.steal
    }

    fn reads_rates(&self) -> bool {
        true
    }

    fn leaves_chunks(&self) -> bool {
        self.steal
    }

    /// Reads the fastest other rank's rate: every rank's in one batch, or past
    /// [`crate::queue::READ_ALL_UP_TO`] ranks the fastest of a block of 16 drawn at random (reading every rank's
    /// rate at every rank is O(N^2) words an iteration).
    fn open(&mut self, view: &dyn View, it: u64) -> Result<()> {
        let (me, world) = (view.rank(), view.world());
        let ranks = if world > READ_ALL_UP_TO { sampled(world, me, it, 0) } else { 0..world };
        let rates = view.rates_in(ranks.clone())?;
        self.fastest = ranks.clone().filter(|&v| v != me).map(|v| rates[v - ranks.start]).fold(0.0, f64::max);
        self.tag = words::tag(it);
        self.claims.reset(view.rank(), self.tag)?;
        Ok(())
    }

    /// A rank slow enough to be copied computes each chunk as a copy that claims it at the end;
    /// others claim theirs before computing them, so nobody copies them. Its own rate is read
    /// live; the fastest other's as the iteration opened (one batch per iteration, not one per
    /// take of own chunks).
    fn own_chunks(&self, view: &dyn View) -> Result<OwnChunks> {
        Ok(if copyable(view.rate(view.rank())?, self.fastest) {
            OwnChunks::AsCopies
        } else {
            OwnChunks::ClaimFirst
        })
    }

    fn claim(&self, owner: usize, tag: u16, chunk: u32) -> Result<bool> {
        self.claims.claim(owner, tag, chunk)
    }

    fn settled(&self, owner: usize, tag: u16, chunk: u32) -> Result<bool> {
        self.claims.settled(owner, tag, chunk)
    }

    fn line_up(&self) -> bool {
        true
    }

    fn copies(&self) -> bool {
        true
    }

    fn copy_due(&self, view: &dyn View, it: u64, waited: bool) -> Result<bool> {
        Ok(waited && self.pick(view, it, false)?.is_some())
    }

    fn copy(&self, view: &dyn View, it: u64) -> Result<Option<(usize, u32)>> {
        self.pick(view, it, true)
    }

    fn ready(&self, view: &dyn View, it: u64) -> Result<bool> {
        Bound::Bsp.ready(view, it)
    }

    fn staleness(&self) -> Option<u64> {
        Bound::Bsp.staleness()
    }

    fn free(self: Box<Self>) -> Result<()> {
        self.claims.window.free()
    }
}

/// The claim bitmap and the bitmap of copies started (see the module's documentation): claim
/// word `w` of a rank and its copies word side by side, one read for both.
struct Claims {
    window: Window<u64>,
    per_rank: usize,
}

/// Of a claim word and its copies word: the claim word.
const CLAIMED: usize = 0;
/// The copies word.
const COPIED: usize = 1;

impl Claims {
    /// Collective: words for `max_chunks` chunks per rank.
    fn new(t: &Transport, max_chunks: usize) -> Result<Self> {
        let per_rank = max_chunks.div_ceil(CLAIM_BITS as usize).max(1);
        let map = ShardMap::from_lens(vec![2 * per_rank; t.world_size()]);
        let window = t.alloc_window("chunk claims", &map)?;
        Ok(Self { window, per_rank })
    }

    /// The index of `rank`'s claim word `word` (`CLAIMED`) or copies word (`COPIED`).
    fn word(&self, rank: usize, word: usize, which: usize) -> usize {
        2 * (rank * self.per_rank + word) + which
    }

    /// Opens this rank's words for the iteration tagged `tag`, nothing claimed or copied (before
    /// its queue is filled, so nobody sees the iteration's chunks with stale bits).
    fn reset(&self, rank: usize, tag: u16) -> Result<()> {
        for i in self.word(rank, 0, CLAIMED)..self.word(rank + 1, 0, CLAIMED) {
            self.window.swap(i, ClaimWord { tag, bits: 0 }.pack())?;
        }
        Ok(())
    }

    /// Claims `rank`'s chunk `chunk` of iteration `tag`: true for the first caller only.
    fn claim(&self, rank: usize, tag: u16, chunk: u32) -> Result<bool> {
        self.set(rank, tag, chunk, CLAIMED)
    }

    /// Marks a copy of `rank`'s chunk `chunk` of iteration `tag` started: true for the first
    /// caller only.
    fn mark_copied(&self, rank: usize, tag: u16, chunk: u32) -> Result<bool> {
        self.set(rank, tag, chunk, COPIED)
    }

    /// Sets `chunk`'s bit in `rank`'s word `which` for iteration `tag`: true if this call set it.
    fn set(&self, rank: usize, tag: u16, chunk: u32, which: usize) -> Result<bool> {
        let word = (chunk / CLAIM_BITS) as usize;
        if word >= self.per_rank {
            return Ok(false);
        }
        let (i, bit) = (self.word(rank, word, which), 1 << (chunk % CLAIM_BITS));
        let mut cur = self.window.load(i)?;
        loop {
            let w = ClaimWord::unpack(cur);
            if w.tag != tag || w.bits & bit != 0 {
                return Ok(false);
            }
            let prev = self.window.compare_and_swap(i, cur, ClaimWord { tag, bits: w.bits | bit }.pack())?;
            if prev == cur {
                return Ok(true);
            }
            cur = prev;
        }
    }

    /// The chunks of `rank`'s claim word `word` that can no longer be claimed in iteration `tag`,
    /// as bits (all of them if the word is of another iteration or beyond the rank's words).
    fn settled_bits(&self, rank: usize, tag: u16, word: u32) -> Result<u64> {
        if word as usize >= self.per_rank {
            return Ok(!0);
        }
        let w = ClaimWord::unpack(self.window.load(self.word(rank, word as usize, CLAIMED))?);
        Ok(if w.tag == tag { w.bits } else { !0 })
    }

    /// The chunks of `rank`'s claim word `word` not to copy in iteration `tag`: settled, or
    /// copied already (both words in one read), as bits.
    fn closed_bits(&self, rank: usize, tag: u16, word: u32) -> Result<u64> {
        if word as usize >= self.per_rank {
            return Ok(!0);
        }
        let mut w = [0; 2];
        self.window.load_range(self.word(rank, word as usize, CLAIMED), &mut w)?;
        let [claimed, copied] = w.map(ClaimWord::unpack);
        Ok(if claimed.tag == tag && copied.tag == tag { claimed.bits | copied.bits } else { !0 })
    }

    /// Whether `rank`'s chunk `chunk` of iteration `tag` can no longer be claimed.
    fn settled(&self, rank: usize, tag: u16, chunk: u32) -> Result<bool> {
        Ok(self.settled_bits(rank, tag, chunk / CLAIM_BITS)? & (1 << (chunk % CLAIM_BITS)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;
    use crate::words::Queue;

    #[test]
    fn only_ranks_below_the_threshold_are_copied() {
        // A copier at 100 chunks/s copies a rank below 60: 59 yes, 60 and 80 no, 0 (no rate yet)
        // no.
        assert!(copies_from(100.0, 59.0));
        assert!(!copies_from(100.0, 60.0));
        assert!(!copies_from(100.0, 80.0));
        assert!(!copies_from(100.0, 0.0));
        // A rank at 50 with the fastest other at 100 computes its chunks as copies; at 70 it
        // claims them first; with no rate of its own yet, too.
        assert!(copyable(50.0, 100.0));
        assert!(!copyable(70.0, 100.0));
        assert!(!copyable(0.0, 100.0));
    }

    #[test]
    fn the_copy_is_a_handed_out_chunk_of_a_slow_rank_in_this_iteration() {
        // Seen from rank 0 at 100 chunks/s: rank 1 (90/s) is on time; rank 2 (30/s) has handed
        // chunks 0..3 to its threads (3..10 still queued); rank 3 (10/s) is in another iteration.
        let mut v = Snapshot::new(0, 4);
        v.rates = vec![100.0, 90.0, 30.0, 10.0];
        v.queues[1] = Queue { tag: 7, head: 5, tail: 10 };
        v.queues[2] = Queue { tag: 7, head: 3, tail: 10 };
        v.queues[3] = Queue { tag: 6, head: 5, tail: 10 };
        let none = |_, _| Ok(0);
        assert_eq!(candidate(&v, 7, none).expect("view"), Some((2, 0)));
        // Chunk 0 settled and chunk 1 being copied: chunk 2; all three settled: nothing (queued
        // chunks are for taking over, not copying).
        assert_eq!(candidate(&v, 7, |_, _| Ok(0b11)).expect("view"), Some((2, 2)));
        assert_eq!(candidate(&v, 7, |_, _| Ok(0b111)).expect("view"), None);
        // Chunks past the first claim word: rank 2 with 100 handed out, the first two words
        // settled, chunk 96 (the first of the third word) is next.
        v.queues[2] = Queue { tag: 7, head: 100, tail: 120 };
        let words_read = std::cell::Cell::new(0);
        let settled = |_, w: u32| {
            words_read.set(words_read.get() + 1);
            Ok(if w < 2 { !0 } else { 0 })
        };
        assert_eq!(candidate(&v, 7, settled).expect("view"), Some((2, 96)));
        assert_eq!(words_read.get(), 3, "one read per claim word");
        v.queues[2] = Queue { tag: 7, head: 3, tail: 10 };
        // In iteration 6 only rank 3 is there to copy.
        assert_eq!(candidate(&v, 6, none).expect("view"), Some((3, 0)));
        // Past 64 ranks only the ranks of the node the done tree's descent ends at are read (this
        // rank's rate on its own): rank 2's node, or rank 3's.
        v.undone = Some(2..4);
        assert_eq!(candidate(&v, 7, none).expect("view"), Some((2, 0)));
        v.undone = Some(3..4);
        assert_eq!(candidate(&v, 7, none).expect("view"), None, "rank 3 is in iteration 6");
        assert_eq!(candidate(&v, 6, none).expect("view"), Some((3, 0)));
        v.undone = Some(0..0);
        assert_eq!(candidate(&v, 6, none).expect("view"), None, "every rank is done");
        v.undone = None;
        // With no rate of its own yet, a rank copies nothing.
        v.rates[0] = 0.0;
        assert_eq!(candidate(&v, 7, none).expect("view"), None);
    }

    #[test]
    fn with_taking_over_a_slow_ranks_last_chunks_are_left_to_the_free_threads() {
        peregrine_transport::run_local(1, |t| -> Result<()> {
            for steal in [false, true] {
                let p = Copies { claims: Claims::new(&t, 8)?, steal, tag: 0, fastest: 0.0 };
                // The end game moves queued chunks: only where they can be taken over (without
                // taking over, the slow rank's chunks are copied once running, as in MapReduce).
                assert_eq!((p.takes_over(), p.leaves_chunks()), (steal, steal));
                Box::new(p).free()?;
            }
            Ok(())
        })
        .expect("world")
        .into_iter()
        .for_each(|r| r.expect("rank"));
    }

    #[test]
    fn a_chunk_is_copied_once_and_its_copy_mark_does_not_claim_it() {
        peregrine_transport::run_local(2, |t| -> Result<()> {
            let c = Claims::new(&t, 100)?;
            c.reset(t.rank(), 4)?;
            t.barrier()?;
            if t.rank() == 1 {
                // Rank 0's chunk 50 (bit 2 of word 1): marked once; still claimable, by its
                // owner's thread or by the copy, once.
                assert!(c.mark_copied(0, 4, 50)?);
                assert!(!c.mark_copied(0, 4, 50)?, "copied twice");
                assert!(!c.settled(0, 4, 50)?, "a copy started is not a result");
                assert_eq!(c.closed_bits(0, 4, 1)?, 1 << 2);
                assert!(c.claim(0, 4, 51)?);
                assert_eq!(c.closed_bits(0, 4, 1)?, 0b1100, "claimed (51) or copied (50)");
                assert_eq!(c.settled_bits(0, 4, 1)?, 0b1000, "claimed only");
                // Another iteration's words, or a word past the rank's: nothing to copy.
                assert_eq!(c.closed_bits(0, 5, 1)?, !0);
                assert_eq!(c.closed_bits(0, 4, 9)?, !0);
                assert!(!c.mark_copied(0, 5, 52)?, "a word of iteration 4 marks nothing of 5");
                assert!(!c.mark_copied(0, 4, 48 * 9)?, "past the rank's words");
                // Rank 1's own words are apart from rank 0's.
                assert_eq!(c.closed_bits(1, 4, 1)?, 0);
            }
            t.barrier()?;
            c.window.free()
        })
        .expect("world")
        .into_iter()
        .for_each(|r| r.expect("rank"));
    }

    #[test]
    fn claims_go_to_the_first_caller_of_the_iteration() {
        peregrine_transport::run_local(1, |t| -> Result<()> {
            let c = Claims::new(&t, 100)?;
            c.reset(0, 4)?;
            assert!(!c.settled(0, 4, 50)?);
            assert!(c.claim(0, 4, 50)?);
            assert!(!c.claim(0, 4, 50)?, "claimed twice");
            assert!(c.settled(0, 4, 50)?);
            // Chunk 50 is bit 2 of word 1; another iteration's word, or one past the rank's
            // words, is settled whole.
            assert_eq!(c.settled_bits(0, 4, 1)?, 1 << 2);
            assert_eq!(c.settled_bits(0, 4, 0)?, 0);
            assert_eq!(c.settled_bits(0, 5, 1)?, !0);
            assert_eq!(c.settled_bits(0, 4, 9)?, !0);
            assert!(!c.claim(0, 5, 51)?, "a word of iteration 4 claims nothing of 5");
            assert!(c.settled(0, 3, 1)?, "another iteration's chunk is settled");
            c.reset(0, 5)?;
            assert!(c.claim(0, 5, 50)?, "a new iteration starts unclaimed");
            c.window.free()
        })
        .expect("world")
        .into_iter()
        .for_each(|r| r.expect("rank"));
    }
}
