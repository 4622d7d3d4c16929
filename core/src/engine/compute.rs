//! Compute: the rank's threads over its own chunks and chunks taken over from others, copies of
//! chunks running elsewhere, and the injected delays inside it all.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::run::Run;
use super::slot::{Slot, Spec, StealBuf};
use super::trace::{Args, Event, Span};
use super::TrainError;
use crate::model::{Delta, KeySet, Model, PassRows};
use crate::queue;
use crate::scheme::{endgame, thread_share, OwnChunks, Policy, Share};
use crate::team::Team;
use crate::words;

/// Closes a team's job when dropped: its members return from [`Team::follow`].
struct Closing<'a>(&'a Team);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Chunks taken over: `(victim, victim's iteration, chunks, the share taken)`.
type Taken = (usize, u64, Range<u32>, f64);

/// Chunks as traced: `(kind, owner, owner's iteration, chunks)`.
type ChunkId = (&'static str, usize, u64, Range<u32>);

/// Injected delays sleep in slices of at most this long (see [`Run::injected_sleep`]).
const SLEEP_SLICE: Duration = Duration::from_millis(1);
/// The last part of an injected delay is spun, not slept: a sleep overshoots by the timer slack.
const SPIN_TAIL: Duration = Duration::from_micros(200);
/// How much shorter than what is left a sleep slice is cut, for the timer slack.
const TIMER_SLACK: Duration = Duration::from_micros(150);

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); zero if the clock
/// cannot be read. Injected delays are this time scaled, so a model standing in for compute
/// should spend its time as CPU time too.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant every Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

impl<M: Model> Run<'_, M> {
    /// Whether another rank still has queued chunks of iteration `it`, among the ranks the tree
    /// of drained queues points to (every rank without one), read in one batch.
    pub(super) fn stealable(&self, it: u64) -> Result<bool, TrainError> {
        let (tag, ranks) = (queue::tag(it), self.queues.candidates(it)?);
        let queues = self.queues.peek_in(ranks.clone())?;
        Ok(ranks.zip(queues).any(|(r, q)| r != self.rank && q.tag == tag && q.left() > 0))
    }

    /// Runs the active threads over this rank's queue (if `own`) and then over chunks taken from
    /// others (if taking over is on), until nothing is left to take.
    pub(super) fn compute(
        &self,
        policy: &dyn Policy,
        it: u64,
        replica: &[f32],
        own: bool,
    ) -> Result<(), TrainError> {
        self.on_threads(|slot, failed| self.worker(policy, it, replica, own, slot, failed))
    }

    /// Runs `job` on every active thread with its slot; the first error stops the others (they
    /// see `failed` set) and is returned.
    ///
    /// A team ([`Run::team`]) runs `job` on its leader alone; the other threads compute their
    /// part of every run of rows the leader computes until `job` returns.
    fn on_threads(
        &self,
        job: impl Fn(&mut Slot<M::Work>, &AtomicBool) -> Result<(), TrainError> + Sync,
    ) -> Result<(), TrainError> {
        let failed = AtomicBool::new(false);
        let error = Mutex::new(None);
        // The posts before the job (read before any member follows).
        let team = self.team.as_ref().map(|t| (t, t.posted()));
        self.pool.run(|w| {
            let mut slot = self.slots[w].lock().expect("a compute thread panicked");
            if let Some((team, start)) = team.filter(|_| w > 0) {
                let work = &mut slot.work;
                team.follow(w, start, |epoch, rows, params, part| {
                    self.model.compute_part(epoch, rows, params, work, part);
                });
                return;
            }
            // The members leave once the leader's job ends, however it ends.
            let _closing = self.team.as_ref().map(Closing);
            if let Err(e) = job(&mut slot, &failed) {
                failed.store(true, Ordering::Relaxed);
                error.lock().expect("error slot").get_or_insert(e);
            }
        });
        match error.into_inner().expect("error slot") {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The fraction of a victim's queued chunks one thread takes: the rank's share (configured,
    /// or the policy's) split over its active threads, since each thread computes what it takes
    /// alone (a thread taking a rank's share would end up the new straggler).
    fn share(&self, share: Share) -> f64 {
        thread_share(share, self.cfg.steal_fraction, self.lanes())
    }

    /// The rows a thread probably computes after its own chunks up to global chunk `end` of
    /// iteration `it` (taking `len` at a time, the rank's `part` of the batch): the next ones of
    /// the part, else the first ones of the same part of the next iteration (as a pass and
    /// rows); `None` when the rank's threads take its chunks in turns (the next chunk is
    /// another thread's). A hint for the cache ([`Model::ahead`]): a queue emptied by others,
    /// or a part resized by the scheme, makes it wrong and costs only memory bandwidth.
    fn next_rows(&self, it: u64, part: &Range<usize>, end: usize, len: usize) -> Option<PassRows> {
        if self.lanes() != 1 {
            return None;
        }
        let (it, first) = if end < part.end { (it, end) } else { (it + 1, part.start) };
        let last = (first + len.max(1)).min(part.end).min(self.plan.batch_chunks(it));
        if first >= last {
            return None;
        }
        let rows =
            self.plan.global_chunk_rows(it, first).start..self.plan.global_chunk_rows(it, last - 1).end;
        Some((self.plan.epoch(it), rows))
    }

    /// Rows `rows` of iteration `it` as a hint ([`Model::ahead`]) for a rank whose chunks one
    /// thread computes in order (a team's leader, or one active thread); else `None`.
    fn lane_rows(&self, it: u64, rows: Range<usize>) -> Option<PassRows> {
        (self.lanes() == 1).then(|| (self.plan.epoch(it), rows))
    }

    /// The rank's threads that take chunks: the active ones, or a team's leader alone.
    pub(super) fn lanes(&self) -> usize {
        if self.team.is_some() {
            1
        } else {
            self.pool.active()
        }
    }

    fn worker(
        &self,
        policy: &dyn Policy,
        it: u64,
        replica: &[f32],
        own: bool,
        slot: &mut Slot<M::Work>,
        failed: &AtomicBool,
    ) -> Result<(), TrainError> {
        let tag = queue::tag(it);
        let view = self.view();
        // The end game: a thread leaves its rank's next chunks to free threads elsewhere once at
        // most in an iteration, then takes what they left; the rank, found slower than they are,
        // then takes over no other rank's chunks (computing or lining up).
        let mut may_leave = policy.leaves_chunks();
        while own && !failed.load(Ordering::Relaxed) {
            if may_leave {
                if let Some(until) = self.end_game(it, slot)? {
                    may_leave = false;
                    self.left_chunks.store(true, Ordering::Relaxed);
                    self.wait_for_takers(it, until)?;
                }
            }
            let Some(r) = self.queues.take_own(self.cfg.grain)? else { break };
            let part = self.own.lock().expect("own chunks").clone();
            let start = part.start;
            let rows = |c: u32| self.plan.global_chunk_rows(it, start + c as usize);
            let next = self.next_rows(it, &part, start + r.end as usize, self.cfg.grain as usize);
            match policy.own_chunks(&view)? {
                OwnChunks::Whole => {
                    self.run_chunks(r.clone(), rows, replica, slot, ("own chunk", self.rank, it), next);
                    slot.own += u64::from(r.end - r.start);
                    self.clocks.done(self.rank, r.end - r.start, it)?;
                }
                OwnChunks::ClaimFirst => {
                    for c in r.clone() {
                        // Claimed before computing, so nobody copies it, and its result goes
                        // straight into the thread's buffers (no per-chunk copy to drain).
                        if policy.claim(self.rank, tag, c)? {
                            let ahead =
                                if c + 1 < r.end { self.lane_rows(it, rows(c + 1)) } else { next.clone() };
                            let id = ("own chunk", self.rank, it, c..c + 1);
                            self.run_chunk(rows(c), replica, slot, id, ahead);
                            slot.own += 1;
                            self.clocks.done(self.rank, 1, it)?;
                        }
                    }
                }
                OwnChunks::AsCopies => {
                    for c in r {
                        // One copy of the chunk, which may lose to another.
                        if self.speculate(policy, (self.rank, tag, c), (it, rows(c)), replica, slot)? {
                            slot.own += 1;
                        }
                    }
                }
            }
            let mut takes = std::mem::take(&mut slot.takes);
            takes.clear();
            policy.after_own_chunk(&view, it, &mut takes)?;
            for take in &takes {
                if let Some((g, r)) = self.queues.steal(take.rank, self.share(take.share), u32::MAX)? {
                    let vit = words::untag(g, it);
                    self.took(slot, "rapid reassignment", take.rank, vit, &r, self.share(take.share));
                    self.help(take.rank, vit, r.clone(), replica, slot)?;
                    let n = u64::from(r.end - r.start);
                    slot.taken += n;
                    slot.reassigned += n;
                }
            }
            slot.takes = takes;
        }
        while self.takes_over_now() && !failed.load(Ordering::Relaxed) {
            let Some((victim, vit, r, share)) = self.take_over(policy, it)? else { break };
            self.took(slot, "take over", victim, vit, &r, share);
            self.help(victim, vit, r.clone(), replica, slot)?;
            slot.taken += u64::from(r.end - r.start);
        }
        Ok(())
    }

    /// Whether this rank takes over other ranks' chunks in the current iteration: with taking
    /// over, unless a thread left own chunks to free threads elsewhere (the rank, found slower
    /// than they are, computing or lining up).
    pub(super) fn takes_over_now(&self) -> bool {
        self.steal && !self.left_chunks.load(Ordering::Relaxed)
    }

    /// The end game ([`endgame`]): until when (since the compute began) a thread about to take
    /// one of the rank's own chunks leaves them to the free threads of other ranks, or `None` to
    /// take it now. The other ranks are surveyed once an iteration, after the rank's first chunk.
    fn end_game(&self, it: u64, slot: &mut Slot<M::Work>) -> Result<Option<Duration>, TrainError> {
        let rank = endgame::Rank {
            now: self.iter_start.lock().map(|s| s.elapsed()).unwrap_or_default().as_secs_f64(),
            chunks: self.iter_chunks.load(Ordering::Relaxed),
            busy: self.iter_busy.load(Ordering::Relaxed) as f64 * 1e-9,
            threads: if self.team.is_some() { 1 } else { self.cfg.threads.max(1) },
            others: self.world - 1,
        };
        let until = self.end_game.lock().expect("end game").leave(
            it,
            &rank,
            || self.queues.remaining(self.rank),
            || {
                let part = self.own.lock().expect("own chunks").len() as u32;
                Ok((endgame::survey(&self.view(), it, part)?, part))
            },
        )?;
        let until = until.map(Duration::from_secs_f64);
        if let (Some(until), Some(t)) = (until, &self.trace) {
            let left = self.queues.remaining(self.rank)?;
            let args = Args::default().int("iter", it).int("left", left).num("until_s", until.as_secs_f64());
            t.instant_into(&mut slot.events, slot.tid, ("leave to free threads", "scheme"), args);
        }
        Ok(until)
    }

    /// Waits until the rank's queue is empty (free threads took what was left) or `until` since
    /// the compute began; a queue still holding chunks then pauses the end game
    /// ([`endgame::Backoff`]).
    fn wait_for_takers(&self, it: u64, until: Duration) -> Result<(), TrainError> {
        let start = *self.iter_start.lock().expect("iteration start");
        let mut answered = false;
        crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            let q = self.queues.peek(self.rank)?;
            answered = q.tag != queue::tag(it) || q.left() == 0;
            Ok(answered || start.elapsed() >= until)
        })?;
        let backoff = &mut self.end_game.lock().expect("end game").backoff;
        if answered {
            backoff.answered();
        } else {
            backoff.missed(it);
        }
        Ok(())
    }

    /// Counts chunks `r` taken from `victim` (its iteration `vit`), and traces the decision.
    fn took(
        &self,
        slot: &mut Slot<M::Work>,
        what: &'static str,
        victim: usize,
        vit: u64,
        r: &Range<u32>,
        share: f64,
    ) {
        let n = u64::from(r.end - r.start);
        match slot.taken_from.iter_mut().find(|(v, _)| *v == victim) {
            Some((_, k)) => *k += n,
            None => slot.taken_from.push((victim, n)),
        }
        if let Some(t) = &self.trace {
            let args =
                Args::default().int("victim", victim).int("iter", vit).int("chunks", n).num("share", share);
            t.instant_into(&mut slot.events, slot.tid, (what, "scheme"), args);
        }
    }

    /// Takes over chunks from the victim the policy names, of an iteration not ahead of `it`:
    /// `(victim, victim's iteration, chunks, the share taken)`. If the victim refilled its queue between the look
    /// and the take (SSP only), the chunks are of a newer iteration, computed against older
    /// parameters like any stale worker's.
    fn take_over(&self, policy: &dyn Policy, it: u64) -> Result<Option<Taken>, TrainError> {
        loop {
            let Some(take) = policy.victim(&self.view(), it)? else { return Ok(None) };
            let share = self.share(take.share);
            if let Some((g, r)) = self.queues.steal(take.rank, share, u32::MAX)? {
                return Ok(Some((take.rank, words::untag(g, it), r, share)));
            }
        }
    }

    /// Computes chunks `r` of `victim`'s iteration `vit`, taken over, and counts them done.
    fn help(
        &self,
        victim: usize,
        vit: u64,
        r: Range<u32>,
        replica: &[f32],
        slot: &mut Slot<M::Work>,
    ) -> Result<(), TrainError> {
        let rows = |c: u32| self.plan.chunk_rows(vit, victim, c);
        // Marked held, so that a rank waiting for the victim's chunks knows who computes them.
        self.clocks.taking(victim, r.end - r.start)?;
        self.with_params(r.clone().map(rows), replica, slot, |run, params, slot| {
            run.run_chunks(r.clone(), rows, params, slot, ("taken chunk", victim, vit), None);
            Ok(())
        })?;
        Ok(self.clocks.done_taken(victim, r.end - r.start, vit)?)
    }

    /// Runs `f` with parameters valid at the keys of `rows`: the rank's `replica` for dense
    /// models, sparse ones pulled whole and the weights read in place; else pulled by this
    /// thread now.
    fn with_params<R>(
        &self,
        rows: impl Iterator<Item = Range<usize>>,
        replica: &[f32],
        slot: &mut Slot<M::Work>,
        f: impl FnOnce(&Self, &[f32], &mut Slot<M::Work>) -> Result<R, TrainError>,
    ) -> Result<R, TrainError> {
        if !self.keyed() || self.params.reads_in_place() {
            return f(self, replica, slot);
        }
        let layout = self.model.layout();
        let sb = slot.steal.get_or_insert_with(|| StealBuf {
            params: vec![0.0; layout.params],
            keys: KeySet::new(layout.keys()),
            ranges: Vec::new(),
            buf: Vec::new(),
        });
        sb.keys.clear();
        for rows in rows {
            self.model.keys(rows, &mut sb.keys);
        }
        self.params.pull_keys(layout, &mut sb.keys, &mut sb.ranges, &mut sb.buf, &mut sb.params)?;
        let p = std::mem::take(&mut sb.params);
        let out = f(self, &p, slot);
        if let Some(sb) = slot.steal.as_mut() {
            sb.params = p;
        }
        out
    }

    /// Computes one copy of chunk `(owner, tag, chunk)` (rows `rows`) and applies it only if this
    /// copy claims the chunk first; returns whether it did. A copy whose chunk is settled before
    /// it starts is not run; an injected delay stops when it is settled meanwhile.
    fn speculate(
        &self,
        policy: &dyn Policy,
        (owner, tag, chunk): (usize, u16, u32),
        (it, rows): (u64, Range<usize>),
        params: &[f32],
        slot: &mut Slot<M::Work>,
    ) -> Result<bool, TrainError> {
        if policy.settled(owner, tag, chunk)? {
            return Ok(false);
        }
        let layout = self.model.layout();
        let sp = slot.spec.get_or_insert_with(|| Spec {
            work: super::run::new_work(self.model, self.cfg, &self.params),
            won: Delta::new(layout),
            trash: Delta::new(layout),
        });
        let n = rows.len() as u64;
        let start = Span::now();
        let (loss, computed) =
            self.chunk_into((it, rows), None, 1, params, (&mut sp.work, &mut slot.scratch), &|| {
                policy.settled(owner, tag, chunk).unwrap_or(false)
            });
        let won = policy.claim(owner, tag, chunk)?;
        let kind = if won { "copy applied" } else { "copy dropped" };
        self.trace_chunk((&mut slot.events, slot.tid), (kind, owner, it, chunk..chunk + 1), start, computed);
        if won {
            self.model.drain(&mut sp.work, 1.0, &mut sp.won);
            slot.rows += n;
            slot.loss += loss;
            self.clocks.done(owner, 1, it)?;
            Ok(true)
        } else {
            self.model.drain(&mut sp.work, 0.0, &mut sp.trash);
            sp.trash.clear();
            slot.discarded += 1;
            Ok(false)
        }
    }

    /// This rank's threads compute copies of chunks still running on other ranks in iteration
    /// `it` (each copy by one thread), as long as the policy names one.
    pub(super) fn clone_chunks(
        &self,
        policy: &dyn Policy,
        it: u64,
        replica: &[f32],
    ) -> Result<(), TrainError> {
        let tag = queue::tag(it);
        self.on_threads(|slot, failed| {
            while !failed.load(Ordering::Relaxed) {
                let Some((v, c)) = policy.copy(&self.view(), it)? else { return Ok(()) };
                if policy.settled(v, tag, c)? {
                    // Done meanwhile: not worth pulling its parameters.
                    continue;
                }
                let rows = self.plan.chunk_rows(it, v, c);
                let won =
                    self.with_params(std::iter::once(rows.clone()), replica, slot, |run, p, slot| {
                        run.speculate(policy, (v, tag, c), (it, rows), p, slot)
                    })?;
                if won {
                    slot.cloned += 1;
                }
            }
            Ok(())
        })
    }

    /// Computes chunks `r` of `(kind, owner, owner's iteration)`, chunk `c` being rows `rows(c)`:
    /// for a model that [`joins_chunks`](Model::joins_chunks), each run of chunks whose rows
    /// follow one another in one call; else one call a chunk. `ahead`: the rows the thread
    /// probably computes after `r` ([`Model::ahead`]).
    fn run_chunks(
        &self,
        r: Range<u32>,
        rows: impl Fn(u32) -> Range<usize>,
        params: &[f32],
        slot: &mut Slot<M::Work>,
        (kind, owner, it): (&'static str, usize, u64),
        ahead: Option<PassRows>,
    ) {
        let joins = self.model.joins_chunks();
        let mut c = r.start;
        while c < r.end {
            let (mut end, mut span) = (c + 1, rows(c));
            while end < r.end && joins {
                let next = rows(end);
                if next.start != span.end {
                    break;
                }
                span.end = next.end;
                end += 1;
            }
            let then = if end < r.end { self.lane_rows(it, rows(end)) } else { ahead.clone() };
            self.run_chunk(span, params, slot, (kind, owner, it, c..end), then);
            c = end;
        }
    }

    /// Computes chunks `id` (`(kind, owner, owner's iteration, chunks)`), rows `rows`, in one
    /// call (`ahead`: the rows probably next).
    fn run_chunk(
        &self,
        rows: Range<usize>,
        params: &[f32],
        slot: &mut Slot<M::Work>,
        id: ChunkId,
        ahead: Option<PassRows>,
    ) {
        slot.rows += rows.len() as u64;
        let start = Span::now();
        let chunks = id.3.len() as u32;
        let (loss, computed) = self.chunk_into(
            (id.2, rows),
            ahead,
            chunks,
            params,
            (&mut slot.work, &mut slot.scratch),
            &|| false,
        );
        slot.loss += loss;
        self.trace_chunk((&mut slot.events, slot.tid), id, start, computed);
    }

    /// Traces a chunk computed from `start` (its injected delay, if any, from `computed` on).
    fn trace_chunk(&self, (events, tid): (&mut Vec<Event>, u32), id: ChunkId, start: Span, computed: Span) {
        let Some(t) = &self.trace else { return };
        let (kind, owner, it, chunk) = id;
        let delay = if f64::from_bits(self.delay.load(Ordering::Relaxed)) > 0.0 {
            computed.0.elapsed().as_nanos() as u64
        } else {
            0
        };
        t.chunk(events, tid, kind, (owner, it, chunk), start, delay);
    }

    /// Computes rows `rows` of iteration `it` (`chunks` chunks) into `work`, then sleeps the
    /// injected delay (cut short when `cancel` says so); returns the rows' summed loss and when
    /// the compute (and any delay) began. Publishes this rank's chunk rate when the policy reads
    /// rates. `ahead`, the rows probably computed next, goes to the model (or the team) as a
    /// hint first ([`Model::ahead`]).
    fn chunk_into(
        &self,
        (it, rows): (u64, Range<usize>),
        ahead: Option<PassRows>,
        chunks: u32,
        params: &[f32],
        (work, scratch): (&mut M::Work, &mut Option<M::Work>),
        cancel: &dyn Fn() -> bool,
    ) -> (f64, Span) {
        let started = Instant::now();
        self.watch.chunk_started();
        let delay = f64::from_bits(self.delay.load(Ordering::Relaxed));
        // What the delay is scaled from: the thread's CPU time, or the wall time of a model that
        // sleeps instead of computing.
        let slept = self.model.slept();
        let spent = || if slept { started.elapsed() } else { thread_cpu_time() };
        let cpu0 = (delay > 0.0).then(spent);
        let epoch = self.plan.epoch(it);
        let loss = if self.values.load(Ordering::Relaxed) {
            self.model.compute_values(epoch, rows, params, work)
        } else if let Some(team) = &self.team {
            // The team computes the rows into `work`, the leader's part with its own buffers.
            let own = scratch.get_or_insert_with(|| super::run::new_work(self.model, self.cfg, &self.params));
            let target = self.model.team_target(work);
            team.run((epoch, rows.clone()), ahead, params, target, self.pool.active(), |part| {
                self.model.compute_part(epoch, rows, params, own, part)
            })
        } else {
            if let Some((e, next)) = ahead {
                self.model.ahead(e, next, work);
            }
            self.model.compute_in(epoch, rows, params, work)
        };
        let computed = Span::now();
        if let Some(cpu0) = cpu0 {
            // The chunk's CPU time, not its wall time: a slower core stretches the compute, and
            // the machine's preemptions while computing stay its noise, counted once (multiplied
            // by the factor, they made a delayed rank's iterations several times noisier than
            // the others').
            self.injected_sleep(spent().saturating_sub(cpu0).mul_f64(delay), cancel);
        }
        self.iter_busy.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.watch.chunk_done();
        let n = self.iter_chunks.fetch_add(u64::from(chunks), Ordering::Relaxed) + u64::from(chunks);
        if self.publish_rates {
            // This iteration's completion rate (a failed store just skips one update; the next
            // chunk publishes again).
            let since = self.iter_start.lock().map(|s| s.elapsed()).unwrap_or_default();
            let rate = n as f64 / since.as_secs_f64().max(1e-9);
            let _ = self.rates.swap(self.rank, rate.to_bits());
        }
        (loss, computed)
    }

    /// Waits `d` in slices of at most [`SLEEP_SLICE`], touching this rank's own queue word between
    /// them: MPI does not promise progress on a window's passive-target operations while its
    /// owner stays out of MPI, and an injected delay must not make a rank's chunks harder to take
    /// over than real slow compute would (which calls into MPI after every chunk). Stops early
    /// when `cancel` says so (checked between slices).
    /// The last [`SPIN_TAIL`] is spun, not slept: a sleep overshoots by the timer slack (~50-100 us
    /// here), which would inflate the small delays of short chunks several times over.
    fn injected_sleep(&self, d: Duration, cancel: &dyn Fn() -> bool) {
        let until = Instant::now() + d;
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let left = until - now;
            if left > SPIN_TAIL {
                std::thread::sleep((left - TIMER_SLACK).min(SLEEP_SLICE));
                if cancel() {
                    return;
                }
            }
            // Into MPI between slices, spun ones too (MPICH carries out others' atomics on this
            // rank's window only then: without it, no chunk of a delayed rank was ever taken over
            // under MPICH).
            let _ = self.queues.peek(self.rank);
        }
    }
}
