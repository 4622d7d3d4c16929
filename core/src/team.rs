//! A team: a rank's active threads computing every chunk together, each thread its own share of
//! the model's units (`--split units`), instead of each thread computing chunks of its own.
//!
//! With chunks split by rows, every thread reads all the weights and writes a gradient of all of
//! them, and the rank's step reads every thread's: the whole model crosses between the cores on
//! every iteration. Split by units, thread `i` reads, differentiates and steps only its units'
//! weights ([`Model::units`](crate::model::Model::units)), which stay in its core's cache from
//! one iteration to the next; the threads exchange only what the units' outputs add up to (the
//! MLP's logits: classes x rows values).
//!
//! The team's leader (worker 0) runs the engine's usual loop over chunks (its own, taken over,
//! copies) and posts each run of rows it computes on the [`Team`]'s board; the other members wait
//! there, compute their part of each posted run into the gradient the leader names
//! ([`SharedGrad`]), and meet the leader at a barrier once their part is written. Members spin for a
//! short while, then yield, then sleep in short slices while no run is posted (an injected delay,
//! the leader's wait for a chunk to take over). A member that panics marks the team failed, and
//! every member waiting on it panics in turn instead of waiting for good; the pool passes the
//! panic on to the rank.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Training rows `rows` of pass `epoch` (0 the first), as `(epoch, rows)`.
pub type PassRows = (u64, Range<usize>);

/// How long a waiting member spins, then yields, before it sleeps in [`NAP`] slices.
const SPIN: Duration = Duration::from_micros(50);
/// A waiting member's sleep once it has spun and yielded for [`SPIN`] (twice).
const NAP: Duration = Duration::from_micros(20);

/// A value on its own cache line.
#[repr(align(64))]
#[derive(Default)]
struct Line<T>(T);

/// The gradient a run of rows is computed into: the leader's buffer, which every member writes in
/// its own ranges ([`Model::units`](crate::model::Model::units)).
#[derive(Clone, Copy, Debug)]
pub struct SharedGrad {
    grad: *mut f32,
    len: usize,
    /// The buffer holds old values, not zeros: the run writes its ranges instead of adding.
    pub fresh: bool,
}

// SAFETY: a `SharedGrad` is a pointer into the leader's buffer, which outlives every run posted with
// it (the leader waits for every member at the run's end); members write disjoint ranges.
unsafe impl Send for SharedGrad {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedGrad {}

impl SharedGrad {
    /// A target writing into `grad` (`fresh`: its values are old, to be overwritten).
    pub fn new(grad: &mut [f32], fresh: bool) -> Self {
        Self { grad: grad.as_mut_ptr(), len: grad.len(), fresh }
    }

    /// The target's values `r`.
    ///
    /// # Safety
    /// The buffer is alive and no one else reads or writes `r` while the slice lives: each member
    /// asks only for its own ranges, during the run it was posted.
    ///
    /// # Panics
    /// If `r` is not within the buffer.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, r: Range<usize>) -> &mut [f32] {
        assert!(r.start <= r.end && r.end <= self.len, "team target: {r:?} out of {}", self.len);
        // SAFETY: within the buffer (checked); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.grad.add(r.start), r.len()) }
    }
}

/// What one member computes a run of rows with.
pub struct Part<'a> {
    /// This member, `0..of` (0 is the leader).
    pub index: usize,
    /// Members in the run.
    pub of: usize,
    /// Where the gradient goes.
    pub target: SharedGrad,
    /// Rows of a pass the team probably computes next: a member may ask for them in cache
    /// meanwhile ([`Model::ahead`](crate::model::Model::ahead)).
    pub ahead: Option<PassRows>,
    team: &'a Team,
    /// Sums this member made in the run (which of the two slots it writes next).
    sums: Cell<usize>,
}

impl std::fmt::Debug for Part<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Part").field("index", &self.index).field("of", &self.of).finish_non_exhaustive()
    }
}

impl Part<'_> {
    /// Sums `mine` over the members into `out` (every member gets the sum): all of them call it
    /// at the same point of the run, with slices of one length.
    ///
    /// # Panics
    /// If `out` and `mine` differ in length.
    pub fn sum(&self, mine: &[f32], out: &mut [f32]) {
        assert_eq!(mine.len(), out.len(), "team sum: {} values into {}", mine.len(), out.len());
        let k = self.sums.get();
        self.sums.set(k + 1);
        self.team.sum(k % 2, self.index, self.of, mine, out);
    }
}

/// A run of rows posted to the members.
#[derive(Clone)]
struct Post {
    epoch: u64,
    rows: Range<usize>,
    ahead: Option<PassRows>,
    params: (*const f32, usize),
    target: SharedGrad,
    of: usize,
}

/// The board, barrier and exchange of one rank's team.
pub struct Team {
    /// Posts so far; a member waits for the count to pass the ones it has seen.
    posted: Line<AtomicU64>,
    /// The latest post (`None`: the job is over, members leave).
    post: UnsafeCell<Option<Post>>,
    arrived: Line<AtomicUsize>,
    passed: Line<AtomicU64>,
    /// A member panicked: the others stop waiting.
    failed: Line<AtomicBool>,
    /// Each member's values to sum, twice over: consecutive sums of a run alternate, so a member
    /// writes a slot again only after every member passed the next sum's barrier, hence after
    /// they read it; a run's end is a barrier too.
    slots: [Vec<UnsafeCell<Vec<f32>>>; 2],
}

// SAFETY: `post` is written by the leader only while no member reads it (before the count that
// publishes it, after the barrier that ends the previous run); a slot is written by its member
// only, read by the others between two barriers (see `slots`).
unsafe impl Sync for Team {}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team").field("members", &self.members()).finish_non_exhaustive()
    }
}

impl Team {
    /// A team of up to `members` threads.
    pub fn new(members: usize) -> Self {
        let members = members.max(1);
        let slots = || (0..members).map(|_| UnsafeCell::new(Vec::new())).collect();
        Self {
            posted: Line::default(),
            post: UnsafeCell::new(None),
            arrived: Line::default(),
            passed: Line::default(),
            failed: Line::default(),
            slots: [slots(), slots()],
        }
    }

    /// Most members.
    pub fn members(&self) -> usize {
        self.slots[0].len()
    }

    /// Leader: posts rows `rows` of pass `epoch` (and the hint `ahead`: see [`Part::ahead`])
    /// with `params` for members `1..of`, computes its own part with `own`, and returns once
    /// every member's part is written.
    pub fn run<R>(
        &self,
        (epoch, rows): PassRows,
        ahead: Option<PassRows>,
        params: &[f32],
        target: SharedGrad,
        of: usize,
        own: impl FnOnce(&Part<'_>) -> R,
    ) -> R {
        let of = of.clamp(1, self.members());
        if of > 1 {
            let post = Post {
                epoch,
                rows,
                ahead: ahead.clone(),
                params: (params.as_ptr(), params.len()),
                target,
                of,
            };
            // SAFETY: no member reads the post now: each is past the last run's barrier and waits
            // for the count, published after this write.
            unsafe { *self.post.get() = Some(post) };
            self.posted.0.fetch_add(1, Ordering::Release);
        }
        let out = {
            let _failing = Failing(self);
            own(&Part { index: 0, of, target, ahead, team: self, sums: Cell::new(0) })
        };
        self.barrier(of);
        out
    }

    /// Leader: the job is over; members waiting in [`follow`](Self::follow) return.
    pub fn close(&self) {
        // SAFETY: as in `run`: every member is past the last run's barrier.
        unsafe { *self.post.get() = None };
        self.posted.0.fetch_add(1, Ordering::Release);
    }

    /// Posts so far: what every member has seen between two jobs. Read before a job starts (no
    /// member's [`follow`](Self::follow) begins before), it is the job's `start`.
    pub fn posted(&self) -> u64 {
        self.posted.0.load(Ordering::Acquire)
    }

    /// Member `index` (`1..of` of every run the leader posts until it closes the job) of the job
    /// that began after `start` posts ([`posted`](Self::posted)): computes its part of each run
    /// with `part(epoch, rows, params, part)`.
    ///
    /// # Panics
    /// If a run has no member `index`.
    pub fn follow(
        &self,
        index: usize,
        start: u64,
        mut part: impl FnMut(u64, Range<usize>, &[f32], &Part<'_>),
    ) {
        let mut seen = start;
        loop {
            seen = self.wait_post(seen);
            // SAFETY: published by the count just read (Acquire); the leader writes it again only
            // after this run's barrier, which this member has not reached yet.
            let Some(post) = (unsafe { (*self.post.get()).clone() }) else { return };
            assert!(index < post.of, "team: member {index} of a run of {}", post.of);
            // SAFETY: the leader's parameters, alive and unwritten until the run's barrier.
            let params = unsafe { std::slice::from_raw_parts(post.params.0, post.params.1) };
            let me = Part {
                index,
                of: post.of,
                target: post.target,
                ahead: post.ahead,
                team: self,
                sums: Cell::new(0),
            };
            {
                let _failing = Failing(self);
                part(post.epoch, post.rows, params, &me);
            }
            self.barrier(post.of);
        }
    }

    /// Waits for the post count to pass `seen`; returns the new count.
    fn wait_post(&self, seen: u64) -> u64 {
        let start = Instant::now();
        loop {
            let now = self.posted.0.load(Ordering::Acquire);
            if now != seen {
                return now;
            }
            self.idle(start);
        }
    }

    /// Waits until `of` members arrived.
    fn barrier(&self, of: usize) {
        if of <= 1 {
            return;
        }
        let round = self.passed.0.load(Ordering::Acquire);
        if self.arrived.0.fetch_add(1, Ordering::AcqRel) + 1 == of {
            self.arrived.0.store(0, Ordering::Relaxed);
            self.passed.0.fetch_add(1, Ordering::Release);
            return;
        }
        let start = Instant::now();
        while self.passed.0.load(Ordering::Acquire) == round {
            self.idle(start);
        }
    }

    fn sum(&self, k: usize, index: usize, of: usize, mine: &[f32], out: &mut [f32]) {
        if of <= 1 {
            out.copy_from_slice(mine);
            return;
        }
        {
            // SAFETY: this member's own slot, which the others read only after the barrier below
            // (and last read before the barrier of the sum in between: see `slots`).
            let slot = unsafe { &mut *self.slots[k][index].get() };
            slot.clear();
            slot.extend_from_slice(mine);
        }
        self.barrier(of);
        out.fill(0.0);
        for m in 0..of {
            // SAFETY: written before the barrier just passed, not again before the next sum's.
            let slot = unsafe { &*self.slots[k][m].get() };
            for (o, v) in out.iter_mut().zip(slot) {
                *o += *v;
            }
        }
    }
}

impl Team {
    /// One round of a wait begun at `start`: spin, then yield, then nap.
    ///
    /// # Panics
    /// If another member panicked (it will not arrive).
    fn idle(&self, start: Instant) {
        assert!(!self.failed.0.load(Ordering::Relaxed), "team: another member of the rank's team panicked");
        let waited = start.elapsed();
        if waited < SPIN {
            std::hint::spin_loop();
        } else if waited < 2 * SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }
}

/// Marks the team failed if dropped while its thread panics (in a member's part of a run).
struct Failing<'a>(&'a Team);

impl Drop for Failing<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.0.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_compute_every_posted_run_and_sum_in_every_order() {
        let team = Team::new(3);
        let mut grad = vec![0.0f32; 9];
        let target = SharedGrad::new(&mut grad, true);
        let params = [1.0f32, 2.0, 3.0];
        let start = team.posted();
        std::thread::scope(|s| {
            for index in 1..3 {
                let team = &team;
                s.spawn(move || {
                    team.follow(index, start, |epoch, rows, p, part| {
                        let (mut out, mut twice) = ([0.0f32; 2], [0.0f32; 2]);
                        assert_eq!(part.ahead, Some((epoch + 1, 4..8)), "the leader's hint");
                        part.sum(&[index as f32, p[index]], &mut out);
                        part.sum(&out, &mut twice);
                        assert_eq!(twice, [9.0, 18.0]);
                        // SAFETY: member `index` writes only its three values.
                        let mine = unsafe { part.target.slice(3 * index..3 * index + 3) };
                        mine.copy_from_slice(&[out[0], out[1], (epoch + rows.len() as u64) as f32]);
                    });
                });
            }
            for run in 0..50u64 {
                let got = team.run((run, 0..4), Some((run + 1, 4..8)), &params, target, 3, |part| {
                    let (mut out, mut twice) = ([0.0f32; 2], [0.0f32; 2]);
                    part.sum(&[0.0, params[0]], &mut out);
                    part.sum(&out, &mut twice);
                    assert_eq!(twice, [9.0, 18.0]);
                    // SAFETY: the leader writes only its three values.
                    let mine = unsafe { part.target.slice(0..3) };
                    mine.copy_from_slice(&[out[0], out[1], 0.0]);
                    out
                });
                assert_eq!(got, [3.0, 6.0]);
                // Every member's part is written once `run` returns.
                let want = [3.0, 6.0, 0.0, 3.0, 6.0, (run + 4) as f32, 3.0, 6.0, (run + 4) as f32];
                // SAFETY: no run is in flight.
                assert_eq!(unsafe { target.slice(0..9) }, &want[..]);
            }
            team.close();
        });
        assert_eq!(grad[8], 53.0);
    }

    #[test]
    fn a_member_that_panics_makes_the_others_panic_not_wait() {
        for leader_fails in [false, true] {
            let team = Team::new(2);
            let mut grad = vec![0.0f32; 2];
            let target = SharedGrad::new(&mut grad, false);
            let start = team.posted();
            let (leader, member) = std::thread::scope(|s| {
                let team = &team;
                let member = s.spawn(move || {
                    team.follow(1, start, |_, _, _, part| {
                        let mut out = [0.0f32];
                        assert!(leader_fails, "member 1 fails");
                        part.sum(&[1.0], &mut out);
                    });
                });
                let leader = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    team.run((0, 0..1), None, &[], target, 2, |part| {
                        assert!(!leader_fails, "the leader fails");
                        let mut out = [0.0f32];
                        part.sum(&[1.0], &mut out);
                    });
                    team.close();
                }));
                (leader, member.join())
            });
            assert!(leader.is_err() && member.is_err(), "leader fails: {leader_fails}: both panic");
        }
    }
}
