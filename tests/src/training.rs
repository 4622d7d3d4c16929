//! The training engine under concurrency, on real ranks of either backend.
//!
//! - [`exactly_once`]: a model whose parameters are one counter per training row and whose
//!   "update" adds 1 to the counter of every row it computed. After `E` epochs through the real
//!   engine (queues, taking over, pushes by accumulate), every counter must be exactly `E`: each
//!   chunk of each iteration computed once, by its owner or by one rank that took it over, and its
//!   update applied once. Rank 0 is slowed down (speed 0.2) so that others take over its chunks.
//! - [`final_params`]: BSP training of a real model, returning the final parameters, to compare
//!   across world sizes and backends.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use peregrine_core::engine::{self, thread_cpu_time, Config, Report};
use peregrine_core::inject::{Injection, Pattern};
use peregrine_core::model::{Baseline, Delta, EvalSums, KeySet, Layout, Metric, Model};
use peregrine_core::optim::Optimizer;
use peregrine_core::pool::{Pinning, RankPool, Slot};
use peregrine_core::{Scheme, SchemeSpec};
use peregrine_transport::{run_local, Backend, Transport};

/// Rank `rank` slowed to `speed` for good.
pub fn slowed(rank: usize, speed: f64) -> Injection {
    Injection { pattern: Pattern::Persistent { ranks: vec![rank], speed, threads: None }, seed: 1 }
}

/// One counter per row.
#[derive(Debug)]
pub struct Counting {
    rows: usize,
    /// Busy time per row computed.
    per_row: Duration,
    /// Whether it [joins chunks](Model::joins_chunks).
    joins: bool,
    /// The most rows one call computed.
    widest: AtomicUsize,
    /// Calls to `compute`.
    computes: AtomicUsize,
    /// Calls to `compute` whose rows the thread's last hint ([`Model::ahead`]) named.
    foreseen: AtomicUsize,
}

impl Counting {
    fn new(rows: usize, per_row: Duration) -> Self {
        Counting {
            rows,
            per_row,
            joins: false,
            widest: AtomicUsize::new(0),
            computes: AtomicUsize::new(0),
            foreseen: AtomicUsize::new(0),
        }
    }
}

/// Per-thread counts.
#[derive(Debug)]
pub struct Counts {
    counts: Vec<f32>,
    keys: KeySet,
    /// The rows of the hint given before this compute (the next one's).
    hint: Option<Range<usize>>,
    /// The rows of the hint given before the last compute (this one's).
    foretold: Option<Range<usize>>,
}

impl Model for Counting {
    type Work = Counts;

    fn name(&self) -> &'static str {
        "counting"
    }

    fn layout(&self) -> Layout {
        Layout { params: self.rows, width: 1 }
    }

    fn rows(&self) -> usize {
        self.rows
    }

    fn eval_rows(&self) -> usize {
        0
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    fn init(&self, _seed: u64, _range: Range<usize>, out: &mut [f32]) {
        out.fill(0.0);
    }

    fn sparse(&self) -> bool {
        true
    }

    fn keys(&self, rows: Range<usize>, set: &mut KeySet) {
        for r in rows {
            set.insert(r as u32);
        }
    }

    fn work(&self, _chunk: usize) -> Counts {
        Counts { counts: vec![0.0; self.rows], keys: KeySet::new(self.rows), hint: None, foretold: None }
    }

    /// Busy for `per_row` of this thread's CPU time a row, like real compute: on a core shared
    /// with other threads it takes longer by the wall clock. (Spun by the wall clock, a chunk
    /// preempted midway used little CPU time, and the injected delay, scaled from CPU time,
    /// shrank with it.) Bounded by the wall clock too, at 50 times the busy time: a clock that
    /// cannot be read reads zero, and must not spin the thread forever.
    fn ahead(&self, _epoch: u64, rows: Range<usize>, work: &mut Counts) {
        work.hint = Some(rows);
    }

    fn compute(&self, rows: Range<usize>, _params: &[f32], work: &mut Counts) -> f64 {
        self.widest.fetch_max(rows.len(), Ordering::Relaxed);
        self.computes.fetch_add(1, Ordering::Relaxed);
        if work.foretold.as_ref() == Some(&rows) {
            self.foreseen.fetch_add(1, Ordering::Relaxed);
        }
        work.foretold = work.hint.take();
        let busy = self.per_row * rows.len() as u32;
        let (until, wall) = (thread_cpu_time() + busy, Instant::now() + busy * 50);
        for r in rows {
            work.counts[r] += 1.0;
            work.keys.insert(r as u32);
        }
        while thread_cpu_time() < until && Instant::now() < wall {
            std::hint::spin_loop();
        }
        0.0
    }

    /// No evaluation rows: nothing is judged against it.
    fn baseline(&self) -> Baseline {
        Baseline { blind_loss: 1.0, constant_metric: 0.0 }
    }

    fn drain(&self, work: &mut Counts, scale: f32, delta: &mut Delta) {
        for &k in work.keys.keys() {
            delta.add(k, scale, &[work.counts[k as usize]]);
            work.counts[k as usize] = 0.0;
        }
        work.keys.clear();
    }

    fn scale(&self, _rows: usize) -> f32 {
        1.0
    }

    /// Counts, not a gradient.
    fn lr(&self) -> Option<f32> {
        None
    }

    fn joins_chunks(&self) -> bool {
        self.joins
    }

    fn evaluate(&self, _params: &[f32], rows: Range<usize>) -> EvalSums {
        [0.0, 0.0, rows.len() as f64]
    }
}

/// The CPU slot of this rank: its share of the process (local backend) or all of it (MPI).
pub fn slot(t: &Transport) -> Slot {
    match t.backend() {
        Backend::Local => Slot { index: t.rank(), of: t.world_size() },
        Backend::Mpi => Slot::WHOLE,
    }
}

/// Trains [`Counting`] for `epochs` epochs under `scheme` with `threads` threads per rank and
/// checks every counter. Returns the report (chunks taken over are in `per_rank`).
pub fn exactly_once(t: &Transport, scheme: Scheme, threads: usize, epochs: u64) -> Result<Report, String> {
    Ok(exactly_once_in(t, scheme, threads, epochs, 1)?.0)
}

/// [`exactly_once`] with threads taking `grain` chunks of their own at a time, and for `grain`
/// above 1 a model that [joins chunks](Model::joins_chunks). Returns the report and the most
/// rows one call computed.
pub fn exactly_once_in(
    t: &Transport,
    scheme: Scheme,
    threads: usize,
    epochs: u64,
    grain: u32,
) -> Result<(Report, usize), String> {
    let rows = 997;
    let model = Counting { joins: grain > 1, ..Counting::new(rows, Duration::from_micros(5)) };
    let (batch, chunk) = (200, 7);
    let cfg = Config {
        grain,
        scheme: SchemeSpec::new(scheme.clone(), true),
        batch,
        chunk,
        iterations: epochs * rows.div_ceil(batch) as u64,
        threads,
        // At a twentieth of its speed, most of rank 0's delay is slept, leaving the core to the
        // others; at a fifth it was all spun (delays under `SPIN_TAIL` are), and on one loaded
        // core a thread of rank 0 ran its chunks back to back within one time slice, before the
        // others looked at its queue (no chunk taken over, 3 runs in 8).
        inject: slowed(0, 0.05),
        keep_params: true,
        seed: 11,
        ..Config::default()
    };
    let pool = RankPool::new(threads, slot(t), Pinning::Off).map_err(|e| e.to_string())?;
    let report = engine::train(t, &model, &cfg, &pool, None, &mut |_| {}).map_err(|e| e.to_string())?;
    let params = report.params.as_ref().ok_or("no parameters in the report")?;
    if let Some((row, &c)) = params.iter().enumerate().find(|&(_, &c)| c != epochs as f32) {
        return Err(format!(
            "rank {}: {scheme}, {} ranks x {threads} threads: row {row} computed {c} times in {epochs} epochs",
            t.rank(),
            t.world_size()
        ));
    }
    Ok((report, model.widest.load(Ordering::Relaxed)))
}

/// [`Counting`] for 2 epochs under BSP, nothing slowed or taken over, `threads` threads a rank
/// taking `grain` chunks of their own at a time (joined into one call for `grain` above 1):
/// this rank's calls to `compute` and how many of them computed the rows of the hint given
/// before them ([`Model::ahead`]).
pub fn foreseen(t: &Transport, threads: usize, grain: u32) -> Result<(usize, usize), String> {
    let model = Counting { joins: grain > 1, ..Counting::new(COUNTING_ROWS, Duration::ZERO) };
    let cfg = Config { grain, threads, ..counting_config(scheme("bsp"), Injection::default(), 2, false) };
    let pool = RankPool::new(threads, slot(t), Pinning::Off).map_err(|e| e.to_string())?;
    engine::train(t, &model, &cfg, &pool, None, &mut |_| {}).map_err(|e| e.to_string())?;
    Ok((model.computes.load(Ordering::Relaxed), model.foreseen.load(Ordering::Relaxed)))
}

/// [`exactly_once`] with every rank's active threads changing between iterations (elastic
/// parallelism): `1, max, 1, max, ...` every 3 iterations. Returns the report and this rank's
/// metrics lines, which must show the schedule.
pub fn exactly_once_elastic(t: &Transport, max: usize) -> Result<(Report, Vec<String>), String> {
    let rows = 997;
    let model = Counting::new(rows, Duration::from_micros(5));
    let iterations = 3 * rows.div_ceil(200) as u64;
    let schedule = (0..iterations / 3)
        .flat_map(|k| (0..t.world_size()).map(move |r| (r, 3 * k, if k % 2 == 0 { 1 } else { max })))
        .collect();
    let cfg = Config {
        batch: 200,
        chunk: 7,
        iterations,
        threads: max,
        elastic: engine::Elastic::Schedule(schedule),
        inject: slowed(0, 0.2),
        keep_params: true,
        ..Config::default()
    };
    let pool = RankPool::new(max, slot(t), Pinning::Off).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    let report = engine::train(t, &model, &cfg, &pool, Some((&mut lines, "memory")), &mut |_| {})
        .map_err(|e| e.to_string())?;
    let params = report.params.as_ref().ok_or("no parameters in the report")?;
    if let Some((row, &c)) = params.iter().enumerate().find(|&(_, &c)| c != 3.0) {
        return Err(format!("elastic: row {row} computed {c} times in 3 epochs"));
    }
    let text = String::from_utf8(lines).map_err(|e| e.to_string())?;
    Ok((report, text.lines().map(str::to_owned).collect()))
}

/// [`Counting`] for `epochs` epochs under `scheme` with `inject`, 2 threads per rank: the final
/// counts and this rank's metrics lines.
pub fn counted(
    t: &Transport,
    scheme: Scheme,
    inject: Injection,
    epochs: u64,
) -> Result<(Vec<f32>, Vec<String>), String> {
    counted_with(t, scheme, inject, epochs, true)
}

/// [`counted`], taking chunks over only if `steal`.
pub fn counted_with(
    t: &Transport,
    scheme: Scheme,
    inject: Injection,
    epochs: u64,
    steal: bool,
) -> Result<(Vec<f32>, Vec<String>), String> {
    counted_by(t, scheme, inject, epochs, steal, Duration::from_micros(20))
}

/// [`counted_with`], each row taking `per_row` (long enough for measured compute times to stand
/// above a loaded machine's noise).
pub fn counted_by(
    t: &Transport,
    scheme: Scheme,
    inject: Injection,
    epochs: u64,
    steal: bool,
    per_row: Duration,
) -> Result<(Vec<f32>, Vec<String>), String> {
    let (report, lines) = train_counting(t, counting_config(scheme, inject, epochs, steal), per_row)?;
    Ok((report.params.ok_or("no parameters")?, lines))
}

/// Rows of the counting model that [`counted`] and [`train_counting`] train.
pub const COUNTING_ROWS: usize = 997;

/// [`counted_with`]'s configuration: batches of 200 rows in chunks of 7, 2 threads a rank.
pub fn counting_config(scheme: Scheme, inject: Injection, epochs: u64, steal: bool) -> Config {
    Config {
        scheme: SchemeSpec::new(scheme, steal),
        batch: 200,
        chunk: 7,
        iterations: epochs * COUNTING_ROWS.div_ceil(200) as u64,
        threads: 2,
        inject,
        keep_params: true,
        ..Config::default()
    }
}

/// The counting model trained under `cfg` (its `threads` on an unpinned pool), each row taking
/// `per_row`: the report and the metrics lines.
pub fn train_counting(
    t: &Transport,
    cfg: Config,
    per_row: Duration,
) -> Result<(Report, Vec<String>), String> {
    let model = Counting::new(COUNTING_ROWS, per_row);
    let pool = RankPool::new(cfg.threads, slot(t), Pinning::Off).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    let report = engine::train(t, &model, &cfg, &pool, Some((&mut lines, "memory")), &mut |_| {})
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8(lines).map_err(|e| e.to_string())?;
    Ok((report, text.lines().map(str::to_owned).collect()))
}

/// [`counted`] for one BSP epoch with `inject`: the metrics lines, after checking every row was
/// counted once.
pub fn injected(t: &Transport, inject: Injection) -> Result<Vec<String>, String> {
    let (params, lines) = counted(t, scheme("bsp"), inject, 1)?;
    if params.iter().any(|&c| c != 1.0) {
        return Err("a row was not computed exactly once".into());
    }
    Ok(lines)
}

/// BSP training of `model` for `iterations` iterations (batch 256, chunks of 16, 2 threads per
/// rank, taking over on, rank 0 slowed to half speed so that chunks do move): the final
/// parameters.
pub fn final_params<M: Model>(t: &Transport, model: &M, iterations: u64) -> Result<Vec<f32>, String> {
    final_params_with(t, model, iterations, scheme("bsp"))
}

/// [`final_params`] under `scheme` (one that keeps BSP's semantics, like Falcon's enforced mode).
pub fn final_params_with<M: Model>(
    t: &Transport,
    model: &M,
    iterations: u64,
    scheme: Scheme,
) -> Result<Vec<f32>, String> {
    final_params_by(t, model, iterations, scheme, Optimizer::Sgd)
}

/// [`final_params_with`] stepping with `optimizer`. The second moments of AdaGrad, Adam and
/// FTRL sum each rank's squared gradient, so their model depends on which rank computed which
/// rows: under them nobody is slowed and nothing is taken over, and every backend splits the
/// batch as the plan says.
pub fn final_params_by<M: Model>(
    t: &Transport,
    model: &M,
    iterations: u64,
    scheme: Scheme,
    optimizer: Optimizer,
) -> Result<Vec<f32>, String> {
    final_params_of(t, model, &params_config(t, iterations, scheme, optimizer))
}

/// The final parameters of a run of `model` with `cfg` (which must keep them).
pub fn final_params_of<M: Model>(t: &Transport, model: &M, cfg: &Config) -> Result<Vec<f32>, String> {
    let pool = RankPool::new(cfg.threads, slot(t), Pinning::Off).map_err(|e| e.to_string())?;
    let report = engine::train(t, model, cfg, &pool, None, &mut |_| {}).map_err(|e| e.to_string())?;
    report.params.ok_or_else(|| "no parameters in the report".into())
}

/// Rank 0's final parameters of `model` on `world` local ranks under BSP with one thread a rank
/// and nothing taken over, so that each rank's gradient is the same from run to run: the
/// configuration is [`params_config`]'s for `iterations` and `optimizer`, then `adjust`ed.
pub fn bsp_params_one_thread<M: Model>(
    world: usize,
    model: &M,
    iterations: u64,
    optimizer: Optimizer,
    adjust: impl Fn(&mut Config) + Sync,
) -> Vec<f32> {
    run_local(world, |t| {
        let mut cfg = Config {
            threads: 1,
            scheme: SchemeSpec::new(scheme("bsp"), false),
            ..params_config(&t, iterations, scheme("bsp"), optimizer)
        };
        adjust(&mut cfg);
        final_params_of(&t, model, &cfg)
    })
    .expect("world")
    .remove(0)
    .expect("rank 0")
}

/// [`final_params_by`]'s configuration.
pub fn params_config(t: &Transport, iterations: u64, scheme: Scheme, optimizer: Optimizer) -> Config {
    let linear = matches!(optimizer, Optimizer::Sgd | Optimizer::Momentum { .. });
    Config {
        optimizer,
        scheme: SchemeSpec::new(scheme, linear),
        batch: 256,
        chunk: 16,
        iterations,
        threads: 2,
        inject: if t.world_size() > 1 && linear { slowed(0, 0.5) } else { Injection::default() },
        keep_params: true,
        seed: 5,
        ..Config::default()
    }
}

/// 6,000 generated ratings of 200 users and 150 items (rank 4), written to `dir/ratings.pgd`:
/// the MF tests' data set.
pub fn mf_ratings(dir: &std::path::Path) -> std::path::PathBuf {
    use peregrine_kernels::data::gen::{self, RatingsSpec};
    let p = dir.join("ratings.pgd");
    gen::ratings(&RatingsSpec { rows: 6000, users: 200, items: 150, rank: 4, noise: 0.1, seed: 3 }, &p)
        .expect("gen");
    p
}

/// Matrix factorization (k 8, adaptive rates) in strata for [`mf_strata_config`]'s batches: on
/// 6,000 ratings a 4 x 4 grid of blocks of about 375, most batches a round of block pieces whose
/// chunks touch disjoint rows (their pushes put new values), the rest the loose ratings'.
pub fn mf_strata(data: &std::path::Path) -> Result<peregrine_core::model::mf::Mf, String> {
    let m = peregrine_core::model::mf::Mf::new(data, None, 8, 0.05, 0.05).map_err(|e| e.to_string())?;
    Ok(m.with_adaptive(true).with_strata(MF_BATCH, MF_CHUNK))
}

const MF_BATCH: usize = 256;
const MF_CHUNK: usize = 64;

/// BSP for [`mf_strata`]: [`params_config`]'s (2 threads; with more than one rank, rank 0 slowed
/// and its chunks taken over) in batches of 256 in chunks of 64, putting the new values of
/// disjoint batches or not, traced into `trace` if given.
pub fn mf_strata_config(
    t: &Transport,
    iterations: u64,
    put_disjoint: bool,
    trace: Option<std::path::PathBuf>,
) -> Config {
    Config {
        put_disjoint,
        trace,
        batch: MF_BATCH,
        chunk: MF_CHUNK,
        ..params_config(t, iterations, scheme("bsp"), Optimizer::Sgd)
    }
}

/// Pushes in rank 0's trace (`rank-0.jsonl` in `dir`) and how many of them put new values.
pub fn traced_puts(dir: &std::path::Path) -> Result<(u64, u64), String> {
    let path = dir.join("rank-0.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let pushes: Vec<&str> = text.lines().filter(|l| l.contains("\"name\":\"push\"")).collect();
    let puts = pushes.iter().filter(|l| l.contains("\"values\":1")).count();
    Ok((pushes.len() as u64, puts as u64))
}

/// The configuration of the checkpoint tests: [`final_params_by`]'s, with a checkpoint every
/// `every` iterations and, if given, resuming from `resume`.
pub fn checkpoint_config(
    t: &Transport,
    iterations: u64,
    scheme: Scheme,
    optimizer: Optimizer,
    every: u64,
    resume: Option<engine::Snapshot>,
) -> Config {
    Config {
        eval_every: 7,
        checkpoint_every: every,
        resume: resume.map(std::sync::Arc::new),
        ..params_config(t, iterations, scheme, optimizer)
    }
}

/// Trains `model` under `cfg`; the final parameters and, on rank 0, every checkpoint taken.
pub fn train_checkpointed<M: Model>(
    t: &Transport,
    model: &M,
    cfg: &Config,
) -> Result<(Report, Vec<engine::Snapshot>), String> {
    let (report, taken) = train_until(t, model, cfg, u64::MAX);
    Ok((report.map_err(|e| e.to_string())?, taken))
}

/// As [`train_checkpointed`], raising the stop flag ([`Config::stop`], which `cfg` must have)
/// on rank 0 once it has done `stop_after` iterations: the run's result and rank 0's
/// checkpoints.
pub fn train_until<M: Model>(
    t: &Transport,
    model: &M,
    cfg: &Config,
    stop_after: u64,
) -> (Result<Report, engine::TrainError>, Vec<engine::Snapshot>) {
    let pool = match RankPool::new(cfg.threads, slot(t), Pinning::Off) {
        Ok(p) => p,
        Err(e) => return (Err(engine::TrainError::Checkpoint(e.to_string())), Vec::new()),
    };
    let mut taken = Vec::new();
    let flag = cfg.stop.clone();
    let report = engine::train_checkpointed(
        t,
        model,
        cfg,
        &pool,
        None,
        &mut |p| {
            if p.iter >= stop_after {
                if let Some(f) = &flag {
                    f.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        },
        &mut |s| {
            taken.push(s.clone());
            Ok(())
        },
    );
    (report, taken)
}

/// The scheme named `name` (`ssp:2`, `lb-bsp:ma`, ...).
///
/// # Panics
/// If no scheme has that name.
pub fn scheme(name: &str) -> Scheme {
    name.parse().unwrap_or_else(|e| panic!("{e}"))
}

/// Largest `|a - b| / (1 + |b|)` over the parameters: how far two runs' models are apart.
pub fn distance(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "models of different sizes");
    a.iter().zip(b).map(|(&x, &y)| f64::from((x - y).abs()) / (1.0 + f64::from(y.abs()))).fold(0.0, f64::max)
}

/// The tolerance BSP runs of the same seed must agree within, on every parameter: they differ
/// only in the order floating-point sums are taken (threads, ranks, accumulates).
pub const BSP_TOLERANCE: f64 = 1e-4;
