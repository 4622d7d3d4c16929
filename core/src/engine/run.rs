//! A run on one rank: its windows and buffers ([`Run`]), and the iteration loop ([`Run::train`])
//! with one method per phase.

use std::io::Write;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use peregrine_transport::{ReduceOp, ShardMap, Transport, Window};

use super::evals::Evals;
pub(super) use super::live::Live;
use super::owner::owner_steps_apply;
use super::params::{keyed, NodePull, Params, PullKeys, PushBufs, Windows};
use super::protocol::Protocol;
use super::slot::Slot;
use super::trace::{Args, Span, Tracer};
use super::watch::{Behind, Phase, Watch};
use super::{Config, IterRecord, Progress, RankTotals, Report, TrainError};
use crate::clocks::{Clocks, Reads};
use crate::inject::Disruptor;
use crate::model::{Delta, Model};
use crate::optim::Step;
use crate::plan::Plan;
use crate::pool::RankPool;
use crate::queue::ChunkQueues;
use crate::record::TOTALS;
use crate::scheme::{Policy, Setup, View};
use crate::team::Team;

/// A training run on this rank: the windows, buffers and counters the phases share. Its
/// threads see it by shared reference; the policy is kept beside it, changed between phases.
pub(super) struct Run<'a, M: Model> {
    pub t: &'a Transport,
    pub model: &'a M,
    pub cfg: &'a Config,
    pub plan: Plan,
    pub pool: &'a RankPool,
    pub params: Params,
    pub queues: ChunkQueues,
    pub clocks: Clocks,
    /// On rank 0: `[evaluations requested, ranks finished, publications for checkpoint
    /// requests]`.
    pub control: Window<u64>,
    /// The stop and checkpoint protocol's words and counters ([`Protocol`]).
    pub protocol: Protocol,
    pub slots: Vec<Mutex<Slot<M::Work>>>,
    pub rank: usize,
    pub world: usize,
    /// This iteration's injected delay factor (f64 bits).
    pub delay: AtomicU64,
    /// Whether ranks take over chunks (the policy's answer).
    pub steal: bool,
    /// Every rank's chunk completion rate in its current iteration (chunks per second, f64 bits),
    /// published only when the policy reads them.
    pub rates: Window<u64>,
    pub publish_rates: bool,
    /// Chunks this rank computed in its current iteration.
    pub iter_chunks: AtomicU64,
    /// Nanoseconds this rank's threads spent in chunks (compute and injected delay) in its current
    /// iteration: the policy's speed measure (the iteration's wall time would count dispatch and
    /// other fixed costs, which make a rank with fewer rows look slower).
    pub iter_busy: AtomicU64,
    /// When the current iteration's compute began.
    pub iter_start: Mutex<Instant>,
    /// The end game's survey of other ranks and its pause ([`crate::scheme::endgame`]).
    pub end_game: Mutex<crate::scheme::endgame::State>,
    /// Whether a thread left own chunks to free threads in the current iteration: the rank,
    /// slower than they are, then takes over no other rank's chunks (computing or lining up).
    pub left_chunks: AtomicBool,
    /// Whether iterations whose chunks touch pairwise disjoint keys push their new values as
    /// puts ([`Config::put_disjoint`](super::Config::put_disjoint)): under a synchronous policy
    /// without copies of chunks, for a model whose update is its own (not a gradient an
    /// optimizer steps with) pulled from the shared windows (not replicated).
    pub puts: bool,
    /// Whether the current iteration's chunks compute their keys' new values
    /// ([`Model::compute_values`]), pushed as puts.
    pub values: AtomicBool,
    /// This rank's chunks of the current iteration (global chunk numbers).
    pub own: Mutex<Range<usize>>,
    pub disruptor: Option<Disruptor>,
    /// This rank's progress marks, for the watchdog.
    pub watch: &'a Watch,
    /// This rank's timeline, when traced.
    pub trace: Option<Tracer>,
    /// The split and the active threads last traced (events only when they change).
    pub traced_split: AtomicU64,
    pub traced_threads: AtomicU64,
    /// When the model splits its units over the rank's threads ([`Model::units`]): the team
    /// they compute every chunk as, the leader (worker 0) taking the chunks.
    pub team: Option<Team>,
    /// When this rank last read every rank's word to name whom it waits for.
    pub naming: Naming,
}

/// What the rank's main thread carries from iteration to iteration: buffers and running sums.
pub(super) struct Local {
    delta: Delta,
    push: PushBufs,
    ranges: Vec<Range<usize>>,
    data: Vec<f32>,
    keys: PullKeys,
    /// The rank's copy of the parameters it reads (all of them for dense models).
    replica: Vec<f32>,
    /// The optimizer state read with a model pulled whole.
    state: Vec<f32>,
    /// Owner-side steps: the step of the iteration pushed last, taken once its pushes landed,
    /// and the scale on the ranks' pushed sums (`1 / rows` of its batch).
    step: Option<(Step, f32)>,
    /// Replicated: this rank's replica stepped with its update, then averaged with its
    /// neighbours'.
    mixed: Vec<f32>,
    totals: RankTotals,
    samples: u64,
    pub(super) evals: Evals,
    /// Checkpoints taken, and their time.
    pub(super) checkpoints: u64,
    pub(super) checkpoint_time: Duration,
    /// The last checkpoint's iteration and training time (rank 0).
    pub(super) last_checkpoint: (u64, f64),
    /// Seconds this rank waited for each rank (counted for the rank last waited for).
    waited_for: Vec<f64>,
    /// `(start, rows per second of its threads' time in chunks)` of its iterations with rows, at most
    /// [`MAX_RATE_SAMPLES`] (thinned by half when full).
    rates: Vec<(f32, f32)>,
    /// Every how many iterations a rate is kept.
    rate_stride: u64,
}

/// Iteration rates a rank keeps for its straggler statistics.
const MAX_RATE_SAMPLES: usize = 1 << 16;

/// Lining up, how long a rank waits before it reads who holds the chunks it waits for (chunks
/// taken over), and then how often it reads again.
const HOLDER_AFTER: Duration = Duration::from_millis(10);

/// Every rank's words are read to name whom a rank waits for (the watchdog's suspect, should it
/// fire while the rank is blocked elsewhere, e.g. in an evaluation's collective) at most every
/// `NAME_EVERY`, and within a wait once it has lasted `NAME_AFTER`: a wait polls one word, a read
/// of every rank's is O(ranks) (at 4,096 ranks over InfiniBand ~1 ms every 500 ms, 0.2 %).
const NAME_AFTER: Duration = Duration::from_millis(10);
const NAME_EVERY: Duration = Duration::from_millis(500);

/// When this rank last read every rank's word to name whom it waits for.
#[derive(Default)]
pub(super) struct Naming(Mutex<Option<Instant>>);

impl Naming {
    /// Whether a wait that began at `since` reads every rank's word now: the first wait of the
    /// run, a wait that lasted [`NAME_AFTER`] without a read since it began, or [`NAME_EVERY`]
    /// after the last read.
    fn due(&self, since: Instant) -> bool {
        let mut last = self.0.lock().expect("naming");
        let due = match *last {
            None => true,
            Some(at) => at.elapsed() >= NAME_EVERY || (at < since && since.elapsed() >= NAME_AFTER),
        };
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

impl<'a, M: Model> Run<'a, M> {
    /// Collective: allocates the windows, writes this rank's shard of the initial model and
    /// builds the policy.
    pub(super) fn start(
        t: &'a Transport,
        model: &'a M,
        cfg: &'a Config,
        plan: Plan,
        pool: &'a RankPool,
        watch: &'a Watch,
    ) -> Result<(Self, Box<dyn Policy>), TrainError> {
        pool.set_active(cfg.threads);
        let setup = Setup {
            t,
            steal: cfg.scheme.steal,
            start: cfg.start_iteration(),
            plan: &plan,
            simulated: false,
            params: model.layout().params,
            shared: None,
        };
        let policy = cfg.scheme.scheme.policy(&setup)?;
        // A dense model under a synchronous scheme steps at the parameters' owners.
        let replicated = cfg.scheme.scheme.replicated();
        let keyed = keyed(model, cfg, replicated);
        let owner_steps =
            owner_steps_apply(policy.synchronous(), replicated, keyed, model.lr().is_some(), cfg.optimizer);
        // Each rank writes the initial values of its own shard.
        let windows = if owner_steps {
            Windows::OwnerSteps
        } else if keyed {
            // Reads in place need every chunk of an iteration done before any push lands (the
            // line-up), every push before the next reads (a bound of 0), and no copy of a chunk
            // still running after the line-up (speculation's copies).
            Windows::Keyed { in_place: policy.line_up() && policy.staleness() == Some(0) && !policy.copies() }
        } else {
            Windows::Plain
        };
        let puts = cfg.put_disjoint
            && policy.synchronous()
            && !policy.copies()
            && !replicated
            && !owner_steps
            && model.lr().is_none();
        // Ranks of a node share a copy of a dense model and combine their updates.
        let stepless = !(model.lr().is_some() && cfg.optimizer.slots() > 0);
        let layout = t.node_layout();
        let node_combine = super::node::applies(
            cfg.node_combine == super::NodeCombine::Auto,
            policy.synchronous() && !policy.copies(),
            (replicated, keyed),
            (stepless, owner_steps),
            layout.as_ref(),
        );
        let params = Params::start(t, model, cfg.optimizer, cfg.seed, (replicated, windows, node_combine))?;
        // A node's sum is of changes: its ranks' chunks compute changes, never new values.
        let puts = puts && params.node_combined().is_none();
        let slots = (0..pool.max_threads())
            .map(|w| Mutex::new(Slot::new(new_work(model, cfg, &params), w as u32 + 1)))
            .collect();
        let trace = match &cfg.trace {
            Some(dir) => {
                let path = dir.join(format!("rank-{}.jsonl", t.rank()));
                Some(
                    Tracer::create(&path, t.rank(), pool.max_threads())
                        .map_err(|source| TrainError::Metrics { path: path.display().to_string(), source })?,
                )
            }
            None => None,
        };
        let mut run = Run {
            t,
            model,
            cfg,
            plan,
            pool,
            params,
            queues: ChunkQueues::with_tree(
                t,
                policy.staleness().filter(|_| policy.takes_over()),
                cfg.start_iteration(),
            )?,
            clocks: Clocks::new(
                t,
                Reads {
                    staleness: policy.staleness(),
                    lines_up: policy.line_up(),
                    version: policy.reads_version(),
                },
                cfg.start_iteration(),
            )?,
            control: t.alloc_window(
                "control",
                &ShardMap::from_lens((0..t.world_size()).map(|r| if r == 0 { 3 } else { 0 })),
            )?,
            protocol: Protocol::new(t, cfg.start_iteration())?,
            slots,
            rank: t.rank(),
            world: t.world_size(),
            delay: AtomicU64::new(0),
            steal: policy.takes_over(),
            rates: t.alloc_window("chunk rates", &ShardMap::from_lens(vec![1; t.world_size()]))?,
            publish_rates: policy.reads_rates(),
            iter_chunks: AtomicU64::new(0),
            iter_busy: AtomicU64::new(0),
            iter_start: Mutex::new(Instant::now()),
            end_game: Mutex::new(Default::default()),
            left_chunks: AtomicBool::new(false),
            puts,
            values: AtomicBool::new(false),
            own: Mutex::new(0..0),
            disruptor: cfg.inject.disruptor(t.rank(), &pool.placement().cpus, pool.max_threads()),
            watch,
            trace,
            traced_split: AtomicU64::new(u64::MAX),
            traced_threads: AtomicU64::new(u64::MAX),
            team: model.units(0, 1).map(|_| Team::new(pool.max_threads())),
            naming: Naming::default(),
        };
        let mut policy = policy;
        if let Some(s) = &cfg.resume {
            run.params.restore(t, &s.params, &s.state)?;
            run.clocks.resume(s.iteration)?;
            if let Some(state) = s.scheme_state(run.rank, run.world) {
                policy.restore(run.rank, state)?;
            }
        }
        t.barrier()?;
        if let Some(tr) = run.trace.as_mut() {
            // Every rank's origin: its exit from the barrier just passed. The spread of the
            // exits from a second barrier bounds how well the tracks line up.
            let origin = Instant::now();
            tr.align(origin);
            t.barrier()?;
            let exit = origin.elapsed().as_secs_f64() * 1e6;
            let mut spread = [exit, -exit];
            t.allreduce(&mut spread, ReduceOp::Max)?;
            tr.write_alignment(spread[0] + spread[1])
                .map_err(|source| TrainError::Metrics { path: tr.path().to_owned(), source })?;
        }
        Ok((run, policy))
    }

    /// A span of the loop's from `start` to now, when traced.
    pub(super) fn traced(&self, name: &'static str, cat: &'static str, start: Span, args: Args) {
        if let Some(t) = &self.trace {
            t.end(name, cat, start, args);
        }
    }

    /// A wait's arguments: the iteration, what was waited for and for whom.
    fn waited(&self, it: u64, who: Option<usize>, what: &'static str) -> Args {
        let args = Args::default().int("iter", it).str("for", what);
        match who {
            Some(r) => args.int("rank", r),
            None => args,
        }
    }

    /// The world as the policy sees it.
    pub(super) fn view(&self) -> Live<'_> {
        Live {
            queues: &self.queues,
            clocks: &self.clocks,
            rates: &self.rates,
            watch: self.watch,
            rank: self.rank,
            world: self.world,
        }
    }

    /// The iterations of this rank, then the final evaluation and the report (collective).
    pub(super) fn train(
        &self,
        policy: &mut dyn Policy,
        mut metrics: Option<(&mut dyn Write, &str)>,
        progress: &mut dyn FnMut(&Progress),
        checkpoint: &mut dyn FnMut(&super::Snapshot) -> Result<(), String>,
    ) -> Result<Report, TrainError> {
        let mut local = Local::new(self);
        let every = self.cfg.checkpoint_every;
        let mut next = self.cfg.start_iteration();
        if let Some(s) = &self.cfg.resume {
            local.evals.resume(s, self.cfg.keep_best && self.rank == 0, self.cfg.early_stop);
        }
        let mut due = next.checked_div(every).map_or(u64::MAX, |k| (k + 1) * every);
        // The iteration of the open checkpoint request, once every rank published for it.
        let mut asked_at = None;
        while next < self.cfg.iterations {
            self.protocol.current.store(next, Ordering::Relaxed);
            self.watch.mark(Phase::Waiting, next);
            if asked_at.is_none() {
                if self.rank == 0 {
                    if let Some(s) = self.cfg.checkpoint_seconds {
                        if local.evals.train_time() - local.last_checkpoint.1 >= s {
                            self.protocol.timed.store(true, Ordering::Relaxed);
                        }
                    }
                }
                // This rank's own request (another rank's is seen by the evaluation check that
                // closed the previous iteration, or by any wait).
                self.publish_stop(0)?;
                if self.request_open() {
                    let Some(d) = self.stop_iteration(&mut local)? else { break };
                    asked_at = Some(d);
                    due = due.min(d);
                }
            }
            let it = policy.begin(&self.view(), next)?;
            if it >= self.cfg.iterations {
                break;
            }
            if it >= due {
                // Before this rank's first iteration at or after the checkpoint's.
                let at = due;
                // Its metrics of the iterations before are on file (a resumed run keeps those).
                if let Some((w, path)) = metrics.as_mut() {
                    w.flush().map_err(|source| TrainError::Metrics { path: path.to_string(), source })?;
                }
                let Some((interval, stop)) = self.checkpoint(&mut local, &*policy, at, checkpoint)? else {
                    break;
                };
                if stop {
                    return Err(TrainError::Stopped(at));
                }
                if asked_at == Some(at) {
                    asked_at = None;
                    self.protocol.settled.fetch_add(1, Ordering::Relaxed);
                    self.protocol.timed.store(false, Ordering::Relaxed);
                }
                if asked_at.is_none() && self.request_open() {
                    // A request published during the checkpoint's wait.
                    let Some(d) = self.stop_iteration(&mut local)? else { break };
                    asked_at = Some(d);
                }
                let every = if every > 0 { interval } else { u64::MAX };
                due = asked_at
                    .unwrap_or(u64::MAX)
                    .min(it.checked_div(every).map_or(u64::MAX, |k| (k + 1) * every));
            }
            next = it + 1;
            let whole = Span::now();
            let mut rec = self.open(policy, &local, it)?;
            // Where the node combines, its copy, pulled by the node's ranks together.
            let pulling = Span::now();
            // SAFETY: `in_place` lives through this iteration's compute only, which ends before
            // this rank pushes (the node's next pull into the copy waits for this push).
            let (mut in_place, stopped) =
                match unsafe { self.params.pull_node(&mut self.node_wait(&mut local.evals)) }? {
                    NodePull::Copy(w) => {
                        rec.comm += pulling.0.elapsed().as_secs_f64();
                        self.traced("pull", "comm", pulling, Args::default().int("iter", it));
                        (Some(w), false)
                    }
                    // The run stops: this iteration computes on the rank's own buffer as it is and
                    // pushes nothing.
                    NodePull::Stopped => (None, true),
                    // SAFETY: `in_place` lives through this iteration's compute only, which ends
                    // before this rank pushes (the owners step once every rank pushed), and the ranks
                    // lined up after the previous iteration's steps (or the windows' start) before
                    // this read.
                    NodePull::Alone => (unsafe { self.params.weights_in_place() }?, false),
                };
            if let Some(w) =
                in_place.filter(|_| self.params.reads_in_place() && self.copy_whole(it, &mut local.keys))
            {
                // A copy as the chunks would read them in place (nothing writes them before this
                // iteration's line-up): a streaming copy, not a load per element.
                let (started, pulling) = (Instant::now(), Span::now());
                local.replica.copy_from_slice(w);
                in_place = None;
                rec.comm += started.elapsed().as_secs_f64();
                self.traced("pull", "comm", pulling, Args::default().int("iter", it));
            } else if in_place.is_none() && !stopped {
                let Local { keys, ranges, data, replica, state, .. } = &mut local;
                let pulling = Span::now();
                self.pull_into(it, keys, ranges, data, (replica, state), &mut rec)?;
                self.traced("pull", "comm", pulling, Args::default().int("iter", it));
            }
            let weights = in_place.unwrap_or(&local.replica);
            let computing = self.compute_phase(policy, &mut local.evals, weights, it, &mut rec)?;
            self.push(policy, &mut local, it, computing, &mut rec)?;
            if !policy.ready(&self.view(), it)? {
                self.watch.mark(Phase::Waiting, it);
                let waiting = Span::now();
                rec.wait += self
                    .wait_serving(&mut local.evals, || {
                        let view = self.view();
                        if self.naming.due(waiting.0) {
                            // Who is behind, for the watchdog: every clock, once the wait is long.
                            view.clocks()?;
                        }
                        Ok(policy.ready(&view, it)?)
                    })?
                    .as_secs_f64();
                // Whom it waited for: the rank whose tick let it go on, named by the clock tree.
                let last = match policy.staleness().and_then(|s| (it + 1).checked_sub(s)) {
                    Some(clock) => self.clocks.last_to_reach(clock)?,
                    None => None,
                };
                rec.waited_for = last.or(self.watch.behind_in(it)).or(rec.waited_for);
                self.traced("wait", "wait", waiting, self.waited(it, rec.waited_for, "clocks"));
            }
            // Once an evaluation says stop, every rank leaves after this iteration without
            // stepping it (some ranks leave before pushing it).
            if self.params.owner_steps() && !local.evals.stopping() {
                let stepping = Instant::now();
                self.watch.mark(Phase::Pushing, it);
                if let Some((step, scale)) = local.step.take() {
                    let pushed = (!local.delta.is_empty()).then_some(&local.delta);
                    let units = |i: usize, of: usize| self.model.units(i, of).unwrap_or_default();
                    let split = self.team.as_ref().map(|_| (self.pool, &units as &super::owner::Units<'_>));
                    self.params.step_owned(step, scale, pushed, split)?;
                }
                // Nobody reads the weights of the next iteration before every owner stepped.
                self.t.barrier()?;
                rec.comm += stepping.elapsed().as_secs_f64();
                self.traced("owner step", "comm", Span(stepping), Args::default().int("iter", it));
            }
            if self.params.replicated() && !local.evals.stopping() {
                let mixing = Instant::now();
                policy.mix(&self.view(), it, &mut local.mixed, &mut rec)?;
                self.params.set_own(self.t, &local.mixed)?;
                rec.comm += mixing.elapsed().as_secs_f64();
                self.traced("mix", "comm", Span(mixing), Args::default().int("iter", it));
            }
            self.close(policy, &mut local, rec, &mut metrics, progress)?;
            self.traced("iteration", "iteration", whole, Args::default().int("iter", it));
            if local.evals.stopping() {
                break;
            }
        }
        self.finish(policy, local)
    }

    /// Opens iteration `it`: active threads, the injected delay, this rank's chunks, announced and
    /// queued. Returns the iteration's record.
    fn open(&self, policy: &mut dyn Policy, local: &Local, it: u64) -> Result<IterRecord, TrainError> {
        // Any wait from here on is inside `it`: the next iteration this rank would begin is the
        // one after.
        self.protocol.current.store(it + 1, Ordering::Relaxed);
        self.watch.mark(Phase::Pulling, it);
        let cfg = self.cfg;
        let planned = cfg.elastic.threads(self.rank, it, cfg.inject.threads(self.rank, cfg.threads));
        self.pool.set_active(policy.threads(planned));
        let delay = cfg.inject.delay(self.rank, it);
        self.delay.store(delay.to_bits(), Ordering::Relaxed);
        let mut rec = IterRecord {
            rank: self.rank,
            iter: it,
            start: local.evals.train_time(),
            threads: self.pool.active(),
            delay,
            ..Default::default()
        };
        let view = self.view();
        let part = policy.chunks(&view, it, &self.plan)?;
        let n_chunks = part.len() as u32;
        rec.chunks = u64::from(n_chunks);
        if let Some(t) = &self.trace {
            // The split (LB-BSP sizes it) and the active threads when they change, the delay.
            let (split, threads) = (u64::from(n_chunks), self.pool.active() as u64);
            if self.traced_split.swap(split, Ordering::Relaxed) != split {
                let args = Args::default().int("iter", it).int("chunks", n_chunks).int("first", part.start);
                t.instant("chunks", "scheme", args);
            }
            if self.traced_threads.swap(threads, Ordering::Relaxed) != threads {
                t.counter("threads", Args::default().int("active", threads));
            }
            if delay > 0.0 {
                t.instant("delayed", "straggler", Args::default().num("factor", delay));
            }
        }
        *self.own.lock().expect("own chunks") = part;
        let values = self.puts
            && self.update_scale(it) == 1.0
            && self.model.disjoint(self.plan.batch_rows(it), self.plan.chunk());
        self.values.store(values, Ordering::Relaxed);
        policy.open(&view, it)?;
        self.clocks.start(it, n_chunks)?;
        self.queues.fill(it, n_chunks)?;
        Ok(rec)
    }

    /// Computes iteration `it`: own chunks, chunks taken over, and lining up if the policy says
    /// so. Returns when the compute began.
    fn compute_phase(
        &self,
        policy: &dyn Policy,
        evals: &mut Evals,
        replica: &[f32],
        it: u64,
        rec: &mut IterRecord,
    ) -> Result<Instant, TrainError> {
        let compute_start = Instant::now();
        self.watch.mark(Phase::Computing, it);
        self.iter_chunks.store(0, Ordering::Relaxed);
        self.iter_busy.store(0, Ordering::Relaxed);
        self.left_chunks.store(false, Ordering::Relaxed);
        *self.iter_start.lock().expect("iteration start") = compute_start;
        self.compute(policy, it, replica, true)?;
        self.traced("compute", "compute", Span(compute_start), Args::default().int("iter", it));
        // How long one chunk takes a thread of this rank (a copy of a late rank's chunk is made
        // only after waiting that long for it).
        let own_done = compute_start.elapsed();
        let per_chunk =
            own_done.mul_f64(self.lanes() as f64) / self.iter_chunks.load(Ordering::Relaxed).max(1) as u32;
        let (mut helped, mut paused) = (Duration::ZERO, Duration::ZERO);
        // Without taking over or copies, nobody reads parameters after its pull: no need to line up.
        if policy.line_up() {
            self.watch.mark(Phase::LiningUp, it);
            let lining = Span::now();
            let mut held = None;
            let w = crate::clocks::wait_until(|| -> Result<bool, TrainError> {
                paused += self.serve_evals(evals)?;
                // Once an evaluation says stop, nobody waits for anyone any more.
                if evals.stopping() || self.clocks.all_done(it)? {
                    return Ok(true);
                }
                // Who is behind, for the watchdog: every progress word, once the wait is long.
                if self.naming.due(lining.0) {
                    if let Some(rank) = self.clocks.first_not_done(it)? {
                        let holder = self.holder(rank, lining.0, &mut held)?;
                        self.watch.saw(Behind::Chunks { rank, holder });
                    }
                }
                let h = Instant::now();
                if self.takes_over_now() && self.stealable(it)? {
                    self.compute(policy, it, replica, false)?;
                } else if policy.copy_due(
                    &self.view(),
                    it,
                    compute_start.elapsed() >= own_done + helped + paused + per_chunk,
                )? {
                    self.clone_chunks(policy, it, replica)?;
                } else {
                    return Ok(false);
                }
                helped += h.elapsed();
                Ok(false)
            })?;
            rec.wait += w.saturating_sub(helped + paused).as_secs_f64();
            rec.waited_for = self.clocks.last_done(it)?.or(self.watch.behind_in(it));
            self.traced("line up", "wait", lining, self.waited(it, rec.waited_for, "chunks"));
        }
        rec.compute += (compute_start.elapsed().saturating_sub(paused).as_secs_f64() - rec.wait).max(0.0);
        Ok(compute_start)
    }

    /// While lining up since `since` for `owner`'s chunks: the rank computing some of them,
    /// taken over, if any (never this rank: it asks between its own take-overs, holding none).
    /// Read only once the wait passed [`HOLDER_AFTER`] (a short wait is not worth a round trip)
    /// and then at most every [`HOLDER_AFTER`] (`read`: the last read).
    fn holder(
        &self,
        owner: usize,
        since: Instant,
        read: &mut Option<(usize, Option<usize>, Instant)>,
    ) -> Result<Option<usize>, TrainError> {
        match *read {
            Some((o, h, at)) if o == owner && at.elapsed() < HOLDER_AFTER => Ok(h),
            _ if since.elapsed() < HOLDER_AFTER => Ok(None),
            _ => {
                let h = self.clocks.holder(owner)?;
                *read = Some((owner, h, Instant::now()));
                Ok(h)
            }
        }
    }

    /// Pushes this rank's update of `it` as the policy admits it, and ticks the clock.
    fn push(
        &self,
        policy: &mut dyn Policy,
        local: &mut Local,
        it: u64,
        computing: Instant,
        rec: &mut IterRecord,
    ) -> Result<(), TrainError> {
        let push_start = Instant::now();
        self.watch.mark(Phase::Pushing, it);
        let pushing = Span(push_start);
        let view = self.view();
        let admit = policy.admit(&view, it, computing.elapsed(), rec)?;
        let batch_rows = self.plan.batch_rows(it).len();
        let cfg = self.cfg;
        let per_row = admit.scale / batch_rows.max(1) as f32;
        let step = match self.model.lr() {
            // The rank's contribution to the iteration's mean gradient, and its share.
            Some(lr) if cfg.optimizer.slots() > 0 => {
                // Stepped at the owners: the ranks push their sums over rows (a synchronous
                // policy admits every update whole, so all scale alike), scaled there as they
                // are summed, without a pass over the vector here.
                let owners = self.params.owner_steps();
                self.drain(if owners { 1.0 } else { per_row }, &mut local.delta, rec);
                let share = per_row * rec.rows as f32;
                Some(Step { lr: lr * self.schedule(it), share, t: it + 1 })
            }
            _ => {
                self.drain(self.update_scale(it) * admit.scale, &mut local.delta, rec);
                None
            }
        };
        // New values (a synchronous scheme admits every update whole: `Policy::synchronous`).
        let values = self.values.load(Ordering::Relaxed);
        debug_assert!(!values || admit.scale == 1.0, "new values scaled by {}", admit.scale);
        if self.params.replicated() {
            // This rank's replica steps by itself and is published for its neighbours.
            self.params.step_own(
                admit.apply.then_some(&local.delta),
                step,
                &mut local.mixed,
                &mut local.push,
            )?;
            policy.publish(&view, it, &local.mixed)?;
        } else if self.params.node_combined().is_some() {
            // Every rank of the node adds to the node's update, zeros when it has none.
            if !admit.apply {
                local.delta.clear();
            }
            let update = (!local.delta.is_empty()).then(|| local.delta.values());
            self.params.push_node(update, &mut self.node_wait(&mut local.evals))?;
            local.step = step.map(|s| (s, per_row));
        } else if self.params.owner_steps() {
            if !admit.apply {
                // Nothing of it joins the step either.
                local.delta.clear();
            }
            // Zeros when there is nothing to add: the slots hold what was put last.
            self.params.push_gradient(&local.delta)?;
            local.step = step.map(|s| (s, per_row));
        } else if self.params.reads_in_place() && local.evals.stopping() {
            // Left the line-up early (an evaluation said stop): others may still read the
            // weights in place, and the run ends after this iteration unstepped anyway.
            local.delta.clear();
        } else if values && admit.apply {
            self.params.put_values(&mut local.delta, &mut local.push)?;
        } else if admit.apply && !local.delta.is_empty() && step.is_none_or(|s| s.share > 0.0) {
            // A model pulled whole stepped with the state read with it.
            let pulled =
                (!self.keyed() && self.params.stateful()).then_some((&local.replica[..], &local.state[..]));
            self.params.push(&mut local.delta, step, pulled, &mut local.push)?;
        }
        self.params.flush_all()?;
        let busy = Duration::from_nanos(self.iter_busy.load(Ordering::Relaxed));
        // Thread time in chunks, per active thread: the rank's compute time as a speed measure
        // (without dispatch, lining up or waiting).
        rec.busy = busy.as_secs_f64() / self.lanes().max(1) as f64;
        policy.before_tick(&view, it, busy, rec)?;
        self.clocks.tick()?;
        policy.after_tick(it, admit.apply)?;
        rec.comm += push_start.elapsed().as_secs_f64();
        local.samples += batch_rows as u64;
        if let Some(t) = &self.trace {
            let mut args = Args::default().int("iter", it).num("scale", f64::from(admit.scale));
            if values {
                args = args.int("values", 1);
            }
            t.end(
                "push",
                "comm",
                pushing,
                match rec.scheme.count("staleness") {
                    0 => args,
                    s => args.int("staleness", s),
                },
            );
            if !admit.apply {
                t.instant("update dropped", "scheme", Args::default().int("iter", it));
            }
        }
        Ok(())
    }

    /// The factor on iteration `it`'s update of a model that steps by itself: the model's scale
    /// for the batch and the learning-rate schedule's (before the policy's own).
    fn update_scale(&self, it: u64) -> f32 {
        self.model.scale(self.plan.batch_rows(it).len()) * self.schedule(it)
    }

    /// The learning-rate schedule's factor at iteration `it`.
    fn schedule(&self, it: u64) -> f32 {
        let cfg = self.cfg;
        cfg.schedule.factor(it, self.plan.iters_per_epoch(), cfg.iterations) as f32
    }

    /// Closes the iteration: its record to the policy, the totals and the metrics; then the
    /// evaluations rank 0 asks for, and rank 0's progress display.
    fn close(
        &self,
        policy: &mut dyn Policy,
        local: &mut Local,
        mut rec: IterRecord,
        metrics: &mut Option<(&mut dyn Write, &str)>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), TrainError> {
        local.evals.train_loss += rec.loss;
        local.evals.train_rows += rec.rows as f64;
        rec.loss /= rec.rows.max(1) as f64;
        rec.disrupted = self.disruptor.as_ref().is_some_and(Disruptor::active);
        policy.end(&rec);
        rec.add_to(&mut local.totals);
        if let Some(r) = rec.waited_for.filter(|&r| r != self.rank) {
            local.waited_for[r] += rec.wait;
        }
        if rec.rows > 0 && rec.busy > 0.0 && rec.iter.is_multiple_of(local.rate_stride) {
            if local.rates.len() == MAX_RATE_SAMPLES {
                // Keep every other one, and from now on every other iteration's.
                let kept: Vec<_> = local.rates.iter().step_by(2).copied().collect();
                (local.rates, local.rate_stride) = (kept, local.rate_stride * 2);
            }
            local.rates.push((rec.start as f32, (rec.rows as f64 / rec.busy) as f32));
        }
        if rec.disrupted {
            if let Some(t) = &self.trace {
                t.instant("disrupted", "straggler", Args::default().int("iter", rec.iter));
            }
        }
        if let Some((w, path)) = metrics.as_mut() {
            rec.write(*w, path)?;
        }
        let done = rec.iter + 1;
        let before = std::mem::replace(&mut local.evals.iters, done);
        // Evaluate when rank 0 asks (the last evaluation comes after the loop, once every push has
        // landed): at the first of its iterations at or past each multiple of `eval_every`. A rank
        // that skips ahead (the slow rank under backup workers and dynamic DBW) asks once for the
        // multiples it skipped, rather than never for them.
        let cfg = self.cfg;
        let crossed = cfg.eval_every > 0 && done / cfg.eval_every > before / cfg.eval_every;
        if self.rank == 0 && crossed && done < cfg.iterations {
            self.control.fetch_add(0, 1)?;
        }
        self.serve_evals(&mut local.evals)?;
        self.write_trace()?;
        if self.rank == 0 {
            progress(&Progress {
                iter: done,
                iterations: cfg.iterations,
                samples: local.samples,
                seconds: local.evals.train_time(),
                batch_loss: rec.loss,
                eval: local.evals.points.last().copied(),
            });
        }
        Ok(())
    }

    /// Writes the iteration's trace events: the loop's and every compute thread's.
    fn write_trace(&self) -> Result<(), TrainError> {
        let Some(t) = &self.trace else { return Ok(()) };
        let io = |source| TrainError::Metrics { path: t.path().to_owned(), source };
        for s in &self.slots {
            let mut s = s.lock().expect("a compute thread panicked");
            t.write(&mut [&mut s.events]).map_err(io)?;
        }
        t.write(&mut []).map_err(io)
    }

    /// Done: keeps joining the evaluations rank 0 asks for until every rank is done (rank 0 asks
    /// for none after it is; a stop asked now names an iteration past the last), then evaluates the final model once every push has landed (each
    /// rank flushed before the barrier), and reports.
    fn finish(&self, policy: &dyn Policy, mut local: Local) -> Result<Report, TrainError> {
        self.protocol.current.store(self.cfg.iterations, Ordering::Relaxed);
        self.watch.mark(Phase::Finishing, local.evals.iters);
        self.control.fetch_add(1, 1)?;
        let since = Instant::now();
        crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            self.serve_evals(&mut local.evals)?;
            let done = self.control.load(1)?;
            if done < self.world as u64 && self.naming.due(since) {
                // Who is behind (a run ends at different clocks under SSP/ASP, or on a target).
                self.view().clocks()?;
            }
            Ok(done == self.world as u64)
        })?;
        self.serve_evals(&mut local.evals)?;
        self.t.barrier()?;
        let evaluating = Span::now();
        self.evaluate(&mut local.evals)?;
        self.traced("evaluate", "evaluate", evaluating, Args::default().int("iter", local.evals.iters));
        // The slowest rank's times; the most iterations any rank ran (ranks differ under SSP/ASP
        // and when a target stops them).
        let evals = local.evals;
        let best = self.cfg.keep_best.then(|| super::evals::best_point(&evals.points)).flatten();
        let (checkpoints, checkpoint_seconds) = (local.checkpoints, local.checkpoint_time.as_secs_f64());
        let stats = crate::straggler::rate_stats(&local.rates);
        (local.totals.best_rate, local.totals.median_rate, local.totals.slow_share) =
            (stats.best, stats.median, stats.slow_share);
        (local.totals.episodes, local.totals.periodic) = (stats.episodes, stats.periodic);
        let mut waited_for = std::mem::take(&mut local.waited_for);
        self.t.allreduce(&mut waited_for, ReduceOp::Sum)?;
        let mut most = [evals.train_time(), evals.time.as_secs_f64(), evals.iters as f64];
        self.t.allreduce(&mut most, ReduceOp::Max)?;
        policy.totals(&mut local.totals);
        let mut all = vec![0.0f64; self.world * TOTALS];
        all[self.rank * TOTALS..(self.rank + 1) * TOTALS].copy_from_slice(&local.totals.to_array());
        self.t.allreduce(&mut all, ReduceOp::Sum)?;
        let mut per_rank: Vec<RankTotals> = all.chunks(TOTALS).map(RankTotals::from_array).collect();
        for (r, w) in per_rank.iter_mut().zip(waited_for) {
            r.waited_for_me = w;
        }
        if let Some(t) = &self.trace {
            t.finish().map_err(|source| TrainError::Metrics { path: t.path().to_owned(), source })?;
        }
        Ok(Report {
            model: self.model.name().into(),
            scheme: self.cfg.scheme.scheme.to_string(),
            ranks: self.world,
            iterations: most[2] as u64,
            samples: per_rank.iter().map(|r| r.rows).sum(),
            train_seconds: most[0],
            eval_seconds: most[1],
            evals: evals.points,
            metric: self.model.metric().name().into(),
            target_loss: self.cfg.target_loss,
            time_to_target: evals.to_target,
            early_stop: self.cfg.early_stop,
            stopped_early: evals.stopped_early,
            best,
            best_params: (!evals.best.is_empty()).then_some(evals.best),
            stragglers: crate::straggler::report(&per_rank),
            node_combined: self
                .params
                .node_combined()
                .map(|l| (0..l.nodes()).map(|n| l.ranks(n).len()).collect()),
            per_rank,
            warnings: evals.health.warnings,
            params: self.cfg.keep_params.then_some(evals.params),
            checkpoints,
            checkpoint_seconds,
        })
    }

    /// Collective: frees every window, the policy's too.
    pub(super) fn free(self, policy: Box<dyn Policy>) -> Result<(), TrainError> {
        self.t.barrier()?;
        self.params.free()?;
        self.queues.free()?;
        self.clocks.free()?;
        self.control.free()?;
        self.protocol.free()?;
        self.rates.free()?;
        policy.free()?;
        Ok(())
    }
}

impl Local {
    fn new<M: Model>(run: &Run<'_, M>) -> Self {
        let layout = run.model.layout();
        let mut replica = vec![0.0f32; layout.params];
        run.pool.bind_memory(&mut replica);
        Self {
            delta: Delta::new(layout),
            push: PushBufs::default(),
            ranges: Vec::new(),
            data: Vec::new(),
            keys: PullKeys::new(layout.keys()),
            replica,
            state: Vec::new(),
            step: None,
            mixed: Vec::new(),
            totals: RankTotals::default(),
            samples: 0,
            evals: Evals::new(layout.params, run.model.baseline(), run.model.metric()),
            checkpoints: 0,
            checkpoint_time: Duration::ZERO,
            last_checkpoint: (
                run.cfg.start_iteration(),
                run.cfg.resume.as_ref().map_or(0.0, |s| s.train_seconds),
            ),
            waited_for: vec![0.0; run.world],
            rates: Vec::new(),
            rate_stride: 1,
        }
    }
}

/// A thread's work for `model`'s chunks: without the model's L2 penalty where the owners'
/// step applies it ([`Params::owners_decay`]).
pub(super) fn new_work<M: Model>(model: &M, cfg: &Config, params: &Params) -> M::Work {
    let mut work = model.work(cfg.chunk);
    if params.owners_decay() {
        model.without_decay(&mut work);
    }
    work
}
