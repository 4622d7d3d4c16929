//! The conformance suite: what every backend must do, as SPMD cases that check their own results.
//!
//! Each case is run by every rank of a world (threads under `cargo test` for `local`, processes
//! under `mpirun -n 2|4` for `mpi`: see `tests/`) and returns an error naming the rank and what
//! was wrong. [`run_all`] runs them in order, with a barrier between cases.

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::{Elem, Error, ErrorKind, ReduceOp, ShardMap, Transport, Window, SHARD_LINE};

/// How a case failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// A transport call failed where it should have worked.
    #[error(transparent)]
    Transport(#[from] Error),
    /// A result was wrong.
    #[error("rank {rank}: {detail}")]
    Check {
        /// The rank that saw it.
        rank: usize,
        /// What was expected and what came.
        detail: String,
    },
}

type Outcome = std::result::Result<(), Failure>;

/// The kind of a result's error, if any.
fn kind<T>(r: crate::Result<T>) -> Option<ErrorKind> {
    r.err().map(Error::into_kind)
}

macro_rules! ensure {
    ($t:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failure::Check { rank: $t.rank(), detail: format!($($fmt)+) });
        }
    };
}

/// Sizes of the suite's loops.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// `fetch_add` calls per rank on the shared counter.
    pub tickets_per_rank: usize,
    /// Rounds of the compare-and-swap election.
    pub election_rounds: usize,
    /// Critical sections per rank under the compare-and-swap spin lock.
    pub lock_sections: usize,
    /// Whether a window from [`Transport::alloc_shared_window`] must be readable whole in place
    /// ([`Window::whole_in_place`]: MPI processes on one node with shared windows), must not be,
    /// or (`None`) either.
    pub whole_in_place: Option<bool>,
}

impl Default for Params {
    fn default() -> Self {
        Self { tickets_per_rank: 100_000, election_rounds: 200, lock_sections: 200, whole_in_place: None }
    }
}

/// A named case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Short name, printed in reports.
    pub name: &'static str,
    /// The case; every rank calls it.
    pub run: fn(&Transport, &Params) -> Outcome,
}

/// Every case, in the order [`run_all`] runs them.
pub const CASES: &[Case] = &[
    Case { name: "collectives", run: collectives },
    Case { name: "uneven-shards-crossing-ranges", run: uneven_shards },
    Case { name: "batches-back-and-forth-between-shards", run: batches_between_shards },
    Case { name: "batches-inside-one-shard", run: batches_inside_one_shard },
    Case { name: "own-shard-in-place", run: own_shard_in_place },
    Case { name: "shared-window-read-whole-in-place", run: whole_in_place },
    Case { name: "accumulate-everywhere-f32", run: accumulate_everywhere::<f32> },
    Case { name: "accumulate-everywhere-f64", run: accumulate_everywhere::<f64> },
    Case { name: "accumulate-everywhere-u64", run: accumulate_everywhere::<u64> },
    Case { name: "fetch-add-tickets", run: fetch_add_tickets },
    Case { name: "compare-and-swap-election", run: cas_election },
    Case { name: "compare-and-swap-spin-lock", run: cas_spin_lock },
    Case { name: "owner-waits-on-its-own-shard", run: owner_waits },
    Case { name: "swap-chain-and-load", run: swap_chain },
    Case { name: "load-batch-of-every-rank", run: load_batch_everywhere },
    Case { name: "positioned-batches-of-many-ranges", run: positioned_batches_plain },
    Case { name: "positioned-batches-on-a-direct-window", run: positioned_batches_direct },
    Case { name: "direct-window-accumulates-and-atomics", run: direct_window },
    Case { name: "bad-use-is-an-error", run: bad_use },
];

/// Result of one case on this rank.
#[derive(Debug)]
pub struct CaseReport {
    /// The case's name.
    pub name: &'static str,
    /// Wall time on this rank.
    pub elapsed: Duration,
    /// What happened.
    pub outcome: Outcome,
}

impl CaseReport {
    /// One report line: `ok   <case> <ms> (<ranks> ranks, <backend>)` or `FAIL <case> <error>`.
    pub fn line(&self, t: &Transport) -> String {
        match &self.outcome {
            Ok(()) => format!(
                "ok   {:<32} {:>9.3} ms  ({} ranks, {})",
                self.name,
                self.elapsed.as_secs_f64() * 1e3,
                t.world_size(),
                t.backend()
            ),
            Err(e) => format!("FAIL {:<32} {e}", self.name),
        }
    }
}

/// The line rank 0 prints after every case passed.
pub fn summary_line(t: &Transport) -> String {
    format!("conformance: all cases passed on {} ranks ({})", t.world_size(), t.backend())
}

/// Runs one case on this rank (collective), then a barrier.
pub fn run_case(t: &Transport, case: &Case, params: &Params) -> CaseReport {
    let start = Instant::now();
    let outcome = (case.run)(t, params).and_then(|()| Ok(t.barrier()?));
    CaseReport { name: case.name, elapsed: start.elapsed(), outcome }
}

/// Runs every case on this rank (collective), and calls `report` after each. Stops at the first
/// failure, since peers may then be stuck in a different collective.
pub fn run_all(t: &Transport, params: &Params, mut report: impl FnMut(&CaseReport)) -> Outcome {
    for case in CASES {
        let r = run_case(t, case, params);
        report(&r);
        r.outcome?;
    }
    Ok(())
}

/// `allreduce` (sum, min, max on each type) and `broadcast` from every root.
fn collectives(t: &Transport, _: &Params) -> Outcome {
    let (r, n) = (t.rank() as u64, t.world_size() as u64);
    let mut v = [r, 10 + r, 1];
    t.allreduce(&mut v, ReduceOp::Sum)?;
    ensure!(t, v == [n * (n - 1) / 2, 10 * n + n * (n - 1) / 2, n], "u64 sum: got {v:?}");
    let mut v = [r as f64 * 0.5, -(r as f64)];
    t.allreduce(&mut v, ReduceOp::Min)?;
    ensure!(t, v == [0.0, -((n - 1) as f64)], "f64 min: got {v:?}");
    let mut v = [r as f32, 3.0];
    t.allreduce(&mut v, ReduceOp::Max)?;
    ensure!(t, v == [(n - 1) as f32, 3.0], "f32 max: got {v:?}");
    for root in 0..t.world_size() {
        let mut b = [r * 7 + 1, 42, r];
        t.broadcast(&mut b, root)?;
        let root = root as u64;
        ensure!(t, b == [root * 7 + 1, 42, root], "broadcast from {root}: got {b:?}");
    }
    Ok(())
}

/// An uneven map with an empty shard; value at global index `i`.
fn uneven_map(n: usize) -> ShardMap {
    ShardMap::from_lens((0..n).map(|r| if r == 1 { 0 } else { 5 + 7 * r + 3 * (r % 2) }))
}

fn pattern(i: usize) -> f64 {
    (i * i) as f64 * 0.25 + 1.0
}

/// Puts and gets over global ranges that do not line up with the (uneven) shards.
fn uneven_shards(t: &Transport, _: &Params) -> Outcome {
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

/// Batches whose ranges jump back and forth between shards (one element near the end of the
/// last shard, one near the start of the first, and so on inwards; then one range across each
/// boundary; then an empty one), through [`Window`] and through a [`WriteScope`]: every range
/// lands where it says whatever shard the range before it was in. No two ranges overlap.
///
/// [`WriteScope`]: crate::WriteScope
fn batches_between_shards(t: &Transport, _: &Params) -> Outcome {
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
fn batches_inside_one_shard(t: &Transport, _: &Params) -> Outcome {
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

/// Every rank accumulates into every shard; between barriers each rank then reads the sums in its
/// own shard in place ([`Window::with_own_shard`]) and overwrites them there; every rank then
/// reads the whole window, and accumulates once more on top of what was stored in place.
fn own_shard_in_place(t: &Transport, _: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    let map = uneven_map(n);
    let w: Window<f64> = t.alloc_window("in place", &map)?;
    let total = map.total();
    let ones = vec![1.0; total];
    w.accumulate(0, &ones)?;
    w.flush_all()?;
    t.barrier()?;
    let mine = map.range(rank);
    // SAFETY: every rank's accumulates were flushed before the barrier above, and nobody touches
    // the window again before the barrier below.
    let seen = unsafe {
        w.with_own_shard(|own| {
            let seen: Vec<f64> = own.to_vec();
            for (j, x) in own.iter_mut().enumerate() {
                *x = 2.0 * pattern(mine.start + j);
            }
            seen
        })
    }?;
    ensure!(t, seen.len() == mine.len(), "own shard of {} elements, expected {:?}", seen.len(), mine);
    ensure!(
        t,
        seen.iter().all(|&x| x == n as f64),
        "own shard read in place: {seen:?}, expected {n} everywhere"
    );
    t.barrier()?;
    let mut all = vec![0.0; total];
    w.get(0, &mut all)?;
    for (i, &x) in all.iter().enumerate() {
        ensure!(
            t,
            x == 2.0 * pattern(i),
            "after the stores in place: element {i} is {x}, expected {}",
            2.0 * pattern(i)
        );
    }
    t.barrier()?;
    w.accumulate(0, &ones)?;
    w.flush_all()?;
    t.barrier()?;
    w.get(0, &mut all)?;
    for (i, &x) in all.iter().enumerate() {
        let want = 2.0 * pattern(i) + n as f64;
        ensure!(
            t,
            x == want,
            "accumulated on top of the stores in place: element {i} is {x}, expected {want}"
        );
    }
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// A window from [`Transport::alloc_shared_window`] in whole lines: read whole in place
/// where this rank maps it (as [`Params::whole_in_place`] asks), it holds what every rank put;
/// after each owner stored into its shard in place, what they stored, in place and by `get`
/// alike; an accumulate lands on it as on any window.
fn whole_in_place(t: &Transport, p: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    let map = ShardMap::balanced_in_lines::<f32>(48 * n + 5, n);
    let w: Window<f32> = t.alloc_shared_window("whole", &map)?;
    let (total, mine) = (map.total(), map.range(rank));
    let at = |i: usize| pattern(i) as f32;
    let values: Vec<f32> = mine.clone().map(at).collect();
    w.put(mine.start, &values)?;
    w.flush_all()?;
    t.barrier()?;
    // SAFETY: every rank's puts were flushed before the barrier above; nobody writes before the
    // barrier below, after the last use of the slice.
    let whole = unsafe { w.whole_in_place() }?;
    // In place, element 0 (and so every shard: whole lines) starts on a cache line, whatever
    // offset the library gave the first allocation.
    let line = whole.map(|s| s.as_ptr() as usize % SHARD_LINE);
    ensure!(t, line.is_none_or(|l| l == 0), "read in place from {line:?} bytes past a line");
    let seen = whole.map(<[f32]>::to_vec);
    if let Some(want) = p.whole_in_place {
        ensure!(t, seen.is_some() == want, "read whole in place: {}, expected {want}", seen.is_some());
    }
    if let Some(seen) = &seen {
        ensure!(t, seen.len() == total, "{} elements read in place, expected {total}", seen.len());
        for (i, &x) in seen.iter().enumerate() {
            ensure!(t, x == at(i), "read in place: element {i} is {x}, expected {}", at(i));
        }
    }
    t.barrier()?;
    // SAFETY: nobody else touches the window between the barriers around this.
    unsafe {
        w.with_own_shard(|own| own.iter_mut().enumerate().for_each(|(j, x)| *x = -at(mine.start + j)))
    }?;
    t.barrier()?;
    let mut all = vec![0.0f32; total];
    w.get(0, &mut all)?;
    // SAFETY: the stores in place ended before the barrier above; nobody writes before the
    // barrier below.
    let seen = unsafe { w.whole_in_place() }?.map(<[f32]>::to_vec);
    for (i, &x) in all.iter().enumerate() {
        ensure!(t, x == -at(i), "after the stores in place: element {i} is {x}, expected {}", -at(i));
    }
    ensure!(t, seen.as_ref().is_none_or(|s| *s == all), "read in place after the stores: {seen:?}");
    t.barrier()?;
    w.accumulate(0, &vec![1.0; total])?;
    w.flush_all()?;
    t.barrier()?;
    w.get(0, &mut all)?;
    for (i, &x) in all.iter().enumerate() {
        let want = -at(i) + n as f32;
        ensure!(t, x == want, "accumulated: element {i} is {x}, expected {want}");
    }
    t.barrier()?;
    // Batches and atomics address every shard alike (rank 0's from an offset within its
    // allocation where the library placed it off a line): ranges inside the first shard, then
    // ranges over all of them, one across a boundary.
    let first = map.range(0);
    let inside = [first.start + 1..first.start + 3, first.end - 4..first.end];
    let edge = map.range(n - 1);
    let spread = [0..2, first.end - 3..(first.end + 2).min(total), edge.end - 2..edge.end];
    for ranges in [&inside[..], &spread[..]] {
        let mut got = vec![0.0f32; ranges.iter().map(|r| r.len()).sum()];
        w.get_batch(ranges, &mut got)?;
        let want: Vec<f32> = ranges.iter().flat_map(|r| r.clone()).map(|i| -at(i) + n as f32).collect();
        ensure!(t, got == want, "batch get of {ranges:?}: {got:?}, expected {want:?}");
    }
    t.barrier()?;
    // An atomic at rank 0's shard, where it lies in place (a shared window: the offset applies
    // there alone). Elsewhere not: OpenMPI 4.1's `osc/ucx` adds `MPI_FLOAT`s as integers in
    // `MPI_Fetch_and_op` (0.75 + 1 + 1 read back as -0.1875), and the engine's atomics are all on
    // `u64` windows.
    if seen.is_some() {
        let before = w.fetch_add(1, 1.0)?;
        // What the ranks before this one added: 0 to n - 1, whole.
        let k = before - (-at(1) + n as f32);
        ensure!(t, k == k.trunc() && (0.0..n as f32).contains(&k), "fetch_add at element 1 saw {before}");
        w.flush_all()?;
        t.barrier()?;
        w.get(0, &mut all[..2])?;
        let want = -at(1) + 2.0 * n as f32;
        ensure!(t, all[1] == want, "after every rank's fetch_add: element 1 is {}, expected {want}", all[1]);
    }
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// Every rank accumulates into every element of every shard, by single ranges and by batches;
/// then every rank reads back the exact sums (small integers: exact in every type).
fn accumulate_everywhere<T: Elem + FromSmall>(t: &Transport, _: &Params) -> Outcome {
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

/// [`positioned_batches`] on a window from [`Transport::alloc_window`] (under MPI, a target's
/// many ranges travel as one operation of an indexed datatype).
fn positioned_batches_plain(t: &Transport, _: &Params) -> Outcome {
    let map = ShardMap::from_lens((0..t.world_size()).map(|r| 150 + 37 * r));
    positioned_batches(t, t.alloc_window("positioned", &map)?)
}

/// [`positioned_batches`] on a window from [`Transport::alloc_direct_window`] (loads, stores
/// and atomic adds in place where every rank maps it whole).
fn positioned_batches_direct(t: &Transport, _: &Params) -> Outcome {
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
fn positioned_batches(t: &Transport, w: Window<f32>) -> Outcome {
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

/// A direct window ([`Transport::alloc_direct_window`]) is direct exactly where every rank maps it
/// whole (the local backend; MPI processes on one node with shared windows), and its float
/// accumulates and atomics are atomic with each other from every rank at once: whole-vector
/// accumulates crossing every shard and positioned ones racing on the same elements give exact
/// sums, `fetch_add` hands out every float ticket once where the window is direct, and `u64` atomics work as on any
/// window.
fn direct_window(t: &Transport, p: &Params) -> Outcome {
    let (rank, n) = (t.rank(), t.world_size());
    let map = ShardMap::balanced_in_lines::<f32>(40 * n + 3, n);
    let total = map.total();
    let w: Window<f32> = t.alloc_direct_window("direct", &map)?;
    if let Some(whole) = p.whole_in_place {
        ensure!(t, w.is_direct() == whole, "is_direct() is {}, expected {whole}", w.is_direct());
    }
    const ROUNDS: usize = 50;
    let contribution = |r: usize, i: usize| ((r + 1) * (i % 7 + 1)) as f32;
    let data: Vec<f32> = (0..total).map(|i| contribution(rank, i)).collect();
    let every: Vec<Range<usize>> = (0..total).map(|i| i..i + 1).collect();
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            w.accumulate(0, &data)?;
        } else {
            w.write_scope(|s| s.accumulate_at(&every, &data))?;
        }
    }
    w.flush_all()?;
    t.barrier()?;
    let mut got = vec![0.0f32; total];
    w.get(0, &mut got)?;
    for (i, &x) in got.iter().enumerate() {
        let want = (0..n).map(|r| contribution(r, i)).sum::<f32>() * ROUNDS as f32;
        ensure!(t, x == want, "element {i} is {x}, expected {want} (an add lost or doubled)");
    }
    t.barrier()?;
    // Float tickets from one element of the last shard: atomic where the window is direct (its
    // adds are ours). Elsewhere a float's `MPI_Fetch_and_op` is the library's: OpenMPI 4.1's
    // `osc/ucx` hands some tickets out twice (the engine's atomics are all on u64 windows).
    if w.is_direct() {
        let last = map.range(n - 1).start;
        let k = 2000;
        // Counted from what the accumulates left there (small enough for every ticket to be exact).
        let base = got[last];
        let tickets: Vec<u64> =
            (0..k).map(|_| w.fetch_add(last, 1.0).map(|v| (v - base) as u64)).collect::<Result<_, _>>()?;
        t.barrier()?;
        let mut all = Vec::with_capacity(n * k);
        for r in 0..n {
            let mut b = if r == rank { tickets.clone() } else { vec![0; k] };
            t.broadcast(&mut b, r)?;
            all.extend(b);
        }
        all.sort_unstable();
        ensure!(
            t,
            all.iter().enumerate().all(|(i, &x)| x == i as u64),
            "float tickets were not handed out once each"
        );
        t.barrier()?;
    }
    let counter: Window<u64> =
        t.alloc_direct_window("direct counter", &ShardMap::balanced_in_lines::<u64>(8 * n, n))?;
    for _ in 0..100 {
        counter.fetch_add(3, 1)?;
    }
    let won = counter.compare_and_swap(5, 0, rank as u64 + 1)?;
    t.barrier()?;
    ensure!(t, counter.load(3)? == 100 * n as u64, "u64 fetch_add on a direct window: {}", counter.load(3)?);
    let winner = counter.load(5)?;
    ensure!(
        t,
        (1..=n as u64).contains(&winner) && (won == 0) == (winner == rank as u64 + 1),
        "compare-and-swap: winner {winner}, this rank saw {won}"
    );
    t.barrier()?;
    counter.free()?;
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

/// Every rank takes `tickets_per_rank` tickets with `fetch_add(1)` on one counter: the total is
/// exact and every ticket is handed out exactly once.
fn fetch_add_tickets(t: &Transport, p: &Params) -> Outcome {
    let n = t.world_size();
    let k = p.tickets_per_rank;
    // The counter lives on the last rank, so that it is remote for most ranks.
    let counter: Window<u64> =
        t.alloc_window("counter", &ShardMap::from_lens((0..n).map(|r| usize::from(r == n - 1))))?;
    let seen: Window<u64> = t.alloc_window("seen", &ShardMap::balanced(n * k, n))?;
    let mut tickets = Vec::with_capacity(k);
    for _ in 0..k {
        tickets.push(counter.fetch_add(0, 1)?);
    }
    ensure!(t, tickets.windows(2).all(|w| w[0] < w[1]), "tickets of one rank are not increasing");
    ensure!(t, tickets.iter().all(|&x| x < (n * k) as u64), "a ticket is >= {}", n * k);
    // Mark every ticket taken; a ticket handed out twice would count 2.
    let ranges: Vec<_> = tickets.iter().map(|&x| x as usize..x as usize + 1).collect();
    seen.accumulate_batch(&ranges, &vec![1; k])?;
    seen.flush_all()?;
    t.barrier()?;
    let mut total = [0u64];
    counter.get(0, &mut total)?;
    ensure!(t, total[0] == (n * k) as u64, "counter is {}, expected {}", total[0], n * k);
    // Each rank checks its own shard of `seen`.
    let mine = seen.map().range(t.rank());
    let mut marks = vec![0u64; mine.len()];
    seen.get(mine.start, &mut marks)?;
    if let Some((i, &m)) = marks.iter().enumerate().find(|(_, &m)| m != 1) {
        return Err(Failure::Check {
            rank: t.rank(),
            detail: format!("ticket {} was handed out {m} times", mine.start + i),
        });
    }
    t.barrier()?;
    seen.free()?;
    counter.free()?;
    Ok(())
}

/// Rounds of swaps: every rank `swap`s a value of its own into one word on rank 0; the previous
/// values returned form a chain (each written value is returned to exactly one later swapper, but
/// the last, which a `load` then reads), and `load` does not change the word.
fn swap_chain(t: &Transport, p: &Params) -> Outcome {
    let n = t.world_size();
    let word: Window<u64> =
        t.alloc_window("word", &ShardMap::from_lens((0..n).map(|r| usize::from(r == 0))))?;
    for round in 0..p.election_rounds as u64 {
        let start = u64::MAX - round;
        if t.rank() == 0 {
            word.swap(0, start)?;
        }
        t.barrier()?;
        let mine = round * 1_000_000 + t.rank() as u64 + 1;
        let mut prevs = vec![0u64; n];
        prevs[t.rank()] = word.swap(0, mine)?;
        t.allreduce(&mut prevs, ReduceOp::Sum)?;
        let last = word.load(0)?;
        ensure!(t, word.load(0)? == last, "round {round}: load changed the word");
        let mut seen: Vec<u64> = prevs.iter().copied().chain(std::iter::once(last)).collect();
        let mut want: Vec<u64> =
            (0..n as u64).map(|r| round * 1_000_000 + r + 1).chain(std::iter::once(start)).collect();
        seen.sort_unstable();
        want.sort_unstable();
        ensure!(t, seen == want, "round {round}: swaps returned {prevs:?} and left {last}");
        t.barrier()?;
    }
    word.free()?;
    Ok(())
}

/// Every rank counts its own two words up with `fetch_add` (a tenth of `tickets_per_rank`
/// times) while reading every rank's words in
/// batches ([`Window::load_batch`], once as one range and once word by word, odd words first):
/// each word read never goes back (atomic reads of a monotone counter, no torn or stale-then-new
/// values out of order within a batch's element), and after a barrier every word reads exactly
/// its final count.
fn load_batch_everywhere(t: &Transport, p: &Params) -> Outcome {
    let n = t.world_size();
    let k = (p.tickets_per_rank / 10).max(1) as u64;
    let words: Window<u64> = t.alloc_window("words", &ShardMap::from_lens(vec![2; n]))?;
    let me = t.rank();
    let odd_then_even: Vec<_> =
        (0..n).map(|r| 2 * r + 1..2 * r + 2).chain((0..n).map(|r| 2 * r..2 * r + 1)).collect();
    let reorder = |got: &[u64]| -> Vec<u64> {
        let mut v = vec![0; 2 * n];
        for r in 0..n {
            v[2 * r + 1] = got[r];
            v[2 * r] = got[n + r];
        }
        v
    };
    let mut last = vec![0u64; 2 * n];
    let mut got = vec![0u64; 2 * n];
    for i in 0..k {
        words.fetch_add(2 * me, 1)?;
        words.fetch_add(2 * me + 1, 1)?;
        let seen = if i % 2 == 0 {
            words.load_range(0, &mut got)?;
            got.clone()
        } else {
            words.load_batch(&odd_then_even, &mut got)?;
            reorder(&got)
        };
        for (w, (&s, &l)) in seen.iter().zip(&last).enumerate() {
            ensure!(t, s >= l && s <= k, "round {i}: word {w} read {s} after {l} (counts to {k})");
        }
        ensure!(t, seen[2 * me] > i && seen[2 * me + 1] > i, "round {i}: own words read {seen:?}");
        last = seen;
    }
    t.barrier()?;
    words.load_range(0, &mut got)?;
    ensure!(t, got.iter().all(|&g| g == k), "after the barrier: {got:?}, expected {k} everywhere");
    t.barrier()?;
    words.free()?;
    Ok(())
}

/// Rounds of an election: every rank tries `compare_and_swap(0 -> rank + 1)` once on a lock word;
/// exactly one wins each round, and every rank agrees on who.
fn cas_election(t: &Transport, p: &Params) -> Outcome {
    let n = t.world_size();
    let me = t.rank() as u64 + 1;
    let lock: Window<u64> =
        t.alloc_window("lock", &ShardMap::from_lens((0..n).map(|r| usize::from(r == 0))))?;
    let wins: Window<u64> = t.alloc_window("wins", &ShardMap::balanced(p.election_rounds, n))?;
    for round in 0..p.election_rounds {
        let prev = lock.compare_and_swap(0, 0, me)?;
        if prev == 0 {
            wins.fetch_add(round, 1)?;
        } else {
            ensure!(t, (1..=n as u64).contains(&prev) && prev != me, "round {round}: lock word held {prev}");
        }
        t.barrier()?;
        let mut winner = [0u64];
        lock.get(0, &mut winner)?;
        ensure!(
            t,
            (prev == 0) == (winner[0] == me),
            "round {round}: CAS returned {prev} but the lock holds {}",
            winner[0]
        );
        t.barrier()?;
        if prev == 0 {
            // The winner releases the lock for the next round.
            let released = lock.compare_and_swap(0, me, 0)?;
            ensure!(t, released == me, "round {round}: winner found {released} when releasing");
        }
        t.barrier()?;
    }
    let mut w = vec![0u64; p.election_rounds];
    wins.get(0, &mut w)?;
    if let Some((round, &c)) = w.iter().enumerate().find(|(_, &c)| c != 1) {
        return Err(Failure::Check { rank: t.rank(), detail: format!("round {round} had {c} winners") });
    }
    t.barrier()?;
    wins.free()?;
    lock.free()?;
    Ok(())
}

/// A spin lock built on `compare_and_swap` protects a non-atomic read-modify-write (`get`, then
/// `put` + `flush`) of a counter: no update is lost. Without the flush before release, the local
/// backend loses updates (as MPI may).
fn cas_spin_lock(t: &Transport, p: &Params) -> Outcome {
    let n = t.world_size();
    let me = t.rank() as u64 + 1;
    let map = ShardMap::from_lens((0..n).map(|r| if r == n - 1 { 2 } else { 0 }));
    let w: Window<u64> = t.alloc_window("spin lock", &map)?;
    let (lock_at, counter_at) = (0, 1);
    for _ in 0..p.lock_sections {
        while w.compare_and_swap(lock_at, 0, me)? != 0 {
            std::hint::spin_loop();
        }
        let mut c = [0u64];
        w.get(counter_at, &mut c)?;
        w.put(counter_at, &[c[0] + 1])?;
        w.flush(n - 1)?;
        let held = w.compare_and_swap(lock_at, me, 0)?;
        ensure!(t, held == me, "lock word held {held} while rank {} owned it", me - 1);
    }
    t.barrier()?;
    let mut c = [0u64];
    w.get(counter_at, &mut c)?;
    ensure!(t, c[0] == (n * p.lock_sections) as u64, "counter is {}, expected {}", c[0], n * p.lock_sections);
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// How long [`owner_waits`] lets rank 0 wait for the others' reads of its shard.
const OWNER_WAIT: Duration = Duration::from_secs(60);

/// Rank 0 waits for a word of its own shard, polling it with atomic loads and
/// [`Transport::progress`], while every other rank makes `election_rounds` atomic loads of
/// rank 0's shard and then adds one to the word: the others' loads are served while rank 0
/// only reads its own memory. (Under OpenMPI's osc/ucx over TCP, without `progress`, rank 0
/// served them only inside its own loads, holding its accumulate lock: their loads waited for
/// the lock for seconds or for good.)
fn owner_waits(t: &Transport, p: &Params) -> Outcome {
    let n = t.world_size();
    let w: Window<u64> =
        t.alloc_window("owner's words", &ShardMap::from_lens((0..n).map(|r| if r == 0 { 2 } else { 0 })))?;
    let (done_at, read_at) = (0, 1);
    t.barrier()?;
    if t.rank() == 0 {
        let t0 = Instant::now();
        loop {
            t.progress()?;
            let done = w.load(done_at)?;
            if done == n as u64 - 1 {
                break;
            }
            ensure!(
                t,
                t0.elapsed() < OWNER_WAIT,
                "{done} of {} ranks done reading rank 0's shard after {} s of its waiting",
                n - 1,
                OWNER_WAIT.as_secs()
            );
            std::thread::sleep(Duration::from_micros(50));
        }
    } else {
        for _ in 0..p.election_rounds {
            let v = w.load(read_at)?;
            ensure!(t, v == 0, "read {v} from a word nobody writes");
        }
        w.fetch_add(done_at, 1)?;
    }
    t.barrier()?;
    w.free()?;
    Ok(())
}

/// Bad use is a typed error on every rank, never UB or a hang, and the world stays usable.
fn bad_use(t: &Transport, _: &Params) -> Outcome {
    let n = t.world_size();
    let w: Window<f32> = t.alloc_window("small", &ShardMap::balanced(10, n))?;
    let mut buf = [0.0f32; 4];
    ensure!(
        t,
        matches!(kind(w.get(8, &mut buf)), Some(ErrorKind::OutOfRange { start: 8, end: 12, len: 10, .. })),
        "get past the end was not OutOfRange"
    );
    ensure!(
        t,
        matches!(kind(w.put(usize::MAX, &buf)), Some(ErrorKind::OutOfRange { .. })),
        "put at usize::MAX was not OutOfRange"
    );
    ensure!(
        t,
        matches!(kind(w.accumulate(7, &buf)), Some(ErrorKind::OutOfRange { .. })),
        "accumulate past the end was not OutOfRange"
    );
    ensure!(
        t,
        matches!(kind(w.fetch_add(10, 1.0)), Some(ErrorKind::OutOfRange { .. })),
        "fetch_add at len was not OutOfRange"
    );
    #[allow(clippy::reversed_empty_ranges, clippy::single_range_in_vec_init)]
    let backwards = [5..3];
    ensure!(
        t,
        matches!(kind(w.get_batch(&backwards, &mut [])), Some(ErrorKind::OutOfRange { .. })),
        "a backwards range was not OutOfRange"
    );
    ensure!(
        t,
        matches!(
            kind(w.get_batch(&[0..2, 3..5], &mut buf[..3])),
            Some(ErrorKind::LengthMismatch { expected: 4, got: 3, .. })
        ),
        "short batch buffer was not LengthMismatch"
    );
    let words: Window<u64> = t.alloc_window("small words", &ShardMap::balanced(10, n))?;
    let mut out = [0u64; 4];
    ensure!(
        t,
        matches!(kind(words.load_range(8, &mut out)), Some(ErrorKind::OutOfRange { end: 12, .. })),
        "load_batch past the end was not OutOfRange"
    );
    ensure!(
        t,
        matches!(
            kind(words.load_batch(&[0..2, 3..5], &mut out[..3])),
            Some(ErrorKind::LengthMismatch { expected: 4, got: 3, .. })
        ),
        "short load_batch buffer was not LengthMismatch"
    );
    words.free()?;
    ensure!(
        t,
        matches!(kind(w.flush(n)), Some(ErrorKind::NoSuchRank { .. })),
        "flush of rank {n} was not NoSuchRank"
    );
    ensure!(
        t,
        matches!(kind(t.broadcast(&mut [0u64], n)), Some(ErrorKind::NoSuchRank { .. })),
        "broadcast from rank {n} was not NoSuchRank"
    );
    // Ranks that disagree about a window's size: every rank gets the error, nobody hangs.
    let total = if t.rank() == 0 { 10 } else { 11 };
    let r = t.alloc_window::<f64>("disagreeing", &ShardMap::balanced(total, n));
    if n > 1 {
        ensure!(
            t,
            matches!(kind(r), Some(ErrorKind::WindowMismatch { .. })),
            "windows of different sizes across ranks were accepted"
        );
    }
    // ... or about its element type.
    let map = ShardMap::balanced(8, n);
    if n > 1 {
        let ok = if t.rank() == 0 {
            matches!(kind(t.alloc_window::<u64>("typed", &map)), Some(ErrorKind::WindowMismatch { .. }))
        } else {
            matches!(kind(t.alloc_window::<f64>("typed", &map)), Some(ErrorKind::WindowMismatch { .. }))
        };
        ensure!(t, ok, "windows of different element types across ranks were accepted");
        // ... or about the length of an allreduce.
        let mut v = vec![1u64; 1 + usize::from(t.rank() == 0)];
        ensure!(
            t,
            matches!(kind(t.allreduce(&mut v, ReduceOp::Sum)), Some(ErrorKind::CollectiveMismatch { .. })),
            "allreduce of different lengths was accepted"
        );
    }
    // A shard map for a different world size.
    ensure!(
        t,
        matches!(
            kind(t.alloc_window::<u64>("wrong parts", &ShardMap::balanced(8, n + 1))),
            Some(ErrorKind::ShardCount { .. })
        ),
        "a map with {} shards was accepted in a world of {n}",
        n + 1
    );
    // The world still works.
    w.put(0, &[1.5])?;
    w.flush_all()?;
    t.barrier()?;
    let mut x = [0.0f32];
    w.get(0, &mut x)?;
    ensure!(t, x[0] == 1.5, "after the errors, element 0 is {}", x[0]);
    t.barrier()?;
    w.free()?;
    Ok(())
}
