//! FlexRR (Harlap et al., SoCC 2016): SSP(s) with rapid reassignment. Ranks form helper groups
//! (each rank helps the up to [`HELPER_GROUP`] ranks before it, cyclically); after each take of its
//! own chunks a rank reads its group's progress words, and a member more than [`LAG`] of an
//! iteration behind it has half of its remaining chunks (the steal fraction) taken over at once,
//! before the helper finishes its own; a rank out of work takes over only within its group too.
//!
//! The group size and the lag threshold are this implementation's choices in the spirit of the
//! paper (which reassigns within small groups on progress reports), not values checked against it.

use std::fmt;
use std::sync::Arc;

use super::staleness::Bound;
use super::{arg, best_queued, bound, Family, Parsed, Policy, Result, SchemeKind, Setup, Share, Take, View};

pub(crate) const FAMILY: Family =
    Family { forms: "flexrr[:<staleness>]", names: &["flexrr"], compared: &["flexrr"], parse };

/// FlexRR's staleness bound when none is given.
const DEFAULT_BOUND: u64 = 3;
/// Ranks a rank helps: the ones before it, cyclically.
pub(crate) const HELPER_GROUP: usize = 4;
/// How far behind (in iterations) a group member must be to have chunks reassigned.
pub(crate) const LAG: f64 = 0.25;

fn parse(s: &str) -> Option<Parsed> {
    let b = match s {
        "flexrr" => Ok(DEFAULT_BOUND),
        _ => bound(s, arg(s, "flexrr")?, "flexrr:2"),
    };
    Some(b.map(|bound| Arc::new(FlexRr { bound }) as Arc<dyn SchemeKind>))
}

/// FlexRR with its staleness bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlexRr {
    bound: u64,
}

impl fmt::Display for FlexRr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "flexrr:{}", self.bound)
    }
}

impl SchemeKind for FlexRr {
    fn policy(&self, _setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        Ok(Box::new(Reassign { bound: Bound::Ssp(self.bound) }))
    }
}

/// Whether rank `me` helps rank `v` in a world of `world`: `v` is one of the up to
/// [`HELPER_GROUP`] ranks before `me`, cyclically (the definition [`helped`] enumerates).
#[cfg(test)]
fn helps(me: usize, v: usize, world: usize) -> bool {
    let d = (me + world - v) % world;
    d >= 1 && d <= (world - 1).min(HELPER_GROUP)
}

/// The ranks `me` helps, in rank order, as at most two runs of consecutive ranks (the group
/// wraps past rank 0), each read in one batch: O(group), not O(world) (asked after every own
/// chunk).
fn helped_runs(me: usize, world: usize) -> [std::ops::Range<usize>; 2] {
    let n = world.saturating_sub(1).min(HELPER_GROUP);
    if me >= n {
        [me - n..me, 0..0]
    } else {
        [0..me, world - (n - me)..world]
    }
}

/// The ranks `me` helps, in rank order.
#[cfg(test)]
fn helped(me: usize, world: usize) -> impl Iterator<Item = usize> {
    helped_runs(me, world).into_iter().flatten()
}

/// The policy.
struct Reassign {
    bound: Bound,
}

impl Policy for Reassign {
    fn takes_over(&self) -> bool {
        true
    }

    /// The group members more than [`LAG`] behind this rank, with chunks still queued: their
    /// queues and progress words read in a batch each (per run of consecutive ranks).
    fn after_own_chunk(&self, view: &dyn View, it: u64, out: &mut Vec<Take>) -> Result<()> {
        let (me, world) = (view.rank(), view.world());
        let here = view.progress(me)?.position(it);
        for run in helped_runs(me, world).into_iter().filter(|r| !r.is_empty()) {
            let queues = view.queues_in(run.clone())?;
            if queues.iter().all(|q| q.left() == 0) {
                continue;
            }
            let progress = view.progress_in(run.clone())?;
            for ((v, q), p) in run.zip(queues).zip(progress) {
                if q.left() == 0 || here - p.position(it) <= LAG {
                    continue;
                }
                out.push(Take { rank: v, share: Share::Configured });
            }
        }
        Ok(())
    }

    fn victim(&self, view: &dyn View, it: u64) -> Result<Option<Take>> {
        // Only the group's queues are read (a handful of words, however large the world), a
        // batch per run of consecutive ranks.
        let (me, world) = (view.rank(), view.world());
        let mut queues = Vec::with_capacity(HELPER_GROUP);
        for run in helped_runs(me, world).into_iter().filter(|r| !r.is_empty()) {
            queues.extend(run.clone().zip(view.queues_in(run)?));
        }
        let most = best_queued(it, queues.into_iter(), |_, q| Ok(f64::from(q.left())))?;
        Ok(most.map(|rank| Take { rank, share: Share::Configured }))
    }

    fn ready(&self, view: &dyn View, it: u64) -> Result<bool> {
        self.bound.ready(view, it)
    }

    fn staleness(&self) -> Option<u64> {
        self.bound.staleness()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;
    use crate::words::{self, ProgressWord, Queue};

    #[test]
    fn the_helped_ranks_are_the_ones_helps_names() {
        for world in [1, 2, 3, 5, 6, 40] {
            for me in 0..world {
                let slow: Vec<usize> = (0..world).filter(|&v| helps(me, v, world)).collect();
                assert_eq!(helped(me, world).collect::<Vec<_>>(), slow, "rank {me} of {world}");
            }
        }
    }

    #[test]
    fn each_rank_helps_the_four_before_it() {
        // 8 ranks: rank 5 helps 4, 3, 2, 1; not 0 (five before), 6 or itself.
        let group: Vec<usize> = (0..8).filter(|&v| helps(5, v, 8)).collect();
        assert_eq!(group, vec![1, 2, 3, 4]);
        // Cyclically: rank 1 helps 0, 7, 6, 5.
        let group: Vec<usize> = (0..8).filter(|&v| helps(1, v, 8)).collect();
        assert_eq!(group, vec![0, 5, 6, 7]);
        // Three ranks: everyone else.
        assert_eq!((0..3).filter(|&v| helps(0, v, 3)).collect::<Vec<_>>(), vec![1, 2]);
        assert!(!helps(0, 0, 1));
    }

    #[test]
    fn members_more_than_a_quarter_iteration_behind_are_reassigned() {
        // Rank 5 of 6 in iteration 10 with 6 of 8 chunks done: position 10.75. Its group is
        // ranks 1-4. Rank 4 has 1 of 8 done (10.125, 0.625 behind): reassigned. Rank 3 has 5 of 8
        // (10.625, 0.125 behind): not. Ranks 1 and 2 are done. Rank 0 is not in the group,
        // however far behind.
        let t = words::tag(10);
        let mut v = Snapshot::new(5, 6);
        let at = |done| ProgressWord { tag: t, total: 8, done };
        v.progress = vec![at(0), at(8), at(8), at(5), at(1), at(6)];
        v.queues = v.progress.iter().map(|p| Queue { tag: t, head: p.done, tail: 8 }).collect();
        let p = Reassign { bound: Bound::Ssp(2) };
        let reassigned = |v: &Snapshot| {
            let mut out = Vec::new();
            p.after_own_chunk(v, 10, &mut out).expect("view");
            assert!(out.iter().all(|t| t.share == Share::Configured));
            out.iter().map(|t| t.rank).collect::<Vec<_>>()
        };
        assert_eq!(reassigned(&v), vec![4]);
        // A member a whole iteration behind (still in 9, half done: 9.5) is 1.25 behind.
        v.progress[3] = ProgressWord { tag: words::tag(9), total: 8, done: 4 };
        assert_eq!(reassigned(&v), vec![3, 4]);
        // Nothing queued, nothing to reassign (its chunks are all running).
        v.queues[4].head = 8;
        assert_eq!(reassigned(&v), vec![3]);
        // Out of work, rank 5 takes over within its group only: from rank 3 (3 left), not from
        // rank 0 with the most (8 left).
        assert_eq!(p.victim(&v, 10).expect("view").map(|t| t.rank), Some(3));
    }
}
