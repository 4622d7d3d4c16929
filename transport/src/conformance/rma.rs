//! Cases of single-range gets, puts and accumulates over whole windows whose shards are uneven,
//! and the small-integer conversion that makes their sums exact in every element type.

use super::{ensure, pattern, uneven_map, Failure, Outcome, Params};
use crate::{Elem, Transport, Window};

/// Puts and gets over global ranges that do not line up with the (uneven) shards.
pub(super) fn uneven_shards(t: &Transport, _: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    let map = uneven_map(n);
    let w: Window<f64> = t.alloc_window("uneven", &map)?;
    let total = map.total();
    // Rank r writes the r-th of n equal slices of the global range: they cross shard boundaries.
    let slice = |r: usize| (r * total / n)..((r + 1) * total / n);
    let mine = slice(rank);
    let data: Vec<f64> = mine.clone().map(pattern).collect();
    // Half with one put, half with a batched put of single elements.
    let mid = mine.start + mine.len() / 2;
    w.put(mine.start, &data[..mid - mine.start])?;
    let singles: Vec<_> = (mid..mine.end).map(|i| i..i + 1).collect();
    w.put_batch(&singles, &data[mid - mine.start..])?;
    w.flush_all()?;
    t.barrier()?;

    let mut all = vec![0.0; total];
    w.get(0, &mut all)?;
    for (i, &x) in all.iter().enumerate() {
        ensure!(t, x == pattern(i), "get(0..{total}): element {i} is {x}, expected {}", pattern(i));
    }
    // A batch of ranges around every shard boundary, some empty.
    let ranges: Vec<_> = (0..n)
        .map(|r| map.range(r).start)
        .map(|b| b.saturating_sub(2)..(b + 2).min(total))
        .chain([total..total, 0..0])
        .collect();
    let mut out = vec![0.0; ranges.iter().map(|r| r.len()).sum()];
    w.get_batch(&ranges, &mut out)?;
    let expected: Vec<f64> = ranges.iter().flat_map(|r| r.clone().map(pattern)).collect();
    ensure!(t, out == expected, "get_batch around shard boundaries: got {out:?}, expected {expected:?}");
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// Every rank accumulates into every element of every shard, by single ranges and by batches;
/// then every rank reads back the exact sums (small integers: exact in every type).
pub(super) fn accumulate_everywhere<T: Elem + FromSmall>(t: &Transport, _: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    let map = uneven_map(n);
    let total = map.total();
    let w: Window<T> = t.alloc_window("accumulate", &map)?;
    const ROUNDS: usize = 3;
    let contribution = |r: usize, i: usize| (r + 1) * (i % 13 + 1);
    let data: Vec<T> = (0..total).map(|i| T::from_small(contribution(rank, i))).collect();
    for _ in 0..ROUNDS {
        w.accumulate(0, &data)?;
    }
    // One more round as a batch of odd-sized ranges.
    let ranges: Vec<_> = (0..total).step_by(3).map(|s| s..(s + 3).min(total)).collect();
    w.accumulate_batch(&ranges, &data)?;
    w.flush_all()?;
    t.barrier()?;
    let mut got = vec![T::default(); total];
    w.get(0, &mut got)?;
    for (i, &x) in got.iter().enumerate() {
        let want = T::from_small((0..n).map(|r| contribution(r, i)).sum::<usize>() * (ROUNDS + 1));
        ensure!(t, x == want, "{}: element {i} is {x:?}, expected {want:?}", T::NAME);
    }
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// Conversion of small integers, exact in every element type.
pub trait FromSmall {
    /// `v` as this type (exact for `v < 2^24`).
    fn from_small(v: usize) -> Self;
}
impl FromSmall for f32 {
    fn from_small(v: usize) -> Self {
        v as f32
    }
}
impl FromSmall for f64 {
    fn from_small(v: usize) -> Self {
        v as f64
    }
}
impl FromSmall for u64 {
    fn from_small(v: usize) -> Self {
        v as u64
    }
}
