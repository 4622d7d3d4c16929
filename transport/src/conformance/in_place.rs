//! Cases of memory read and written in place: a rank's own shard, a shared window read whole, and
//! a direct window's in-place accumulates and atomics.

use std::ops::Range;

use super::{ensure, pattern, uneven_map, Failure, Outcome, Params};
use crate::{ShardMap, Transport, Window, SHARD_LINE};

/// Every rank accumulates into every shard; between barriers each rank then reads the sums in its
/// own shard in place ([`Window::with_own_shard`]) and overwrites them there; every rank then
/// reads the whole window, and accumulates once more on top of what was stored in place.
pub(super) fn own_shard_in_place(t: &Transport, _: &Params) -> Outcome {
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
pub(super) fn whole_in_place(t: &Transport, p: &Params) -> Outcome {
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

/// A direct window ([`Transport::alloc_direct_window`]) is direct exactly where every rank maps it
/// whole (the local backend; MPI processes on one node with shared windows), and its float
/// accumulates and atomics are atomic with each other from every rank at once: whole-vector
/// accumulates crossing every shard and positioned ones racing on the same elements give exact
/// sums, `fetch_add` hands out every float ticket once where the window is direct, and `u64` atomics work as on any
/// window.
pub(super) fn direct_window(t: &Transport, p: &Params) -> Outcome {
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

/// Every rank steps its keys (key `j`: elements `3j..3j + 3`, the last key cut short; shards
/// in lines, so some keys lie across two shards) of a direct window with its state window of
/// two slots ([`Window::step_with_state`]), 50 rounds at once: each element's change is its
/// gathered value, its state's slots count the steps and sum the values; the values are left
/// zero at the keys and only there. The ranks' keys
/// overlap; any add lost, doubled or misplaced shows in the sums. Where the windows are not
/// both direct (the local backend, processes on several nodes), the step is an error naming
/// them and the rest is skipped. Then bad use: keys out of order, past the window, values of
/// the wrong length.
pub(super) fn stepped_with_state(t: &Transport, p: &Params) -> Outcome {
    use super::kind;
    use crate::ErrorKind;
    const WIDTH: usize = 3;
    const ROUNDS: usize = 50;
    let (rank, n) = (t.rank(), t.world_size());
    let map = ShardMap::balanced_in_lines::<f32>(40 * n + 7, n);
    let total = map.total();
    let w: Window<f32> = t.alloc_direct_window("stepped", &map)?;
    let st: Window<f32> =
        t.alloc_direct_window("stepped state", &ShardMap::from_lens((0..n).map(|r| 2 * map.len_of(r))))?;
    let touches = |r: usize, key: usize| !(key + r).is_multiple_of(3);
    let keys: Vec<u32> = (0..total.div_ceil(WIDTH)).filter(|&j| touches(rank, j)).map(|j| j as u32).collect();
    let contribution = |r: usize, i: usize| ((r + 1) * (i % 5 + 1)) as f32;
    let mut values: Vec<f32> = (0..total).map(|i| contribution(rank, i)).collect();
    let step = |c: &mut [f32], s: &[f32], ds: &mut [f32]| {
        assert_eq!((s.len(), ds.len()), (2 * c.len(), 2 * c.len()), "state gathered in proportion");
        for (c, d) in c.iter().zip(ds.chunks_exact_mut(2)) {
            d.copy_from_slice(&[1.0, *c]);
        }
    };
    let direct = w.steps_with(&st);
    if let Some(whole) = p.whole_in_place {
        ensure!(t, direct == (whole && t.backend() != crate::Backend::Local), "steps_with() is {direct}");
    }
    if !direct {
        let got = kind(w.step_with_state(&st, WIDTH, &keys, &mut values, step));
        ensure!(t, matches!(got, Some(ErrorKind::NotDirect { .. })), "a step where it cannot be: {got:?}");
    } else {
        for _ in 0..ROUNDS {
            let mut v = values.clone();
            w.step_with_state(&st, WIDTH, &keys, &mut v, step)?;
            // Taken whole: zero at the keys, untouched elsewhere.
            for (i, (&x, &was)) in v.iter().zip(&values).enumerate() {
                let want = if touches(rank, i / WIDTH) { 0.0 } else { was };
                ensure!(t, x == want, "value {i} left {x}, expected {want}");
            }
        }
        t.barrier()?;
        let (mut got, mut state) = (vec![0.0f32; total], vec![0.0f32; 2 * total]);
        w.get(0, &mut got)?;
        st.get(0, &mut state)?;
        for i in 0..total {
            let by: Vec<usize> = (0..n).filter(|&r| touches(r, i / WIDTH)).collect();
            let sum = by.iter().map(|&r| contribution(r, i)).sum::<f32>() * ROUNDS as f32;
            let steps = (by.len() * ROUNDS) as f32;
            ensure!(
                t,
                got[i] == sum && state[2 * i] == steps && state[2 * i + 1] == sum,
                "element {i}: {} with state {:?}, expected {sum} with [{steps}, {sum}] (a step lost, \
                 doubled or misplaced)",
                got[i],
                &state[2 * i..2 * i + 2]
            );
        }
        t.barrier()?;
    }
    let unordered = kind(w.step_with_state(&st, WIDTH, &[2, 1], &mut values, step));
    ensure!(t, matches!(unordered, Some(ErrorKind::Unordered { key: 1, after: 2, .. })), "{unordered:?}");
    let past = kind(w.step_with_state(&st, WIDTH, &[total.div_ceil(WIDTH) as u32], &mut values, step));
    ensure!(t, matches!(past, Some(ErrorKind::OutOfRange { .. })), "a key past the window: {past:?}");
    let short = kind(w.step_with_state(&st, WIDTH, &keys, &mut values[1..], step));
    ensure!(t, matches!(short, Some(ErrorKind::LengthMismatch { .. })), "values too short: {short:?}");
    t.barrier()?;
    st.free()?;
    w.free()?;
    Ok(())
}
