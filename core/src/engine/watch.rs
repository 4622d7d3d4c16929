//! The watchdog: a thread beside each rank's loop that ends the job when the rank has made no
//! progress for a set time, naming the rank that looks stuck.
//!
//! A rank that stops (a process stopped or swapped out for good, a hung thread, a node that no
//! longer answers) does not fail: the others wait for it forever. Under MPI they may not even
//! wait in Peregrine's own loop, where a time-out could be checked: with OpenMPI's `pt2pt`
//! one-sided component a get from a stopped rank blocks inside the library. So the check runs on
//! its own thread, which touches no window: the loop marks its progress (an atomic store at each
//! phase and chunk), and remembers whom it last saw behind (the slowest clock in its last read of
//! every rank's clock, the ranks whose chunks were not done, how many ranks had finished). When
//! the last mark is older than the limit, the thread hands a message naming the rank to
//! [`Watchdog::on_hang`], whose job is to end the process (threads stuck in a call cannot be
//! unwound); the launcher then ends the other ranks (mpirun and `srun --kill-on-bad-exit` do).
//!
//! Time the process itself did not run (the watchdog thread woke far later than it asked to:
//! the process was stopped, or starved of CPU) does not count: a job suspended whole
//! (`scontrol suspend`, SIGSTOP to every rank) goes on when resumed, and a rank stopped alone
//! and continued does not blame the others for its own pause.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// [`Watchdog::on_hang`]: the message, and whether the run had been asked to stop.
pub type OnHang = dyn Fn(&str, bool) + Send + Sync;

/// What the watchdog does with a rank that stopped progressing.
#[derive(Clone)]
pub struct Watchdog {
    /// How long without progress before the rank counts as stuck.
    pub after: Duration,
    /// The shorter limit once the run is asked to stop ([`super::Config::stop`]), counted from
    /// the request: a rank that cannot reach the stop's checkpoint (a peer died; a launcher
    /// ending a step sends the survivors SIGTERM, and SIGKILL only after its grace time, 30 s
    /// by default under Slurm) ends the job instead of waiting for the SIGKILL.
    pub after_stop: Duration,
    /// Called once, from the watchdog's thread, with a message naming the stuck rank and whether
    /// the run had been asked to stop (the [`Watchdog::after_stop`] limit ran out); expected to end
    /// the process.
    pub on_hang: Arc<OnHang>,
}

impl fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watchdog").field("after", &self.after).finish_non_exhaustive()
    }
}

/// Where in its iteration a rank is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Phase {
    Starting,
    Pulling,
    Computing,
    LiningUp,
    Pushing,
    Waiting,
    Evaluating,
    Checkpointing,
    Finishing,
}

impl Phase {
    const ALL: [Phase; 9] = [
        Phase::Starting,
        Phase::Pulling,
        Phase::Computing,
        Phase::LiningUp,
        Phase::Pushing,
        Phase::Waiting,
        Phase::Evaluating,
        Phase::Checkpointing,
        Phase::Finishing,
    ];

    fn describe(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Pulling => "pulling parameters",
            Phase::Computing => "computing its chunks",
            Phase::LiningUp => "waiting for every rank's chunks",
            Phase::Pushing => "pushing its update",
            Phase::Waiting => "waiting for the other ranks' clocks",
            Phase::Evaluating => "evaluating",
            Phase::Checkpointing => "at a checkpoint",
            Phase::Finishing => "waiting for the other ranks to finish",
        }
    }
}

/// Whom the rank saw behind, last time it looked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Behind {
    /// The slowest other rank's clock in its last read of every rank's clock, and how many
    /// other ranks were at the same clock.
    Clock { rank: usize, clock: u64, tied: usize },
    /// The first rank whose chunks of the iteration were not done, and the first other rank
    /// computing some of them, taken over (once the wait was long enough to look).
    Chunks { rank: usize, holder: Option<usize> },
    /// The first rank that had not arrived at the checkpoint.
    Arrival { rank: usize },
    /// Every rank had arrived at the checkpoint, and this one went on into its collectives (a
    /// rank stopped after arriving holds everyone there, unseen by any read).
    Collective,
    /// A rank whose clock was no lower than any other's, marked as passing its tick up the
    /// clock tree ([`crate::clocks::PASSING`]): stopped there, it keeps every rank waiting.
    Passing { rank: usize, clock: u64 },
}

/// A rank's progress marks, written by its loop and threads, read by its watchdog.
pub(super) struct Watch {
    t0: Instant,
    /// Nanoseconds from `t0` to the last mark.
    last: AtomicU64,
    iteration: AtomicU64,
    phase: AtomicU8,
    /// Chunks being computed now (a rank stuck with none in progress is blocked in a call, not
    /// in its own compute).
    in_chunk: AtomicU64,
    /// Whom it last saw behind, and in which of its iterations.
    behind: Mutex<Option<(Behind, u64)>>,
}

impl Watch {
    pub fn new(iteration: u64) -> Self {
        Self {
            t0: Instant::now(),
            last: AtomicU64::new(0),
            iteration: AtomicU64::new(iteration),
            phase: AtomicU8::new(Phase::Starting as u8),
            behind: Mutex::new(None),
            in_chunk: AtomicU64::new(0),
        }
    }

    /// Progress: the rank entered `phase` of `iteration`.
    pub fn mark(&self, phase: Phase, iteration: u64) {
        self.iteration.store(iteration, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Relaxed);
        self.beat();
    }

    /// A compute thread starts a chunk.
    pub fn chunk_started(&self) {
        self.in_chunk.fetch_add(1, Ordering::Relaxed);
    }

    /// A compute thread finished a chunk: progress.
    pub fn chunk_done(&self) {
        self.in_chunk.fetch_sub(1, Ordering::Relaxed);
        self.beat();
    }

    /// Progress within the phase.
    pub fn beat(&self) {
        self.last.store(self.t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Every rank's clock word, as just read by rank `me`: the slowest other rank (the first of
    /// those tied) and how many others share its clock; if no other rank is behind another, one
    /// still passing its tick up the clock tree ([`crate::clocks::PASSING`]).
    pub fn saw_clocks(&self, me: usize, words: &[u64]) {
        use crate::clocks::PASSING;
        let others = || words.iter().map(|&w| w & !PASSING).enumerate().filter(|&(r, _)| r != me);
        let Some((rank, clock)) = others().min_by_key(|&(_, c)| c) else { return };
        let tied = others().filter(|&(_, c)| c == clock).count() - 1;
        let passing = words.iter().enumerate().find(|&(r, &w)| r != me && w & PASSING != 0);
        match passing {
            Some((r, &w)) if others().all(|(_, c)| c >= w & !PASSING) => {
                self.saw(Behind::Passing { rank: r, clock: w & !PASSING });
            }
            _ => self.saw(Behind::Clock { rank, clock, tied }),
        }
    }

    pub fn saw(&self, b: Behind) {
        let it = self.iteration.load(Ordering::Relaxed);
        *self.behind.lock().expect("watch") = Some((b, it));
    }

    /// Forgets whom the rank saw behind (a wait that named someone is over).
    pub fn saw_nobody(&self) {
        *self.behind.lock().expect("watch") = None;
    }

    /// The rank the rank saw behind in its iteration `it`, if any.
    pub fn behind_in(&self, it: u64) -> Option<usize> {
        match *self.behind.lock().expect("watch") {
            Some((
                Behind::Clock { rank, .. }
                | Behind::Chunks { holder: None, rank }
                | Behind::Chunks { holder: Some(rank), .. }
                | Behind::Arrival { rank }
                | Behind::Passing { rank, .. },
                seen,
            )) if seen == it => Some(rank),
            _ => None,
        }
    }

    /// How long since the last mark.
    fn idle(&self) -> Duration {
        self.t0.elapsed().saturating_sub(Duration::from_nanos(self.last.load(Ordering::Relaxed)))
    }

    /// Watches until `done` says the run is over (a message or a hang-up); calls the
    /// watchdog's `on_hang` once if the rank goes `dog.after` without progress.
    pub fn guard(
        &self,
        rank: usize,
        world: usize,
        dog: &Watchdog,
        stop: Option<&AtomicBool>,
        done: &Receiver<()>,
    ) {
        let poll =
            (dog.after.min(dog.after_stop) / 8).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut stop_seen: Option<Instant> = None;
        // Time this process did not run at all since the last mark (stopped, as by `scontrol
        // suspend`, or starved): not the rank's fault, and not the others' either.
        let mut discount = Duration::ZERO;
        let mut seen = self.last.load(Ordering::Relaxed);
        let mut woke = Instant::now();
        loop {
            match done.recv_timeout(poll) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let late = woke.elapsed().saturating_sub(poll);
            woke = Instant::now();
            let last = self.last.load(Ordering::Relaxed);
            if last != seen {
                (seen, discount) = (last, Duration::ZERO);
            }
            if late > poll {
                discount += late;
            }
            let idle = self.idle().saturating_sub(discount);
            if stop_seen.is_none() && stop.is_some_and(|f| f.load(Ordering::Relaxed)) {
                stop_seen = Some(Instant::now());
            }
            let stopping = stop_seen.map(|t| idle.min(t.elapsed()));
            if idle >= dog.after {
                (dog.on_hang)(&self.describe(rank, world, idle, dog.after, ""), false);
                return;
            }
            if let Some(idle) = stopping.filter(|&i| i >= dog.after_stop) {
                (dog.on_hang)(&self.describe(rank, world, idle, dog.after_stop, " once asked to stop"), true);
                return;
            }
        }
    }

    fn describe(&self, rank: usize, world: usize, idle: Duration, after: Duration, when: &str) -> String {
        let phase = Phase::ALL[usize::from(self.phase.load(Ordering::Relaxed))];
        let it = self.iteration.load(Ordering::Relaxed);
        let seen = *self.behind.lock().expect("watch");
        let behind = seen.map(|s| s.0);
        // Computing with no chunk in progress: its threads are blocked in a one-sided call (taking
        // over, counting a chunk done), waiting on another rank like the other phases. Lining up,
        // a rank computes chunks it took over: stuck in one, it is itself the one stuck.
        let computing = matches!(phase, Phase::Computing | Phase::LiningUp);
        let own = computing && self.in_chunk.load(Ordering::Relaxed) > 0;
        let suspect = match (!own, behind) {
            (false, _) => format!("rank {rank} itself looks stuck"),
            (true, Some(Behind::Clock { rank: r, clock, tied: 0 })) => format!(
                "rank {r} looks stuck: the last clocks rank {rank} read put it at iteration {clock}, \
                 behind every other rank"
            ),
            (true, Some(Behind::Clock { rank: r, clock, tied })) => format!(
                "the last clocks rank {rank} read put rank {r} and {tied} other rank(s) at iteration \
                 {clock}, the slowest: one of them looks stuck"
            ),
            (true, Some(Behind::Chunks { rank: r, holder: None })) => {
                format!("rank {r} looks stuck: its chunks of iteration {it} were not done when rank {rank} last looked")
            }
            (true, Some(Behind::Chunks { rank: r, holder: Some(h) })) => format!(
                "rank {h} looks stuck: it had taken over chunks of rank {r}'s iteration {it} and not \
                 finished them when rank {rank} last looked"
            ),
            (true, Some(Behind::Passing { rank: r, clock })) => format!(
                "rank {r} looks stuck: it had ticked to iteration {clock} and not passed the tick up \
                 the combining tree of clocks when rank {rank} last read the clocks"
            ),
            (true, Some(Behind::Arrival { rank: r })) => {
                format!(
                    "rank {r} looks stuck: it had not arrived at a checkpoint when rank {rank} last looked"
                )
            }
            // Two ranks: the one rank 0 waits for in a collective is the other.
            (true, Some(Behind::Collective)) if world == 2 => format!(
                "rank {} looks stuck: every rank had arrived at the checkpoint and rank {rank} waits for it                  in the checkpoint's collectives",
                1 - rank.min(1)
            ),
            (true, Some(Behind::Collective)) => format!(
                "every rank had arrived at the checkpoint and rank {rank} waits in its collectives: one of                  the other ranks looks stuck (a collective does not say which)"
            ),
            // Two ranks: whatever rank 0 waits for (a collective of an evaluation, a one-sided
            // call) is the other one, read or not.
            (true, None) if world == 2 => format!(
                "rank {} looks stuck: rank {rank} had not seen it behind in a read, but it is the only \
                 other rank",
                1 - rank.min(1)
            ),
            (true, None) => format!("rank {rank} had not read the other ranks' progress yet"),
        };
        // Seen in an earlier iteration (the rank is now blocked where it reads nothing: inside a
        // one-sided call or a collective): still the best guess, and the message says when.
        let suspect = match seen {
            Some((_, at)) if at != it && !own => format!("{suspect} (seen in its iteration {at})"),
            _ => suspect,
        };
        format!(
            "watchdog: rank {rank} of {world} made no progress for {:.1} s ({} in iteration {it}); \
             {suspect}; ending the job (the limit is {} s{when})",
            idle.as_secs_f64(),
            phase.describe(),
            after.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn dog(after_ms: u64, seen: Arc<Mutex<Vec<String>>>) -> Watchdog {
        Watchdog {
            after: Duration::from_millis(after_ms),
            after_stop: Duration::from_millis(after_ms),
            on_hang: Arc::new(move |m: &str, _| seen.lock().expect("seen").push(m.to_owned())),
        }
    }

    #[test]
    fn a_rank_without_progress_is_named_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let w = Watch::new(0);
        w.mark(Phase::Waiting, 7);
        w.saw_clocks(1, &[8, 8, 6, 7]);
        let (_tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        w.guard(1, 4, &dog(100, seen.clone()), None, &rx);
        assert!(t0.elapsed() >= Duration::from_millis(100));
        let seen = seen.lock().expect("seen");
        assert_eq!(seen.len(), 1);
        assert!(seen[0].contains("rank 2 looks stuck"), "{}", seen[0]);
        assert!(seen[0].contains("iteration 6"), "{}", seen[0]);
        assert!(seen[0].contains("rank 1 of 4 made no progress"), "{}", seen[0]);
    }

    #[test]
    fn a_rank_stopped_passing_its_tick_up_the_tree_is_named() {
        use crate::clocks::PASSING;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let w = Watch::new(0);
        w.mark(Phase::Waiting, 6);
        // Every clock at 7, rank 3 marked as passing its tick up: it is the one.
        w.saw_clocks(1, &[7, 7, 7, 7 | PASSING]);
        assert_eq!(w.behind_in(6), Some(3));
        let (_tx, rx) = mpsc::channel();
        w.guard(1, 4, &dog(50, seen.clone()), None, &rx);
        let seen = seen.lock().expect("seen");
        assert!(seen[0].contains("rank 3 looks stuck") && seen[0].contains("combining tree"), "{}", seen[0]);
        // A rank behind the others comes first: the one passing is on its way.
        w.saw_clocks(1, &[7, 7, 6, 7 | PASSING]);
        assert_eq!(w.behind_in(6), Some(2));
    }

    #[test]
    fn a_rank_stopped_after_arriving_at_a_checkpoint_or_unseen_is_named_among_two() {
        for (world, rank, want) in
            [(2, 0, "rank 1 looks stuck"), (2, 1, "rank 0 looks stuck"), (3, 0, "one of")]
        {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let w = Watch::new(0);
            w.mark(Phase::Checkpointing, 400);
            w.saw(Behind::Collective);
            assert_eq!(w.behind_in(400), None, "nobody to name as waited for");
            let (_tx, rx) = mpsc::channel();
            w.guard(rank, world, &dog(50, seen.clone()), None, &rx);
            let seen = seen.lock().expect("seen");
            assert!(seen[0].contains(want) && seen[0].contains("collectives"), "{}", seen[0]);
        }
        // Nothing seen at all (blocked in an evaluation's collective before any read): among two
        // ranks the other one; among more, nobody.
        for (world, want) in [(2, "rank 1 looks stuck"), (3, "had not read the other ranks' progress")] {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let w = Watch::new(0);
            w.mark(Phase::Evaluating, 300);
            let (_tx, rx) = mpsc::channel();
            w.guard(0, world, &dog(50, seen.clone()), None, &rx);
            let seen = seen.lock().expect("seen");
            assert!(seen[0].contains(want), "{}", seen[0]);
        }
    }

    #[test]
    fn once_asked_to_stop_the_shorter_limit_counts_from_the_request() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let w = Watch::new(0);
        w.mark(Phase::Waiting, 3);
        w.saw_clocks(0, &[4, 3, 4]);
        let stop = AtomicBool::new(false);
        let dog = Watchdog { after_stop: Duration::from_millis(300), ..dog(60_000, seen.clone()) };
        let (_tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Long without progress before the request: not held against the rank.
                std::thread::sleep(Duration::from_millis(400));
                stop.store(true, Ordering::Relaxed);
            });
            let t0 = Instant::now();
            w.guard(0, 3, &dog, Some(&stop), &rx);
            assert!(t0.elapsed() >= Duration::from_millis(700), "{:?}", t0.elapsed());
        });
        let seen = seen.lock().expect("seen");
        assert!(
            seen[0].contains("rank 1 looks stuck") && seen[0].contains("once asked to stop"),
            "{}",
            seen[0]
        );
    }

    #[test]
    fn a_rank_stuck_in_its_own_compute_names_itself() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let w = Watch::new(0);
        w.saw(Behind::Chunks { rank: 3, holder: None });
        w.mark(Phase::Computing, 2);
        w.chunk_started();
        let (_tx, rx) = mpsc::channel();
        w.guard(0, 4, &dog(50, seen.clone()), None, &rx);
        let seen = seen.lock().expect("seen");
        assert!(seen[0].contains("rank 0 itself looks stuck"), "{}", seen[0]);
    }

    #[test]
    fn a_rank_waiting_for_chunks_names_the_rank_that_took_them_over() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let w = Watch::new(0);
        w.mark(Phase::LiningUp, 0);
        // Rank 0's chunks are not done: rank 1 took them over and computes them.
        w.saw(Behind::Chunks { rank: 0, holder: Some(1) });
        assert_eq!(w.behind_in(0), Some(1));
        let (_tx, rx) = mpsc::channel();
        w.guard(2, 3, &dog(50, seen.clone()), None, &rx);
        let said = |i: usize| seen.lock().expect("seen")[i].clone();
        assert!(said(0).contains("rank 1 looks stuck: it had taken over chunks of rank 0's"), "{}", said(0));
        // Lining up, stuck in a chunk it took over itself: the rank names itself, whomever it
        // saw behind before.
        let w = Watch::new(0);
        w.mark(Phase::LiningUp, 4);
        w.saw(Behind::Chunks { rank: 0, holder: None });
        w.chunk_started();
        let (_tx, rx) = mpsc::channel();
        w.guard(1, 3, &dog(50, seen.clone()), None, &rx);
        assert!(said(1).contains("rank 1 itself looks stuck"), "{}", said(1));
        // Nobody else holds them: the owner is named.
        let w = Watch::new(0);
        w.mark(Phase::LiningUp, 0);
        w.saw(Behind::Chunks { rank: 0, holder: None });
        assert_eq!(w.behind_in(0), Some(0));
    }

    #[test]
    fn progress_keeps_the_watchdog_quiet_and_the_end_of_the_run_stops_it() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let w = Watch::new(0);
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            let (w, dog) = (&w, dog(1000, seen.clone()));
            s.spawn(move || w.guard(0, 2, &dog, None, &rx));
            for i in 0..60 {
                w.mark(Phase::Computing, i);
                std::thread::sleep(Duration::from_millis(25));
            }
            drop(tx);
        });
        assert!(seen.lock().expect("seen").is_empty());
    }
}
