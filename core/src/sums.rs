//! Sums over the world through the combining tree's shape ([`crate::tree::Shape`]): each rank
//! adds [`PARTS`] values (the first of them counted: a rank with 0 there has none), and any rank
//! then reads the world's totals and the sums of the ranks before it, at a cost per rank of
//! O(log N) words instead of a read of every rank's (LB-BSP's split past 128 ranks).
//!
//! A rank writes its values into its own words, then adds them to its level-0 node's running
//! sums (count of first values, each part's sum: one accumulate; the least first value) and,
//! once they have landed, counts itself in; whoever completes a node
//! (the fetched count says so) reads the node's sums, publishes them as the node's totals,
//! resets the running words and carries the totals to the parent, and so on up to the root. The
//! sums of the ranks before rank `r` are the values of the ranks before it in its level-0 node
//! plus, at each level above, the totals of the nodes before its own under the same parent: one
//! batch of at most [`FAN`] nodes' totals per level. Those reads, and the completing rank's read
//! of a node's running sums, are plain gets (one operation a range, not an atomic load a word:
//! a batch of 15 nodes' totals is 15 operations, not 75): by the protocol below nobody writes a
//! word while it is read.
//!
//! Values are integers (callers fix the point), so every order of the adds gives the same sums
//! and every rank derives the same split from them. Words come in two rounds (`round`, e.g. an
//! iteration's parity), each reused every other time. That needs of the callers what LB-BSP's
//! BSP gives: every rank adds to a round once, each rank adds to round `j` only after every
//! rank has read the previous use of round `j`, and reads of a round start only after every
//! rank has added to it (its add, climbs included, returned before a barrier or a clock tick
//! the readers wait for).

use std::ops::Range;

use peregrine_transport::{Result, ShardMap, Transport, Window};

use crate::tree::{Shape, FAN};

/// Values a rank adds.
pub const PARTS: usize = 3;

/// The totals of a set of ranks' values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Ranks with a first value.
    pub count: u64,
    /// Each part's sum.
    pub sum: [u64; PARTS],
    /// The least first value (`None` without any).
    pub min: Option<u64>,
}

impl Totals {
    /// One rank's values.
    pub fn of(values: [u64; PARTS]) -> Self {
        let first = (values[0] > 0).then_some(values[0]);
        Self { count: u64::from(first.is_some()), sum: values, min: first }
    }

    /// The totals of ranks' `values`.
    pub fn of_all(values: impl IntoIterator<Item = [u64; PARTS]>) -> Self {
        values.into_iter().fold(Self::default(), |mut t, v| {
            t.add(Self::of(v));
            t
        })
    }

    /// Adds `o`'s values to these.
    pub fn add(&mut self, o: Totals) {
        self.count += o.count;
        for (s, v) in self.sum.iter_mut().zip(o.sum) {
            *s += v;
        }
        self.min = match (self.min, o.min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Per node and round: the running count of arrivals, then the running totals ([`WORDS`]
/// words: the count of first values, each part's sum, the least first value stored complemented,
/// so that a zeroed word means none and a larger word a smaller value); then the totals the
/// completing rank publishes, in the same form.
const ARRIVED: usize = 0;
const RUNNING: usize = 1;
const WORDS: usize = PARTS + 2;
const NOT_MIN: usize = PARTS + 1;
const TOTALS: usize = RUNNING + WORDS;
const NODE: usize = TOTALS + WORDS;
/// Per rank: its own values of each round, before its nodes' words.
const OWN: usize = 2 * PARTS;

/// A tree of sums over the world (see the module's documentation).
#[derive(Debug)]
pub struct Sums {
    words: Window<u64>,
    shape: Shape,
}

impl Sums {
    /// Collective: the tree over the world, every word zero (no round holds anything).
    pub fn new(t: &Transport, name: &str) -> Result<Self> {
        let shape = Shape::new(t.world_size(), FAN);
        let map = ShardMap::from_lens(vec![OWN + shape.levels() * 2 * NODE; t.world_size()]);
        Ok(Self { words: t.alloc_window(name, &map)?, shape })
    }

    fn per_rank(&self) -> usize {
        OWN + self.shape.levels() * 2 * NODE
    }

    /// The first word of the node of `level` above `rank`, in `round`.
    fn node(&self, rank: usize, level: usize, round: usize) -> usize {
        self.shape.host(rank, level) * self.per_rank() + OWN + (level * 2 + round % 2) * NODE
    }

    /// The word of `rank`'s own part `i` in `round`.
    fn own(&self, rank: usize, round: usize, i: usize) -> usize {
        rank * self.per_rank() + (round % 2) * PARTS + i
    }

    /// Adds `rank`'s `values` to `round`, and for as long as its arrival completes a node, that
    /// node's totals to the parent's. Most ranks issue a write of their own words, an
    /// accumulate of the running sums and two or three atomics on their level-0 node's host; a
    /// rank completing a node, a read and a write more for it, and as much again for the
    /// parent.
    pub fn add(&self, rank: usize, round: usize, values: [u64; PARTS]) -> Result<()> {
        self.words.put(self.own(rank, round, 0), &values)?;
        self.words.flush(rank)?;
        let mut carry = Totals::of(values);
        for level in 0..self.shape.levels() {
            let (node, host) = (self.node(rank, level, round), self.shape.host(rank, level));
            let mut running = [0; PARTS + 1];
            running[0] = carry.count;
            running[1..].copy_from_slice(&carry.sum);
            self.words.accumulate(node + RUNNING, &running)?;
            self.words.flush(host)?;
            if let Some(min) = carry.min {
                crate::words::raise(&self.words, node + RUNNING + NOT_MIN, !min, |_| true)?;
            }
            // Counted in after its sums have landed.
            if self.words.fetch_add(node + ARRIVED, 1)? + 1 != self.shape.children(rank, level) {
                return Ok(());
            }
            // The last arrival: publishes the node's totals and clears its running words for
            // the round's next use (nobody adds to it before every rank has read this one).
            let mut w = [0; WORDS];
            // Every arrival's sums landed before its count (a plain read: nobody adds to them
            // until the round's next use).
            self.words.get(node + RUNNING, &mut w)?;
            // The count and the running sums cleared and the totals published, in one write.
            let mut words = [0; NODE];
            words[TOTALS..].copy_from_slice(&w);
            self.words.put(node + ARRIVED, &words)?;
            self.words.flush(host)?;
            carry = unpack(&w);
        }
        Ok(())
    }

    /// Every rank's values of `round`, once every rank has added to it: one read of the root's
    /// totals.
    pub fn totals(&self, round: usize) -> Result<Totals> {
        let at = self.node(0, self.shape.levels() - 1, round) + TOTALS;
        let mut w = [0; WORDS];
        self.words.get(at, &mut w)?;
        Ok(unpack(&w))
    }

    /// The values of ranks `0..rank` in `round`, and `rank`'s own, once every rank has added
    /// to it: one batch per level (the values of the ranks before it in its level-0 node, its
    /// own with them; above, the totals of the nodes before its own under the same parent).
    pub fn before(&self, rank: usize, round: usize) -> Result<(Totals, [u64; PARTS])> {
        let first = self.shape.host(rank, 0);
        let ranges: Vec<Range<usize>> =
            (first..=rank).map(|r| self.own(r, round, 0)..self.own(r, round, 0) + PARTS).collect();
        let mut values = vec![0; ranges.len() * PARTS];
        self.words.get_batch(&ranges, &mut values)?;
        let mut acc = Totals::default();
        let mut mine = [0; PARTS];
        for (r, v) in (first..=rank).zip(values.chunks_exact(PARTS)) {
            let v: [u64; PARTS] = v.try_into().expect("PARTS values");
            if r == rank {
                mine = v;
            } else {
                acc.add(Totals::of(v));
            }
        }
        for level in 1..self.shape.levels() {
            let (parent, span) = (self.shape.host(rank, level), self.shape.span(level - 1));
            let kids = (self.shape.host(rank, level - 1) - parent) / span;
            if kids == 0 {
                continue;
            }
            let ranges: Vec<Range<usize>> = (0..kids)
                .map(|i| {
                    let at = self.node(parent + i * span, level - 1, round) + TOTALS;
                    at..at + WORDS
                })
                .collect();
            let mut w = vec![0; WORDS * kids];
            self.words.get_batch(&ranges, &mut w)?;
            for node in w.chunks_exact(WORDS) {
                acc.add(unpack(node));
            }
        }
        Ok((acc, mine))
    }

    /// Collective: frees the window.
    pub fn free(self) -> Result<()> {
        self.words.free()
    }
}

/// Totals from a node's words: count, sums, complemented minimum.
fn unpack(w: &[u64]) -> Totals {
    let count = w[0];
    Totals {
        count,
        sum: w[1..=PARTS].try_into().expect("PARTS sums"),
        min: (count > 0).then_some(!w[NOT_MIN]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `r`'s values in round `j`: no first value for every seventh rank, else a spread of
    /// sizes; the other parts anything, zeros included.
    fn value(r: usize, j: u64) -> [u64; PARTS] {
        let first = if (r + j as usize) % 7 == 3 { 0 } else { 1 + (r as u64 * 7919 + j * 104_729) % 1000 };
        [first, (r as u64 * 31 + j) % 5, r as u64 * 1_000_003]
    }

    #[test]
    fn every_rank_reads_the_worlds_totals_and_the_sums_before_it_round_after_round() {
        // One level (5), two (40: three nodes of level 0, the last part full), three (300).
        for world in [5, 40, 300] {
            let out = peregrine_transport::run_local(world, |t| -> Result<()> {
                let sums = Sums::new(&t, "sums")?;
                let r = t.rank();
                for j in 0..5u64 {
                    sums.add(r, j as usize, value(r, j))?;
                    t.barrier()?;
                    let want = Totals::of_all((0..world).map(|k| value(k, j)));
                    let before = Totals::of_all((0..r).map(|k| value(k, j)));
                    assert_eq!(sums.totals(j as usize)?, want, "world {world}, round {j}");
                    assert_eq!(
                        sums.before(r, j as usize)?,
                        (before, value(r, j)),
                        "world {world}, rank {r}, round {j}"
                    );
                    // Every rank has read round j before anyone adds to it again (j + 2).
                    t.barrier()?;
                }
                t.barrier()?;
                sums.free()
            })
            .expect("world");
            out.into_iter().for_each(|r| r.expect("rank"));
        }
    }

    #[test]
    fn a_round_without_values_totals_nothing() {
        let out = peregrine_transport::run_local(20, |t| -> Result<(Totals, Totals)> {
            let sums = Sums::new(&t, "sums")?;
            // Nobody has added yet: zeroed words.
            let empty = sums.totals(0)?;
            t.barrier()?;
            sums.add(t.rank(), 1, [0; PARTS])?;
            t.barrier()?;
            let none = sums.totals(1)?;
            t.barrier()?;
            sums.free()?;
            Ok((empty, none))
        })
        .expect("world");
        for r in out {
            assert_eq!(r.expect("rank"), (Totals::default(), Totals::default()));
        }
    }
}
