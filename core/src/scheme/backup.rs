//! Backup workers (Sync-opt, Chen et al. 2016): each iteration applies the first `N - b` updates
//! to arrive; later ones are dropped, and a rank that was late moves straight on to the iteration
//! the others are in. The dynamic variant (after DBW's rule, here with one server-side `b`;
//! `dbw.rs` is the decentralized scheme itself) chooses `b` for each iteration from the arrivals
//! of the one two before (whose late ranks have had an iteration more to arrive): the `k = N - b`
//! that maximizes updates per unit of time, `k / d_(k)`, where `d_(k)` is the compute time of the
//! k-th rank to arrive (k at least half the ranks).
//!
//! Words on rank 0 (a window; every count a compare-and-swap against the word read, so a late rank
//! can never count towards an iteration that is over): for two slots `s = t mod 2`, `arrived[s]`
//! and `committed[s]`, each a [`crate::words::Arrivals`] (tag = iteration mod 2^24, k = updates
//! the iteration needs, and the count: of arrivals, in time or late, and of commits); then `done`,
//! the number of completed iterations; then, for the dynamic choice, `best[s]`: the best
//! `k / d_(k)` among the iteration's arrivals so far ([`candidate`]), each arriving rank raising it
//! with its own (one load, rarely a compare-and-swap: O(1) per rank, where reading every rank's
//! last time was O(N) per iteration for the rank closing it, 1.9x the bound at 4,096 ranks).
//!
//! The rank whose commit completes iteration `t` prepares the slot of `t + 1` (choosing its `k`
//! from `best` of `t - 1`, the same slot's, before clearing it) before raising `done`, so a rank
//! starting `t + 1` (after seeing `done > t`) always finds it ready; a rank still in `t - 1` sees a
//! tag that is not its iteration and knows it is late.

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
        rec.scheme.set("backups", Figure::Count(self.counters.backups(it)? as u64));
        let arrival = self.counters.arrive(it, compute)?;
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
    world: usize,
    /// Whether this rank's last arrival was late: it starts the next iteration late, so its
    /// place among that one's arrivals says nothing of its compute time.
    was_late: bool,
    /// `Some(b)`: static; `None`: dynamic.
    fixed: Option<usize>,
}

const DONE: usize = 4;
/// `best[s]`: words 5 and 6.
const BEST: usize = 5;

impl Counters {
    /// Collective. `fixed`: `Some(b)` backups every iteration (`b` below the world size, checked by
    /// [`Backups::validate`]), `None` to choose per iteration; `start`: the first iteration (a
    /// resumed run's).
    pub(crate) fn new(t: &Transport, fixed: Option<usize>, start: u64) -> Result<Self> {
        let n = t.world_size();
        let words = t.alloc_window(
            "backup",
            &ShardMap::from_lens((0..n).map(|r| if r == 0 { BEST + 2 } else { 0 })),
        )?;
        let me = Self { words, world: n, fixed, was_late: false };
        if t.rank() == 0 {
            // The first iteration: every update (dynamic), nothing arrived before it.
            let k = me.fixed.map_or(n, |b| n - b) as u64;
            let (slot, tag) = (2 * (start % 2) as usize, start & ARRIVAL_TAG_MASK);
            me.words.swap(slot, Arrivals { tag, k, count: 0 }.pack())?;
            me.words.swap(slot + 1, Arrivals { tag, k, count: 0 }.pack())?;
            me.words.swap(DONE, start)?;
            // The first two iterations' bests, empty and tagged (later ones are cleared by the
            // rank closing the iteration before).
            for it in [start, start + 1] {
                me.words.swap(BEST + (it % 2) as usize, no_candidate(it))?;
            }
        }
        me.words.flush_all()?;
        t.barrier()?;
        Ok(me)
    }

    /// Adds one to slot word `i` if it is tagged `it`: `Some((k, count before))`, or `None` if the
    /// slot belongs to another iteration (or counts every rank already).
    fn bump(&self, i: usize, it: u64) -> Result<Option<(u64, u64)>> {
        let mut cur = self.words.load(i)?;
        loop {
            let a = Arrivals::unpack(cur);
            if a.tag != it & ARRIVAL_TAG_MASK || a.count >= self.world as u64 {
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

    /// Registers this rank's update of iteration `it`, computed in `compute`: among the first
    /// `k` to arrive, or late. Under the dynamic choice, the arrival's `k / d_(k)` raises the
    /// slot's best if it beats it (unless this rank's last arrival was late: it started this
    /// iteration after the others, and arrives later than its compute time would place it).
    pub(crate) fn arrive(&mut self, it: u64, compute: Duration) -> Result<Arrival> {
        let was_late = std::mem::replace(&mut self.was_late, true);
        let Some((k, before)) = self.bump(2 * (it % 2) as usize, it)? else { return Ok(Arrival::Late) };
        self.was_late = before >= k;
        if self.fixed.is_none() && !was_late {
            let mine = candidate(before + 1, compute, self.world, it);
            // Not over a word of another iteration (a late arrival of `it - 2`).
            crate::words::raise(&self.words, BEST + (it % 2) as usize, mine, |cur| {
                tag_of(cur) == tag_of(mine)
            })?;
        }
        Ok(if before < k { Arrival::InTime { k } } else { Arrival::Late })
    }

    /// After pushing (and flushing) an in-time update of `it`: counts it, and if it completes the
    /// iteration, prepares the next one and marks `it` done.
    pub(crate) fn commit(&self, it: u64) -> Result<()> {
        let Some((k, before)) = self.bump(2 * (it % 2) as usize + 1, it)? else { return Ok(()) };
        if before + 1 == k {
            let next = Arrivals { tag: (it + 1) & ARRIVAL_TAG_MASK, k: self.choose_k(it)? as u64, count: 0 };
            let s = 2 * ((it + 1) % 2) as usize;
            self.words.swap(s, next.pack())?;
            self.words.swap(s + 1, next.pack())?;
            if self.fixed.is_none() {
                // `t + 1`'s best (read for the choice above, as `t - 1`'s), empty and tagged: a
                // late arrival of `t - 1` leaves it alone.
                self.words.swap(BEST + s / 2, no_candidate(it + 1))?;
            }
            self.words.fetch_add(DONE, 1)?;
        }
        Ok(())
    }

    /// Updates the iteration after `it` applies: `N - b` (static), or the `k` of the best arrival
    /// of `it - 1` (dynamic: [`candidate`]; all `N` where none qualified, or before a second
    /// iteration).
    pub(crate) fn choose_k(&self, it: u64) -> Result<usize> {
        if let Some(b) = self.fixed {
            return Ok(self.world - b);
        }
        let Some(before) = it.checked_sub(1) else { return Ok(self.world) };
        let best = self.words.load(BEST + (before % 2) as usize)?;
        let k = (best & 0xffff) as usize;
        let tagged = tag_of(best) == tag_of(no_candidate(before));
        Ok(if tagged && k > 0 { k } else { self.world })
    }

    /// Backups of iteration `it`'s slot (for the metrics): `N - k`.
    pub(crate) fn backups(&self, it: u64) -> Result<usize> {
        let a = Arrivals::unpack(self.words.load(2 * (it % 2) as usize)?);
        Ok(if a.tag == it & ARRIVAL_TAG_MASK { self.world - a.k as usize } else { 0 })
    }

    /// Collective: frees the window.
    pub(crate) fn free(self) -> Result<()> {
        self.words.free()
    }
}

/// The dynamic choice's word for the `k`-th arrival of iteration `it`, after `compute`, in a
/// world of `n`: `k / d` (updates per microsecond, as f32 bits: a larger rate is a larger word)
/// above the iteration's tag (16 bits) above `k` (16 bits), so that the largest word is the best
/// rate, ties to the larger `k`; the rate 0 (the word a slot starts from) for a `k` below half the
/// ranks, which the floor keeps out (one fast rank must not make every iteration a one-update
/// step).
fn candidate(k: u64, compute: Duration, n: usize, it: u64) -> u64 {
    let eligible = k > 0 && k as usize >= n.div_ceil(2);
    let rate = if eligible { k as f32 / compute.as_micros().max(1) as f32 } else { 0.0 };
    let k = if eligible { k } else { 0 };
    (u64::from(rate.to_bits()) << 32) | no_candidate(it) | (k & 0xffff)
}

/// The word `best` of iteration `it` starts from: no candidate, the rate 0 ([`candidate`]).
fn no_candidate(it: u64) -> u64 {
    (it & 0xffff) << 16
}

/// A [`candidate`] word's iteration tag.
fn tag_of(w: u64) -> u64 {
    (w >> 16) & 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `k` the dynamic choice takes from arrivals with compute times `d` (microseconds), in
    /// the order they arrive.
    fn best_k(d: &[u64]) -> u64 {
        let best = (0..d.len())
            .map(|i| candidate(i as u64 + 1, Duration::from_micros(d[i]), d.len(), 7))
            .fold(no_candidate(7), u64::max);
        best & 0xffff
    }

    #[test]
    fn the_dynamic_choice_leaves_out_the_slow_tail() {
        // Equal times: all four (4 / 100 beats 2 / 100 and 3 / 100).
        assert_eq!(best_k(&[100, 100, 100, 100]), 4);
        // Arriving 100, 105, 110, 400: k = 2 gives 2 / 105 = 0.019, k = 3 gives 3 / 110 = 0.027,
        // k = 4 gives 4 / 400 = 0.010: wait for three, one backup.
        assert_eq!(best_k(&[100, 105, 110, 400]), 3);
        // One fast rank and three slow: k = 2 (2 / 900 = 0.0022) loses to k = 4 (4 / 1100 =
        // 0.0036), and k may not go below half the ranks.
        assert_eq!(best_k(&[100, 900, 1000, 1100]), 4);
        assert_eq!(best_k(&[100, 1000, 1000, 1000]), 4);
        // No arrival of half the ranks or more: no choice (all N).
        assert_eq!(best_k(&[]), 0);
        // Dropped updates weigh nothing; the k in time stand for all N.
        assert_eq!(in_time_scale(4, 3), 4.0 / 3.0);
    }

    #[test]
    fn each_k_is_the_best_of_the_arrivals_two_iterations_before() {
        // Four ranks arrive in turn, in iteration 0 with compute times 100, 105, 110 and 400 us,
        // in iteration 1 100, 100, 100 and 300 us, then all at 100 us: iterations 2 and 3 apply
        // 3 updates (3 / 100 beats 4 / 300), the others all 4.
        let times = [100u64, 105, 110, 400];
        let ks = peregrine_transport::run_local(4, |t| -> Result<Vec<u64>> {
            let mut b = Counters::new(&t, None, 0)?;
            let mut ks = Vec::new();
            for it in 0..5u64 {
                for turn in 0..4 {
                    if t.rank() == turn {
                        let d = match it {
                            0 => times[turn],
                            // Iteration 1 too, so that iteration 3 shows its arrivals counted.
                            1 => [100, 100, 100, 300][turn],
                            _ => 100,
                        };
                        if let Arrival::InTime { k } = b.arrive(it, Duration::from_micros(d))? {
                            ks.push(k);
                            b.commit(it)?;
                        }
                    }
                    t.barrier()?;
                }
            }
            t.barrier()?;
            b.free()?;
            Ok(ks)
        })
        .expect("world");
        let ks: Vec<Vec<u64>> = ks.into_iter().map(|r| r.expect("rank")).collect();
        // Iterations 0 and 1: k = 4 (every update, no arrivals two before); 2 and 3: k = 3 (from
        // 0's and 1's), rank 3 late; 4: 4 again (from 2's: ranks 0-2 at 100 us, rank 3 after
        // the close at 100 us too, one more arrival before the choice).
        assert_eq!(ks[0], vec![4, 4, 3, 3, 4]);
        assert_eq!(ks[3], vec![4, 4, 4], "rank 3 is late in iterations 2 and 3");
    }

    #[test]
    fn only_the_first_k_count_and_late_ranks_are_told() {
        peregrine_transport::run_local(3, |t| -> Result<Vec<Arrival>> {
            let mut b = Counters::new(&t, Some(1), 0)?;
            let mut seen = Vec::new();
            for it in 0..20u64 {
                // Ranks arrive in turn: rank (it % 3) last.
                for turn in 0..3 {
                    if (t.rank() + it as usize) % 3 == turn {
                        let a = b.arrive(it, Duration::from_micros(100))?;
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
            assert_eq!(b.arrive(3, Duration::from_micros(100))?, Arrival::Late);
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
