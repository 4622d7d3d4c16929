//! Cases of batched gets, puts and accumulates: ranges that jump between shards, ranges inside one
//! shard, and positioned batches of many ranges on plain and direct windows.

use std::ops::Range;

use super::{ensure, kind, pattern, Failure, Outcome, Params};
use crate::{ShardMap, Transport, Window};

/// Batches whose ranges jump back and forth between shards (one element near the end of the
/// last shard, one near the start of the first, and so on inwards; then one range across each
/// boundary; then an empty one), through [`Window`] and through a [`WriteScope`]: every range
/// lands where it says whatever shard the range before it was in. No two ranges overlap.
///
/// [`WriteScope`]: crate::WriteScope
pub(super) fn batches_between_shards(t: &Transport, _: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    // Every shard at least 5 long, but rank 1's empty when there are more than two.
    let map = ShardMap::from_lens((0..n).map(|r| if r == 1 && n > 2 { 0 } else { 5 + 3 * r }));
    let w: Window<f64> = t.alloc_window("back and forth", &map)?;
    let shards: Vec<_> = (0..n).map(|r| map.range(r)).filter(|r| !r.is_empty()).collect();
    let m = shards.len();
    let mut ranges: Vec<_> = (0..m)
        .flat_map(|i| {
            [shards[m - 1 - i].end - 2..shards[m - 1 - i].end - 1, shards[i].start + 1..shards[i].start + 2]
        })
        .collect();
    ranges.extend(shards.iter().skip(1).map(|s| s.start - 1..s.start + 1));
    ranges.push(3..3);
    let len: usize = ranges.iter().map(|r| r.len()).sum();
    let values: Vec<f64> = ranges.iter().flat_map(|r| r.clone().map(pattern)).collect();
    // Each batch is checked by a batched read (the same ranges) and by one read of the whole
    // window (split at shard boundaries): a range sent to the wrong place and read back from it
    // passes the first, not the second.
    let total = map.total();
    let check = |what: &str, expected: &dyn Fn(usize) -> f64| -> Outcome {
        let mut got = vec![0.0; len];
        w.get_batch(&ranges, &mut got)?;
        let want: Vec<f64> = ranges.iter().flat_map(|r| r.clone().map(expected)).collect();
        ensure!(t, got == want, "{what} {ranges:?}, read back by get_batch: got {got:?}, expected {want:?}");
        let mut all = vec![0.0; total];
        w.get(0, &mut all)?;
        for (i, &x) in all.iter().enumerate() {
            let want = if ranges.iter().any(|r| r.contains(&i)) { expected(i) } else { 0.0 };
            ensure!(t, x == want, "{what} {ranges:?}: element {i} is {x}, expected {want}");
        }
        Ok(())
    };
    // Rank 0 puts the pattern through a plain batch; every rank then adds 1 to every element of
    // the ranges through a scope's batch; rank 0 then puts the pattern back through a scope.
    if rank == 0 {
        w.put_batch(&ranges, &values)?;
        w.flush_all()?;
    }
    t.barrier()?;
    check("put_batch", &pattern)?;
    t.barrier()?;
    let ones = vec![1.0; len];
    w.write_scope(|s| s.accumulate_batch(&ranges, &ones))?;
    t.barrier()?;
    check("scope accumulate_batch", &|i| pattern(i) + n as f64)?;
    t.barrier()?;
    if rank == 0 {
        w.write_scope(|s| s.put_batch(&ranges, &values))?;
    }
    t.barrier()?;
    check("scope put_batch", &pattern)?;
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// Batches whose ranges all lie in one shard (the path that issues them with no test per range),
/// out of order, not from the shard's first element, and with an empty range at the shard's end,
/// which is the next shard's start:
/// each rank puts into the next rank's shard through a plain batch, then every rank adds 1
/// through a scope's batch to rank 0's shard. Each is read back by the same batch and by one read
/// of the whole window.
pub(super) fn batches_inside_one_shard(t: &Transport, _: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    let map = ShardMap::from_lens((0..n).map(|r| 6 + 2 * r));
    let w: Window<f64> = t.alloc_window("one shard", &map)?;
    let total = map.total();
    let inside = |s: usize| {
        let r = map.range(s);
        vec![r.end - 2..r.end, r.start + 1..r.start + 2, r.end..r.end, r.start + 3..r.start + 4]
    };
    let check = |what: &str, ranges: &[Range<usize>], expected: &dyn Fn(usize) -> f64| -> Outcome {
        let mut got = vec![0.0; ranges.iter().map(|r| r.len()).sum()];
        w.get_batch(ranges, &mut got)?;
        let want: Vec<f64> = ranges.iter().flat_map(|r| r.clone().map(expected)).collect();
        ensure!(t, got == want, "{what} {ranges:?}, read back by get_batch: got {got:?}, expected {want:?}");
        let mut all = vec![0.0; total];
        w.get(0, &mut all)?;
        for (i, &x) in all.iter().enumerate() {
            ensure!(t, x == expected(i), "{what} {ranges:?}: element {i} is {x}, expected {}", expected(i));
        }
        Ok(())
    };
    // Every shard gets the pattern on its batch's ranges from the rank before it.
    let written = |i: usize| (0..n).any(|s| inside(s).iter().any(|r| r.contains(&i)));
    let mine = inside((rank + 1) % n);
    let values: Vec<f64> = mine.iter().flat_map(|r| r.clone().map(pattern)).collect();
    w.put_batch(&mine, &values)?;
    w.flush_all()?;
    t.barrier()?;
    let put = |i: usize| if written(i) { pattern(i) } else { 0.0 };
    check("put_batch", &mine, &put)?;
    t.barrier()?;
    let first = inside(0);
    let ones = vec![1.0; first.iter().map(|r| r.len()).sum()];
    w.write_scope(|s| s.accumulate_batch(&first, &ones))?;
    t.barrier()?;
    let added = |i: usize| if first.iter().any(|r| r.contains(&i)) { n as f64 } else { 0.0 };
    check("scope accumulate_batch", &first, &|i| put(i) + added(i))?;
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// [`positioned_batches`] on a window from [`Transport::alloc_window`] (under MPI, a target's
/// many ranges travel as one operation of an indexed datatype).
pub(super) fn positioned_batches_plain(t: &Transport, _: &Params) -> Outcome {
    let map = ShardMap::from_lens((0..t.world_size()).map(|r| 150 + 37 * r));
    positioned_batches(t, t.alloc_window("positioned", &map)?)
}

/// [`positioned_batches`] on a window from [`Transport::alloc_direct_window`] (loads, stores
/// and atomic adds in place where every rank maps it whole).
pub(super) fn positioned_batches_direct(t: &Transport, _: &Params) -> Outcome {
    let n = t.world_size();
    positioned_batches(
        t,
        t.alloc_direct_window("positioned direct", &ShardMap::balanced_in_lines::<f32>(150 * n + 7, n))?,
    )
}

/// Positioned batches ([`Window::get_at`], [`crate::WriteScope::put_at`], `accumulate_at`) of many
/// ranges to every target (single elements, runs, ranges across a shard's end, an empty one),
/// as a sparse model's keys are: rank 0 puts the pattern at them, every rank then adds its
/// rank + 1 at every third of them and reads every range back into the positions of a vector
/// that holds a marker elsewhere; one read of the whole window checks that nothing landed
/// beside its range.
pub(super) fn positioned_batches(t: &Transport, w: Window<f32>) -> Outcome {
    let (rank, n, total) = (t.rank(), t.world_size(), w.len());
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut i = 1;
    while i + 3 < total {
        ranges.push(if i % 5 == 0 { i..i + 3 } else { i..i + 1 });
        i += 4 + i % 3;
    }
    for r in 1..n {
        let b = w.map().range(r).start;
        if b >= 2 && b + 2 <= total && !ranges.iter().any(|x| x.start < b + 2 && b - 2 < x.end) {
            ranges.push(b - 2..b + 2); // across the shard's boundary
        }
    }
    ranges.sort_by_key(|r| r.start);
    ranges.push(5..5);
    let inside = |i: usize| ranges.iter().any(|r| r.contains(&i));
    let third: Vec<Range<usize>> = ranges.iter().step_by(3).cloned().collect();
    let in_third = |i: usize| third.iter().any(|r| r.contains(&i));
    let pat = |i: usize| (i % 251) as f32;
    let values: Vec<f32> = (0..total).map(pat).collect();
    if rank == 0 {
        w.write_scope(|s| s.put_at(&ranges, &values))?;
    }
    t.barrier()?;
    let add = vec![(rank + 1) as f32; total];
    w.write_scope(|s| s.accumulate_at(&third, &add))?;
    t.barrier()?;
    let sum = (n * (n + 1) / 2) as f32;
    let want = |i: usize| if inside(i) { pat(i) + if in_third(i) { sum } else { 0.0 } } else { 0.0 };
    let mut got = vec![-1.0f32; total];
    w.get_at(&ranges, &mut got)?;
    for (i, &x) in got.iter().enumerate() {
        let expected = if inside(i) { want(i) } else { -1.0 };
        ensure!(t, x == expected, "get_at: position {i} holds {x}, expected {expected}");
    }
    let mut all = vec![0.0f32; total];
    w.get(0, &mut all)?;
    for (i, &x) in all.iter().enumerate() {
        ensure!(t, x == want(i), "after put_at and accumulate_at: element {i} is {x}, expected {}", want(i));
    }
    ensure!(
        t,
        kind(w.get_at(&ranges, &mut got[1..])).is_some(),
        "get_at into a vector shorter than the window"
    );
    t.barrier()?;
    w.free()?;
    Ok(())
}
