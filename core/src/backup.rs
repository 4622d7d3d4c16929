//! Backup workers (Sync-opt, Chen et al. 2016): each iteration applies the first `N - b` updates
//! to arrive; later ones are dropped, and a rank that was late moves straight on to the iteration
//! the others are in. The dynamic variant (after DBW) chooses `b` for each iteration from the ranks'
//! last compute times: the `k = N - b` that maximizes updates per unit of time, `k / d_(k)`, where
//! `d_(k)` is the k-th shortest compute time (k at least half the ranks).
//!
//! Words on rank 0 (a window; every change a compare-and-swap, so a late rank can never count
//! towards an iteration that is over): for two slots `s = t mod 2`, `arrived[s]` and
//! `committed[s]`, each `tag << 40 | k << 24 | count` (tag = iteration mod 2^24, k = updates the
//! iteration needs); then `done`, the number of completed iterations. The rank whose commit
//! completes iteration `t` prepares the slot of `t + 1` (choosing its `k`) before raising `done`, so
//! a rank starting `t + 1` (after seeing `done > t`) always finds it ready; a rank still in `t - 1`
//! sees a tag that is not its iteration and knows it is late. Per rank, one more word holds its last
//! compute time (microseconds), the input of the dynamic choice.

use std::time::Duration;

use peregrine_transport::{Result, ShardMap, Transport, Window};

const TAG_BITS: u32 = 24;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

fn pack(tag: u64, k: u64, count: u64) -> u64 {
    ((tag & TAG_MASK) << 40) | ((k & 0xFFFF) << 24) | (count & 0xFF_FFFF)
}

fn unpack(w: u64) -> (u64, u64, u64) {
    (w >> 40, (w >> 24) & 0xFFFF, w & 0xFF_FFFF)
}

/// What happened to this rank's update of an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Among the first `k`: push it, then [`Backup::commit`].
    InTime {
        /// Updates the iteration applies.
        k: u64,
    },
    /// Too late (the iteration has its `k` updates, or is over): drop it.
    Late,
}

/// The backup-worker counters.
#[derive(Debug)]
pub struct Backup {
    words: Window<u64>,
    times: Window<u64>,
    world: usize,
    rank: usize,
    /// `Some(b)`: static; `None`: dynamic.
    fixed: Option<usize>,
}

const DONE: usize = 4;

impl Backup {
    /// Collective. `fixed`: `Some(b)` backups every iteration, `None` to choose per iteration.
    ///
    /// # Panics
    /// If `b >= world` (nothing would ever be applied).
    pub fn new(t: &Transport, fixed: Option<usize>) -> Result<Self> {
        let n = t.world_size();
        if let Some(b) = fixed {
            assert!(b < n, "backup workers: b = {b} of {n} ranks leaves no update");
        }
        let words =
            t.alloc_window("backup", &ShardMap::from_lens((0..n).map(|r| if r == 0 { 5 } else { 0 })))?;
        let times = t.alloc_window("compute times", &ShardMap::from_lens(vec![1; n]))?;
        let me = Self { words, times, world: n, rank: t.rank(), fixed };
        if t.rank() == 0 {
            let k = me.choose_k()? as u64;
            me.swap(0, pack(0, k, 0))?;
            me.swap(1, pack(0, k, 0))?;
        }
        me.words.flush_all()?;
        t.barrier()?;
        Ok(me)
    }

    /// Sets word `i` to `v`, whatever it holds.
    fn swap(&self, i: usize, v: u64) -> Result<()> {
        let mut cur = self.words.fetch_add(i, 0)?;
        loop {
            let prev = self.words.compare_and_swap(i, cur, v)?;
            if prev == cur {
                return Ok(());
            }
            cur = prev;
        }
    }

    /// Adds one to slot word `i` if it is tagged `it`: `Some((k, count before))`, or `None` if the
    /// slot belongs to another iteration.
    fn bump(&self, i: usize, it: u64) -> Result<Option<(u64, u64)>> {
        let mut cur = self.words.fetch_add(i, 0)?;
        loop {
            let (tag, k, count) = unpack(cur);
            if tag != it & TAG_MASK || count >= k {
                return Ok(None);
            }
            let prev = self.words.compare_and_swap(i, cur, pack(tag, k, count + 1))?;
            if prev == cur {
                return Ok(Some((k, count)));
            }
            cur = prev;
        }
    }

    /// Completed iterations.
    pub fn done(&self) -> Result<u64> {
        self.words.fetch_add(DONE, 0)
    }

    /// Records this rank's compute time of its last iteration.
    pub fn record(&self, compute: Duration) -> Result<()> {
        let us = compute.as_micros().max(1) as u64;
        let cur = self.times.fetch_add(self.rank, 0)?;
        self.times.compare_and_swap(self.rank, cur, us).map(drop)
    }

    /// Registers this rank's update of iteration `it`.
    pub fn arrive(&self, it: u64) -> Result<Arrival> {
        Ok(match self.bump(2 * (it % 2) as usize, it)? {
            Some((k, _)) => Arrival::InTime { k },
            None => Arrival::Late,
        })
    }

    /// After pushing (and flushing) an in-time update of `it`: counts it, and if it completes the
    /// iteration, prepares the next one and marks `it` done.
    pub fn commit(&self, it: u64) -> Result<()> {
        let Some((k, before)) = self.bump(2 * (it % 2) as usize + 1, it)? else { return Ok(()) };
        if before + 1 == k {
            let next = self.choose_k()? as u64;
            let s = 2 * ((it + 1) % 2) as usize;
            self.swap(s, pack(it + 1, next, 0))?;
            self.swap(s + 1, pack(it + 1, next, 0))?;
            self.words.fetch_add(DONE, 1)?;
        }
        Ok(())
    }

    /// Updates the next iteration applies: `N - b` (static), or the `k` maximizing `k / d_(k)` over
    /// the ranks' last compute times (dynamic; all of them until every rank has reported one).
    pub fn choose_k(&self) -> Result<usize> {
        if let Some(b) = self.fixed {
            return Ok(self.world - b);
        }
        let mut d = Vec::with_capacity(self.world);
        for r in 0..self.world {
            d.push(self.times.fetch_add(r, 0)?);
        }
        Ok(best_k(&mut d))
    }

    /// Backups of iteration `it`'s slot (for the metrics): `N - k`.
    pub fn backups(&self, it: u64) -> Result<usize> {
        let (tag, k, _) = unpack(self.words.fetch_add(2 * (it % 2) as usize, 0)?);
        Ok(if tag == it & TAG_MASK { self.world - k as usize } else { 0 })
    }

    /// Collective: frees the windows.
    pub fn free(self) -> Result<()> {
        self.words.free()?;
        self.times.free()
    }
}

/// The `k >= ceil(N / 2)` maximizing `k / d_(k)` (ties: the larger `k`); `N` if a time is
/// missing (0). The floor keeps one fast rank from making every iteration a one-update step.
fn best_k(d: &mut [u64]) -> usize {
    if d.contains(&0) {
        return d.len();
    }
    d.sort_unstable();
    let mut best = (d.len(), d.len() as f64 / d[d.len() - 1] as f64);
    for (i, &t) in d.iter().enumerate().skip(d.len().div_ceil(2) - 1) {
        let rate = (i + 1) as f64 / t as f64;
        if rate > best.1 * (1.0 + 1e-9) {
            best = (i + 1, rate);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dynamic_choice_leaves_out_the_slow_tail() {
        assert_eq!(best_k(&mut [100, 100, 100, 100]), 4);
        assert_eq!(best_k(&mut [100, 110, 105, 400]), 3);
        assert_eq!(best_k(&mut [100, 900, 1000, 1100]), 4);
        assert_eq!(best_k(&mut [100, 1000, 1000, 1000]), 4);
        assert_eq!(best_k(&mut [100, 0, 100]), 3);
        assert_eq!(unpack(pack(5, 3, 7)), (5, 3, 7));
    }

    #[test]
    fn only_the_first_k_count_and_late_ranks_are_told() {
        peregrine_transport::run_local(3, |t| -> Result<Vec<Arrival>> {
            let b = Backup::new(&t, Some(1))?;
            let mut seen = Vec::new();
            for it in 0..20u64 {
                // Ranks arrive in turn: rank (it % 3) last.
                for turn in 0..3 {
                    if (t.rank() + it as usize) % 3 == turn {
                        let a = b.arrive(it)?;
                        if a != Arrival::Late {
                            b.commit(it)?;
                        }
                        seen.push(a);
                    }
                    t.barrier()?;
                }
                assert_eq!(b.done()?, it + 1);
            }
            // Arriving for an iteration that is over is late.
            assert_eq!(b.arrive(3)?, Arrival::Late);
            t.barrier()?;
            b.free()?;
            Ok(seen)
        })
        .expect("world")
        .into_iter()
        .map(|r| r.expect("rank"))
        .enumerate()
        .for_each(|(rank, seen)| {
            for (it, a) in seen.iter().enumerate() {
                let last = (rank + it) % 3 == 2;
                assert_eq!(*a == Arrival::Late, last, "rank {rank} iteration {it}: {a:?}");
            }
        });
    }
}
