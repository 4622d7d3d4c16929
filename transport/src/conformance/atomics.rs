//! Cases of atomics on `u64` words: `fetch_add` tickets, `swap` chains, batched atomic loads,
//! compare-and-swap elections and spin locks, and an owner polling its own shard.

use std::time::{Duration, Instant};

use super::{ensure, Failure, Outcome, Params};
use crate::{ReduceOp, ShardMap, Transport, Window};

/// Every rank takes `tickets_per_rank` tickets with `fetch_add(1)` on one counter: the total is
/// exact and every ticket is handed out exactly once.
pub(super) fn fetch_add_tickets(t: &Transport, p: &Params) -> Outcome {
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
pub(super) fn swap_chain(t: &Transport, p: &Params) -> Outcome {
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
pub(super) fn load_batch_everywhere(t: &Transport, p: &Params) -> Outcome {
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
pub(super) fn cas_election(t: &Transport, p: &Params) -> Outcome {
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
pub(super) fn cas_spin_lock(t: &Transport, p: &Params) -> Outcome {
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
pub(super) fn owner_waits(t: &Transport, p: &Params) -> Outcome {
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
