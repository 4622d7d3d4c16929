//! Backup workers (Sync-opt, Chen et al. 2016): each iteration applies the first `N - b` updates
//! to arrive; later ones are dropped, and a rank that was late moves straight on to the iteration
//! the others are in. The dynamic variant (after DBW's rule, here with one server-side `b`; `dbw.rs` is the
//! decentralized scheme itself) chooses `b` for each iteration from the ranks'
//! last compute times: the `k = N - b` that maximizes updates per unit of time, `k / d_(k)`, where
//! `d_(k)` is the k-th shortest compute time (k at least half the ranks).
//!
//! Words on rank 0 (a window; every count a compare-and-swap against the word read, so a late rank
//! can never count towards an iteration that is over): for two slots `s = t mod 2`, `arrived[s]`
//! and `committed[s]`, each a [`crate::words::Arrivals`] (tag = iteration mod 2^24, k = updates
//! the iteration needs, and the count); then `done`, the number of completed iterations. The rank whose commit
//! completes iteration `t` prepares the slot of `t + 1` (choosing its `k`) before raising `done`, so
//! a rank starting `t + 1` (after seeing `done > t`) always finds it ready; a rank still in `t - 1`
//! sees a tag that is not its iteration and knows it is late. Per rank, one more word holds its last
//! compute time (microseconds), the input of the dynamic choice.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use peregrine_transport::{ShardMap, Transport, Window};

use super::{arg, Admit, Family, Parsed, Policy, Result, SchemeError, SchemeKind, Setup, View};
use crate::record::{Figure, IterRecord};
use crate::words::{Arrivals, ARRIVAL_TAG_MASK, MAX_ARRIVALS};

pub(crate) const FAMILY: Family = Family {
    forms: "backup:<b>, backup-dynamic",
    names: &["backup:1", "backup-dynamic"],
    compared: &["backup-dynamic"],
    parse,
};

fn parse(s: &str) -> Option<Parsed> {
    let b = match s {
        "backup-dynamic" => Ok(Backups { fixed: None }),
        _ => arg(s, "backup")?.parse().map(|b| Backups { fixed: Some(b) }).map_err(|_| {
            SchemeError::argument(
                s,
                "the number of backup workers",
                "a whole number below the number of ranks",
                "backup:1",
            )
        }),
    };
    Some(b.map(|b| Arc::new(b) as Arc<dyn SchemeKind>))
}

/// Backup workers per iteration: `Some(b)` always, `None` chosen per iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backups {
    fixed: Option<usize>,
}

impl fmt::Display for Backups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fixed {
            Some(b) => write!(f, "backup:{b}"),
            None => f.write_str("backup-dynamic"),
        }
    }
}

impl SchemeKind for Backups {
    fn validate(&self, ranks: usize) -> std::result::Result<(), SchemeError> {
        let world = |accepted: String| SchemeError::World { scheme: self.to_string(), ranks, accepted };
        if ranks as u64 > MAX_ARRIVALS {
            return Err(world(format!("backup workers count arrivals of at most {MAX_ARRIVALS} ranks")));
        }
        match self.fixed {
            Some(b) if b >= ranks => Err(world(format!(
                "b backup workers leave N - b updates per iteration, so b must be at most {} with {ranks} rank{} (b = {b} would apply none)",
                ranks.saturating_sub(1),
                if ranks == 1 { "" } else { "s" }
            ))
),
            _ => Ok(()),
        }
    }

    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        Ok(Box::new(BackupPolicy { counters: Counters::new(setup.t, self.fixed, setup.start)? }))
    }
}

/// The policy: arrivals counted on rank 0, late updates dropped, late ranks moved on.
struct BackupPolicy {
    counters: Counters,
}

impl Policy for BackupPolicy {
    fn takes_over(&self) -> bool {
        false
    }

    fn begin(&mut self, _view: &dyn View, next: u64) -> Result<u64> {
        // A rank that was late moves on to the iteration the others are in.
        Ok(next.max(self.counters.done()?))
    }

    fn admit(&mut self, _view: &dyn View, it: u64, compute: Duration, rec: &mut IterRecord) -> Result<Admit> {
        self.counters.record(compute)?;
        rec.scheme.set("backups", Figure::Count(self.counters.backups(it)? as u64));
        let arrival = self.counters.arrive(it)?;
        rec.scheme.set("dropped", Figure::Flag(arrival == Arrival::Late));
        Ok(match arrival {
            Arrival::Late => Admit { apply: false, scale: 1.0 },
            // The first k updates stand for all N: each is scaled to N / k.
            Arrival::InTime { k } => Admit { apply: true, scale: in_time_scale(self.counters.world, k) },
        })
    }

    fn after_tick(&mut self, it: u64, applied: bool) -> Result<()> {
        if applied {
            self.counters.commit(it)?;
        }
        Ok(())
    }

    fn ready(&self, _view: &dyn View, it: u64) -> Result<bool> {
        Ok(self.counters.done()? > it)
    }

    fn free(self: Box<Self>) -> Result<()> {
        self.counters.free()
    }
}

/// The factor on one of the `k` updates an iteration applies in a world of `world` ranks.
fn in_time_scale(world: usize, k: u64) -> f32 {
    world as f32 / k as f32
}

/// What happened to this rank's update of an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Among the first `k`: push it, then [`Counters::commit`].
    InTime {
        /// Updates the iteration applies.
        k: u64,
    },
    /// Too late (the iteration has its `k` updates, or is over): drop it.
    Late,
}

/// The backup-worker counters.
#[derive(Debug)]
pub(crate) struct Counters {
    words: Window<u64>,
    times: Window<u64>,
    world: usize,
    rank: usize,
    /// `Some(b)`: static; `None`: dynamic.
    fixed: Option<usize>,
}

const DONE: usize = 4;

impl Counters {
    /// Collective. `fixed`: `Some(b)` backups every iteration (`b` below the world size, checked by
    /// [`Backups::validate`]), `None` to choose per iteration; `start`: the first iteration (a
    /// resumed run's).
    pub(crate) fn new(t: &Transport, fixed: Option<usize>, start: u64) -> Result<Self> {
        let n = t.world_size();
        let words =
            t.alloc_window("backup", &ShardMap::from_lens((0..n).map(|r| if r == 0 { 5 } else { 0 })))?;
        let times = t.alloc_window("compute times", &ShardMap::from_lens(vec![1; n]))?;
        let me = Self { words, times, world: n, rank: t.rank(), fixed };
        if t.rank() == 0 {
            let k = me.choose_k()? as u64;
            let (slot, tag) = (2 * (start % 2) as usize, start & ARRIVAL_TAG_MASK);
            me.words.swap(slot, Arrivals { tag, k, count: 0 }.pack())?;
            me.words.swap(slot + 1, Arrivals { tag, k, count: 0 }.pack())?;
            me.words.swap(DONE, start)?;
        }
        me.words.flush_all()?;
        t.barrier()?;
        Ok(me)
    }

    /// Adds one to slot word `i` if it is tagged `it`: `Some((k, count before))`, or `None` if the
    /// slot belongs to another iteration.
    fn bump(&self, i: usize, it: u64) -> Result<Option<(u64, u64)>> {
        let mut cur = self.words.load(i)?;
        loop {
            let a = Arrivals::unpack(cur);
            if a.tag != it & ARRIVAL_TAG_MASK || a.count >= a.k {
                return Ok(None);
            }
            let prev = self.words.compare_and_swap(i, cur, Arrivals { count: a.count + 1, ..a }.pack())?;
            if prev == cur {
                return Ok(Some((a.k, a.count)));
            }
            cur = prev;
        }
    }

    /// Completed iterations.
    pub(crate) fn done(&self) -> Result<u64> {
        self.words.load(DONE)
    }

    /// Records this rank's compute time of its last iteration.
    pub(crate) fn record(&self, compute: Duration) -> Result<()> {
        let us = compute.as_micros().max(1) as u64;
        self.times.swap(self.rank, us).map(drop)
    }

    /// Registers this rank's update of iteration `it`.
    pub(crate) fn arrive(&self, it: u64) -> Result<Arrival> {
        Ok(match self.bump(2 * (it % 2) as usize, it)? {
            Some((k, _)) => Arrival::InTime { k },
            None => Arrival::Late,
        })
    }

    /// After pushing (and flushing) an in-time update of `it`: counts it, and if it completes the
    /// iteration, prepares the next one and marks `it` done.
    pub(crate) fn commit(&self, it: u64) -> Result<()> {
        let Some((k, before)) = self.bump(2 * (it % 2) as usize + 1, it)? else { return Ok(()) };
        if before + 1 == k {
            let next = Arrivals { tag: (it + 1) & ARRIVAL_TAG_MASK, k: self.choose_k()? as u64, count: 0 };
            let s = 2 * ((it + 1) % 2) as usize;
            self.words.swap(s, next.pack())?;
            self.words.swap(s + 1, next.pack())?;
            self.words.fetch_add(DONE, 1)?;
        }
        Ok(())
    }

    /// Updates the next iteration applies: `N - b` (static), or the `k` maximizing `k / d_(k)` over
    /// the ranks' last compute times (dynamic; all of them until every rank has reported one).
    pub(crate) fn choose_k(&self) -> Result<usize> {
        if let Some(b) = self.fixed {
            return Ok(self.world - b);
        }
        // Every rank's time in one batch.
        let mut d = vec![0; self.world];
        self.times.load_range(0, &mut d)?;
        Ok(best_k(&mut d))
    }

    /// Backups of iteration `it`'s slot (for the metrics): `N - k`.
    pub(crate) fn backups(&self, it: u64) -> Result<usize> {
        let a = Arrivals::unpack(self.words.load(2 * (it % 2) as usize)?);
        Ok(if a.tag == it & ARRIVAL_TAG_MASK { self.world - a.k as usize } else { 0 })
    }

    /// Collective: frees the windows.
    pub(crate) fn free(self) -> Result<()> {
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
        // Equal times: all four (4 / 100 beats 2 / 100 and 3 / 100).
        assert_eq!(best_k(&mut [100, 100, 100, 100]), 4);
        // Sorted 100, 105, 110, 400: k = 2 gives 2 / 105 = 0.019, k = 3 gives 3 / 110 = 0.027,
        // k = 4 gives 4 / 400 = 0.010: wait for three, one backup.
        assert_eq!(best_k(&mut [100, 110, 105, 400]), 3);
        // One fast rank and three slow: k = 2 (2 / 900 = 0.0022) loses to k = 4 (4 / 1100 =
        // 0.0036), and k may not go below half the ranks.
        assert_eq!(best_k(&mut [100, 900, 1000, 1100]), 4);
        assert_eq!(best_k(&mut [100, 1000, 1000, 1000]), 4);
        assert_eq!(best_k(&mut [100, 0, 100]), 3);
        // Dropped updates weigh nothing; the k in time stand for all N.
        assert_eq!(in_time_scale(4, 3), 4.0 / 3.0);
    }

    #[test]
    fn only_the_first_k_count_and_late_ranks_are_told() {
        peregrine_transport::run_local(3, |t| -> Result<Vec<Arrival>> {
            let b = Counters::new(&t, Some(1), 0)?;
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
