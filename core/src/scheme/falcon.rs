//! Falcon's EPSP (elastic parallel synchronous processing): straggler projection, task transfer
//! and elastic parallelism, in two modes.
//!
//! - **Projection**: every rank publishes its chunk completion rate in its current iteration; a
//!   rank's projected finish time is its queued chunks over its rate ([`projected_finish`]).
//! - **Task transfer**: a rank out of work (a pioneer) takes over from the rank projected to
//!   finish last, the share that makes both finish together ([`transfer_share`]: `p / (p + v)`
//!   of what is left for rates `p`, thief, and `v`, victim).
//! - **Elastic parallelism**: a rank whose per-thread chunk rate falls below [`SHRINK_BELOW`] of
//!   its best (its cores are contended) gives up a thread; back above [`GROW_ABOVE`], it takes one
//!   back ([`elastic`]).
//! - **Enforced** mode (`falcon`, `falcon:enforced`): BSP with every chunk of an iteration done
//!   before anyone pushes it (the compute-done point). **Slack** mode (`falcon:slack:s`): SSP(s)
//!   instead, a pioneer running up to `s` iterations ahead and taking over chunks of older
//!   iterations of the ranks behind it.

use std::fmt;
use std::sync::Arc;

use super::staleness::Bound;
use super::{arg, best_queued, bound, Family, Parsed, Policy, Result, SchemeKind, Setup, Share, Take, View};
use crate::record::IterRecord;
use crate::words::Queue;

pub(crate) const FAMILY: Family = Family {
    forms: "falcon[:enforced|:slack[:<staleness>]]",
    names: &["falcon", "falcon:slack"],
    compared: &["falcon", "falcon:slack:2"],
    parse,
};

/// The slack mode's staleness bound when none is given.
const DEFAULT_SLACK: u64 = 2;
/// Elastic parallelism: a thread is given up when the per-thread rate falls below this fraction
/// of the best seen.
pub(crate) const SHRINK_BELOW: f64 = 0.6;
/// Elastic parallelism: a thread is taken back when the per-thread rate is above this fraction
/// of the best seen.
pub(crate) const GROW_ABOVE: f64 = 0.9;

fn parse(s: &str) -> Option<Parsed> {
    let f = match s {
        "falcon" | "epsp" | "falcon:enforced" => Ok(Falcon { slack: None }),
        "falcon:slack" => Ok(Falcon { slack: Some(DEFAULT_SLACK) }),
        _ => bound(s, arg(s, "falcon:slack")?, "falcon:slack:2").map(|b| Falcon { slack: Some(b) }),
    };
    Some(f.map(|f| Arc::new(f) as Arc<dyn SchemeKind>))
}

/// Falcon in enforced mode (`slack: None`) or slack mode with its staleness bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Falcon {
    slack: Option<u64>,
}

impl fmt::Display for Falcon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.slack {
            None => f.write_str("falcon"),
            Some(s) => write!(f, "falcon:slack:{s}"),
        }
    }
}

impl SchemeKind for Falcon {
    fn pulls_every_update(&self) -> bool {
        self.slack.is_none()
    }

    fn policy(&self, _setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        Ok(Box::new(Epsp { slack: self.slack, best_per_thread: 0.0, active: None, cap: 1 }))
    }
}

/// A rank's projected finish time: `left` chunks at `rate` chunks per second (an unknown rate, 0,
/// counts as slowest).
pub(crate) fn projected_finish(left: u32, rate: f64) -> f64 {
    if rate > 0.0 {
        f64::from(left) / rate
    } else {
        f64::INFINITY
    }
}

/// The share of a victim's remaining chunks that a thief at rate `p` takes from a victim at rate
/// `v` so that both finish together: `p / (p + v)` (unknown rates: the configured share).
pub(crate) fn transfer_share(p: f64, v: f64) -> Share {
    if p > 0.0 && v > 0.0 {
        Share::Fraction(p / (p + v))
    } else {
        Share::Configured
    }
}

/// The active threads after an iteration at `per_thread` chunks per second per thread, the best
/// seen being `best`, with `cur` active and at most `cap`.
pub(crate) fn elastic(per_thread: f64, best: f64, cur: usize, cap: usize) -> usize {
    if per_thread < SHRINK_BELOW * best && cur > 1 {
        cur - 1
    } else if per_thread > GROW_ABOVE * best && cur < cap {
        cur + 1
    } else {
        cur
    }
}

/// The policy.
struct Epsp {
    slack: Option<u64>,
    /// The best per-thread chunk rate seen.
    best_per_thread: f64,
    /// Active threads set by elastic parallelism (`None` before the first iteration's measure).
    active: Option<usize>,
    /// The most threads elastic parallelism may run.
    cap: usize,
}

impl Epsp {
    /// Enforced: BSP's wait; slack: SSP's with its bound.
    fn bound(&self) -> Bound {
        self.slack.map_or(Bound::Bsp, Bound::Ssp)
    }
}

impl Policy for Epsp {
    fn takes_over(&self) -> bool {
        true
    }

    fn reads_rates(&self) -> bool {
        true
    }

    fn threads(&mut self, planned: usize) -> usize {
        self.cap = planned;
        self.active.unwrap_or(planned)
    }

    /// The rank projected to finish last, and the share that equalizes both finish times.
    fn victim(&self, view: &dyn View, it: u64) -> Result<Option<Take>> {
        // The candidates' queues and rates, each in one batch, and this rank's rate.
        let (me, ranks) = (view.rank(), view.candidates(it)?);
        let (queues, rates) = (view.queues_in(ranks.clone())?, view.rates_in(ranks.clone())?);
        let rate = |r: usize| rates[r - ranks.start];
        let finish = |r: usize, q: Queue| Ok(projected_finish(q.left(), rate(r)));
        let among = ranks.clone().filter(|&r| r != me).map(|r| (r, queues[r - ranks.start]));
        let Some(rank) = best_queued(it, among, finish)? else {
            return Ok(None);
        };
        let mine = if ranks.contains(&me) { rate(me) } else { view.rate(me)? };
        Ok(Some(Take { rank, share: transfer_share(mine, rate(rank)) }))
    }

    fn line_up(&self) -> bool {
        self.slack.is_none()
    }

    fn leaves_chunks(&self) -> bool {
        self.slack.is_none()
    }

    fn ready(&self, view: &dyn View, it: u64) -> Result<bool> {
        self.bound().ready(view, it)
    }

    fn staleness(&self) -> Option<u64> {
        self.bound().staleness()
    }

    fn end(&mut self, rec: &IterRecord) {
        // The threads' time in chunks, not the compute's wall time: a thread idle at the end of
        // the round (nothing left to take, or its last chunks left to free threads elsewhere by
        // the end game) is not a contended core.
        let seconds = if rec.busy > 0.0 { rec.busy } else { rec.compute };
        if seconds > 0.0 {
            let per_thread = (rec.own + rec.taken) as f64 / (seconds * rec.threads as f64);
            self.best_per_thread = self.best_per_thread.max(per_thread);
            self.active = Some(elastic(per_thread, self.best_per_thread, rec.threads, self.cap));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;
    use crate::words;

    #[test]
    fn the_victim_is_the_rank_projected_to_finish_last() {
        // From rank 0 at 40 chunks/s in iteration 3: rank 1 has 10 left at 20/s (0.5 s), rank 2
        // has 30 left at 100/s (0.3 s), rank 3 has 2 left and no rate yet (never measured:
        // slowest of all).
        let t = words::tag(3);
        let mut v = Snapshot::new(0, 4);
        v.rates = vec![40.0, 20.0, 100.0, 0.0];
        v.queues = vec![
            Queue { tag: t, head: 0, tail: 0 },
            Queue { tag: t, head: 0, tail: 10 },
            Queue { tag: t, head: 0, tail: 30 },
            Queue { tag: t, head: 0, tail: 2 },
        ];
        let p = Epsp { slack: None, best_per_thread: 0.0, active: None, cap: 1 };
        // Rank 3's rate is unknown: the configured share.
        assert_eq!(p.victim(&v, 3).expect("view"), Some(Take { rank: 3, share: Share::Configured }));
        v.queues[3].head = 2;
        // Rank 1 (0.5 s) over rank 2 (0.3 s, though it has the most left); share 40 / (40 + 20):
        // the thief takes 2/3 of the 10, 6.7 chunks in 0.17 s, the victim keeps 3.3 for 0.17 s.
        let take = p.victim(&v, 3).expect("view").expect("a victim");
        assert_eq!(take.rank, 1);
        let Share::Fraction(f) = take.share else { panic!("{take:?}") };
        assert!((f - 2.0 / 3.0).abs() < 1e-12);
        // A rank already in iteration 4 is not taken from by a rank in 3.
        v.queues[1].tag = words::tag(4);
        assert_eq!(p.victim(&v, 3).expect("view").map(|t| t.rank), Some(2));
        assert_eq!(projected_finish(30, 100.0), 0.3);
    }

    #[test]
    fn elastic_parallelism_gives_threads_up_and_back() {
        // Best 100/s per thread. At 55 (below 60) one thread is given up; at 70 nothing changes;
        // at 95 (above 90) one comes back, up to the cap.
        assert_eq!(elastic(55.0, 100.0, 4, 4), 3);
        assert_eq!(elastic(70.0, 100.0, 3, 4), 3);
        assert_eq!(elastic(95.0, 100.0, 3, 4), 4);
        assert_eq!(elastic(95.0, 100.0, 4, 4), 4, "not beyond the cap");
        assert_eq!(elastic(10.0, 100.0, 1, 4), 1, "never below one");
    }

    #[test]
    fn the_policy_measures_per_thread_rates_from_the_record() {
        let mut p = Epsp { slack: Some(2), best_per_thread: 0.0, active: None, cap: 1 };
        assert_eq!(p.threads(4), 4);
        // 40 chunks in 0.1 s on 4 threads: 100/s per thread, the best so far: stays at 4.
        p.end(&IterRecord { own: 30, taken: 10, compute: 0.1, threads: 4, ..Default::default() });
        assert_eq!(p.threads(4), 4);
        // 20 chunks in 0.1 s on 4 threads: 50/s, below 60% of 100: 3 threads next.
        p.end(&IterRecord { own: 20, compute: 0.1, threads: 4, ..Default::default() });
        assert_eq!(p.threads(4), 3);
        // 29 chunks in 0.1 s on 3 threads: 96.7/s, above 90%: back to 4.
        p.end(&IterRecord { own: 29, compute: 0.1, threads: 3, ..Default::default() });
        assert_eq!(p.threads(4), 4);
        // 20 chunks on 4 threads in a compute of 0.1 s, but 0.05 s of it in chunks a thread (the
        // rest idle at the end): 100/s, not contended: stays at 4.
        p.end(&IterRecord { own: 20, compute: 0.1, busy: 0.05, threads: 4, ..Default::default() });
        assert_eq!(p.threads(4), 4);
        assert!(!p.line_up(), "slack mode has no compute-done point");
        assert!(!p.leaves_chunks(), "nor an end game");
        assert!(Epsp { slack: None, ..p }.leaves_chunks(), "the enforced mode has both");
    }
}
