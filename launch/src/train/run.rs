//! One training run on a rank: the agreement of the ranks, the run directory and its lock, the
//! rank's threads and memory, the model, the engine's run with its checkpoints and watchdog, and
//! the progress bar.

use std::io::{BufWriter, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peregrine_core::engine::{self, Config, Progress, Report, Watchdog};
use peregrine_core::inject::Injection;
use peregrine_core::model::{
    lda::Lda, lr::LogReg, mf::Mf, mlp::Mlp, softmax::Softmax, synthetic::Synthetic, Export,
};
use peregrine_core::optim::{Optimizer, Schedule};
use peregrine_core::plan::Plan;
use peregrine_core::pool::{Pinning, RankPool, Slot};
use peregrine_core::{SchemeSpec, TrainError};
use peregrine_kernels::data::standardize::Scaling;
use peregrine_transport::{Backend, Transport};

use super::args::{ModelKind, RunOpts, Split};
use super::footprint;
use super::io;
use super::output::{
    join_trace, print_summary, rate_text, save_model, save_model_params, write_summary, TRACE_PARTS,
};
use super::resolve::{usage, Resolved};
use super::resume::{resume_point, IDENTITY};
use crate::agree::Digest;
use crate::error::AppError;
use crate::meta;
use crate::preempt::{write_atomically, EXIT_REQUEUE};
use crate::world::RunContext;

/// The share of the training time default checkpoints may take.
const CHECKPOINT_BUDGET: f64 = 0.01;

/// Seconds a rank may go without progress once asked to stop (SIGTERM, SIGUSR1) before the
/// watchdog ends the job: a peer that died cannot reach the stop's checkpoint, and Slurm sends
/// SIGKILL 30 s (`KillWait`) after SIGTERM, which leaves this much for the wait and the rest for
/// writing the checkpoint. Not less: with UCX over TCP between nodes on an oversubscribed
/// machine, one accumulate has been seen to take over 5 s while both ranks were healthy.
const STOP_GRACE: f64 = 15.0;

/// One training run on this rank (collective): its report.
pub(crate) fn rank(
    t: &Transport,
    ctx: &RunContext,
    a: &RunOpts,
    r: Resolved,
    epochs: Option<f64>,
    stamp: u64,
) -> Result<Report, AppError> {
    // First of all, before any collective whose sequence the job decides.
    crate::agree::agree(t, digest(&r, epochs, a, ctx))?;
    // Every rank must agree on the run directory's name: rank 0's clock decides.
    let mut when = [stamp];
    t.broadcast(&mut when, 0)?;
    let parent_existed;
    let (dir, made) = match a.dir.clone().or_else(|| ctx.run_dir.clone()) {
        Some(d) => {
            let existed = d.exists();
            parent_existed = d.parent().is_none_or(|p| p.as_os_str().is_empty() || p.exists());
            (d, !existed)
        }
        None => {
            let base = PathBuf::from("runs").join(format!(
                "{}-{}-{}",
                r.model_name(),
                r.scheme.to_string().replace(':', ""),
                when[0]
            ));
            parent_existed = base.parent().is_none_or(Path::exists);
            // Runs started within the same second (a seed sweep's) each get their own.
            (agree_fresh_dir(t, &base)?, true)
        }
    };
    // Rank 0 holds the directory's lock for the run's life; the others learn whether it got it.
    let lock = if t.rank() == 0 { Some(crate::run_dir::Lock::take(&dir)) } else { None };
    let mut locked = [u64::from(lock.as_ref().is_none_or(Result::is_ok))];
    t.broadcast(&mut locked, 0)?;
    let result = match lock {
        Some(Err(e)) => Err(AppError::Agreed(Box::new(e))),
        _ if locked[0] == 0 => Err(AppError::Agreed(Box::new(AppError::Usage(format!(
            "{} is in use by another run (rank 0 names it)",
            dir.display()
        ))))),
        lock => {
            let result = rank_in(t, ctx, a, r, epochs, &dir);
            drop(lock);
            result
        }
    };
    if made && result.is_err() && t.rank() == 0 {
        // A run refused or failed before writing anything leaves no directory (only an empty
        // one is removed, once its lock file is).
        let _ = std::fs::remove_file(dir.join(crate::run_dir::LOCK_FILE));
        let _ = std::fs::remove_dir(&dir);
        if !parent_existed {
            let _ = dir.parent().map(std::fs::remove_dir);
        }
    }
    result
}

/// What this rank would run, key by key, for [`crate::agree::agree`]: the resolved configuration
/// (but the compute threads, which a rank may set for its own node), the datasets' identities
/// (not their paths), the run directory and its checkpoints, and how the run is written out.
fn digest(r: &Resolved, epochs: Option<f64>, a: &RunOpts, ctx: &RunContext) -> Result<Digest, AppError> {
    let mut d: Digest = vec![("peregrine version".into(), env!("CARGO_PKG_VERSION").into())];
    let config = serde_json::to_value(r).map_err(|e| AppError::Train(format!("configuration: {e}")))?;
    if let serde_json::Value::Object(keys) = config {
        d.extend(
            keys.into_iter()
                .filter(|(k, _)| !matches!(k.as_str(), "threads" | "data" | "eval"))
                .map(|(k, v)| (k, v.to_string())),
        );
    }
    d.push(("epochs".into(), format!("{epochs:?}")));
    d.push(("data".into(), data_identity(&r.data)?));
    d.push(("eval".into(), r.eval.as_deref().map_or(Ok("none".into()), data_identity)?));
    let dir = a.dir.clone().or_else(|| ctx.run_dir.clone());
    let absolute = dir.as_deref().map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_owned()));
    d.push((
        "run directory".into(),
        absolute.as_deref().map_or("a new one under runs/".into(), |d| d.display().to_string()),
    ));
    let store = dir.as_deref().map(crate::checkpoint::Store::new);
    for (name, path) in
        store.iter().flat_map(|s| [("checkpoint", s.newest()), ("previous checkpoint", s.previous())])
    {
        d.push((name.into(), file_identity(&path)));
    }
    d.push(("--force".into(), a.force.to_string()));
    d.push(("--trace".into(), a.trace.to_string()));
    d.push(("--npy".into(), r.npy.to_string()));
    Ok(d)
}

/// A dataset's identity in O(1): its size, rows and header checksum (which covers the counts,
/// the section table and the data's checksum).
fn data_identity(path: &Path) -> Result<String, AppError> {
    let ds = peregrine_kernels::data::Dataset::open(path)?;
    Ok(format!("{} bytes, {} rows, header crc {:08x}", ds.bytes(), ds.rows(), ds.header().header_crc))
}

/// A file's identity for [`digest`]: its size and the CRC-32 of its first and last 64 KiB
/// (`none` if it does not exist).
fn file_identity(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const EDGE: u64 = 64 << 10;
    let Ok(mut f) = std::fs::File::open(path) else { return "none".into() };
    let len = f.metadata().map_or(0, |m| m.len());
    let mut crc = crc32fast::Hasher::new();
    let mut buf = Vec::new();
    let head = Read::by_ref(&mut f).take(EDGE).read_to_end(&mut buf);
    if len > EDGE && f.seek(SeekFrom::Start(len.saturating_sub(EDGE).max(EDGE))).is_ok() {
        let _ = f.take(EDGE).read_to_end(&mut buf);
    }
    crc.update(&buf);
    match head {
        Ok(_) => format!("{len} bytes, crc {:08x}", crc.finalize()),
        Err(e) => format!("unreadable ({e})"),
    }
}

fn rank_in(
    t: &Transport,
    ctx: &RunContext,
    a: &RunOpts,
    mut r: Resolved,
    epochs: Option<f64>,
    dir: &Path,
) -> Result<Report, AppError> {
    let scheme = SchemeSpec::new(r.scheme.clone(), r.steal);
    let local = t.backend() == Backend::Local;
    let slot = if local { Slot { index: t.rank(), of: t.world_size() } } else { Slot::WHOLE };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_rank = if local { (cpus / t.world_size()).max(1) } else { cpus };
    if r.threads == 0 {
        r.threads = per_rank;
    }
    let pinning = if a.no_pin { Pinning::Off } else { Pinning::Auto };
    let pool = RankPool::new(r.threads, slot, pinning).map_err(|e| AppError::Train(e.to_string()))?;
    // More ranks on the node than cores (8-32 ranks on a workstation): waits sleep soon instead
    // of yielding, and idle workers park at once. Ranks that fit (each rank's loop alternating
    // with its compute threads) keep the short spin and yield, which their dispatch needs. The
    // node's cores, not this process's mask: `mpirun -n 2` binds each rank to one core, which
    // made two ranks on two cores look oversubscribed (waits of 50 us sleeps, softmax at batch
    // 128 0.7x as fast).
    if ranks_on_node(t) > peregrine_core::pool::node_cpus() {
        peregrine_core::clocks::set_oversubscribed(true);
        pool.set_spin(Duration::ZERO);
    }
    if local && pool.placement().pinned {
        // Local ranks share the machine's cores: each rank's loop stays on its own first core,
        // so that it competes with its own compute threads, not with another rank's.
        if let Some(&cpu) = pool.placement().cpus.first() {
            peregrine_core::pool::pin_current_thread(cpu);
        }
    }
    let inject = Injection { pattern: r.straggler.parse().map_err(usage)?, seed: r.seed };
    footprint::check(t, &r, ranks_on_node(t))?;
    // Before the models open the training set.
    peregrine_core::model::copy_training_sets_up_to(a.huge_pages.budget(ranks_on_node(t)));
    // Before anything reads them: the rows every rank will read, and the checksum.
    let datasets: Vec<&Path> = std::iter::once(r.data.as_path()).chain(r.eval.as_deref()).collect();
    let checked = crate::faults::check_datasets(t, &datasets, &ctx.preemption.flag())?;
    if let Some(when) = r.standardize {
        let budget = crate::limits::available()
            .map(|(bytes, _)| (bytes as f64 * crate::scaling::COPY_SHARE / ranks_on_node(t) as f64) as u64);
        let measured = crate::scaling::measure(t, &r.data, r.eval.as_deref(), when, budget)?;
        r.off_scale = measured.off_scale.filter(|_| measured.applied.is_none());
        r.scaling = measured.applied;
        if let (Some(s), 0) = (&r.scaling, t.rank()) {
            eprintln!(
                "standardizing the features on the fly ({} centred, {} scaled; --standardize {})",
                s.shift.iter().filter(|&&x| x != 0.0).count(),
                s.mult.iter().filter(|&&x| x != 1.0).count(),
                when.name()
            );
        }
    }
    if r.l2_per_row {
        let rows = peregrine_kernels::data::Dataset::open(&r.data)?.rows();
        r.l2 = 1.0 / rows.max(1) as f32;
        r.l2_per_row = false;
    }
    match r.model {
        ModelKind::Lr => {
            let m = match r.hash_bits {
                Some(b) => LogReg::with_hashing(&r.data, r.eval.as_deref(), r.lr, r.intercept, b),
                None => LogReg::new(&r.data, r.eval.as_deref(), r.lr, r.intercept),
            }
            .and_then(|m| scaled(m.with_l2(r.l2), &r.scaling, LogReg::standardized))
            .map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Softmax => {
            let m = Softmax::new(&r.data, r.eval.as_deref(), r.lr)
                .and_then(|m| scaled(m.with_l2(r.l2), &r.scaling, Softmax::standardized))
                .map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Mf => {
            let m = Mf::new(&r.data, r.eval.as_deref(), r.k, r.lr, r.l2)
                .map_err(data_err)?
                .with_biases(r.intercept)
                .with_adaptive(matches!(r.optimizer, Optimizer::AdaGrad { .. }))
                .with_strata(r.batch, r.chunk);
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Mlp => {
            let m = Mlp::new(&r.data, r.eval.as_deref(), &r.hidden, r.lr)
                .and_then(|m| scaled(m.with_l2(r.l2), &r.scaling, Mlp::standardized))
                .map_err(data_err)?;
            let m = if r.split == Split::Units { m.split_units().map_err(data_err)? } else { m };
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Lda => {
            let m = Lda::new(&r.data, r.eval.as_deref(), r.k, r.alpha, r.eta).map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Synthetic => {
            let cost = Duration::from_secs_f64(r.chunk_cost);
            let m = Synthetic::new(&r.data, r.params, cost, r.chunk).map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
    }
}

/// Ranks on this node: every rank of a local world; under MPI as the launcher says
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`), else all of them.
fn ranks_on_node(t: &Transport) -> usize {
    if t.backend() == Backend::Local {
        return t.world_size();
    }
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or_else(|| t.world_size())
}

/// `m` reading its sets through `scaling` (`standardized`, the model's), if there is one.
fn scaled<M>(
    m: M,
    scaling: &Option<Scaling>,
    standardized: impl FnOnce(M, &Scaling) -> peregrine_core::model::Built<M>,
) -> peregrine_core::model::Built<M> {
    match scaling {
        Some(s) => standardized(m, s),
        None => Ok(m),
    }
}

/// Collective: rank 0 creates `base`, or `base-2`, `base-3`, ... if taken (by an earlier run,
/// or one started at the same time), and every rank gets its name.
pub(crate) fn agree_fresh_dir(t: &Transport, base: &Path) -> Result<PathBuf, AppError> {
    let mut n = [0u64];
    let made = if t.rank() == 0 { fresh_dir(base).map(|k| n[0] = k) } else { Ok(()) };
    let mut ok = [u64::from(made.is_ok())];
    t.broadcast(&mut ok, 0)?;
    made?;
    if ok[0] == 0 {
        return Err(AppError::Elsewhere {
            rank: 0,
            what: format!("creating a directory {}", base.display()),
        });
    }
    t.broadcast(&mut n, 0)?;
    Ok(numbered(base, n[0]))
}

/// Creates `base`, or `base-2`, `base-3`, ... if taken: the number used (1 for `base`).
fn fresh_dir(base: &Path) -> Result<u64, AppError> {
    if let Some(parent) = base.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    for n in 1.. {
        let dir = numbered(base, n);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(AppError::Io { what: format!("creating {}", dir.display()), source: e }),
        }
    }
    unreachable!("a free name is found before the counter wraps")
}

/// `base` for 1, `base-n` after.
fn numbered(base: &Path, n: u64) -> PathBuf {
    if n <= 1 {
        return base.to_owned();
    }
    let mut name = base.as_os_str().to_owned();
    name.push(format!("-{n}"));
    PathBuf::from(name)
}

fn data_err(e: peregrine_core::model::ModelError) -> AppError {
    AppError::Data { what: "train".into(), detail: e.to_string() }
}

fn train_err(e: TrainError) -> AppError {
    match e {
        TrainError::Transport(t) => AppError::Transport(t),
        e if e.is_usage() => AppError::Usage(e.to_string()),
        TrainError::Metrics { path, source } => AppError::Io { what: format!("writing {path}"), source },
        e => AppError::Train(e.to_string()),
    }
}

#[allow(clippy::too_many_arguments)]
fn train_model<M: Export>(
    t: &Transport,
    ctx: &RunContext,
    a: &RunOpts,
    r: &mut Resolved,
    epochs: Option<f64>,
    scheme: SchemeSpec,
    inject: Injection,
    pool: &RankPool,
    dir: &Path,
    model: &M,
    data_check_seconds: f64,
) -> Result<Report, AppError> {
    let plan = Plan::new(model.rows(), r.batch, t.world_size(), r.chunk, r.seed).map_err(usage)?;
    if plan.batch() < r.batch {
        // What runs is what config.toml records.
        if t.rank() == 0 {
            eprintln!(
                "warning: --batch {} is more than the {} training rows: every iteration is the whole set",
                r.batch,
                plan.batch()
            );
        }
        r.batch = plan.batch();
    }
    if plan.idle_ranks() > 0 && t.rank() == 0 {
        let (n, chunks) = (t.world_size(), t.world_size() - plan.idle_ranks());
        let fix = if plan.batch() >= n {
            format!("--chunk {} or less gives every rank one", plan.batch() / n)
        } else {
            format!("a --batch of {n} rows or more is needed for every rank to have one")
        };
        eprintln!(
            "warning: --batch {} in chunks of {} rows is {chunks} chunk(s) an iteration for {n} ranks: ranks \
             {chunks} to {} get none of their own and compute only what they take over (under schemes \
             that take chunks over); {fix}",
            plan.batch(),
            plan.chunk(),
            n - 1,
        );
    }
    if let Some(w) = model.warning().filter(|_| t.rank() == 0) {
        eprintln!("warning: {w}");
    }
    if let Some(e) = epochs {
        r.iterations = ((e * plan.iters_per_epoch() as f64).ceil() as u64).max(r.at_least).max(1);
    }
    if r.eval_every == 0 {
        // Every epoch, and at most about ten times when a small set runs many epochs; under early
        // stopping every epoch, which its stop and the best model are as fine as.
        r.eval_every = match r.early_stop {
            Some(_) => plan.iters_per_epoch(),
            None => plan.iters_per_epoch().max(r.iterations.div_ceil(10)),
        };
    }
    // By default every epoch, at most about ten per run, and spaced to cost at most 1 % of the
    // training time.
    let budget = (r.checkpoint_every == u64::MAX).then_some(CHECKPOINT_BUDGET);
    if r.checkpoint_every == u64::MAX {
        r.checkpoint_every = plan.iters_per_epoch().max(r.iterations.div_ceil(10));
    }
    let mut cfg = Config {
        scheme,
        batch: r.batch,
        chunk: r.chunk,
        grain: r.grain,
        iterations: r.iterations,
        target_loss: r.target_loss,
        early_stop: r.early_stop,
        // The best evaluated model is the one to keep when the evaluations are on held-out data.
        keep_best: r.eval.is_some(),
        eval_every: r.eval_every,
        steal_fraction: r.steal_fraction,
        seed: r.seed,
        threads: r.threads,
        inject,
        keep_params: true,
        // MF's adaptive rates live in its rows (the model steps them); the engine applies its
        // updates as they come.
        optimizer: if r.model == ModelKind::Mf { Optimizer::Sgd } else { r.optimizer },
        schedule: Schedule { warmup: r.warmup, decay: r.lr_decay },
        stop_on_stall: r.stop_on_stall,
        checkpoint_every: r.checkpoint_every,
        checkpoint_budget: budget,
        checkpoint_seconds: (r.checkpoint_seconds > 0.0).then_some(r.checkpoint_seconds),
        stop: Some(ctx.preemption.flag()),
        trace: a.trace.then(|| dir.join(TRACE_PARTS)),
        node_combine: r.node_combine,
        // Off (--watchdog 0), a rank asked to stop still has STOP_GRACE without progress to reach
        // the stop's checkpoint: the signal is never swallowed by a rank that cannot get there.
        watchdog: Some(Watchdog {
            after: if r.watchdog > 0.0 { Duration::from_secs_f64(r.watchdog) } else { Duration::MAX },
            after_stop: Duration::from_secs_f64(if r.watchdog > 0.0 {
                r.watchdog.min(STOP_GRACE)
            } else {
                STOP_GRACE
            }),
            on_hang: std::sync::Arc::new(end_hung_job),
        }),
        ..Config::default()
    };
    // Refused configurations leave no run directory behind.
    peregrine_core::engine::check(&cfg, t.world_size(), model.rows()).map_err(train_err)?;
    peregrine_core::engine::check_model(&cfg, model).map_err(train_err)?;
    let text = r.to_toml().map_err(|e| AppError::Train(format!("config.toml: {e}")))?;
    // Checkpoints record the configuration and what data it ran on (not where it was): a resume
    // elsewhere is refused with the keys that differ.
    let mut identity = toml::Table::new();
    identity.insert("data".into(), data_identity(&r.data)?.into());
    identity.insert("eval".into(), r.eval.as_deref().map_or(Ok("none".into()), data_identity)?.into());
    let mut recorded = toml::Table::new();
    recorded.insert(IDENTITY.into(), identity.into());
    let recorded = format!(
        "{text}\n{}",
        toml::to_string(&recorded).map_err(|e| AppError::Train(format!("checkpoint configuration: {e}")))?
    );
    let store = crate::checkpoint::Store::new(dir);
    cfg.resume = resume_point(t, a, dir, &store, &recorded, model.param_order())?;
    let metrics_dir = dir.join("metrics");
    std::fs::create_dir_all(&metrics_dir).map_err(io(format!("creating {}", metrics_dir.display())))?;
    if t.rank() == 0 {
        write_atomically(&dir.join("config.toml"), text.as_bytes())?;
    }
    meta::write(t, dir, ctx.slurm.as_ref())?;
    let path = metrics_dir.join(format!("rank-{}.jsonl", t.rank()));
    // A resumed run adds to the metrics of the run it resumes; a link there is not followed.
    let file = std::fs::OpenOptions::new()
        .custom_flags(libc::O_NOFOLLOW)
        .create(true)
        .write(true)
        .append(cfg.resume.is_some())
        .truncate(cfg.resume.is_none())
        .open(&path)
        .map_err(io(format!("creating {}", path.display())))?;
    let mut out = BufWriter::new(file);
    let show = t.rank() == 0 && !a.quiet && std::io::stderr().is_terminal();
    let mut bar = Bar { last: None, shown: false };
    let name = path.display().to_string();
    let report = engine::train_checkpointed(
        t,
        model,
        &cfg,
        pool,
        Some((&mut out, &name)),
        &mut |p| {
            if show {
                bar.draw(p, cfg.target_loss);
            }
        },
        &mut |s| {
            store.save(s, &recorded, model.param_order())?;
            // The model as of the checkpoint (the best so far, when kept), for use before the run
            // ends.
            let best = peregrine_core::engine::best_point(&s.evals).filter(|_| !s.best.is_empty());
            let params = if best.is_some() { &s.best } else { &s.weights };
            save_model_params(dir, model, params, r, s.iteration, "checkpoint", None, best)
                .map_err(|e| e.to_string())
        },
    )
    .map_err(|e| match e {
        // Stopped at a checkpoint on a signal: the batch script requeues, the rerun resumes.
        TrainError::Stopped(at) => AppError::Preempted {
            checkpoint: format!(
                "{} (iteration {at}; rerun the same command to resume)",
                store.newest().display()
            ),
        },
        TrainError::Stalled(w) => train_err(TrainError::Stalled(with_scale(&w, r))),
        e @ TrainError::Diverged { .. } => match &r.off_scale {
            Some(why) => AppError::Train(format!("{e}; {}", scale_cause(why))),
            None => train_err(e),
        },
        e => train_err(e),
    })?;
    out.flush().map_err(io(format!("writing {name}")))?;
    if bar.shown {
        eprintln!();
    }
    if a.trace && t.rank() == 0 {
        // Every rank's part is whole: training ended with a barrier after the last was written.
        join_trace(&dir.join(TRACE_PARTS), &dir.join("trace.json"), t.world_size())?;
    }
    if t.rank() == 0 {
        write_summary(dir, &report, pool.placement())?;
        save_model(dir, model, &report, r)?;
        if !a.quiet {
            print_summary(&report, dir, data_check_seconds);
            print!("{}", report.stragglers);
        }
        for w in &report.warnings {
            eprintln!("warning: {}", with_scale(w, r));
        }
    }
    Ok(report)
}

/// Warning `w` of a model that does not learn, with the features' scale named as the likely
/// cause when they are far from unit scale and were left so (`--standardize off`).
fn with_scale(w: &str, r: &Resolved) -> String {
    match &r.off_scale {
        Some(why) => format!("{w}; but first, the likely cause: {}", scale_cause(why)),
        None => w.to_owned(),
    }
}

/// The features' scale as a cause, `why` saying how far it is from unit scale.
fn scale_cause(why: &str) -> String {
    format!(
        "the features are far from unit scale ({why}), and --standardize off left them so: \
         drop --standardize off (auto standardizes such data) or run `peregrine data standardize`"
    )
}

/// The watchdog's end of a job whose rank stopped progressing: the message, then the process
/// ends at once with [`EXIT_HUNG`], or [`EXIT_REQUEUE`] when it had been asked to stop (by Slurm
/// before a time limit or a preemption: a batch script requeues the job, which resumes from the
/// last checkpoint). Threads stuck in a call cannot be unwound; the launcher ends the other
/// ranks. The checkpoints on disk are whole: they are written aside and renamed.
fn end_hung_job(message: &str, stopping: bool) {
    // Local ranks share the process: their watchdogs fire together. The first waits a moment
    // for the others and speaks for them all, preferring a rank that found itself stuck (a
    // waiting rank's guess is as good as its last look at the others' words).
    static HEARD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let first = {
        let mut heard = HEARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        heard.push(message.to_owned());
        heard.len() == 1
    };
    if !first {
        return;
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let heard = HEARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let message = heard.iter().find(|m| m.contains("itself looks stuck")).unwrap_or(&heard[0]);
    let code = if stopping {
        crate::say(format_args!(
            "error: {message}: the stop's checkpoint cannot be reached; the last checkpoint \
             stands (exit {EXIT_REQUEUE}: rerun, or let the batch script requeue, to resume from it)"
        ));
        EXIT_REQUEUE
    } else {
        crate::say(format_args!(
            "error: {message}; rerun the same command to resume from the last checkpoint"
        ));
        EXIT_HUNG
    };
    // SAFETY: `_exit` ends the process without running exit handlers, which could block on
    // the locks of threads stuck in MPI calls; nothing is half-written by skipping them (the
    // files that matter are renamed into place whole).
    unsafe { libc::_exit(code) }
}

/// The exit code of a job the watchdog ended (as `timeout(1)`'s).
pub const EXIT_HUNG: i32 = 124;

/// A one-line progress display on standard error.
struct Bar {
    last: Option<Instant>,
    shown: bool,
}

impl Bar {
    fn draw(&mut self, p: &Progress, target: Option<f64>) {
        let now = Instant::now();
        if p.iter != p.iterations
            && self.last.is_some_and(|l| now - l < std::time::Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        self.shown = true;
        let frac = p.iter as f64 / p.iterations.max(1) as f64;
        let filled = (frac * 20.0).round() as usize;
        let rate = p.samples as f64 / p.seconds.max(1e-9);
        let eta = p.seconds / frac.max(1e-9) - p.seconds;
        let eval = p.eval.map(|e| format!("  eval {:.4}", e.loss)).unwrap_or_default();
        let goal = target.map(|g| format!(" (target {g})")).unwrap_or_default();
        eprint!(
            "\r[{}{}] {}/{}  loss {:.4}{eval}{goal}  {}  ETA {:.0}s   ",
            "#".repeat(filled),
            ".".repeat(20 - filled),
            p.iter,
            p.iterations,
            p.batch_loss,
            rate_text(rate),
            eta.max(0.0)
        );
        let _ = std::io::stderr().flush();
    }
}
