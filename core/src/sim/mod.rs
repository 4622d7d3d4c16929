//! A discrete-event simulator of training runs at any scale, driving **the same policies** the
//! engine runs ([`crate::scheme`]): which scheme to pick for a cluster of 8 to 4,096 ranks,
//! before booking it.
//!
//! One process plays every rank in virtual time (integer nanoseconds). Each rank has its own
//! [`Policy`](crate::scheme) built exactly as in a run (collectively, on a *serial* world of the
//! local transport: its windows are real windows, all driven by this thread), and the simulator
//! asks it at the same hooks as the engine, in the same order; the mechanism around them (chunk
//! queues, progress words, clocks, threads taking chunks, taking over, lining up, copies, pushes,
//! waits) is mirrored phase by phase from `crate::engine` (see `world.rs` and `world/`).
//!
//! ## What is modelled
//! - **Compute**: a thread computes a chunk in a time from a [`ComputeModel`] (constant, drawn
//!   from measured times by the chunk's identity, or replayed per rank and iteration from a real
//!   run), times the injected straggler pattern applied as the engine applies it: the delay factor
//!   of `(seed, rank, iteration)` after each chunk ([`crate::inject::Injection::delay`]), thread
//!   counts ([`crate::inject::Injection::threads`]) and a disruptor's share of the cores
//!   ([`crate::inject::Injection::slowdown`]). A rank's threads run in parallel without
//!   interfering (no memory-bandwidth contention).
//! - **Communication**, alpha-beta per operation ([`Network`]): a dense pull or push of the model
//!   is one latency plus each link's bytes over its bandwidth; each atomic (taking chunks,
//!   counting them done, the clock tick) one round trip of its link; every word a policy reads
//!   on its own through its view or its windows one atomic at the mean link cost, and a word of
//!   every rank read in one batch (clocks, queues, rates, progress: `Window::load_batch`) one
//!   atomic plus a gap ([`cost::Link::gap`]) per further word, charged to the thread or phase
//!   that read it. The engine's combining trees (`crate::clocks`, `crate::tree`) where the
//!   policy bounds staleness: a tick is visible once its atomics have landed (the clock word, then
//!   one per tree node it adds to, each on the rank holding that node, and the mark cleared); the
//!   add that counts a rank's last chunk of an iteration done climbs the done tree the same way;
//!   "every clock at least `c`" and "every chunk done" are one read of the root (without a bound,
//!   every clock in one batch). A rank waiting for `ready` resumes one poll (its reads) after the
//!   condition became true; a rank lining up pushes one read of the done tree's root after the
//!   last arrival there landed, and a look for chunks to take over reads every queue in one
//!   batch.
//! - **Node-combined communication** ([`NodeCombine`], on by default where it applies: a synchronous
//!   scheme, more than one node, some of several ranks): the ranks of a node share one copy of the parameters.
//!   A rank pulls its stripe (the shards of its local index on every other node) and copies its
//!   own shard into the node's copy; no rank of the node computes before all have (a node
//!   barrier). It pushes by copying its update into its slot of a node buffer; once every rank
//!   of the node has (a second barrier: the node's slowest compute), it sums its stripe over the
//!   slots and writes the sums to the other nodes. Between nodes, `nodes - 1` operations each
//!   way instead of one per rank ([`Network::combine`]). Replayed costs keep their measured
//!   communication, split the same way around the barriers.
//! - **Fixed costs** per rank and iteration outside compute, communication and waits (opening,
//!   closing, metrics): a constant, or replayed.
//!
//! ## What is not
//! - Convergence: the simulator computes no model. Time to target is the time at which rank 0
//!   completes the number of iterations a real run needed ([`SimConfig::target_iterations`]), so
//!   it is as good as that number is for the scheme and its staleness; a scheme that needs more
//!   iterations to converge must be given its own count.
//!   Operations on the policies' own windows (backup counters, LB-BSP's predictions,
//!   speculation's claims) are counted by the serial world and charged the same way, to the
//!   rank's next step.
//! - Evaluations (a real run pauses for them and excludes them from training time), network
//!   contention in switches, polling costs beyond one poll per wake, the
//!   node's load as LB-BSP's ARX reads it (zero here), and sparse models' per-chunk pulls.

pub mod cost;
mod events;
mod world;

use std::time::Instant;

use peregrine_transport::Transport;
use serde::Serialize;

pub use crate::engine::NodeCombine;
pub use cost::{CombineCosts, ComputeModel, Link, Measured, Network, Preset, Replay};
pub use events::{EventQueue, Grouped, Nanos};

use crate::engine::{Config, IterRecord, RankTotals, TrainError};
use crate::plan::Plan;
use crate::scheme::{Policy, Setup};

/// A simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The run's configuration, as `peregrine train` would use it (scheme, batch, chunk, grain,
    /// iterations, threads, straggler pattern, seeds). Its `threads` is every rank's pool size.
    pub cfg: Config,
    /// Ranks.
    pub ranks: usize,
    /// Training rows (the batch plan's epoch).
    pub rows: usize,
    /// Model parameters (f32) pulled and pushed whole by every rank every iteration.
    pub params: usize,
    /// What a chunk costs a thread.
    pub compute: ComputeModel,
    /// What communication costs.
    pub net: Network,
    /// Whether the ranks of a node share one copy of the parameters and combine their updates
    /// on the node where the scheme allows it ([`NodeCombine`]).
    pub node_combine: NodeCombine,
    /// Fixed seconds per rank and iteration outside compute, communication and waits (replayed
    /// runs use their measured ones instead).
    pub overhead: f64,
    /// Iterations a real run needed to reach its target: time to target is when rank 0 completes
    /// that many.
    pub target_iterations: Option<u64>,
}

impl SimConfig {
    /// Whether the ranks of a node combine on the node under `synchronous` (the scheme's policy
    /// is `crate::scheme::Policy::synchronous`): [`NodeCombine::Auto`], more than one rank on a
    /// node, more than one node (as the engine: one node has nothing to combine across), and a
    /// model sharded over the ranks (the simulator refuses replicated schemes).
    pub fn node_combine(&self, synchronous: bool) -> bool {
        self.node_combine == NodeCombine::Auto
            && synchronous
            && !self.cfg.scheme.scheme.replicated()
            && self.net.ranks_per_node.min(self.ranks) > 1
            && self.ranks > self.net.ranks_per_node
    }

    /// Threads of every rank's pool (the most any iteration may use).
    pub fn max_threads(&self) -> usize {
        self.cfg.threads.max(1)
    }
}

/// The furthest virtual time a simulation may reach: 2^62 ns, about 146 years. Costs are
/// summed as integers without overflow (saturating), so a figure out of scale (a chunk time, a
/// model over a link's bandwidth, a straggler's delay) sends some event to this horizon or
/// beyond, and the simulation ends there with [`SimError::Horizon`] instead of wrapping round to
/// a short time.
pub const HORIZON: Nanos = 1 << 62;

/// Errors of a simulation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The configuration is refused as `peregrine train` would refuse it.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// A policy's window operation failed.
    #[error("simulated world: {0}")]
    Transport(#[from] peregrine_transport::Error),
    /// No event is left but ranks have not finished (a policy that never lets them go on).
    #[error(
        "the simulation stalled: {ranks} ranks never finished (rank {rank} in iteration {iteration}, phase {phase})"
    )]
    Stalled {
        /// Ranks not finished.
        ranks: usize,
        /// The first of them.
        rank: usize,
        /// Its iteration.
        iteration: u64,
        /// Where it is.
        phase: String,
    },
    /// Virtual time reached [`HORIZON`]: too many iterations, or figures out of scale.
    #[error(
        "the simulated run passes {} years of virtual time (rank {rank} in iteration {iteration}): too many \
         iterations, or a cost out of scale (a chunk's compute time, the model's size over a link's \
         bandwidth, a latency, the fixed costs, a straggler's delay)",
        HORIZON / 1_000_000_000 / 31_557_600
    )]
    Horizon {
        /// The rank whose event came at the horizon.
        rank: usize,
        /// Its iteration.
        iteration: u64,
    },
}

impl SimError {
    /// Whether the error is in the configuration (the user's to fix) rather than the simulation.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Train(e) if e.is_usage()) || matches!(self, Self::Horizon { .. })
    }
}

/// What a simulated run reports.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// The scheme, as `scheme[+steal]`.
    pub scheme: String,
    /// Ranks.
    pub ranks: usize,
    /// Whether the ranks of a node shared one copy of the parameters and combined their updates
    /// on the node ([`SimConfig::node_combine`]).
    pub node_combine: bool,
    /// Threads per rank (the pool's size).
    pub threads: usize,
    /// The most iterations any rank ran.
    pub iterations: u64,
    /// Simulated seconds until the last rank finished.
    pub seconds: f64,
    /// `seconds / iterations`.
    pub per_iteration: f64,
    /// Simulated seconds until rank 0 completed the target's iterations.
    pub time_to_target: Option<f64>,
    /// Per-rank totals (compute, comm and wait seconds, chunks own and taken, ...).
    pub per_rank: Vec<RankTotals>,
    /// Events processed.
    pub events: u64,
    /// Wall-clock seconds the simulation took.
    pub wall_seconds: f64,
}

impl SimReport {
    /// Seconds all ranks spent waiting, over all their seconds.
    pub fn wait_share(&self) -> f64 {
        let (wait, all) =
            self.per_rank.iter().fold((0.0, 0.0), |(w, a), r| (w + r.wait, a + r.compute + r.comm + r.wait));
        if all > 0.0 {
            wait / all
        } else {
            0.0
        }
    }

    /// Chunks taken over, all ranks together.
    pub fn taken(&self) -> u64 {
        self.per_rank.iter().map(|r| r.taken).sum()
    }
}

/// The balanced bound of `s` in seconds an iteration, given `ideal`, the same world's run
/// without stragglers: each iteration's chunks spread over every rank's threads at their
/// injected speeds (threads and delay factors, as the engine applies them) as if work were a
/// fluid, plus what Ideal spends outside compute (communication, coordination). No scheme that
/// computes every chunk can do better on average (backup workers and DBW, which drop late
/// updates, can); one that moves work in whole chunks may not reach it (a chunk in flight on a
/// slow rank is not shared: [`chunk_bound`]). Disruptors' slowdowns are not counted (a looser
/// bound there); `None` for replayed costs.
pub fn balanced_bound(s: &SimConfig, ideal: &SimReport) -> Option<f64> {
    bound(s, ideal, |chunks, groups| {
        chunks as f64 / groups.iter().map(|&(c, n)| n / c).sum::<f64>().max(1e-12)
    })
}

/// The whole-chunk bound of `s` in seconds an iteration, given `ideal`: each iteration's chunks
/// moved whole, each to the thread that would finish it first (at the threads' injected speeds),
/// from the iteration's start, plus what Ideal spends outside its own compute. A scheme that ends
/// every iteration before the next begins (BSP, LB-BSP, enforced Falcon, speculation) cannot do
/// better; it is above the balanced bound by what a chunk on a slow thread costs beyond a share
/// of a fluid. Schemes that let iterations overlap (SSP, FlexRR, ASP, slack Falcon) can: a slow
/// rank's chunk then runs on past the iteration's end. `None` where [`balanced_bound`] is.
pub fn chunk_bound(s: &SimConfig, ideal: &SimReport) -> Option<f64> {
    bound(s, ideal, whole_chunk_makespan)
}

/// A bound per iteration: `compute(chunks, groups)` of each iteration's chunks on threads
/// grouped by speed (`(seconds a chunk, threads)`), averaged over Ideal's iterations, plus
/// Ideal's time beyond the same bound of its own world (every thread at full speed).
fn bound(s: &SimConfig, ideal: &SimReport, compute: impl Fn(usize, &[(f64, f64)]) -> f64) -> Option<f64> {
    let chunk = match &s.compute {
        ComputeModel::Constant(c) => *c,
        ComputeModel::Samples(v) if !v.is_empty() => v.iter().sum::<f64>() / v.len() as f64,
        _ => return None,
    };
    let plan = crate::engine::check(&s.cfg, s.ranks, s.rows).ok()?;
    let iterations = ideal.iterations.max(1);
    let threads = s.max_threads();
    let (mut bound, mut flat) = (0.0, 0.0);
    let mut groups: Vec<(f64, f64)> = Vec::new();
    for it in 0..iterations {
        let chunks = plan.batch_chunks(it);
        groups.clear();
        for r in 0..s.ranks {
            let (c, n) = (chunk * (1.0 + s.cfg.inject.delay(r, it)), s.cfg.inject.threads(r, threads) as f64);
            match groups.iter_mut().find(|g| g.0 == c) {
                Some(g) => g.1 += n,
                None => groups.push((c, n)),
            }
        }
        bound += compute(chunks, &groups);
        flat += compute(chunks, &[(chunk, (s.ranks * threads) as f64)]);
    }
    let overhead = (ideal.per_iteration - flat / iterations as f64).max(0.0);
    Some(bound / iterations as f64 + overhead)
}

/// The least time by which threads of the given speeds (`(seconds a chunk, threads)`) finish
/// `chunks` whole chunks, each thread one chunk after another: the least `t` with
/// `sum threads x floor(t / seconds) >= chunks`, which is a multiple of some group's seconds.
fn whole_chunk_makespan(chunks: usize, groups: &[(f64, f64)]) -> f64 {
    // Chunks done by `t`; a chunk ending at `t` to rounding counts (3 x 0.1 / 0.1 is 2.99...).
    let done = |t: f64| groups.iter().map(|&(c, n)| n * (t * (1.0 + 1e-12) / c).floor()).sum::<f64>();
    let need = chunks as f64;
    // Every candidate is k x seconds of a group, for k up to what that group alone would need.
    let mut best = f64::INFINITY;
    for &(c, n) in groups.iter().filter(|g| g.1 > 0.0 && g.0 > 0.0) {
        // The least k for this group with done(k c) >= need, by bisection on k.
        let (mut lo, mut hi) = (0u64, (need / n).ceil() as u64);
        if done(hi as f64 * c) < need {
            continue;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if done(mid as f64 * c) >= need {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        best = best.min(lo as f64 * c);
    }
    if best.is_finite() {
        best
    } else {
        0.0
    }
}

/// Every rank's policy, by rank.
type Policies = Vec<Box<dyn Policy>>;

/// The serial world of `s` and every rank's policy in it, built as a run builds them (the
/// operations building them takes are not part of the run: they are dropped).
fn build(s: &SimConfig, plan: &Plan) -> Result<(Vec<Transport>, Policies), SimError> {
    let world: Vec<Transport> =
        peregrine_transport::local::serial_world(s.ranks)?.into_iter().map(Transport::Local).collect();
    let mut policies = Vec::with_capacity(s.ranks);
    let shared = std::sync::Arc::new(crate::scheme::Shared::default());
    for t in &world {
        policies.push(s.cfg.scheme.scheme.policy(&Setup {
            t,
            steal: s.cfg.scheme.steal,
            start: s.cfg.start_iteration(),
            plan,
            simulated: true,
            params: 0,
            shared: Some(shared.clone()),
        })?);
    }
    for t in &world {
        t.take_ops();
    }
    Ok((world, policies))
}

/// Simulates `s`; `records`, if given, receives every rank's record of every iteration (as a
/// run's metrics files hold them), in virtual-time order.
pub fn simulate<'a>(
    s: &'a SimConfig,
    records: Option<&'a mut dyn FnMut(&IterRecord)>,
) -> Result<SimReport, SimError> {
    let plan = crate::engine::check(&s.cfg, s.ranks, s.rows)?;
    if s.cfg.scheme.scheme.replicated() {
        return Err(SimError::Train(TrainError::Setting {
            setting: "the scheme",
            accepted: "one the simulator models: every scheme but dbw (its ranks' replicas and \
                       neighbour exchanges are not simulated; run it with peregrine train)"
                .into(),
            got: s.cfg.scheme.scheme.to_string(),
        }));
    }
    let wall = Instant::now();
    let (world, policies) = build(s, &plan)?;
    let mut sim = world::Sim::new(s, plan, world, policies, records);
    let end = sim.run()?;
    let iterations = sim.most_iterations;
    let seconds = end as f64 * 1e-9;
    let report = SimReport {
        scheme: s.cfg.scheme.to_string(),
        ranks: s.ranks,
        node_combine: sim.node_combine(),
        threads: s.max_threads(),
        iterations,
        seconds,
        per_iteration: if iterations > 0 { seconds / iterations as f64 } else { 0.0 },
        time_to_target: sim.to_target.map(|t| t as f64 * 1e-9),
        per_rank: sim.totals(),
        events: sim.events(),
        wall_seconds: 0.0,
    };
    sim.free()?;
    Ok(SimReport { wall_seconds: wall.elapsed().as_secs_f64(), ..report })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::{Injection, Pattern};
    use crate::scheme::SchemeSpec;

    pub(super) fn config(scheme: &str, ranks: usize, threads: usize, pattern: Pattern) -> SimConfig {
        let chunks_per_rank = 3 * threads;
        let cfg = Config {
            scheme: scheme.parse::<SchemeSpec>().expect("scheme"),
            batch: 8 * chunks_per_rank * ranks,
            chunk: 8,
            iterations: 20,
            threads,
            inject: Injection { pattern, seed: 3 },
            ..Config::default()
        };
        SimConfig {
            rows: cfg.batch * 20,
            cfg,
            ranks,
            params: 100_000,
            compute: ComputeModel::Constant(100e-6),
            net: Network {
                intra: Link { latency: 1e-6, atomic: 0.0, gap: 0.0, bandwidth: 10e9 },
                inter: Link { latency: 5e-6, atomic: 0.0, gap: 0.0, bandwidth: 2e9 },
                ranks_per_node: 2,
            },
            node_combine: NodeCombine::Off,
            overhead: 0.0,
            target_iterations: None,
        }
    }

    #[test]
    fn bsp_without_stragglers_is_iterations_times_compute_and_communication() {
        let s = config("bsp", 4, 2, Pattern::Ideal);
        let r = simulate(&s, None).expect("simulation");
        // Each thread computes 3 chunks of 100 us; the pull and the push each move 400 KB, 200 KB
        // of it over the node's link and 200 KB to the other node, at half the card's 2 GB/s
        // (the node's other rank moves as much at once).
        let transfer = s.net.transfer(0, 4, 100_000);
        assert_eq!(transfer, cost::nanos(5e-6 + 200e3 / 10e9 + 200e3 / 1e9));
        let per_iteration = 3 * 100_000 + 2 * transfer;
        assert_eq!(r.iterations, 20);
        assert_eq!(cost::nanos(r.seconds), 20 * per_iteration, "{r:?}");
        for t in &r.per_rank {
            assert_eq!(cost::nanos(t.compute), 20 * 300_000);
            assert_eq!(cost::nanos(t.comm), 20 * 2 * transfer);
            assert_eq!(t.wait, 0.0);
            assert_eq!((t.own, t.taken, t.rows), (20 * 6, 0, 20 * 6 * 8));
        }
    }

    /// Figures out of scale end the simulation at the horizon, as a usage error, under every
    /// scheme's mechanism (taking over, lining up, copies, clock trees), instead of wrapping the
    /// integer clock round to a short run (or overflowing).
    #[test]
    fn a_run_past_the_horizon_is_an_error_not_a_wrapped_clock() {
        type Edit = fn(&mut SimConfig);
        let edits: [(Edit, &str); 4] = [
            (|s| s.net.inter.bandwidth = 1e-5, "a pull over a link of 10 us per byte"),
            (|s| s.params = usize::MAX, "a model of usize::MAX parameters"),
            (|s| s.compute = ComputeModel::Constant(1e300), "a chunk of 1e300 s"),
            (|s| s.cfg.iterations = u64::MAX, "a year a chunk, for ever"),
        ];
        for scheme in ["bsp", "bsp+steal", "ssp:2+steal", "flexrr", "falcon", "speculative"] {
            for (edit, what) in edits {
                let mut s = config(scheme, 4, 2, Pattern::Ideal);
                if what.starts_with("a year") {
                    s.compute = ComputeModel::Constant(3e7);
                }
                edit(&mut s);
                match simulate(&s, None) {
                    Err(e @ SimError::Horizon { .. }) => assert!(e.is_usage(), "{scheme}, {what}"),
                    other => panic!("{scheme}, {what}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_slow_rank_holds_bsp_back_and_taking_over_wins_most_of_it_back() {
        let slow = Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None };
        let ideal = simulate(&config("bsp", 8, 2, Pattern::Ideal), None).expect("ideal").seconds;
        let bsp = simulate(&config("bsp", 8, 2, slow.clone()), None).expect("bsp");
        let steal = simulate(&config("bsp+steal", 8, 2, slow), None).expect("bsp+steal");
        // Without taking over, every iteration waits for rank 0's doubled compute: 600 us of
        // chunks instead of 300 (plus the same communication).
        let comm = 20.0 * 2.0 * s_transfer();
        assert!(((bsp.seconds - comm) / (ideal - comm) - 2.0).abs() < 1e-6, "{} vs {}", bsp.seconds, ideal);
        assert!(bsp.per_rank[1].wait > 0.0 && bsp.per_rank[0].wait == 0.0);
        // With it: rank 0's 2 threads take chunks 0-1 (done at 200 us) and 2-3 (at 400 us);
        // the fast ranks are through their 6 own chunks at 300 us, when rank 0 has chunks 4 and 5
        // queued: the first thief thread takes a quarter rounded up (its rank's half over its 2
        // threads: one), the next the other, both done at 400 us.
        assert_eq!(steal.taken(), 20 * 2);
        assert_eq!(cost::nanos(steal.seconds), 20 * (400_000 + cost::nanos(2.0 * s_transfer())));
        // Every chunk is computed exactly once.
        let rows: u64 = steal.per_rank.iter().map(|r| r.rows).sum();
        assert_eq!(rows, 20 * (8 * 6 * 8) as u64);
    }

    #[test]
    fn a_waiting_rank_pays_for_one_poll_not_for_every_look_the_simulator_makes() {
        // Backup workers wait on a word of their own window (`done`, on rank 0). While a rank
        // waits, the simulator asks its policy again at every other rank's tick; those looks are
        // the simulator's way of finding when the rank may go on, not reads the rank makes. Charged
        // to the rank, 255 of them at InfiniBand's 2.5 us held the late rank of each iteration
        // 0.6 ms, and the iteration after waited for it: 1.76x Ideal at 256 ranks.
        let world = |scheme| SimConfig { net: Network::default(), ..config(scheme, 256, 2, Pattern::Ideal) };
        let ideal = simulate(&world("bsp"), None).expect("ideal");
        let backup = simulate(&world("backup:1"), None).expect("backup:1");
        // One rank an iteration is late and drops its update; the others go on as under BSP, plus
        // the counters' few atomics on rank 0.
        assert!(
            backup.per_iteration < 1.05 * ideal.per_iteration,
            "{} vs {}",
            backup.per_iteration,
            ideal.per_iteration
        );
        let most = backup.per_rank.iter().map(|t| t.wait).fold(0.0, f64::max);
        assert!(most < 20.0 * 20e-6, "a rank waited {most} s in 20 iterations");
    }

    #[test]
    fn the_balanced_bound_spreads_the_work_over_the_ranks_speeds() {
        // 8 ranks of 2 threads, 3 chunks of 100 us a thread: 0.3 ms of compute an iteration.
        // Rank 0 at half speed: 16 threads' work over 15 threads' worth of capacity.
        let ideal_cfg = config("bsp", 8, 2, Pattern::Ideal);
        let ideal = simulate(&ideal_cfg, None).expect("ideal");
        let slow = config("bsp", 8, 2, Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None });
        let bound = balanced_bound(&slow, &ideal).expect("a bound");
        let overhead = ideal.per_iteration - 300e-6;
        assert!((bound - (300e-6 * 16.0 / 15.0 + overhead)).abs() < 1e-9, "{bound}");
        // No straggler: Ideal itself.
        assert!((balanced_bound(&ideal_cfg, &ideal).expect("a bound") - ideal.per_iteration).abs() < 1e-12);
        // Every scheme at or above it.
        for scheme in ["bsp", "bsp+steal", "ssp:2+steal", "flexrr:2", "falcon"] {
            let c = config(scheme, 8, 2, Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None });
            let r = simulate(&c, None).expect("simulation");
            assert!(r.per_iteration >= bound * (1.0 - 1e-9), "{scheme}: {} < {bound}", r.per_iteration);
        }
    }

    #[test]
    fn the_end_game_leaves_a_slow_ranks_last_round_to_the_free_threads() {
        // 64 ranks of 16 threads, 4 chunks of 100 us a thread; rank 0 at half speed. By 400 us
        // the others are out of chunks and rank 0's threads have done 2 each: a third round would
        // end at 600 us, the free threads end the 32 chunks left at 500 us (the whole-chunk
        // bound). Without the end game BSP with taking over and enforced Falcon took 1.2x it,
        // speculation with taking over 1.08x (copies end part of that round sooner).
        let with = |scheme: &str, pattern| {
            let mut c = config(scheme, 64, 16, pattern);
            c.cfg.batch = 8 * 4 * 16 * 64;
            c.rows = c.cfg.batch * 20;
            c
        };
        let ideal = simulate(&with("bsp", Pattern::Ideal), None).expect("ideal");
        let slow = || Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None };
        let bound = chunk_bound(&with("bsp", slow()), &ideal).expect("a bound");
        assert!((bound - ideal.per_iteration - 100e-6).abs() < 1e-9, "{bound}");
        for scheme in ["bsp+steal", "falcon", "speculative+steal"] {
            let r = simulate(&with(scheme, slow()), None).expect("simulation");
            assert!(r.per_iteration < 1.05 * bound, "{scheme}: {} against {bound}", r.per_iteration);
            assert!(r.per_iteration >= bound * (1.0 - 1e-9), "{scheme}: {} < {bound}", r.per_iteration);
        }
    }

    #[test]
    fn the_whole_chunk_bound_moves_chunks_whole_to_the_thread_that_finishes_first() {
        // 8 ranks of 2 threads, 3 chunks of 100 us a thread (48 chunks); rank 0 at half speed:
        // by 300 us the fast threads finish 42 and rank 0's 2 (one each), 44 < 48; by 400 us the
        // fast ones alone finish 56. The fluid bound is 320 us.
        let ideal_cfg = config("bsp", 8, 2, Pattern::Ideal);
        let ideal = simulate(&ideal_cfg, None).expect("ideal");
        let slow = config("bsp", 8, 2, Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None });
        let bound = chunk_bound(&slow, &ideal).expect("a bound");
        let overhead = ideal.per_iteration - 300e-6;
        assert!((bound - (400e-6 + overhead)).abs() < 1e-9, "{bound}");
        assert!(bound > balanced_bound(&slow, &ideal).expect("a bound"));
        assert!((chunk_bound(&ideal_cfg, &ideal).expect("a bound") - ideal.per_iteration).abs() < 1e-12);
        // The schemes that end each iteration before the next at or above it.
        for scheme in ["bsp", "bsp+steal", "falcon", "speculative", "speculative+steal"] {
            let c = config(scheme, 8, 2, Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None });
            let r = simulate(&c, None).expect("simulation");
            assert!(r.per_iteration >= bound * (1.0 - 1e-9), "{scheme}: {} < {bound}", r.per_iteration);
        }
        // Makespans: 10 chunks on 4 threads of 1 s and 1 of 3 s: by 2 s, 8 + 0; by 3 s, 12 + 1.
        assert_eq!(whole_chunk_makespan(10, &[(1.0, 4.0), (3.0, 1.0)]), 3.0);
        assert_eq!(whole_chunk_makespan(9, &[(1.0, 4.0), (2.0, 2.0)]), 2.0);
        assert_eq!(whole_chunk_makespan(0, &[(1.0, 4.0)]), 0.0);
    }

    fn s_transfer() -> f64 {
        let s = config("bsp", 8, 2, Pattern::Ideal);
        s.net.transfer(0, 8, s.params) as f64 * 1e-9
    }

    #[test]
    fn every_scheme_runs_under_every_pattern() {
        let patterns = [
            "slow-worker:p=0.2,max=3",
            "power-law:alpha=4",
            "persistent:rank=1,speed=0.25",
            "heterogeneous:speed=1/0.5,threads=4/2",
            "disrupted:p=0.5,period=0.001,intensity=200",
        ];
        let schemes = [
            "bsp",
            "bsp+steal",
            "ssp:2+steal",
            "asp+steal",
            "dynsgd",
            "backup:2",
            "backup-dynamic",
            "lb-bsp",
            "lb-bsp:ma",
            "lb-bsp:narx",
            "speculative",
            "flexrr:2",
            "falcon",
            "falcon:slack:2",
        ];
        for p in patterns {
            for name in schemes {
                let s = config(name, 16, 4, p.parse().expect("pattern"));
                let r = simulate(&s, None).unwrap_or_else(|e| panic!("{name} under {p}: {e}"));
                assert_eq!(r.iterations, 20, "{name} under {p}");
                assert!(r.seconds > 0.0 && r.per_rank.len() == 16);
                if !name.starts_with("backup") {
                    // Chunks applied exactly once: the batch's rows, every iteration.
                    let rows: u64 = r.per_rank.iter().map(|t| t.rows).sum();
                    assert_eq!(rows, 20 * s.cfg.batch as u64, "{name} under {p}");
                }
            }
        }
    }

    /// A digest of a report's figures (its time, events and every rank's totals but the threads'
    /// time in chunks, `busy`, which the simulator records since): equal digests, equal runs.
    fn digest(r: &SimReport) -> u64 {
        let per_rank: Vec<_> =
            r.per_rank.iter().map(|t| crate::record::RankTotals { busy: 0.0, ..*t }).collect();
        let text = format!("{} {} {:?}", cost::nanos(r.seconds), r.events, per_rank);
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    }

    /// Where the node combine does not apply (one rank a node, `off`, a scheme that is not
    /// synchronous), runs are the ones before it existed: their digests were taken from the
    /// simulator before the combine was added (8 ranks of 2 threads, rank 0 at half speed,
    /// atomics and gaps that cost).
    #[test]
    fn without_the_node_combine_runs_are_unchanged() {
        #[rustfmt::skip]
        let before: [(usize, &str, u64, u64); 18] = [
            (1, "bsp", 19860000, 0xc39e8b5c79f381c0),
            (1, "bsp+steal", 16890000, 0xb66432356dec54df),
            (1, "lb-bsp", 16482000, 0x8e395e10791ec28a),
            (1, "ssp:3", 19850000, 0x4c69e7d0c8c41a38),
            (1, "ssp:3+steal", 14666000, 0x77bdb0218152a9c5),
            (1, "falcon", 17060000, 0x8b0bf6c8442b22f1),
            (2, "bsp", 19051420, 0x83aa60d3fb2aff8b),
            (2, "bsp+steal", 16042700, 0xfff93cecec32bfef),
            (2, "lb-bsp", 15648260, 0xa176a53ccbfe5bf7),
            (2, "ssp:3", 19042278, 0x2e0163f913b18456),
            (2, "ssp:3+steal", 13817979, 0xcbad4c479d910a85),
            (2, "falcon", 16196120, 0xbb82871c34403e54),
            (4, "bsp", 17434280, 0x8d658f650154c5f5),
            (4, "bsp+steal", 14058140, 0x00f5b191c69f69be),
            (4, "lb-bsp", 13889122, 0x158002dece8fdd04),
            (4, "ssp:3", 17426852, 0x9bfdc872ef34b752),
            (4, "ssp:3+steal", 12164852, 0x42cfafb87b4bc944),
            (4, "falcon", 14178420, 0xf54cd5205b519c2a),
        ];
        for (per_node, scheme, nanos, figures) in before {
            let synchronous = !(scheme.starts_with("ssp") || scheme == "falcon");
            for node_combine in [NodeCombine::Auto, NodeCombine::Off] {
                let mut s =
                    config(scheme, 8, 2, Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None });
                s.net.ranks_per_node = per_node;
                (s.net.intra.atomic, s.net.intra.gap, s.net.inter.atomic, s.net.inter.gap) =
                    (2e-6, 0.1e-6, 5e-6, 0.5e-6);
                s.node_combine = node_combine;
                let r = simulate(&s, None).expect("simulation");
                let combines = node_combine == NodeCombine::Auto && per_node > 1 && synchronous;
                assert_eq!(r.node_combine, combines, "{scheme}, {per_node} a node, {node_combine}");
                // With several ranks a node they now share its card between nodes, flat too.
                if per_node == 1 {
                    let what = format!("{scheme}, {per_node} a node, {node_combine}");
                    assert_eq!((cost::nanos(r.seconds), digest(&r)), (nanos, figures), "{what}");
                }
            }
        }
    }

    /// 8 ranks of 2 threads, 4 a node, 100,000 parameters (a 50 KB shard), a slow link between
    /// nodes (100 MB/s): the combine's iteration by hand, and against the flat one.
    #[test]
    fn the_node_combine_is_a_stripe_between_nodes_and_two_node_barriers() {
        let world = |scheme: &str, pattern: Pattern, node_combine: NodeCombine| {
            let mut s = config(scheme, 8, 2, pattern);
            s.net.ranks_per_node = 4;
            s.net.inter.bandwidth = 1e8;
            s.node_combine = node_combine;
            s
        };
        let ideal = simulate(&world("bsp", Pattern::Ideal, NodeCombine::Auto), None).expect("combined");
        assert!(ideal.node_combine);
        // Pull: 5 us + one 50 KB shard from the other node at a quarter of the card's 100 MB/s
        // (the node's 4 ranks at once: 2,000 us) + the own shard into the node's copy at 10 GB/s
        // (5 us) = 2,010 us; compute: 3 chunks of 100 us; push: the 400 KB update into the slot
        // (40 us), the stripe's 400 KB summed (40 us) and one shard's sum written to the other
        // node (2,005 us). Atomics cost nothing here.
        let per_iteration = 2_010_000 + 300_000 + 40_000 + 2_045_000;
        assert_eq!(cost::nanos(ideal.seconds), 20 * per_iteration, "{ideal:?}");
        for t in &ideal.per_rank {
            assert_eq!(cost::nanos(t.comm), 20 * (2_010_000 + 40_000 + 2_045_000));
            assert_eq!(t.wait, 0.0);
        }
        // Flat: every rank moves 200 KB within the node and 200 KB to the other one each way
        // (5 us + 20 us + 8,000 us: the 4 ranks' 800 KB through the card).
        let flat = simulate(&world("bsp", Pattern::Ideal, NodeCombine::Off), None).expect("flat");
        assert!(!flat.node_combine);
        assert_eq!(cost::nanos(flat.seconds), 20 * (300_000 + 2 * 8_025_000));
        assert!(ideal.seconds < flat.seconds / 3.0);
        // Rank 0 at half speed: its node's ranks wait for it at the push barrier (300 us), the
        // other node's at BSP's wait for every clock; the iteration is its 600 us of compute
        // between the same communication.
        let slow = Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None };
        let r = simulate(&world("bsp", slow, NodeCombine::Auto), None).expect("a slow rank");
        assert_eq!(cost::nanos(r.seconds), 20 * (per_iteration + 300_000));
        assert_eq!(r.per_rank[0].wait, 0.0);
        for rank in [1, 4] {
            assert_eq!(cost::nanos(r.per_rank[rank].wait), 20 * 300_000, "rank {rank}");
            assert_eq!(cost::nanos(r.per_rank[rank].compute), 20 * 300_000, "rank {rank}");
        }
    }

    /// An asynchronous scheme (bounded staleness) never combines on the node: `auto` leaves it
    /// as `off` does, however many ranks a node holds.
    #[test]
    fn an_asynchronous_scheme_is_flat_under_auto() {
        for scheme in ["ssp:3", "ssp:3+steal", "asp", "falcon", "flexrr"] {
            let mut s =
                config(scheme, 8, 2, Pattern::Persistent { ranks: vec![0], speed: 0.5, threads: None });
            s.net.ranks_per_node = 4;
            let off = simulate(&s, None).expect("off");
            s.node_combine = NodeCombine::Auto;
            let auto = simulate(&s, None).expect("auto");
            assert!(!auto.node_combine, "{scheme}");
            assert_eq!((auto.seconds, digest(&auto)), (off.seconds, digest(&off)), "{scheme}");
        }
    }

    /// Replayed costs keep the measured communication, and the node barriers still hold: 2 nodes
    /// of 2 ranks alike, rank 0 (and 2) computing 1 ms a chunk and pulling and pushing in 1 ms,
    /// rank 1 (and 3: a replay's ranks past its own repeat them) computing 0.1 ms a chunk and
    /// communicating in 3 ms.
    #[test]
    fn a_replay_keeps_its_measured_communication_between_node_barriers() {
        let measured = |chunk: f64, comm: f64| vec![Some(Measured { chunk, comm, overhead: 0.0 }); 20];
        let mut s = config("bsp", 4, 1, Pattern::Ideal);
        s.compute = ComputeModel::Replay(Replay::new(vec![measured(1e-3, 1e-3), measured(0.1e-3, 3e-3)]));
        s.net.ranks_per_node = 2;
        // Flat: rank 0 is the slower, 0.5 + 3 + 0.5 ms.
        let flat = simulate(&s, None).expect("flat");
        assert_eq!(cost::nanos(flat.seconds), 20 * 4_000_000);
        // Combined: both compute from rank 1's pull (1.5 ms) on; both sum after rank 0's compute
        // (at 4.5 ms), rank 1's writes end at 6 ms.
        s.node_combine = NodeCombine::Auto;
        let r = simulate(&s, None).expect("combined");
        assert!(r.node_combine);
        assert_eq!(cost::nanos(r.seconds), 20 * 6_000_000);
        assert_eq!(cost::nanos(r.per_rank[0].comm), 20 * 1_000_000);
        assert_eq!(cost::nanos(r.per_rank[1].comm), 20 * 3_000_000);
        // Rank 0 waits 1 ms at the pull barrier and 1 ms for rank 1's tick; rank 1 2.7 ms at the
        // push barrier.
        assert_eq!(cost::nanos(r.per_rank[0].wait), 20 * 2_000_000);
        assert_eq!(cost::nanos(r.per_rank[1].wait), 20 * 2_700_000);
    }

    /// Rank 0 reaching the target while it waits for the others closes its iteration once:
    /// every rank's records are its iterations in order, each once.
    #[test]
    fn reaching_the_target_closes_each_iteration_once() {
        for scheme in ["bsp", "ssp:2"] {
            let mut s =
                config(scheme, 4, 2, Pattern::Persistent { ranks: vec![3], speed: 0.5, threads: None });
            s.target_iterations = Some(5);
            let mut its = vec![Vec::new(); 4];
            let mut f = |r: &IterRecord| its[r.rank].push(r.iter);
            simulate(&s, Some(&mut f)).expect("simulation");
            assert_eq!(its[0], [0, 1, 2, 3, 4], "{scheme}");
            for (r, its) in its.iter().enumerate() {
                assert!(its.iter().enumerate().all(|(i, &it)| i as u64 == it), "{scheme}, rank {r}: {its:?}");
            }
        }
    }
}
