//! The packed `u64` words that ranks read and update one-sidedly, in one place: each layout's
//! fields, widths and (un)packing, with a property test that every field round-trips.
//!
//! | word | layout (high to low bits) | owner / who changes it |
//! |---|---|---|
//! | [`Queue`] | tag 16, head 24, tail 24 | a rank's chunk queue: owner takes from the head, thieves lower the tail |
//! | [`ProgressWord`] | tag 16, total 24, done 24 | a rank's current iteration: chunks announced and done (by anyone) |
//! | [`ClaimWord`] | tag 16, 48 claim bits | speculative execution: one bit per chunk, set by the copy that finishes first |
//! | [`Arrivals`] | tag 24, k 16, count 24 | backup workers: an iteration slot on rank 0, updates wanted and counted |
//!
//! Tags are the iteration number modulo the field's range ([`tag`] for the 16-bit ones): a reader
//! that finds another iteration's tag knows the word is not about the iteration it means.

/// Raises word `i` of `words` to `v` by compare-and-swap, as long as the word read is below `v`
/// and `keep` holds for it (one load when it does not; a word other ranks raise too is read
/// again after each lost race): a maximum kept one-sidedly, as MPI has no fetch-and-max for it.
pub fn raise(
    words: &peregrine_transport::Window<u64>,
    i: usize,
    v: u64,
    keep: impl Fn(u64) -> bool,
) -> peregrine_transport::Result<()> {
    let mut cur = words.load(i)?;
    while v > cur && keep(cur) {
        match words.compare_and_swap(i, cur, v)? {
            prev if prev == cur => break,
            prev => cur = prev,
        }
    }
    Ok(())
}

/// Most chunks a queue or progress word can count (24 bits).
pub const MAX_CHUNKS: u32 = (1 << 24) - 1;
const MASK24: u64 = (1 << 24) - 1;

/// The 16-bit tag of iteration `iteration`.
pub fn tag(iteration: u64) -> u16 {
    iteration as u16
}

/// The iteration that `tag` stands for, given that it is within 2^15 of `near`.
pub fn untag(tag: u16, near: u64) -> u64 {
    (near as i64 + i64::from(tag.wrapping_sub(self::tag(near)) as i16)).max(0) as u64
}

/// Whether `tag` stands for an iteration after `near`'s (within 2^15).
pub fn ahead(tag: u16, near: u64) -> bool {
    (tag.wrapping_sub(self::tag(near)) as i16) > 0
}

/// A chunk queue word: chunks `head..tail` of the iteration tagged `tag` are still queued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Queue {
    /// The iteration's tag.
    pub tag: u16,
    /// The next chunk the owner takes.
    pub head: u32,
    /// One past the last chunk still queued (thieves take from here down).
    pub tail: u32,
}

impl Queue {
    /// The word.
    pub fn pack(self) -> u64 {
        debug_assert!(self.head <= MAX_CHUNKS && self.tail <= MAX_CHUNKS);
        (u64::from(self.tag) << 48) | (u64::from(self.head) << 24) | u64::from(self.tail)
    }

    /// The fields of `w`.
    pub fn unpack(w: u64) -> Self {
        Self { tag: (w >> 48) as u16, head: ((w >> 24) & MASK24) as u32, tail: (w & MASK24) as u32 }
    }

    /// Chunks still queued.
    pub fn left(self) -> u32 {
        self.tail.saturating_sub(self.head)
    }
}

/// A progress word: the rank's current iteration (by tag), its chunks, and how many are done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressWord {
    /// The iteration's tag.
    pub tag: u16,
    /// Chunks the rank owns in the iteration.
    pub total: u32,
    /// Chunks done, by the rank or whoever took them over.
    pub done: u32,
}

impl ProgressWord {
    /// The word (`done` in the low bits, so that adding `n` counts `n` more chunks done).
    pub fn pack(self) -> u64 {
        debug_assert!(self.total <= MAX_CHUNKS && self.done <= MAX_CHUNKS);
        (u64::from(self.tag) << 48) | (u64::from(self.total) << 24) | u64::from(self.done)
    }

    /// The fields of `w`.
    pub fn unpack(w: u64) -> Self {
        Self { tag: (w >> 48) as u16, total: ((w >> 24) & MASK24) as u32, done: (w & MASK24) as u32 }
    }

    /// The word of no iteration about to start: tag `u16::MAX`, nothing announced (a zero word
    /// would read as "iteration 0: all of its 0 chunks done").
    pub const NONE: u64 = (u16::MAX as u64) << 48;

    /// ProgressWord in iterations, seen from a rank in iteration `near`: the iteration this word is
    /// about plus the fraction of its chunks done (a rank with no chunks counts as done).
    pub fn position(self, near: u64) -> f64 {
        untag(self.tag, near) as f64
            + if self.total == 0 { 1.0 } else { f64::from(self.done) / f64::from(self.total) }
    }
}

/// Chunks one claim word covers.
pub const CLAIM_BITS: u32 = 48;

/// A claim word: speculative execution's bits for 48 chunks of one rank's iteration tagged `tag`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClaimWord {
    /// The iteration's tag.
    pub tag: u16,
    /// Bit `i` set: chunk `i` (of this word's 48) is claimed.
    pub bits: u64,
}

impl ClaimWord {
    /// The word.
    pub fn pack(self) -> u64 {
        debug_assert!(self.bits >> CLAIM_BITS == 0);
        (u64::from(self.tag) << CLAIM_BITS) | self.bits
    }

    /// The fields of `w`.
    pub fn unpack(w: u64) -> Self {
        Self { tag: (w >> CLAIM_BITS) as u16, bits: w & ((1 << CLAIM_BITS) - 1) }
    }
}

/// Most iterations an arrivals tag tells apart (24 bits).
pub const ARRIVAL_TAG_MASK: u64 = (1 << 24) - 1;
/// Most ranks a backup-worker iteration can wait for (16 bits).
pub const MAX_ARRIVALS: u64 = (1 << 16) - 1;

/// A backup-worker slot: the iteration (tag, 24 bits), the updates it applies (`k`) and how
/// many have arrived (or committed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arrivals {
    /// The iteration modulo 2^24.
    pub tag: u64,
    /// Updates the iteration applies.
    pub k: u64,
    /// Updates counted so far.
    pub count: u64,
}

impl Arrivals {
    /// The word.
    pub fn pack(self) -> u64 {
        debug_assert!(self.k <= MAX_ARRIVALS && self.count <= MASK24);
        ((self.tag & ARRIVAL_TAG_MASK) << 40) | ((self.k & MAX_ARRIVALS) << 24) | (self.count & MASK24)
    }

    /// The fields of `w`.
    pub fn unpack(w: u64) -> Self {
        Self { tag: w >> 40, k: (w >> 24) & MAX_ARRIVALS, count: w & MASK24 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn queue_words_round_trip(tag: u16, head in 0..=MAX_CHUNKS, tail in 0..=MAX_CHUNKS) {
            let q = Queue { tag, head, tail };
            prop_assert_eq!(Queue::unpack(q.pack()), q);
        }

        #[test]
        fn progress_words_round_trip_and_count(tag: u16, total in 0..MAX_CHUNKS, done in 0..MAX_CHUNKS) {
            let p = ProgressWord { tag, total, done };
            prop_assert_eq!(ProgressWord::unpack(p.pack()), p);
            // What `Clocks::done` relies on: adding to the word adds to `done` alone.
            prop_assert_eq!(ProgressWord::unpack(p.pack() + 1), ProgressWord { done: done + 1, ..p });
        }

        #[test]
        fn claim_words_round_trip(tag: u16, bits in 0u64..(1 << CLAIM_BITS)) {
            let c = ClaimWord { tag, bits };
            prop_assert_eq!(ClaimWord::unpack(c.pack()), c);
        }

        #[test]
        fn arrival_words_round_trip(tag in 0..=ARRIVAL_TAG_MASK, k in 0..=MAX_ARRIVALS, count in 0..=MASK24) {
            let a = Arrivals { tag, k, count };
            prop_assert_eq!(Arrivals::unpack(a.pack()), a);
        }

        #[test]
        fn tags_are_read_back_near_their_iteration(it in 0u64..1 << 40, d in -30000i64..30000) {
            let other = (it as i64 + d).max(0) as u64;
            prop_assert_eq!(untag(tag(other), it), other);
            prop_assert_eq!(ahead(tag(other), it), other > it);
        }
    }

    #[test]
    fn the_no_iteration_word_is_not_iteration_zero() {
        let p = ProgressWord::unpack(ProgressWord::NONE);
        assert_eq!((p.tag, p.total, p.done), (u16::MAX, 0, 0));
        assert_ne!(p.tag, tag(0));
    }
}
